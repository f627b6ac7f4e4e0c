#pragma once
#include <mpi.h>

namespace kshard::io::detail {
inline int open(MPI_Comm comm, const char* path, MPI_File* file) {
  return MPI_File_open(comm, path, MPI_MODE_RDONLY, MPI_INFO_NULL, file);
}
}  // namespace kshard::io::detail
