# The default for handing device memory to MPI directly (KSHARD_GPU_AWARE_MPI_DEFAULT on the
# kshard target). KSHARD_GPU_AWARE_MPI: ON, OFF, or AUTO (the default): ON when the MPI says at
# configure time that it was built with CUDA or ROCm support (Open MPI's mpi-ext.h). The
# environment variable KSHARD_GPU_AWARE_MPI=0|1 overrides the default at run time; a CUDA-aware
# Open MPI is also asked at run time whether its CUDA transport is loaded.
include(CheckCXXSourceCompiles)
include(CMakePushCheckState)

set(KSHARD_GPU_AWARE_MPI AUTO CACHE STRING
    "Hand device memory to MPI directly by default: AUTO (ask the MPI), ON or OFF")
set_property(CACHE KSHARD_GPU_AWARE_MPI PROPERTY STRINGS AUTO ON OFF)

function(kshard_gpu_aware_mpi_default out)
  string(TOUPPER "${KSHARD_GPU_AWARE_MPI}" choice)
  if(choice STREQUAL "ON")
    set(${out} 1 PARENT_SCOPE)
    return()
  elseif(choice STREQUAL "OFF")
    set(${out} 0 PARENT_SCOPE)
    return()
  elseif(NOT choice STREQUAL "AUTO")
    message(FATAL_ERROR "kshard: KSHARD_GPU_AWARE_MPI is '${KSHARD_GPU_AWARE_MPI}'; "
                        "it must be AUTO, ON or OFF")
  endif()
  cmake_push_check_state(RESET)
  set(CMAKE_REQUIRED_LIBRARIES MPI::MPI_CXX)
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_source_compiles([[
#include <mpi.h>
#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#if !(defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT) && \
    !(defined(MPIX_ROCM_AWARE_SUPPORT) && MPIX_ROCM_AWARE_SUPPORT)
#error "this MPI does not say it was built with GPU support"
#endif
int main() { return 0; }
]] KSHARD_MPI_SAYS_GPU_AWARE)
  cmake_pop_check_state()
  if(KSHARD_MPI_SAYS_GPU_AWARE)
    set(${out} 1 PARENT_SCOPE)
  else()
    set(${out} 0 PARENT_SCOPE)
  endif()
endfunction()

kshard_gpu_aware_mpi_default(kshard_gpu_aware_default)
if(kshard_gpu_aware_default)
  message(STATUS "kshard: device memory goes to MPI directly (KSHARD_GPU_AWARE_MPI="
                 "${KSHARD_GPU_AWARE_MPI})")
else()
  message(STATUS "kshard: device memory goes to MPI through host buffers "
                 "(KSHARD_GPU_AWARE_MPI=${KSHARD_GPU_AWARE_MPI})")
endif()
