#pragma once

// Marks functions of the arithmetic layer callable from host and device code without
// making that layer depend on Kokkos (it is tested with neither Kokkos nor MPI).
#if defined(__CUDACC__) || defined(__HIPCC__)
#define KSHARD_HOST_DEVICE __host__ __device__
#else
#define KSHARD_HOST_DEVICE
#endif

#define KSHARD_FUNCTION KSHARD_HOST_DEVICE constexpr inline
