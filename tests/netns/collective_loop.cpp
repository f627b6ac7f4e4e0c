// A job that keeps kshard's collectives busy: every rank redistributes a row-sharded matrix to
// Replicate (an all-gather over the whole mesh) again and again, for SECONDS of wall time, then
// exits 0. scripts/netns.sh runs it across two network namespaces and cuts the link between
// them mid-run: with KSHARD_COLLECTIVE_TIMEOUT set, every rank must then name the stuck
// collective and the job must abort; without the watchdog it would hang.
//
// Usage: kshard_netns_collective_loop SECONDS [ROWS]   (the matrix is ROWS x 64 doubles)

#include <kshard/kshard.hpp>

#include <Kokkos_Core.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rank = 0;
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const double seconds = argc > 1 ? std::atof(argv[1]) : 10.0;
    const long rows = argc > 2 ? std::atol(argv[2]) : 4096;
    char host[256] = {};
    gethostname(host, sizeof host - 1);

    const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
    const kshard::HostMatrix<double> full("full", static_cast<std::size_t>(rows), 64);
    for (std::size_t i = 0; i < full.extent(0); ++i)
      for (std::size_t j = 0; j < full.extent(1); ++j) full(i, j) = static_cast<double>(i * 64 + j);
    const auto sharded = kshard::distribute(mesh, kshard::Layout(kshard::Shard<0>{}),
                                            kshard::HostMatrix<const double>(full));
    std::printf("collective_loop: rank %d of %d on %s: running for %.0f s\n", rank, size, host,
                seconds);
    std::fflush(stdout);

    const auto start = std::chrono::steady_clock::now();
    auto last_report = start;
    const kshard::HostMatrix<int> flags("flags", static_cast<std::size_t>(size), 1);
    long rounds = 0;
    for (;;) {
      const auto replicated = kshard::redistribute(sharded, kshard::Layout(kshard::Replicate{}));
      ++rounds;
      // Every rank leaves after the same round: the ranks agree through one more kshard
      // collective (so that it is watched too), a gather of one flag per rank.
      flags(static_cast<std::size_t>(rank), 0) =
          std::chrono::steady_clock::now() - start > std::chrono::duration<double>(seconds) ? 1 : 0;
      const auto all_flags = kshard::gather(kshard::distribute(
          mesh, kshard::Layout(kshard::Shard<0>{}), kshard::HostMatrix<const int>(flags)));
      int done = 0;
      for (std::size_t r = 0; r < all_flags.extent(0); ++r) done |= all_flags(r, 0);
      if (rounds == 1) {
        const auto local = kshard::gather(replicated);
        if (local(static_cast<std::size_t>(rows - 1), 63) !=
            full(static_cast<std::size_t>(rows - 1), 63)) {
          std::fprintf(stderr, "collective_loop: rank %d: wrong data after redistribute\n", rank);
          status = 1;
          done = 1;
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::seconds(1)) {
        std::printf("collective_loop: rank %d: %ld rounds\n", rank, rounds);
        std::fflush(stdout);
        last_report = now;
      }
      if (done != 0) break;
    }
    std::printf("collective_loop: rank %d: done after %ld rounds\n", rank, rounds);
  }
  MPI_Finalize();
  return status;
}
