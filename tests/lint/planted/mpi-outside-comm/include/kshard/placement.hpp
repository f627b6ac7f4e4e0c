#pragma once
#include <mpi.h>  // planted: mpi-outside-comm
#include "kshard/index.hpp"

namespace kshard {
// A comment may name MPI_Comm, and a string "MPI_Bcast" too.
inline const char* name = "MPI_Allreduce";
inline int ranks(MPI_Comm comm) {  // planted: mpi-outside-comm
  int size = 0;
  MPI_Comm_size(comm, &size);  // planted: mpi-outside-comm
  return size;
}
}  // namespace kshard
