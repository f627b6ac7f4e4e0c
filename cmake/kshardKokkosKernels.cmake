# kokkos-kernels for the local GEMM (include/kshard/kernels/gemm.hpp): KokkosBlas::gemm, which
# runs the vendor BLAS kokkos-kernels was built with (a host BLAS, cuBLAS, rocBLAS). Included by
# the top-level CMakeLists.txt after Kokkos is found; KSHARD_KOKKOS_KERNELS says what to do:
#   AUTO (default): use kokkos-kernels when a usable one is found, else kshard's own GEMM;
#   ON: require it; OFF: kshard's own GEMM.
# GPU builds (Kokkos with CUDA or HIP) require it, with its cuBLAS or rocBLAS: kshard's own GEMM
# is not a GPU GEMM anyone should run. Sets
#   KSHARD_USES_KOKKOS_KERNELS    ON or OFF (also read by the installed package config)
#   KSHARD_KOKKOS_KERNELS_TARGET  the target kshard::kshard links when ON

string(TOUPPER "${KSHARD_KOKKOS_KERNELS}" kshard_kk_mode)
if(NOT kshard_kk_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "kshard: KSHARD_KOKKOS_KERNELS is '${KSHARD_KOKKOS_KERNELS}'; it must be "
                      "AUTO, ON or OFF")
endif()
string(TOUPPER "${Kokkos_DEVICES}" kshard_kk_devices)
set(kshard_kk_gpu "")
foreach(device CUDA HIP)
  if(device IN_LIST kshard_kk_devices)
    set(kshard_kk_gpu ${device})
  endif()
endforeach()
set(kshard_kk_vendor_CUDA CUBLAS)
set(kshard_kk_vendor_HIP ROCBLAS)

set(KSHARD_USES_KOKKOS_KERNELS OFF)
set(KSHARD_KOKKOS_KERNELS_TARGET "")
set(kshard_kk_problem "")
if(kshard_kk_mode STREQUAL "OFF")
  set(kshard_kk_problem "KSHARD_KOKKOS_KERNELS is OFF, which a GPU build does not allow")
else()
  if(NOT TARGET Kokkos::kokkoskernels AND NOT TARGET trilinos_kokkoskernels)
    find_package(KokkosKernels CONFIG QUIET)
  endif()
  kshard_repair_kokkos_kernels_target(KSHARD_KOKKOS_KERNELS_TARGET)
  if(NOT KSHARD_KOKKOS_KERNELS_TARGET)
    string(CONCAT kshard_kk_problem "no KokkosKernels CMake package was found (Debian: "
                          "libtrilinos-kokkos-kernels-dev; else set KokkosKernels_ROOT)")
  elseif(KSHARD_KOKKOS_KERNELS_TARGET STREQUAL "trilinos_kokkoskernels")
    # Trilinos' kokkos-kernels is built against Trilinos' own Kokkos: only that one will do.
    get_target_property(kshard_kk_links Kokkos::kokkos INTERFACE_LINK_LIBRARIES)
    if(NOT "trilinos_kokkoscore" IN_LIST kshard_kk_links OR
       (DEFINED KokkosKernels_INSTALL_DIR AND DEFINED Kokkos_INSTALL_DIR AND
        NOT KokkosKernels_INSTALL_DIR STREQUAL Kokkos_INSTALL_DIR))
      string(CONCAT kshard_kk_problem
                    "the kokkos-kernels at ${KokkosKernels_DIR} is Trilinos' and built against Trilinos' "
          "Kokkos, not the Kokkos at ${Kokkos_DIR}")
    endif()
  endif()
  # Which vendor BLAS it has, from its KokkosKernels_config.h.
  set(kshard_kk_tpls "")
  if(KSHARD_KOKKOS_KERNELS_TARGET AND NOT kshard_kk_problem)
    get_target_property(kshard_kk_dirs ${KSHARD_KOKKOS_KERNELS_TARGET}
                        INTERFACE_INCLUDE_DIRECTORIES)
    find_file(KSHARD_KOKKOS_KERNELS_CONFIG_H KokkosKernels_config.h
              HINTS ${kshard_kk_dirs} NO_DEFAULT_PATH)
    if(KSHARD_KOKKOS_KERNELS_CONFIG_H)
      file(STRINGS "${KSHARD_KOKKOS_KERNELS_CONFIG_H}" kshard_kk_defines
           REGEX "^#define KOKKOSKERNELS_ENABLE_TPL_(BLAS|MKL|ARMPL|CUBLAS|ROCBLAS)[ \t]*$")
      foreach(line IN LISTS kshard_kk_defines)
        string(REGEX REPLACE "^#define KOKKOSKERNELS_ENABLE_TPL_([A-Z]+).*" "\\1" tpl "${line}")
        list(APPEND kshard_kk_tpls ${tpl})
      endforeach()
      list(REMOVE_DUPLICATES kshard_kk_tpls)
    endif()
    if(kshard_kk_gpu AND KSHARD_KOKKOS_KERNELS_CONFIG_H AND
       NOT kshard_kk_vendor_${kshard_kk_gpu} IN_LIST kshard_kk_tpls)
      string(CONCAT kshard_kk_problem
                    "the kokkos-kernels at ${KokkosKernels_DIR} was built without "
          "${kshard_kk_vendor_${kshard_kk_gpu}} (its BLAS TPLs: '${kshard_kk_tpls}')")
    endif()
  endif()
endif()

if(NOT kshard_kk_problem)
  set(KSHARD_USES_KOKKOS_KERNELS ON)
  if(NOT kshard_kk_tpls)
    set(kshard_kk_tpls "unknown")
  endif()
  message(STATUS "kshard: local GEMM through kokkos-kernels (${KSHARD_KOKKOS_KERNELS_TARGET} from "
                 "${KokkosKernels_DIR}; BLAS TPLs: ${kshard_kk_tpls})")
elseif(kshard_kk_gpu)
  message(FATAL_ERROR
          "kshard: Kokkos has ${kshard_kk_gpu}, and a GPU build needs kokkos-kernels with "
          "${kshard_kk_vendor_${kshard_kk_gpu}} for its local GEMM (kshard's own GEMM is only the "
          "CPU fallback), but ${kshard_kk_problem}. Build kokkos-kernels against this Kokkos "
          "with -DKokkosKernels_ENABLE_TPL_${kshard_kk_vendor_${kshard_kk_gpu}}=ON and point "
          "KokkosKernels_ROOT at it.")
elseif(kshard_kk_mode STREQUAL "ON")
  message(FATAL_ERROR "kshard: KSHARD_KOKKOS_KERNELS is ON, but ${kshard_kk_problem}")
elseif(kshard_kk_mode STREQUAL "OFF")
  message(STATUS "kshard: local GEMM: kshard's own (KSHARD_KOKKOS_KERNELS is OFF)")
else()
  message(STATUS "kshard: local GEMM: kshard's own (${kshard_kk_problem})")
endif()
