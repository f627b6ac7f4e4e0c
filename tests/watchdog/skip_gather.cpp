// A rank that never reaches a collective: every rank but the last calls kshard::gather, the last
// one waits elsewhere. Run with KSHARD_COLLECTIVE_TIMEOUT set, the gathering ranks must name
// gather's collective (its argument agreement or its all-gather) and abort the job
// (expect_abort.sh checks it); without the watchdog this program hangs.

#include <kshard/kshard.hpp>

#include <Kokkos_Core.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rank = 0;
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
    const kshard::HostMatrix<double> full("full", 8, 3);
    const auto matrix = kshard::distribute(mesh, kshard::Layout(kshard::Shard<0>{}),
                                           kshard::HostMatrix<const double>(full));
    if (rank != size - 1) (void)kshard::gather(matrix);
    MPI_Barrier(MPI_COMM_WORLD);  // the last rank waits here, outside kshard
  }
  MPI_Finalize();
  return 0;
}
