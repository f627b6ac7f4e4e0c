#pragma once
#include <mpi.h>
namespace kshard::comm {
inline int size(MPI_Comm comm) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  return n;
}
}  // namespace kshard::comm
