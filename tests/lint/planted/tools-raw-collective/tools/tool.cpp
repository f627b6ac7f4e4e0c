#include <mpi.h>

#include "kshard/kshard.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ok = 1, rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // MPI_Bcast in a comment is fine.
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);  // planted: tools-raw-collective
  MPI_Comm world = MPI_COMM_WORLD;
  MPI_File f;
  MPI_File_open(world, "x", MPI_MODE_RDONLY, MPI_INFO_NULL, &f);  // planted: tools-raw-collective
  if (!ok) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
}
