#pragma once
#include <mpi.h>

#include "kshard/kernels/copies.hpp"
#ifdef KSHARD_COMM_BACKEND_HEADER
#include KSHARD_COMM_BACKEND_HEADER
#endif

namespace kshard::comm {
inline int size(MPI_Comm comm) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  return n;
}
}  // namespace kshard::comm
