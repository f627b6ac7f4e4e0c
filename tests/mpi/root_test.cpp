// distribute from one root rank (a scatterv) and gather to one (a gatherv): the shards and the
// gathered matrix against a serial reference for 1-D and 2-D layouts (Partial too, for
// distribute), uneven and empty shards and both ends of the rank range as root; the exact bytes
// every rank sends, from shard sizes exchanged here; and bad or differing roots, layouts and
// element types refused alike on every rank.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kshard/comm/stats.hpp"
#include "kshard/distribute.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::HostMatrix;
using kshard::index_t;
using kshard::Layout;
using kshard::Partial;
using kshard::PlacementKind;
using kshard::Replicate;
using kshard::Root;
using kshard::Shard;
using kshard::StridedShard;
using kshard::test::all_ranks;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::expect_collective_refusal;
using kshard::test::Matrix;
using kshard::test::MemSpace;
using kshard::test::reference_matrix;
using kshard::test::same_bits;
using kshard::test::watch;
using kshard::test::world_size;

// Uneven, fewer rows than ranks (3 x 5 on 4 ranks leaves a shard empty), and nothing at all.
constexpr std::array<std::pair<index_t, index_t>, 4> shapes{{{3, 5}, {13, 7}, {0, 4}, {6, 1}}};

// Rank 0 and the last rank (once on one rank).
std::vector<int> roots() {
  if (world_size() == 1) return {0};
  return {0, world_size() - 1};
}

// Every rank's number of local elements, in rank order, exchanged through MPI itself.
template <class M>
std::vector<std::int64_t> shard_sizes(const M& matrix) {
  const auto mine = static_cast<std::int64_t>(matrix.local().size());
  std::vector<std::int64_t> all(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&mine, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

// The documented rules, restated from the placements: a Partial sum is held by coordinate 0
// alone; a replicated block is sent by coordinate 0 of the Replicate dimensions alone.
template <class L, std::size_t M>
bool zero_addend(const std::array<int, M>& coords) {
  for (std::size_t m = 0; m < M; ++m)
    if (L::kinds[m] == PlacementKind::partial && L::partial_op(m) == kshard::ReduceOp::sum &&
        coords[m] != 0)
      return true;
  return false;
}

template <class L, std::size_t M>
bool replica(const std::array<int, M>& coords) {
  for (std::size_t m = 0; m < M; ++m)
    if (L::kinds[m] == PlacementKind::replicate && coords[m] != 0) return true;
  return false;
}

// distribute from `root`: each shard is the reference at its global indices (zeros on the zero
// addends); the root sends the 16-byte shape and every other rank's shard that holds values.
template <class T, class L, std::size_t M>
void check_distribute(const kshard::Mesh<M>& mesh, const L& layout, index_t rows, index_t cols,
                      int root, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "layout #" << seed << " mesh " << ::testing::PrintToString(mesh.shape()) << " "
               << rows << " x " << cols << " root " << root);
  const auto full = reference_matrix<T>(rows, cols, seed);
  const auto given = mesh.my_rank() == root ? HostMatrix<const T>(full) : HostMatrix<const T>();
  kshard::reset_comm_stats();
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(mesh, layout, given, Root{root});
  const kshard::CommStats stats = kshard::comm_stats();

  const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
  const auto& map = matrix.mapping();
  const bool zero = zero_addend<L>(mesh.coords());
  bool ok = matrix.rows() == rows && matrix.cols() == cols &&
            static_cast<index_t>(local.extent(0)) == map.rows.local_extent() &&
            static_cast<index_t>(local.extent(1)) == map.cols.local_extent();
  for (index_t i = 0; ok && i < map.rows.local_extent(); ++i)
    for (index_t j = 0; j < map.cols.local_extent(); ++j)
      ok = ok && local(i, j) == (zero ? T{} : full(map.rows.to_global(i), map.cols.to_global(j)));
  EXPECT_TRUE(all_ranks(ok));

  const auto sizes = shard_sizes(matrix);
  std::int64_t expected = 0;
  if (mesh.my_rank() == root) {
    expected = 2 * static_cast<std::int64_t>(sizeof(index_t));
    for (int r = 0; r < mesh.size(); ++r)
      if (r != root && !zero_addend<L>(mesh.coords_of(r)))
        expected += sizes[static_cast<std::size_t>(r)] * static_cast<std::int64_t>(sizeof(T));
  }
  EXPECT_TRUE(all_ranks(stats.bytes_sent == expected && stats.collectives == 2))
      << "sent " << stats.bytes_sent << " bytes in " << stats.collectives
      << " collectives, expected " << expected << " in 2";
}

// gather to `root`: the reference on the root, 0 x 0 elsewhere; every rank but the root sends
// its shard unless it is a replica.
template <class T, class L, std::size_t M>
void check_gather(const kshard::Mesh<M>& mesh, const L& layout, index_t rows, index_t cols,
                  int root, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "layout #" << seed << " mesh " << ::testing::PrintToString(mesh.shape()) << " "
               << rows << " x " << cols << " root " << root);
  const auto full = reference_matrix<T>(rows, cols, seed);
  const auto matrix =
      kshard::distribute<ExecSpace, MemSpace>(mesh, layout, HostMatrix<const T>(full));
  const auto sizes = shard_sizes(matrix);
  kshard::reset_comm_stats();
  const HostMatrix<T> got = kshard::gather(matrix, Root{root});
  const kshard::CommStats stats = kshard::comm_stats();

  const bool is_root = mesh.my_rank() == root;
  const bool ok = is_root ? same_bits(got, full) : got.extent(0) == 0 && got.extent(1) == 0;
  EXPECT_TRUE(all_ranks(ok));

  const bool sends = !is_root && !replica<L>(mesh.coords());
  const std::int64_t expected =
      sends ? sizes[static_cast<std::size_t>(mesh.my_rank())] * static_cast<std::int64_t>(sizeof(T))
            : 0;
  EXPECT_TRUE(all_ranks(stats.bytes_sent == expected && stats.collectives == 1))
      << "sent " << stats.bytes_sent << " bytes in " << stats.collectives
      << " collectives, expected " << expected << " in 1";
}

// Calls `check(mesh, layout, seed)` for the 1-D layouts on a mesh of every rank.
template <class Check>
void for_each_1d_layout(Check&& check) {
  const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  check(mesh, Layout(Shard<0>{}), 1);
  check(mesh, Layout(Shard<1>{}), 2);
  check(mesh, Layout(Replicate{}), 3);
  check(mesh, Layout(StridedShard<0>{2}), 4);
  check(mesh, Layout(StridedShard<1>{3}), 5);
}

// Calls `check(mesh, layout, seed)` for the 2-D layouts on every 2-D mesh of the world.
template <class Check>
void for_each_2d_layout(Check&& check) {
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) {
    const kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    check(mesh, Layout(Shard<0>{}, Shard<1>{}), 11);
    check(mesh, Layout(Replicate{}, Shard<0>{}), 12);
    check(mesh, Layout(StridedShard<0>{2}, Shard<0>{}), 13);
    check(mesh, Layout(Shard<1>{}, Replicate{}), 14);
  }
}

enum class Tested { distribute, gather };

// Every shape and root for one mesh and layout, elements of `T`.
template <Tested tested, class T>
struct EveryCase {
  template <class L, std::size_t M>
  void operator()(const kshard::Mesh<M>& mesh, const L& layout, std::uint64_t seed) const {
    for (const auto& [rows, cols] : shapes)
      for (const int root : roots()) {
        if constexpr (tested == Tested::distribute)
          check_distribute<T>(mesh, layout, rows, cols, root, seed);
        else
          check_gather<T>(mesh, layout, rows, cols, root, seed);
      }
  }
};

TEST(Root, DistributeMatchesTheReference) {
  for_each_1d_layout(EveryCase<Tested::distribute, double>{});
  for_each_1d_layout(EveryCase<Tested::distribute, float>{});
  for_each_2d_layout(EveryCase<Tested::distribute, double>{});
}

// Sum: the value on coordinate 0 and zeros elsewhere, sent to coordinate 0 only; max, min, avg:
// the value everywhere.
TEST(Root, DistributePartialGivesValidAddends) {
  const EveryCase<Tested::distribute, double> check;
  const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  check(mesh, Layout(Partial<>{}), 21);
  check(mesh, Layout(Partial<kshard::ReduceOp::max>{}), 22);
  check(mesh, Layout(Partial<kshard::ReduceOp::avg>{}), 23);
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) {
    const kshard::Mesh<2> mesh2(MPI_COMM_WORLD, shape, {"dp", "tp"});
    check(mesh2, Layout(Partial<>{}, Shard<1>{}), 24);
    check(mesh2, Layout(Shard<0>{}, Partial<>{}), 25);
  }
}

// distribute without a root where the ranks pass other values (one element on the last rank,
// or a rank-dependent seed): the matrix is rank 0's, scattered by it (DTensor's default
// src_data_rank), never replicas that disagree; with the same values, no data moves.
struct DistributeOfDifferingValues {
  template <class L, std::size_t M>
  void operator()(const kshard::Mesh<M>& mesh, const L& layout, std::uint64_t seed) const {
    for (const auto& [rows, cols] : shapes)
      for (const int how : {0, 1, 2}) {  // the same values, one element changed, another seed
        SCOPED_TRACE(::testing::Message()
                     << "layout #" << seed << " mesh " << ::testing::PrintToString(mesh.shape())
                     << " " << rows << " x " << cols << " case " << how);
        const int rank = mesh.my_rank();
        const auto rank0 = reference_matrix<double>(rows, cols, seed);
        auto mine = how == 2 ? reference_matrix<double>(rows, cols, seed + rank) : rank0;
        if (how == 1 && rank == mesh.size() - 1 && rank > 0 && rows * cols > 0) {
          mine = reference_matrix<double>(rows, cols, seed);
          mine(rows - 1, cols - 1) = -mine(rows - 1, cols - 1);
        }
        kshard::reset_comm_stats();
        const auto matrix =
            kshard::distribute<ExecSpace, MemSpace>(mesh, layout, HostMatrix<const double>(mine));
        const kshard::CommStats stats = kshard::comm_stats();
        const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
        const auto& map = matrix.mapping();
        const bool zero = zero_addend<L>(mesh.coords());
        bool ok = true;
        for (index_t i = 0; ok && i < map.rows.local_extent(); ++i)
          for (index_t j = 0; j < map.cols.local_extent(); ++j)
            ok = ok &&
                 local(i, j) == (zero ? 0.0 : rank0(map.rows.to_global(i), map.cols.to_global(j)));
        EXPECT_TRUE(all_ranks(ok));
        // Rank 0's values differ from the last rank's only where one was changed on it.
        const bool differ = mesh.size() > 1 && rows * cols > 0 && how != 0;
        // The constructor's two agreements (arguments, allocation) and the digest's (none on
        // one rank: no other copy to compare with).
        const int agreements = mesh.size() > 1 ? 3 : 2;
        EXPECT_TRUE(
            all_ranks(stats.agreements == agreements && stats.collectives == (differ ? 1 : 0)))
            << stats.agreements << " agreements, " << stats.collectives << " collectives";
      }
  }
};

TEST(Root, DistributeOfDifferingValuesIsRankZerosMatrix) {
  const DistributeOfDifferingValues check;
  for_each_1d_layout(check);
  for_each_2d_layout(check);
  const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  check(mesh, Layout(Partial<>{}), 21);
  check(mesh, Layout(Partial<kshard::ReduceOp::max>{}), 22);
}

TEST(Root, GatherMatchesTheReference) {
  for_each_1d_layout(EveryCase<Tested::gather, double>{});
  for_each_1d_layout(EveryCase<Tested::gather, float>{});
  for_each_2d_layout(EveryCase<Tested::gather, double>{});
}

// distribute(Root) then gather(Root) returns the input on the root, bf16 included.
TEST(Root, RoundTripThroughTheRoot) {
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const Layout layout(StridedShard<0>{2}, Shard<1>{});
  const int root = world_size() - 1;
  const auto full = reference_matrix<kshard::bf16>(9, 4, 31);
  const auto given = mesh.my_rank() == root ? HostMatrix<const kshard::bf16>(full)
                                            : HostMatrix<const kshard::bf16>();
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(mesh, layout, given, Root{root});
  const auto back = kshard::gather(matrix, Root{root});
  const bool ok = mesh.my_rank() != root || same_bits(back, full);
  EXPECT_TRUE(all_ranks(ok));
}

TEST(Root, BadRootsAreCollectiveErrors) {
  const int size = world_size();
  const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  const auto full = reference_matrix<float>(5, 3, 41);
  const HostMatrix<const float> given(full);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(mesh, Layout(Shard<0>{}), given);
  for (const int bad_root : {size, -1}) {
    expect_collective_refusal(
        fmt::format("gather to root {}", bad_root), {"is not a rank of the mesh"},
        [&](bool here) { (void)kshard::gather(matrix, Root{here ? bad_root : 0}); },
        {watch(matrix)});
    expect_collective_refusal(fmt::format("distribute from root {}", bad_root),
                              {"is not a rank of the mesh"}, [&](bool here) {
                                (void)kshard::distribute<ExecSpace, MemSpace>(
                                    mesh, Layout(Shard<0>{}), given, Root{here ? bad_root : 0});
                              });
  }
  const bool one_rank_only = true;
  expect_collective_refusal(
      "gather root",
      {"the root rank differs between ranks: 0 on rank 0, " + std::to_string(size - 1)},
      [&](bool here) { (void)kshard::gather(matrix, Root{here ? size - 1 : 0}); }, {watch(matrix)},
      one_rank_only);
  expect_collective_refusal(
      "distribute root",
      {"the root rank differs between ranks: 0 on rank 0, " + std::to_string(size - 1)},
      [&](bool here) {
        (void)kshard::distribute<ExecSpace, MemSpace>(mesh, Layout(Shard<0>{}), given,
                                                      Root{here ? size - 1 : 0});
      },
      {}, one_rank_only);
}

// The root's shape reaches every rank first, so a layout or element type that differs on one
// rank is found by the same agreement as in distribute.
TEST(Root, DistributeOfDifferentMatricesIsACollectiveError) {
  const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  const auto floats = reference_matrix<float>(5, 3, 51);
  const auto doubles = reference_matrix<double>(5, 3, 51);
  const bool one_rank_only = true;
  expect_collective_refusal(
      "layout", {"the placement of the matrix on mesh dimension 0 differs between ranks"},
      [&](bool here) {
        const HostMatrix<const float> given(floats);
        if (here)
          (void)kshard::distribute<ExecSpace, MemSpace>(mesh, Layout(Shard<1>{}), given, Root{0});
        else
          (void)kshard::distribute<ExecSpace, MemSpace>(mesh, Layout(Shard<0>{}), given, Root{0});
      },
      {}, one_rank_only);
  expect_collective_refusal(
      "element type", {"the element type of the matrix differs between ranks"},
      [&](bool here) {
        if (here)
          (void)kshard::distribute<ExecSpace, MemSpace>(mesh, Layout(Shard<0>{}),
                                                        HostMatrix<const double>(doubles), Root{0});
        else
          (void)kshard::distribute<ExecSpace, MemSpace>(mesh, Layout(Shard<0>{}),
                                                        HostMatrix<const float>(floats), Root{0});
      },
      {}, one_rank_only);
}

// Shards wrapped from unmanaged views that are never read: each fits, the whole does not.
template <class L>
Matrix<float, L> unread(const kshard::Mesh<1>& mesh, const L& layout, index_t rows, index_t cols,
                        float* anywhere) {
  const auto map = kshard::map_layout(layout.actions(), mesh.shape(), mesh.coords(), rows, cols);
  typename Matrix<float, L>::view_type view(anywhere,
                                            static_cast<std::size_t>(map.rows.local_extent()),
                                            static_cast<std::size_t>(map.cols.local_extent()));
  return Matrix<float, L>(mesh, layout, rows, cols, view);
}

TEST(Root, GatherOfTooLargeAMatrixIsACollectiveError) {
  const int size = world_size();
  const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  float anywhere = 0.0f;
  // INT_MAX + 1 elements: the whole fits in bytes but not in one MPI message.
  const auto long_message = unread(mesh, Layout(Shard<0>{}), index_t{INT_MAX} + 1, 1, &anywhere);
  std::string message =
      collective_error([&] { (void)kshard::gather(long_message, Root{size - 1}); });
  EXPECT_NE(message.find("kshard::gather: the number of elements in one MPI message is 2147483648"),
            std::string::npos)
      << message;
  if (size == 1) return;  // one rank's shard is the whole matrix: its bytes were counted
  // 2^61 floats: 2^63 bytes, one past INT64_MAX; each rank holds at most half.
  const auto huge = unread(mesh, Layout(Shard<0>{}), index_t{1} << 61, 1, &anywhere);
  message = collective_error([&] { (void)kshard::gather(huge, Root{0}); });
  EXPECT_NE(
      message.find("needs more than the limit of 9223372036854775807 bytes on the root rank 0"),
      std::string::npos)
      << message;
}

}  // namespace
