// The data collectives of the algorithms go through comm::Backend, here the test-only counting
// backend chosen at configure time: as many backend calls as the collectives the algorithms
// report in comm_stats(), and the same results as with MPI directly.

#include <gtest/gtest.h>

#include "counting_backend.hpp"
#include "kshard/comm/stats.hpp"
#include "kshard/distribute.hpp"
#include "kshard/redistribute.hpp"
#include "kshard/rowwise.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::test::all_ranks;
using kshard::test::ExecSpace;
using kshard::test::MemSpace;
using kshard::test::reference_matrix;

static_assert(std::is_same_v<kshard::comm::Backend, kshard::comm::CountingBackend>);

// The concept names what a backend lacks: a backend without reduce_scatter is not one.
struct MissingReduceScatter {
  using Handle = MPI_Comm;
  static Handle make_handle(MPI_Comm comm) { return comm; }
  template <class... Args>
  static void allreduce(Args&&...) {}
  template <class... Args>
  static void bcast(Args&&...) {}
  template <class... Args>
  static void allgatherv(Args&&...) {}
  template <class... Args>
  static void alltoallv(Args&&...) {}
};
static_assert(kshard::comm::CommBackend<kshard::comm::CountingBackend>);
static_assert(kshard::comm::CommBackend<kshard::comm::MpiBackend>);
static_assert(!kshard::comm::CommBackend<MissingReduceScatter>);

TEST(BackendSeam, RowNormsAndRedistributeUseTheConfiguredBackend) {
  const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {kshard::test::world_size()});
  const auto full = reference_matrix<double>(10, 9, 81);
  auto matrix = kshard::distribute<ExecSpace, MemSpace>(mesh, Layout<kshard::Shard<1>>(),
                                                        kshard::HostMatrix<const double>(full));
  kshard::reset_comm_stats();
  kshard::comm::CountingBackend::calls() = 0;
  const auto norms =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::row_squared_norms(matrix));
  auto replicated = kshard::redistribute(matrix, Layout<kshard::Replicate>());
  const auto data_collectives = kshard::comm_stats().collectives;
  bool ok = kshard::comm::CountingBackend::calls() == data_collectives;
  // Over several ranks both algorithms communicate.
  if (mesh.size() > 1) ok = ok && data_collectives >= 2;
  const auto whole = kshard::gather(replicated);
  for (index_t r = 0; r < 10; ++r) {
    double expected = 0;
    for (index_t c = 0; c < 9; ++c) {
      expected += full(r, c) * full(r, c);
      ok = ok && whole(r, c) == full(r, c);
    }
    ok = ok && std::abs(norms(r) - expected) <= 1e-12 * expected;
  }
  EXPECT_TRUE(all_ranks(ok)) << kshard::comm::CountingBackend::calls() << " backend calls, "
                             << data_collectives << " collectives";
}

}  // namespace
