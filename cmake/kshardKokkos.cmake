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

# Debian's Kokkos 5 (libkokkos-dev 5.2, from unstable) exports Kokkos::kokkosalgorithms and
# Kokkos::kokkossimd as static libraries that the package does not ship (header-only parts of
# Kokkos whose archives hold only a dummy object), and its KokkosTargets.cmake stops
# find_package with a fatal error on the missing files. So the check comes before find_package:
# when the Kokkos package about to be loaded (Kokkos_DIR, else the first KokkosConfig.cmake
# under Kokkos_ROOT, CMAKE_PREFIX_PATH or the system prefixes) names library files that do not
# exist, a copy of its CMake files goes to <build>/kshard-kokkos-package with an empty archive
# in place of each missing one, and Kokkos_DIR points at the copy. Sets KSHARD_KOKKOS_PACKAGE_DIR
# to the original package directory (what an installed kshard records), "" when none was seen.
function(kshard_prepare_kokkos_package)
  set(KSHARD_KOKKOS_PACKAGE_DIR "" PARENT_SCOPE)
  set(dir "")
  if(Kokkos_DIR AND EXISTS "${Kokkos_DIR}/kshard-original-dir.txt")
    file(READ "${Kokkos_DIR}/kshard-original-dir.txt" dir)  # an earlier copy: start over
  elseif(Kokkos_DIR AND EXISTS "${Kokkos_DIR}/KokkosConfig.cmake")
    set(dir "${Kokkos_DIR}")
  elseif(NOT Kokkos_DIR)
    set(prefixes ${Kokkos_ROOT} $ENV{Kokkos_ROOT} ${CMAKE_PREFIX_PATH} $ENV{CMAKE_PREFIX_PATH}
                 ${CMAKE_SYSTEM_PREFIX_PATH})
    string(REPLACE ":" ";" prefixes "${prefixes}")
    unset(found)
    find_path(found KokkosConfig.cmake NO_CACHE NO_DEFAULT_PATH PATHS ${prefixes}
              PATH_SUFFIXES lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Kokkos lib64/cmake/Kokkos
                            lib/cmake/Kokkos share/cmake/Kokkos)
    if(found)
      set(dir "${found}")
    endif()
  endif()
  if(NOT dir OR NOT EXISTS "${dir}/KokkosTargets.cmake")
    return()  # found elsewhere or not at all: find_package speaks for itself
  endif()
  set(KSHARD_KOKKOS_PACKAGE_DIR "${dir}" PARENT_SCOPE)
  # The prefix KokkosTargets.cmake computes: its directory, up once per PATH step it takes.
  file(STRINGS "${dir}/KokkosTargets.cmake" steps
       REGEX "^get_filename_component\\(_IMPORT_PREFIX \"\\\${_IMPORT_PREFIX}\" PATH\\)")
  set(prefix "${dir}")
  foreach(step IN LISTS steps)
    get_filename_component(prefix "${prefix}" DIRECTORY)
  endforeach()
  file(GLOB configs "${dir}/KokkosTargets-*.cmake")
  set(missing "")
  foreach(config IN LISTS configs)
    file(STRINGS "${config}" locations REGEX "IMPORTED_LOCATION_[A-Z_]+ \"\\\${_IMPORT_PREFIX}/")
    foreach(line IN LISTS locations)
      string(REGEX REPLACE ".*\"\\\${_IMPORT_PREFIX}/([^\"]+)\".*" "\\1" file "${line}")
      if(NOT EXISTS "${prefix}/${file}")
        list(APPEND missing "${file}")
      endif()
    endforeach()
  endforeach()
  if(NOT missing)
    return()
  endif()
  list(REMOVE_DUPLICATES missing)
  set(copy "${CMAKE_BINARY_DIR}/kshard-kokkos-package")
  file(REMOVE_RECURSE "${copy}")
  file(GLOB files "${dir}/*.cmake")
  file(COPY ${files} DESTINATION "${copy}")
  file(WRITE "${copy}/kshard-original-dir.txt" "${dir}")
  # Paths relative to the package's own directory now name the original's.
  file(READ "${copy}/KokkosTargets.cmake" text)
  string(REPLACE "get_filename_component(_IMPORT_PREFIX \"\${CMAKE_CURRENT_LIST_FILE}\" PATH)"
                 "set(_IMPORT_PREFIX \"${dir}\")" text "${text}")
  file(WRITE "${copy}/KokkosTargets.cmake" "${text}")
  file(READ "${copy}/KokkosConfig.cmake" text)
  string(REPLACE "\${CMAKE_CURRENT_LIST_DIR}/.." "${dir}/.." text "${text}")
  file(WRITE "${copy}/KokkosConfig.cmake" "${text}")
  foreach(config IN LISTS configs)
    get_filename_component(name "${config}" NAME)
    file(READ "${copy}/${name}" text)
    foreach(file IN LISTS missing)
      get_filename_component(archive "${file}" NAME)
      file(WRITE "${copy}/empty/${archive}" "!<arch>\n")  # an ar archive with no members
      string(REPLACE "\"\${_IMPORT_PREFIX}/${file}\"" "\"${copy}/empty/${archive}\"" text "${text}")
    endforeach()
    file(WRITE "${copy}/${name}" "${text}")
  endforeach()
  string(REPLACE ";" ", " list "${missing}")
  message(STATUS "kshard: the Kokkos package in ${dir} names files it does not ship (${list}): "
                 "using a copy with empty archives in their place, ${copy}")
  set(Kokkos_DIR "${copy}" CACHE PATH "The directory containing KokkosConfig.cmake" FORCE)
  set(Kokkos_DIR "${copy}" PARENT_SCOPE)
endfunction()

macro(kshard_find_kokkos)
  if(NOT TARGET Kokkos::kokkos)
    kshard_prepare_kokkos_package()
    find_package(Kokkos CONFIG REQUIRED)
  endif()
  if(NOT KSHARD_KOKKOS_PACKAGE_DIR)
    set(KSHARD_KOKKOS_PACKAGE_DIR "${Kokkos_DIR}")
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
