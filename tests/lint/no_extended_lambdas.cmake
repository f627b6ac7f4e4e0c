# Fails when a kshard header defines a kernel as an extended lambda (KOKKOS_LAMBDA,
# KOKKOS_CLASS_LAMBDA, or a lambda marked __host__/__device__): run as
#   cmake -DINCLUDE_DIR=<include> -P no_extended_lambdas.cmake
# nvcc gives each translation unit its own copy of the function pointers behind an extended
# __host__ __device__ lambda, while the lambda's wrapper and the kernel launch that copies it are
# inline functions the linker keeps once for the whole program. A header template instantiated
# alike in two sources can then copy the lambda through the other source's pointer, which is
# null unless that source ran the lambda first: a crash in a user's program of several sources
# on CUDA only (seen on an H200 in vocab_parallel_lookup_backward, 2026-12-04). Named functors
# have none of this. Comments may name the macros.
file(GLOB_RECURSE headers "${INCLUDE_DIR}/kshard/*.hpp")
set(found "")
foreach(header IN LISTS headers)
  file(STRINGS "${header}" lines)
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    string(REGEX REPLACE "//.*$" "" code "${line}")
    if(code MATCHES "KOKKOS_(CLASS_)?LAMBDA|\\][ \t]*(__host__|__device__)|\\)[ \t]*(__host__|__device__)[ \t]*(->|{|mutable)")
      file(RELATIVE_PATH name "${INCLUDE_DIR}" "${header}")
      string(APPEND found "\n  ${name}:${number}: ${line}")
    endif()
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "kshard headers define kernels as extended lambdas; write named functors "
                      "(tests/lint/no_extended_lambdas.cmake says why):${found}")
endif()
list(LENGTH headers count)
message(STATUS "${count} headers, no extended lambdas")
