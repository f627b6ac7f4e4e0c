// Test main for the MPI tests: MPI and Kokkos initialised once; rank 0 prints progress,
// other ranks print only their failures (tagged with the rank); every rank returns the
// same exit code, the worst of all ranks.

#include <mpi.h>

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>

#include <cstdio>

#include "kshard_test.hpp"

namespace {

// Forwards failures to the default printer, tagged with this rank.
class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  FailurePrinter(int rank, testing::TestEventListener* inner) : rank_(rank), inner_(inner) {}
  ~FailurePrinter() override { delete inner_; }
  FailurePrinter(const FailurePrinter&) = delete;
  FailurePrinter& operator=(const FailurePrinter&) = delete;

  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
  testing::TestEventListener* inner_;
};

// Collective after every test: rank 0 reports a test that failed only on other ranks.
class FailureCounter : public testing::EmptyTestEventListener {
 public:
  explicit FailureCounter(int rank) : rank_(rank) {}
  void OnTestEnd(const testing::TestInfo& info) override {
    const int mine = info.result()->Failed() ? 1 : 0;
    int failed = 0;
    MPI_Allreduce(&mine, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank_ == 0 && failed > mine)
      std::printf("[  FAILED  ] %s.%s on %d other rank(s)\n", info.test_suite_name(), info.name(),
                  failed - mine);
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    testing::InitGoogleTest(&argc, argv);
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    if (rank != 0) {
      auto* inner = listeners.Release(listeners.default_result_printer());
      listeners.Append(new FailurePrinter(rank, inner));
    } else {
      std::printf("kshard MPI tests on %d rank(s), backend %s; replay with KSHARD_TEST_SEED=%llu\n",
                  size, KSHARD_TEST_BACKEND_NAME,
                  static_cast<unsigned long long>(kshard::test::base_seed()));
    }
    listeners.Append(new FailureCounter(rank));
    const int mine = RUN_ALL_TESTS();
    MPI_Allreduce(&mine, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && status != 0 && mine == 0)
      std::printf("kshard: tests failed on another rank (see its [rank N] lines)\n");
  }
  MPI_Finalize();
  return status;
}
