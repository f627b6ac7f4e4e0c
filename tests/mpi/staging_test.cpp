// The two ways kshard hands memory to MPI give the same bits: directly (host memory, or device
// memory with a GPU-aware MPI) and through host buffers, which a host build can only reach
// with staging forced (detail::force_host_staging). Every collective that takes a view is
// covered: all-gather(v) into the result and through a buffer, all-to-all(v), all-reduce,
// reduce-scatter, and the all-reduces of row norms and of the vocabulary-parallel lookup.

#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kshard/comm/staging.hpp"
#include "kshard/comm/stats.hpp"
#include "kshard/distribute.hpp"
#include "kshard/redistribute.hpp"
#include "kshard/rowwise.hpp"
#include "kshard/tensor_parallel.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::Partial;
using kshard::ReduceOp;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using kshard::test::all_ranks;
using kshard::test::ExecSpace;
using kshard::test::ForcedStaging;
using kshard::test::MemSpace;
using kshard::test::reference_matrix;
using kshard::test::world_size;

constexpr bool host_memory = Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;

template <class V>
std::vector<unsigned char> bytes_of(const V& view) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  std::vector<unsigned char> bytes(host.span() * sizeof(typename V::value_type));
  if (!bytes.empty()) std::memcpy(bytes.data(), host.data(), bytes.size());
  return bytes;
}

// Runs `produce` (returning a view) directly and then staged; expects the same bytes, the
// same payload sent, and staged bytes exactly where staging applies: none directly on host
// memory or with a GPU-aware MPI, some when staged, on every rank that sends or receives
// anything (`input_size` elements in, the result out; a rank whose shards are both empty at
// high rank counts hands MPI nothing to stage).
template <class Produce>
void check_both_ways(const char* what, std::size_t input_size, Produce&& produce) {
  SCOPED_TRACE(what);
  kshard::reset_comm_stats();
  const auto direct = bytes_of(produce());
  const kshard::CommStats direct_stats = kshard::comm_stats();
  std::vector<unsigned char> staged;
  kshard::CommStats staged_stats;
  {
    const ForcedStaging force;
    kshard::reset_comm_stats();
    staged = bytes_of(produce());
    staged_stats = kshard::comm_stats();
  }
  EXPECT_TRUE(all_ranks(direct == staged)) << "staged result differs";
  EXPECT_TRUE(all_ranks(direct_stats.bytes_sent == staged_stats.bytes_sent));
  const bool direct_path = host_memory || kshard::detail::gpu_aware_mpi();
  EXPECT_TRUE(all_ranks(!direct_path || direct_stats.bytes_staged == 0))
      << direct_stats.bytes_staged << " bytes staged on the direct path";
  // Every case here hands a view to MPI once there are two ranks, unless this rank has none.
  const bool moves_data = input_size > 0 || !direct.empty();
  EXPECT_TRUE(all_ranks(world_size() == 1 || !moves_data || staged_stats.bytes_staged > 0))
      << "staging was forced but nothing was staged";
}

TEST(Staging, RedistributeSameBitsBothWays) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const auto full = reference_matrix<double>(13, 6, 600);
  const auto rows = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Shard<0>{}),
                                                            kshard::HostMatrix<const double>(full));
  const auto strided = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(StridedShard<0>{2}), kshard::HostMatrix<const double>(full));
  // Addends of a Partial<sum>: the values on rank 0, zeros elsewhere.
  const auto addends =
      kshard::redistribute(kshard::distribute<ExecSpace, MemSpace>(
                               line, Layout(Replicate{}), kshard::HostMatrix<const double>(full)),
                           Layout(Partial<ReduceOp::sum>{}));
  check_both_ways("all-gather into the result", rows.local().size(),
                  [&] { return kshard::redistribute(rows, Layout(Replicate{})).local(); });
  check_both_ways("all-gather through a buffer", strided.local().size(),
                  [&] { return kshard::redistribute(strided, Layout(Replicate{})).local(); });
  check_both_ways("all-to-all", rows.local().size(),
                  [&] { return kshard::redistribute(rows, Layout(Shard<1>{})).local(); });
  check_both_ways("all-reduce", addends.local().size(),
                  [&] { return kshard::redistribute(addends, Layout(Replicate{})).local(); });
  check_both_ways("reduce-scatter", addends.local().size(),
                  [&] { return kshard::redistribute(addends, Layout(Shard<0>{})).local(); });
}

TEST(Staging, RowNormsAndLookupSameBitsBothWays) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size}, {"tp"});
  const auto full = reference_matrix<float>(11, 7, 601);
  const auto by_cols = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<1>{}), kshard::HostMatrix<const float>(full));
  check_both_ways("row norms over split columns", by_cols.local().size(),
                  [&] { return kshard::row_squared_norms(by_cols); });
  const auto table = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Shard<0>{}),
                                                             kshard::HostMatrix<const float>(full));
  Kokkos::View<std::int32_t*, MemSpace> ids("ids", 5);
  auto host_ids = Kokkos::create_mirror_view(ids);
  const std::int32_t chosen[] = {10, 0, 3, 3, 7};
  for (std::size_t i = 0; i < 5; ++i) host_ids(i) = chosen[i];
  Kokkos::deep_copy(ids, host_ids);
  check_both_ways("vocabulary-parallel lookup", table.local().size(),
                  [&] { return kshard::vocab_parallel_lookup(table, ids, kshard::TpDim{0}); });
}

TEST(Staging, GpuAwareDefaultAndOverride) {
  const char* env = std::getenv("KSHARD_GPU_AWARE_MPI");
  if (env != nullptr && *env != '\0') {
    EXPECT_EQ(kshard::detail::gpu_aware_mpi(), std::string(env) != "0");
  } else if (KSHARD_GPU_AWARE_MPI_DEFAULT == 0) {
    EXPECT_FALSE(kshard::detail::gpu_aware_mpi());
  }
}

}  // namespace
