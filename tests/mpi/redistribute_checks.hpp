#pragma once

// The checks the redistribute tests share (tests/mpi/redistribute*_test.cpp): a transition
// checked on every rank against the source and a serial reference, bit for bit, through
// redistribute, redistribute_into and a reused plan, with the bytes each rank sends against
// the minimum computed here by brute force from the index maps. The exhaustive sweeps live in
// files of their own so that a 2-core build compiles them side by side.

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
#include "kshard/comm/stats.hpp"
#include "kshard/distribute.hpp"
#include "kshard/redistribute.hpp"
#include "kshard_test.hpp"

namespace kshard::test::redistribute_checks {

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
using kshard::test::Matrix;
using kshard::test::MemSpace;
using kshard::test::other_instance;
using kshard::test::reference_matrix;
using kshard::test::same_bits;
using kshard::test::world_size;

using Sum = Partial<ReduceOp::sum>;
using Max = Partial<ReduceOp::max>;
using Min = Partial<ReduceOp::min>;
using Avg = Partial<ReduceOp::avg>;

inline std::int64_t bytes_sent() { return kshard::comm_stats().bytes_sent; }

// True when two placements hold the same indices on a mesh dim of `extent` ranks.
inline bool same_data(const kshard::MeshDimAction& a, ReduceOp a_op, const kshard::MeshDimAction& b,
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
      EXPECT_TRUE(all_ranks(same_bits(gathered, full)));
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
inline std::pair<index_t, index_t> random_shape(std::uint64_t seed) {
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

}  // namespace kshard::test::redistribute_checks
