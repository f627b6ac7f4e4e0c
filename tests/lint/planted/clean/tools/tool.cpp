#include <mpi.h>

#include "kshard/io/safetensors.hpp"
#include "kshard/kshard.hpp"

namespace detail {
inline int own() { return 0; }  // the tool's own detail namespace
}  // namespace detail

// Collectives go through kshard: no MPI_Bcast or MPI_Allreduce here, nor kshard::detail.
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* text = "MPI_Barrier and io::detail in a string";
  if (text == nullptr) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
  return detail::own();
}
