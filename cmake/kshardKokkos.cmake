# Finds Kokkos and makes Kokkos::kokkos usable. Shared by kshard's own build and its
# installed package config, so consumers get the same treatment.
#
# Debian's Trilinos Kokkos 3.4 ships a KokkosConfig.cmake whose Kokkos::kokkos target points
# at <prefix>/lib/include; its headers are in <prefix>/include/trilinos. When the target's
# include directories hold no Kokkos_Core.hpp, they are replaced by the directory that does.

function(kshard_repair_kokkos_target)
  get_target_property(aliased Kokkos::kokkos ALIASED_TARGET)
  get_target_property(dirs Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  if(aliased OR NOT dirs OR dirs MATCHES "\\$<")
    return()  # a standalone Kokkos: its targets are sound
  endif()
  foreach(dir IN LISTS dirs)
    if(EXISTS "${dir}/Kokkos_Core.hpp")
      return()
    endif()
  endforeach()
  find_path(KSHARD_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
            HINTS ${Kokkos_INCLUDE_DIRS} PATH_SUFFIXES trilinos NO_CMAKE_FIND_ROOT_PATH)
  if(NOT KSHARD_KOKKOS_INCLUDE_DIR)
    message(FATAL_ERROR "kshard: Kokkos::kokkos names include directories '${dirs}' without "
                        "Kokkos_Core.hpp, and no other Kokkos headers were found")
  endif()
  message(STATUS "kshard: repairing Kokkos::kokkos include directory -> ${KSHARD_KOKKOS_INCLUDE_DIR}")
  set_target_properties(Kokkos::kokkos PROPERTIES
                        INTERFACE_INCLUDE_DIRECTORIES "${KSHARD_KOKKOS_INCLUDE_DIR}")
endfunction()

macro(kshard_find_kokkos)
  if(NOT TARGET Kokkos::kokkos)
    find_package(Kokkos CONFIG REQUIRED)
  endif()
  kshard_repair_kokkos_target()
endmacro()

# kokkos-kernels, when kshard uses it (KSHARD_KOKKOS_KERNELS): sets <out_var> to the target to
# link, or to "" when neither flavour's target exists. A standalone kokkos-kernels exports
# Kokkos::kokkoskernels, which is sound. Trilinos' (Debian 12: libtrilinos-kokkos-kernels-dev,
# Trilinos 13.2) exports trilinos_kokkoskernels without include directories; its headers are in
# <prefix>/include/trilinos, next to Kokkos': the target is given the directory that holds them.
function(kshard_repair_kokkos_kernels_target out_var)
  set(${out_var} "" PARENT_SCOPE)
  if(TARGET Kokkos::kokkoskernels)
    set(${out_var} Kokkos::kokkoskernels PARENT_SCOPE)
    return()
  endif()
  if(NOT TARGET trilinos_kokkoskernels)
    return()
  endif()
  get_target_property(dirs trilinos_kokkoskernels INTERFACE_INCLUDE_DIRECTORIES)
  if(dirs)
    foreach(dir IN LISTS dirs)
      if(EXISTS "${dir}/KokkosBlas3_gemm.hpp")
        set(${out_var} trilinos_kokkoskernels PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endif()
  find_path(KSHARD_KOKKOS_KERNELS_INCLUDE_DIR KokkosBlas3_gemm.hpp
            HINTS ${KokkosKernels_INCLUDE_DIRS} ${Kokkos_INCLUDE_DIRS} PATH_SUFFIXES trilinos
            NO_CMAKE_FIND_ROOT_PATH)
  if(NOT KSHARD_KOKKOS_KERNELS_INCLUDE_DIR)
    message(FATAL_ERROR "kshard: trilinos_kokkoskernels (from ${KokkosKernels_DIR}) names no "
                        "include directory with KokkosBlas3_gemm.hpp, and none was found")
  endif()
  message(STATUS "kshard: repairing trilinos_kokkoskernels include directory -> "
                 "${KSHARD_KOKKOS_KERNELS_INCLUDE_DIR}")
  set_target_properties(trilinos_kokkoskernels PROPERTIES
                        INTERFACE_INCLUDE_DIRECTORIES "${KSHARD_KOKKOS_KERNELS_INCLUDE_DIR}")
  set(${out_var} trilinos_kokkoskernels PARENT_SCOPE)
endfunction()
