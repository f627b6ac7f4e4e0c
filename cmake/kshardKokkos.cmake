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
