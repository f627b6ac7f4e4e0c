// kshard::redistribute on the backend under test: every pair of placements on meshes of rank 1
// and 2 (and several of rank 3), on every mesh shape of the world size, for random shapes
// (0 rows, fewer rows than ranks, uneven). Each result is checked element by element on every
// rank against the source (bit for bit; Partial: the reduced value), and the bytes each rank
// sends against the minimum of the transition, computed here by brute force from the index
// maps. Also: Partial sums against serial sums, mesh changes (checkpoint resharding) that
// round-trip bit for bit, and collective errors.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>

#include "block_cyclic.hpp"
#include "kshard/comm_stats.hpp"
#include "kshard/distribute.hpp"
#include "kshard/redistribute.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::Partial;
using kshard::PlacementKind;
using kshard::ReduceOp;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using kshard::test::all_ranks;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::for_each_placement;
using kshard::test::make_placement;
using kshard::test::MemSpace;
using kshard::test::other_instance;
using kshard::test::reference_matrix;
using kshard::test::world_size;

template <class T, class L>
using Matrix = kshard::DistMatrix<T, L, ExecSpace, MemSpace>;

using Sum = Partial<ReduceOp::sum>;
using Max = Partial<ReduceOp::max>;
using Min = Partial<ReduceOp::min>;
using Avg = Partial<ReduceOp::avg>;

std::int64_t bytes_sent() { return kshard::comm_stats().bytes_sent; }

// True when two placements hold the same indices on a mesh dim of `extent` ranks.
bool same_data(const kshard::MeshDimAction& a, ReduceOp a_op, const kshard::MeshDimAction& b,
               ReduceOp b_op, int extent) {
  if (extent == 1) return true;
  if (a.kind == PlacementKind::partial || b.kind == PlacementKind::partial)
    return a.kind == b.kind && a_op == b_op;
  return a.tensor_dim == b.tensor_dim &&
         (a.tensor_dim < 0 || (a.split_rule == b.split_rule && a.split_factor == b.split_factor));
}

// The bytes this rank must send for a transition that changes one mesh dim m, when every other
// mesh dim of extent > 1 is Replicate in both layouts (so m's groups hold all they need), or
// -1 when the layouts are not of that form. Brute force from the index maps: Shard ->
// Replicate all-gathers the local shard; a split -> another split sends each local element
// once to each other group member whose new shard holds it; Replicate -> anything sends
// nothing; Partial -> Replicate all-reduces the shard; Partial -> split sends every addend but
// those of this rank's own new block.
template <class T, std::size_t N, class L, class LT>
std::int64_t single_dim_bytes(const kshard::Mesh<N>& mesh, const L& source, const LT& target,
                              index_t rows, index_t cols) {
  const auto a = source.actions();
  const auto b = target.actions();
  int changed = -1;
  for (std::size_t m = 0; m < N; ++m) {
    if (same_data(a[m], L::partial_op(m), b[m], LT::partial_op(m), mesh.extent(m))) continue;
    if (changed >= 0) return -1;
    changed = static_cast<int>(m);
  }
  for (std::size_t m = 0; m < N; ++m)
    if (static_cast<int>(m) != changed && mesh.extent(m) > 1 &&
        (a[m].kind != PlacementKind::replicate || b[m].kind != PlacementKind::replicate))
      return -1;
  if (changed < 0) return 0;
  const auto m = static_cast<std::size_t>(changed);
  const auto mine = kshard::map_layout(a, mesh.shape(), mesh.coords(), rows, cols);
  const std::int64_t local = mine.local_size() * static_cast<std::int64_t>(sizeof(T));
  const PlacementKind from = a[m].kind;
  const PlacementKind to = b[m].kind;
  if (from == PlacementKind::replicate) return 0;
  if (from == PlacementKind::partial) {
    if (to == PlacementKind::replicate || to == PlacementKind::partial) return local;
    const auto block = kshard::map_layout(b, mesh.shape(), mesh.coords(), rows, cols);
    return local - block.local_size() * static_cast<std::int64_t>(sizeof(T));
  }
  if (to == PlacementKind::replicate || to == PlacementKind::partial) return local;
  std::int64_t elements = 0;
  for (int k = 0; k < mesh.extent(m); ++k) {
    if (k == mesh.coords()[m]) continue;
    auto coords = mesh.coords();
    coords[m] = k;
    const auto theirs = kshard::map_layout(b, mesh.shape(), coords, rows, cols);
    for (index_t i = 0; i < mine.rows.local_extent(); ++i)
      for (index_t j = 0; j < mine.cols.local_extent(); ++j)
        if (theirs.rows.is_local(mine.rows.to_global(i)) &&
            theirs.cols.is_local(mine.cols.to_global(j)))
          ++elements;
  }
  return elements * static_cast<std::int64_t>(sizeof(T));
}

// True when this rank's shard of `matrix` holds `full` where the layout puts values: for a
// Partial<sum> dim, coordinate 0 holds the value and the others zeros. `tolerance` 0 means
// bit for bit.
template <class T, class L>
bool shard_matches(const Matrix<T, L>& matrix, const kshard::HostMatrix<T>& full,
                   double tolerance) {
  bool zeros = false;
  for (std::size_t m = 0; m < L::rank; ++m)
    if (L::kinds[m] == PlacementKind::partial && L::partial_op(m) == ReduceOp::sum &&
        matrix.mesh().coords()[m] != 0)
      zeros = true;
  const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
  const auto& map = matrix.mapping();
  bool ok = static_cast<index_t>(local.extent(0)) == map.rows.local_extent() &&
            static_cast<index_t>(local.extent(1)) == map.cols.local_extent();
  for (index_t i = 0; ok && i < map.rows.local_extent(); ++i)
    for (index_t j = 0; ok && j < map.cols.local_extent(); ++j) {
      const T want = zeros ? T{} : full(map.rows.to_global(i), map.cols.to_global(j));
      const T got = local(i, j);
      ok = tolerance == 0 ? std::memcmp(&want, &got, sizeof(T)) == 0
                          : std::abs(static_cast<double>(want) - static_cast<double>(got)) <=
                                tolerance * (1 + std::abs(static_cast<double>(want)));
    }
  return ok;
}

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  static_assert(std::is_same_v<typename A::value_type, typename B::value_type>);
  const auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  const auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  return ha.extent(0) == hb.extent(0) && ha.extent(1) == hb.extent(1) &&
         std::memcmp(ha.data(), hb.data(), ha.span() * sizeof(typename A::value_type)) == 0;
}

// redistribute_into a matrix of `moved`'s layout on `target_mesh`, holding garbage: the same
// shard, bit for bit, and the same bytes sent as the redistribute that returned `moved`.
template <class T, class L, std::size_t NT, class LT>
void check_into(const Matrix<T, L>& matrix, const kshard::Mesh<NT>& target_mesh,
                const Matrix<T, LT>& moved, std::int64_t sent) {
  const Matrix<T, LT> into(target_mesh, moved.layout(), moved.rows(), moved.cols());
  Kokkos::deep_copy(into.local(), static_cast<T>(-77));
  kshard::reset_comm_stats();
  kshard::redistribute_into(matrix, into);
  EXPECT_TRUE(all_ranks(bytes_sent() == sent)) << "redistribute_into sent " << bytes_sent();
  EXPECT_TRUE(all_ranks(same_bits(into.local(), moved.local()))) << "redistribute_into";
}

// A plan made once and applied to `matrix` and to matrices of other values (for Partial
// layouts, other addends), into one reused target holding garbage: each result is bit for bit
// what `redistribute` (via `move`) gives and, after the first round (which the caller checks),
// matches its own serial reference within `tolerance`; each apply sends `sent` bytes, on the
// default and on another execution-space instance.
template <class T, class L, class Plan, class Move>
void check_plan(const Matrix<T, L>& matrix, Plan&& plan, Move&& move, std::int64_t sent,
                std::uint64_t seed, double tolerance) {
  auto target = plan.make_target();
  Kokkos::deep_copy(target.local(), static_cast<T>(-77));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "plan apply #" << round);
    const auto full = reference_matrix<T>(matrix.rows(), matrix.cols(),
                                          seed * 7919 + static_cast<std::uint64_t>(round));
    const auto source =
        round == 0 ? matrix
                   : kshard::distribute<ExecSpace, MemSpace>(matrix.mesh(), matrix.layout(),
                                                             kshard::HostMatrix<const T>(full));
    const auto expected = move(source);
    kshard::reset_comm_stats();
    if (round == 1) {
      const ExecSpace instance = other_instance();
      plan.apply(instance, source, target);
      instance.fence();
    } else {
      plan.apply(source, target);
    }
    EXPECT_TRUE(all_ranks(bytes_sent() == sent)) << "apply sent " << bytes_sent();
    EXPECT_TRUE(all_ranks(same_bits(target.local(), expected.local()))) << "plan.apply";
    if (round > 0) {
      EXPECT_TRUE(all_ranks(shard_matches(target, full, tolerance))) << "against the reference";
    }
  }
}

// distribute(source) -> redistribute(target): checks the result on every rank, its gather
// (layouts without Partial), and the bytes sent (exactly the single-dim minimum where it
// applies; otherwise at most one whole matrix per mesh dimension).
template <class T, std::size_t N, class L, class LT>
void check_transition(const kshard::Mesh<N>& mesh, const L& source, const LT& target, index_t rows,
                      index_t cols, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "case #" << seed << " mesh " << ::testing::PrintToString(mesh.shape()) << " "
               << rows << " x " << cols << " " << fmt::format("{}", seed));
  const auto full = reference_matrix<T>(rows, cols, seed);
  const auto matrix =
      kshard::distribute<ExecSpace, MemSpace>(mesh, source, kshard::HostMatrix<const T>(full));
  kshard::reset_comm_stats();
  const auto moved = kshard::redistribute(matrix, target);
  const std::int64_t sent = bytes_sent();
  check_into(matrix, mesh, moved, sent);
  bool averaged = false;  // (k x) / k need not be x exactly
  for (std::size_t m = 0; m < N; ++m)
    averaged = averaged ||
               (L::kinds[m] == PlacementKind::partial && L::partial_op(m) == ReduceOp::avg &&
                mesh.extent(m) > 1 &&
                !(LT::kinds[m] == PlacementKind::partial && LT::partial_op(m) == ReduceOp::avg));
  check_plan(
      matrix, kshard::plan_redistribute(matrix, target),
      [&](const auto& m) { return kshard::redistribute(m, target); }, sent, seed,
      averaged ? 1e-6 : 0.0);
  EXPECT_TRUE(all_ranks(shard_matches(moved, full, averaged ? 1e-6 : 0.0)));
  if constexpr (!LT::has_partial) {
    if (!averaged) {
      const auto gathered = kshard::gather(moved);
      EXPECT_TRUE(
          all_ranks(std::memcmp(gathered.data(), full.data(), full.span() * sizeof(T)) == 0));
    }
  }
  const std::int64_t expected = single_dim_bytes<T>(mesh, source, target, rows, cols);
  if (expected >= 0) {
    EXPECT_TRUE(all_ranks(sent == expected)) << "sent " << sent << " expected " << expected;
  } else {
    const auto whole = static_cast<std::int64_t>(rows * cols * static_cast<index_t>(sizeof(T)));
    EXPECT_TRUE(all_ranks(sent <= whole * static_cast<std::int64_t>(N))) << "sent " << sent;
  }
}

// A random shape, different per case: 0 rows, fewer than the ranks, or uneven.
std::pair<index_t, index_t> random_shape(std::uint64_t seed) {
  auto rng = kshard::test::shared_rng(seed);
  auto pick = [&](index_t hi) { return std::uniform_int_distribution<index_t>(0, hi)(rng); };
  switch (seed % 3) {
    case 0:
      return {pick(1) == 0 ? 0 : pick(3), pick(4)};
    case 1:
      return {pick(3), 1 + pick(3)};
    default:
      return {5 + pick(20), 1 + pick(9)};
  }
}

// The five Replicate / Shard / StridedShard placements and the four Partial ones.
template <class F>
void for_each_placement_or_partial(F&& f) {
  for_each_placement(f);
  f(Sum{});
  f(Max{});
  f(Min{});
  f(Avg{});
}

TEST(Redistribute, EveryPairOnMeshRank1) {
  std::uint64_t seed = 1000;
  for (const auto& shape : kshard::test::mesh_shapes<1>(world_size())) {
    kshard::Mesh<1> mesh(MPI_COMM_WORLD, shape);
    for_each_placement_or_partial([&](auto p) {
      for_each_placement_or_partial([&](auto q) {
        for (int repeat = 0; repeat < 3; ++repeat) {
          auto rng = kshard::test::shared_rng(seed);
          const Layout source(make_placement<decltype(p)>(rng));
          const Layout target(make_placement<decltype(q)>(rng));
          const auto [rows, cols] = random_shape(seed);
          check_transition<double>(mesh, source, target, rows, cols, seed++);
        }
      });
    });
  }
}

// Every source layout of two placements, to the layout with the placements swapped (so each
// mesh dim sees every transition between the five placements) and to a few fixed layouts.
TEST(Redistribute, EveryPlacementPairOnMeshRank2) {
  std::uint64_t seed = 2000;
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    for_each_placement([&](auto p0) {
      for_each_placement([&](auto p1) {
        auto rng = kshard::test::shared_rng(seed);
        const Layout source(make_placement<decltype(p0)>(rng), make_placement<decltype(p1)>(rng));
        const Layout swapped(make_placement<decltype(p1)>(rng), make_placement<decltype(p0)>(rng));
        const Layout fsdp(StridedShard<0>{make_placement<StridedShard<0>>(rng).factor}, Shard<0>{});
        for (int repeat = 0; repeat < 2; ++repeat) {
          auto [rows, cols] = random_shape(seed);
          check_transition<float>(mesh, source, swapped, rows, cols, seed++);
          check_transition<float>(mesh, source, Layout(Replicate{}, Replicate{}), rows, cols,
                                  seed++);
          check_transition<float>(mesh, source, Layout(Shard<1>{}, Shard<0>{}), rows, cols, seed++);
          check_transition<float>(mesh, source, fsdp, rows, cols, seed++);
        }
      });
    });
  }
}

// The test-only block-cyclic placement (tests/support/block_cyclic.hpp) to and from every
// placement, on meshes of rank 1 and 2: kshard maps, plans and moves it through its split
// rule alone, with the same checks (values, gather, plan, bytes sent) as the built-in ones.
TEST(Redistribute, CustomPlacementToAndFromEveryPlacement) {
  using kshard::test::BlockCyclic;
  std::uint64_t seed = 9000;
  auto block = [](std::uint64_t salt) {
    auto rng = kshard::test::shared_rng(salt);
    return std::uniform_int_distribution<index_t>(1, 4)(rng);
  };
  for (const auto& shape : kshard::test::mesh_shapes<1>(world_size())) {
    kshard::Mesh<1> mesh(MPI_COMM_WORLD, shape);
    for_each_placement_or_partial([&](auto p) {
      for (int repeat = 0; repeat < 2; ++repeat) {
        auto rng = kshard::test::shared_rng(seed);
        const Layout other(make_placement<decltype(p)>(rng));
        const auto [rows, cols] = random_shape(seed);
        const Layout by_rows(BlockCyclic<0>{block(seed)});
        const Layout by_cols(BlockCyclic<1>{block(seed + 1)});
        check_transition<double>(mesh, by_rows, other, rows, cols, seed++);
        check_transition<double>(mesh, other, by_rows, rows, cols, seed++);
        check_transition<double>(mesh, other, by_cols, rows, cols, seed++);
      }
    });
  }
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    for (int repeat = 0; repeat < 3; ++repeat) {
      auto rng = kshard::test::shared_rng(seed);
      const Layout dealt(BlockCyclic<0>{block(seed)}, Shard<1>{});
      const Layout twice(BlockCyclic<1>{block(seed + 1)}, BlockCyclic<0>{block(seed + 2)});
      const Layout fsdp(make_placement<StridedShard<0>>(rng), Shard<0>{});
      const auto [rows, cols] = random_shape(seed);
      check_transition<float>(mesh, dealt, fsdp, rows, cols, seed++);
      check_transition<float>(mesh, fsdp, dealt, rows, cols, seed++);
      check_transition<float>(mesh, dealt, twice, rows, cols, seed++);
      check_transition<float>(mesh, twice, Layout(Replicate{}, Replicate{}), rows, cols, seed++);
      check_transition<float>(mesh, Layout(Sum{}, Shard<0>{}), dealt, rows, cols, seed++);
    }
  }
}

TEST(Redistribute, PartialLayoutsOnMeshRank2) {
  std::uint64_t seed = 3000;
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    for (int repeat = 0; repeat < 3; ++repeat) {
      const auto [rows, cols] = random_shape(seed);
      check_transition<double>(mesh, Layout(Sum{}, Shard<1>{}), Layout(Shard<0>{}, Shard<1>{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Sum{}, Shard<0>{}), Layout(Shard<0>{}, Shard<0>{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Shard<0>{}, Max{}), Layout(Replicate{}, Shard<1>{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Sum{}, Avg{}), Layout(StridedShard<0>{2}, Shard<0>{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Sum{}, Shard<1>{}), Layout(Sum{}, Shard<0>{}), rows,
                               cols, seed++);
      check_transition<double>(mesh, Layout(Shard<1>{}, StridedShard<0>{2}), Layout(Min{}, Sum{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Max{}, Replicate{}), Layout(Min{}, Shard<0>{}), rows,
                               cols, seed++);
    }
  }
}

TEST(Redistribute, SeveralLayoutsOnMeshRank3) {
  std::uint64_t seed = 4000;
  for (const auto& shape : kshard::test::mesh_shapes<3>(world_size())) {
    kshard::Mesh<3> mesh(MPI_COMM_WORLD, shape, {"pp", "dp", "tp"});
    for (int repeat = 0; repeat < 2; ++repeat) {
      const auto [rows, cols] = random_shape(seed);
      check_transition<double>(mesh, Layout(Shard<0>{}, StridedShard<0>{2}, Replicate{}),
                               Layout(Replicate{}, Shard<1>{}, Shard<0>{}), rows, cols, seed++);
      check_transition<double>(mesh, Layout(StridedShard<0>{3}, Shard<1>{}, Shard<0>{}),
                               Layout(Shard<0>{}, Shard<0>{}, StridedShard<1>{2}), rows, cols,
                               seed++);
      check_transition<float>(mesh, Layout(Replicate{}, StridedShard<1>{2}, StridedShard<0>{2}),
                              Layout(Shard<1>{}, Replicate{}, Replicate{}), rows, cols, seed++);
      check_transition<float>(mesh, Layout(Sum{}, Shard<0>{}, Avg{}),
                              Layout(Shard<1>{}, Shard<0>{}, StridedShard<0>{3}), rows, cols,
                              seed++);
      check_transition<double>(mesh, Layout(Shard<1>{}, Shard<0>{}, Sum{}),
                               Layout(Shard<1>{}, Replicate{}, Shard<0>{}), rows, cols, seed++);
      check_transition<double>(mesh, Layout(Replicate{}, Replicate{}, Replicate{}),
                               Layout(Shard<0>{}, StridedShard<0>{2}, Shard<1>{}), rows, cols,
                               seed++);
    }
  }
}

// The transitions the issue names, with their exact costs.
TEST(Redistribute, NamedTransitionsSendTheirMinimum) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const index_t rows = 13;
  const index_t cols = 6;
  const auto full = reference_matrix<double>(rows, cols, 11);
  const kshard::HostMatrix<const double> source(full);
  const auto per_rank = [&](index_t r, index_t c) {
    return static_cast<std::int64_t>(r * c * static_cast<index_t>(sizeof(double)));
  };
  const index_t my_rows = kshard::chunk_extent(rows, size, line.my_rank());
  const index_t my_cols = kshard::chunk_extent(cols, size, line.my_rank());
  // Replicate -> Shard: a local slice.
  auto replicated = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Replicate{}), source);
  kshard::reset_comm_stats();
  auto sharded = kshard::redistribute(replicated, Layout(Shard<0>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
  EXPECT_TRUE(all_ranks(shard_matches(sharded, full, 0)));
  // Shard -> Replicate: all-gather of the local rows.
  kshard::reset_comm_stats();
  auto back = kshard::redistribute(sharded, Layout(Replicate{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == (size > 1 ? per_rank(my_rows, cols) : 0)));
  EXPECT_TRUE(all_ranks(shard_matches(back, full, 0)));
  // Shard<0> -> Shard<1>: all-to-all; this rank keeps its own block.
  kshard::reset_comm_stats();
  auto by_cols = kshard::redistribute(sharded, Layout(Shard<1>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == per_rank(my_rows, cols - my_cols)));
  EXPECT_TRUE(all_ranks(shard_matches(by_cols, full, 0)));
  // Partial -> Replicate: all-reduce; Partial -> Shard: reduce-scatter.
  auto partial = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Sum{}), source);
  kshard::reset_comm_stats();
  auto reduced = kshard::redistribute(partial, Layout(Replicate{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == (size > 1 ? per_rank(rows, cols) : 0)));
  EXPECT_TRUE(all_ranks(shard_matches(reduced, full, 0)));
  kshard::reset_comm_stats();
  auto scattered = kshard::redistribute(partial, Layout(Shard<0>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == per_rank(rows - my_rows, cols)));
  EXPECT_TRUE(all_ranks(shard_matches(scattered, full, 0)));
  // Replicate -> Partial: local.
  kshard::reset_comm_stats();
  auto addends = kshard::redistribute(replicated, Layout(Sum{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
  EXPECT_TRUE(all_ranks(shard_matches(addends, full, 0)));
}

// On a host backend a step that moves more than detail::host_inline_elements elements runs a
// kernel, one that moves fewer copies on the calling thread (the tests above are all small):
// every placement pair of a line mesh at 300 x 300, above the limit on every rank count up to 4.
TEST(Redistribute, LargeMovesTakeTheKernel) {
  static_assert(300 * 300 / 16 * 3 > kshard::detail::host_inline_elements);
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  std::uint64_t seed = 9000;
  for_each_placement([&](auto p) {
    for_each_placement([&](auto q) {
      auto rng = kshard::test::shared_rng(seed);
      const Layout source(make_placement<decltype(p)>(rng));
      const Layout target(make_placement<decltype(q)>(rng));
      check_transition<float>(line, source, target, 300, 300, seed++);
    });
  });
}

// FSDP2 x TP: unshard the (StridedShard, Shard) embedding over dp (all-gather of the local
// block) and reshard it (local, nothing sent).
TEST(Redistribute, FsdpUnshardAndReshard) {
  const int size = world_size();
  if (size % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {2, size / 2}, {"dp", "tp"});
  for (index_t rows : {index_t{10}, index_t{8}, index_t{3}, index_t{0}}) {
    const auto full = reference_matrix<float>(rows, 5, static_cast<std::uint64_t>(rows));
    const auto fsdp = kshard::distribute<ExecSpace, MemSpace>(
        mesh, Layout(StridedShard<0>{size / 2}, Shard<0>{}), kshard::HostMatrix<const float>(full));
    kshard::reset_comm_stats();
    const auto unsharded = kshard::redistribute(fsdp, Layout(Replicate{}, Shard<0>{}));
    const auto local = static_cast<std::int64_t>(fsdp.mapping().local_size() *
                                                 static_cast<index_t>(sizeof(float)));
    EXPECT_TRUE(all_ranks(bytes_sent() == local)) << bytes_sent() << " vs " << local;
    EXPECT_TRUE(all_ranks(shard_matches(unsharded, full, 0)));
    kshard::reset_comm_stats();
    const auto resharded = kshard::redistribute(unsharded, fsdp.layout());
    EXPECT_TRUE(all_ranks(bytes_sent() == 0));
    EXPECT_TRUE(all_ranks(shard_matches(resharded, full, 0)));
  }
}

// Genuinely different addends (small integers, so sums are exact in any order) against the
// serial reduction.
template <ReduceOp Op, std::size_t N, class L, class LT>
void check_partial_against_serial(const kshard::Mesh<N>& mesh, const L& source, const LT& target,
                                  index_t rows, index_t cols, std::size_t partial_dim) {
  SCOPED_TRACE(::testing::Message() << "mesh " << ::testing::PrintToString(mesh.shape()) << " "
                                    << rows << " x " << cols << " op " << kshard::to_string(Op));
  auto addend = [](index_t r, index_t c, int p) {
    return static_cast<double>((r * 7 + c * 3 + p * 5) % 11 - 5);
  };
  const int k = mesh.extent(partial_dim);
  kshard::HostMatrix<double> reduced("reduced", static_cast<std::size_t>(rows),
                                     static_cast<std::size_t>(cols));
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) {
      double acc = addend(r, c, 0);
      for (int p = 1; p < k; ++p) {
        const double x = addend(r, c, p);
        acc = Op == ReduceOp::max   ? std::max(acc, x)
              : Op == ReduceOp::min ? std::min(acc, x)
                                    : acc + x;
      }
      reduced(r, c) = Op == ReduceOp::avg ? acc / static_cast<double>(k) : acc;
    }
  const auto map = kshard::map_layout(source.actions(), mesh.shape(), mesh.coords(), rows, cols);
  typename Matrix<double, L>::view_type local("addends",
                                              static_cast<std::size_t>(map.rows.local_extent()),
                                              static_cast<std::size_t>(map.cols.local_extent()));
  auto host = Kokkos::create_mirror_view(local);
  for (index_t i = 0; i < map.rows.local_extent(); ++i)
    for (index_t j = 0; j < map.cols.local_extent(); ++j)
      host(i, j) = addend(map.rows.to_global(i), map.cols.to_global(j), mesh.coords()[partial_dim]);
  Kokkos::deep_copy(local, host);
  const Matrix<double, L> matrix(mesh, source, rows, cols, local);
  kshard::reset_comm_stats();
  const auto moved = kshard::redistribute(matrix, target);
  const std::int64_t expected = single_dim_bytes<double>(mesh, source, target, rows, cols);
  if (expected >= 0) {
    EXPECT_TRUE(all_ranks(bytes_sent() == expected)) << bytes_sent();
  }
  EXPECT_TRUE(all_ranks(shard_matches(moved, reduced, 0)));
}

TEST(Redistribute, PartialMatchesSerialReduction) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  for (index_t rows : {index_t{0}, index_t{3}, index_t{11}}) {
    check_partial_against_serial<ReduceOp::sum>(line, Layout(Sum{}), Layout(Replicate{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::sum>(line, Layout(Sum{}), Layout(Shard<0>{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::sum>(line, Layout(Sum{}), Layout(Shard<1>{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::sum>(line, Layout(Sum{}), Layout(StridedShard<0>{2}),
                                                rows, 7, 0);
    check_partial_against_serial<ReduceOp::max>(line, Layout(Max{}), Layout(Shard<0>{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::min>(line, Layout(Min{}), Layout(Replicate{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::avg>(line, Layout(Avg{}), Layout(StridedShard<1>{3}),
                                                rows, 7, 0);
  }
  for (const auto& shape : kshard::test::mesh_shapes<2>(size)) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    check_partial_against_serial<ReduceOp::sum>(mesh, Layout(Sum{}, Shard<1>{}),
                                                Layout(Shard<0>{}, Shard<1>{}), 9, 5, 0);
    check_partial_against_serial<ReduceOp::sum>(mesh, Layout(Shard<0>{}, Sum{}),
                                                Layout(Shard<0>{}, Shard<0>{}), 9, 5, 1);
    check_partial_against_serial<ReduceOp::avg>(mesh, Layout(Replicate{}, Avg{}),
                                                Layout(StridedShard<0>{2}, Shard<0>{}), 10, 3, 1);
  }
}

// Checkpoint resharding: another mesh shape over the same communicator, and back.
template <class T, std::size_t N, std::size_t NT, class L, class LT>
void check_mesh_change(const kshard::Mesh<N>& mesh, const L& layout,
                       const kshard::Mesh<NT>& target_mesh, const LT& target, index_t rows,
                       index_t cols, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "from " << ::testing::PrintToString(mesh.shape()) << " to "
               << ::testing::PrintToString(target_mesh.shape()) << " " << rows << " x " << cols);
  const auto full = reference_matrix<T>(rows, cols, seed);
  const auto matrix =
      kshard::distribute<ExecSpace, MemSpace>(mesh, layout, kshard::HostMatrix<const T>(full));
  kshard::reset_comm_stats();
  const auto moved = kshard::redistribute(matrix, target_mesh, target);
  const std::int64_t sent = bytes_sent();
  check_into(matrix, target_mesh, moved, sent);
  const auto move = [&](const auto& m) { return kshard::redistribute(m, target_mesh, target); };
  check_plan(matrix, kshard::plan_redistribute(matrix, target_mesh, target), move, sent, seed, 0.0);
  check_plan(matrix, kshard::plan_redistribute(matrix, moved), move, sent, seed + 1, 0.0);
  EXPECT_TRUE(all_ranks(shard_matches(moved, full, 0)));
  if constexpr (!L::has_partial) {
    const auto back = kshard::redistribute(moved, mesh, layout);
    EXPECT_TRUE(all_ranks(shard_matches(back, full, 0)));
    const auto gathered = kshard::gather(back);
    EXPECT_TRUE(all_ranks(std::memcmp(gathered.data(), full.data(), full.span() * sizeof(T)) == 0));
  }
}

TEST(Redistribute, MeshChangeRoundTrips) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  kshard::Mesh<2> wide(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  std::uint64_t seed = 5000;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const auto [rows, cols] = random_shape(seed);
    check_mesh_change<double>(line, Layout(Shard<0>{}), wide, Layout(Shard<1>{}, Shard<0>{}), rows,
                              cols, seed++);
    check_mesh_change<double>(line, Layout(StridedShard<0>{2}), wide,
                              Layout(Replicate{}, StridedShard<1>{3}), rows, cols, seed++);
    check_mesh_change<float>(line, Layout(Sum{}), wide, Layout(Replicate{}, Shard<1>{}), rows, cols,
                             seed++);
    check_mesh_change<float>(line, Layout(Shard<1>{}), wide, Layout(Shard<0>{}, Sum{}), rows, cols,
                             seed++);
    for (const auto& shape : kshard::test::mesh_shapes<2>(size)) {
      kshard::Mesh<2> grid(MPI_COMM_WORLD, shape, {"dp", "tp"});
      check_mesh_change<double>(line, Layout(Shard<0>{}), grid,
                                Layout(StridedShard<0>{2}, Shard<0>{}), rows, cols, seed++);
      check_mesh_change<double>(grid, Layout(Shard<1>{}, StridedShard<0>{2}), line,
                                Layout(Shard<1>{}), rows, cols, seed++);
    }
    for (const auto& shape : kshard::test::mesh_shapes<3>(size)) {
      kshard::Mesh<3> cube(MPI_COMM_WORLD, shape, {"pp", "dp", "tp"});
      check_mesh_change<double>(cube, Layout(Shard<0>{}, Replicate{}, StridedShard<1>{2}), wide,
                                Layout(Shard<0>{}, Shard<1>{}), rows, cols, seed++);
    }
  }
}

// Moving to a mesh whose ranks already hold what they need sends nothing.
TEST(Redistribute, MeshChangeSendsOnlyWhatMoves) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  kshard::Mesh<2> wide(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const auto full = reference_matrix<double>(10, 4, 3);
  const kshard::HostMatrix<const double> source(full);
  const auto rows = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Shard<0>{}), source);
  kshard::reset_comm_stats();
  const auto same = kshard::redistribute(rows, wide, Layout(StridedShard<1>{2}, Shard<0>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
  EXPECT_TRUE(all_ranks(shard_matches(same, full, 0)));
  const auto replicated =
      kshard::distribute<ExecSpace, MemSpace>(line, Layout(Replicate{}), source);
  kshard::reset_comm_stats();
  const auto sliced = kshard::redistribute(replicated, wide, Layout(Shard<1>{}, Shard<1>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
  EXPECT_TRUE(all_ranks(shard_matches(sliced, full, 0)));
  // Rows -> columns: each rank sends its rows except its own column block.
  kshard::reset_comm_stats();
  const auto by_cols = kshard::redistribute(rows, wide, Layout(Replicate{}, Shard<1>{}));
  const index_t my_rows = kshard::chunk_extent(10, size, line.my_rank());
  const index_t my_cols = kshard::chunk_extent(4, size, line.my_rank());
  EXPECT_TRUE(all_ranks(
      bytes_sent() ==
      static_cast<std::int64_t>(my_rows * (4 - my_cols) * static_cast<index_t>(sizeof(double)))));
  EXPECT_TRUE(all_ranks(shard_matches(by_cols, full, 0)));
}

// Calls f with a 1-D mesh over half of the world's ranks: not the world's communicator.
template <class F>
void on_half_mesh(F&& f) {
  const int rank = kshard::test::world_rank();
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < world_size() / 2 ? 0 : 1, rank, &half);
  int half_size = 0;
  MPI_Comm_size(half, &half_size);
  {
    const kshard::Mesh<1> mesh(half, {half_size});
    f(mesh);
  }
  MPI_Comm_free(&half);
}

TEST(Redistribute, BadArgumentsAreCollectiveErrors) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const auto full = reference_matrix<double>(6, 4, 9);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}), kshard::HostMatrix<const double>(full));
  auto message =
      collective_error([&] { (void)kshard::redistribute(matrix, Layout(StridedShard<1>{0})); });
  EXPECT_NE(message.find("split factor 0; it must be >= 1"), std::string::npos) << message;
  message = collective_error([&] {
    (void)kshard::redistribute(matrix, Layout(StridedShard<1>{line.my_rank() == size - 1 ? 3 : 2}));
  });
  if (size > 1) {
    EXPECT_NE(message.find("differs between ranks"), std::string::npos) << message;
  }
  if (size > 1) {
    on_half_mesh([&](const kshard::Mesh<1>& other) {
      message =
          collective_error([&] { (void)kshard::redistribute(matrix, other, Layout(Replicate{})); });
      EXPECT_NE(message.find("different communicator"), std::string::npos) << message;
    });
  }
  // Nothing was sent by a failed call (only the agreement's metadata, which is not counted).
  kshard::reset_comm_stats();
  (void)collective_error([&] { (void)kshard::redistribute(matrix, Layout(StridedShard<0>{-1})); });
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
}

TEST(Redistribute, IntoRefusesWrongTargetsAndWritesNothing) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const auto full = reference_matrix<double>(6, 4, 10);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}), kshard::HostMatrix<const double>(full));
  const auto expect_refused = [&](const auto& target, const std::string& expected) {
    const auto before = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), target.local());
    const auto message = collective_error([&] { kshard::redistribute_into(matrix, target); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_TRUE(all_ranks(same_bits(target.local(), before)));
    EXPECT_TRUE(all_ranks(shard_matches(matrix, full, 0)));
  };
  // A different global shape.
  Matrix<double, Layout<Replicate>> wider(line, Layout(Replicate{}), 6, 5);
  Kokkos::deep_copy(wider.local(), 3.0);
  expect_refused(wider, "the target is 6 x 5 but the matrix is 6 x 4");
  // The matrix's own storage, under another layout where that is possible: at 1 rank, a
  // Replicate matrix wrapping the Shard<0> one's view.
  if (size == 1) {
    const Matrix<double, Layout<Replicate>> alias(line, Layout(Replicate{}), 6, 4, matrix.local());
    expect_refused(alias, "shares memory with the matrix's");
  }
  if (size > 1) {
    on_half_mesh([&](const kshard::Mesh<1>& other) {
      Matrix<double, Layout<Replicate>> elsewhere(other, Layout(Replicate{}), 6, 4);
      Kokkos::deep_copy(elsewhere.local(), 3.0);
      expect_refused(elsewhere, "different communicator");
    });
  }
}

// The forms with an execution-space instance first give what the default-instance forms give.
TEST(Redistribute, InstanceOverloadsMatchTheDefaultInstance) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  kshard::Mesh<2> wide(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const auto full = reference_matrix<double>(11, 7, 21);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}), kshard::HostMatrix<const double>(full));
  const ExecSpace instance = other_instance();
  kshard::reset_comm_stats();
  const auto expected = kshard::redistribute(matrix, Layout(Shard<1>{}));
  const std::int64_t sent = bytes_sent();
  kshard::reset_comm_stats();
  const auto moved = kshard::redistribute(instance, matrix, Layout(Shard<1>{}));
  instance.fence();
  EXPECT_TRUE(all_ranks(bytes_sent() == sent));
  EXPECT_TRUE(all_ranks(same_bits(moved.local(), expected.local())));
  Matrix<double, Layout<Shard<1>>> into(line, Layout(Shard<1>{}), 11, 7);
  kshard::redistribute_into(instance, matrix, into);
  instance.fence();
  EXPECT_TRUE(all_ranks(same_bits(into.local(), expected.local())));
  const auto reshaped =
      kshard::redistribute(instance, matrix, wide, Layout(Shard<1>{}, Shard<0>{}));
  instance.fence();
  EXPECT_TRUE(all_ranks(shard_matches(reshaped, full, 0)));
}

// A plan applied to matrices it was not made for: the same kshard::error on every rank, naming
// what differs, with neither matrix changed; the plan still works afterwards.
TEST(Redistribute, PlanRefusesOtherMatricesAndChangesNothing) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  kshard::Mesh<1> twin(MPI_COMM_WORLD, {size});  // the same shape and ranks, another mesh
  using Source = Layout<StridedShard<0>>;
  using Target = Layout<Shard<1>>;
  const auto full = reference_matrix<double>(9, 6, 31);
  const kshard::HostMatrix<const double> host(full);
  const auto matrix =
      kshard::distribute<ExecSpace, MemSpace>(line, Source(StridedShard<0>{2}), host);
  auto plan = kshard::plan_redistribute(matrix, Target{});
  const auto target = plan.make_target();
  plan.apply(matrix, target);
  const auto expect_refused = [&](const Matrix<double, Source>& source,
                                  const Matrix<double, Target>& into, const std::string& phrase) {
    const auto source_before =
        Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), source.local());
    const auto into_before = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), into.local());
    kshard::reset_comm_stats();
    const auto message = collective_error([&] { plan.apply(source, into); });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
    EXPECT_TRUE(all_ranks(bytes_sent() == 0 && kshard::comm_stats().collectives == 0));
    EXPECT_TRUE(all_ranks(same_bits(source.local(), source_before)));
    EXPECT_TRUE(all_ranks(same_bits(into.local(), into_before)));
  };
  const auto taller_full = reference_matrix<double>(10, 6, 32);
  const auto taller = kshard::distribute<ExecSpace, MemSpace>(
      line, Source(StridedShard<0>{2}), kshard::HostMatrix<const double>(taller_full));
  expect_refused(taller, target, "the matrix is 10 x 6 but the plan was made for 9 x 6");
  const auto strided3 =
      kshard::distribute<ExecSpace, MemSpace>(line, Source(StridedShard<0>{3}), host);
  expect_refused(strided3, target, "the matrix's layout is (StridedShard(0, sf=3))");
  const auto elsewhere =
      kshard::distribute<ExecSpace, MemSpace>(twin, Source(StridedShard<0>{2}), host);
  expect_refused(elsewhere, target, "the matrix is on another mesh");
  Matrix<double, Target> wide_target(line, Target{}, 9, 7);
  expect_refused(matrix, wide_target, "the target is 9 x 7 but the plan was made for 9 x 6");
  Matrix<double, Target> twin_target(twin, Target{}, 9, 6);
  expect_refused(matrix, twin_target, "the target is on another mesh");
  // The plan still works, and gives what redistribute gives.
  Kokkos::deep_copy(target.local(), -1.0);
  plan.apply(matrix, target);
  EXPECT_TRUE(all_ranks(shard_matches(target, full, 0)));
}

// Planning agrees on its arguments as redistribute does: the same errors on every rank.
TEST(Redistribute, PlanningErrorsAreCollective) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const auto full = reference_matrix<double>(6, 4, 9);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}), kshard::HostMatrix<const double>(full));
  auto message = collective_error(
      [&] { (void)kshard::plan_redistribute(matrix, Layout(StridedShard<1>{0})); });
  EXPECT_NE(message.find("split factor 0; it must be >= 1"), std::string::npos) << message;
  Matrix<double, Layout<Replicate>> wider(line, Layout(Replicate{}), 6, 5);
  message = collective_error([&] { (void)kshard::plan_redistribute(matrix, wider); });
  EXPECT_NE(message.find("the target is 6 x 5 but the matrix is 6 x 4"), std::string::npos)
      << message;
  if (size > 1) {
    on_half_mesh([&](const kshard::Mesh<1>& other) {
      message = collective_error(
          [&] { (void)kshard::plan_redistribute(matrix, other, Layout(Replicate{})); });
      EXPECT_NE(message.find("different communicator"), std::string::npos) << message;
    });
  }
}

}  // namespace
