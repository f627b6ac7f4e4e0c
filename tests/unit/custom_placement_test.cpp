// The placement seam: a placement defined in the tests (block-cyclic, tests/support/
// block_cyclic.hpp) maps indices through its own split rule, alone and composed with the
// built-in splits, against a reference that deals explicit lists of indices; a tensor of rank
// 3 maps each of its axes; and the placement prints by its own name.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <array>
#include <random>
#include <vector>

#include "block_cyclic.hpp"
#include "kshard/format.hpp"
#include "kshard/layout_mapping.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using kshard::test::block_owner;
using kshard::test::BlockCyclic;

// The positions of `held` that coordinate `coord` of `ranks` keeps under each rule, in order.
std::vector<index_t> deal(const std::vector<index_t>& held, index_t block, index_t ranks,
                          index_t coord) {
  std::vector<index_t> kept;
  for (std::size_t p = 0; p < held.size(); ++p)
    if (block_owner(static_cast<index_t>(p), block, ranks) == coord) kept.push_back(held[p]);
  return kept;
}

std::vector<index_t> chunk(const std::vector<index_t>& held, index_t k, index_t i) {
  const auto size = static_cast<index_t>(held.size());
  const index_t full = (size + k - 1) / k;
  const index_t begin = std::min(size, i * full);
  const index_t end = std::min(size, begin + full);
  return {held.begin() + begin, held.begin() + end};
}

std::vector<index_t> strided(const std::vector<index_t>& held, index_t pieces, index_t ranks,
                             index_t coord) {
  std::vector<index_t> kept;
  for (index_t p = 0; p < pieces; ++p) {
    const auto sub = chunk(chunk(held, pieces, p), ranks, coord);
    kept.insert(kept.end(), sub.begin(), sub.end());
  }
  return kept;
}

// Every query of `axis` against the ordered list of global indices it must hold.
template <std::size_t N>
void expect_axis(const kshard::AxisMap<N>& axis, const std::vector<index_t>& want, index_t n) {
  ASSERT_EQ(axis.local_extent(), static_cast<index_t>(want.size()));
  std::vector<index_t> from_runs;
  for (const kshard::IndexRun& run : axis.runs())
    for (index_t i = 0; i < run.size; ++i) from_runs.push_back(run.global_begin + i);
  EXPECT_EQ(from_runs, want);
  for (std::size_t l = 0; l < want.size(); ++l) {
    EXPECT_EQ(axis.to_global(static_cast<index_t>(l)), want[l]);
    EXPECT_EQ(axis.to_local(want[l]), static_cast<index_t>(l));
  }
  index_t owned = 0;
  for (index_t g = 0; g < n; ++g) owned += axis.is_local(g) ? 1 : 0;
  EXPECT_EQ(owned, static_cast<index_t>(want.size()));
}

std::vector<index_t> iota(index_t n) {
  std::vector<index_t> v(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

static_assert(kshard::Placement<BlockCyclic<0>>);
static_assert(kshard::Placement<BlockCyclic<1>>);

// A splitting placement without a split rule is not a placement.
struct NoRule {
  static constexpr kshard::PlacementKind kind = kshard::PlacementKind::custom;
  static constexpr std::string_view name = "NoRule";
  static constexpr int tensor_dim = 0;
  static constexpr std::nullptr_t split_rule = nullptr;
  [[nodiscard]] static constexpr index_t split_factor() { return 1; }
};
static_assert(!kshard::Placement<NoRule>);

TEST(CustomPlacement, DealsBlocksOnOneMeshDimension) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const auto n = std::uniform_int_distribution<index_t>(0, 70)(rng);
    const auto block = std::uniform_int_distribution<index_t>(1, 9)(rng);
    const int ranks = std::uniform_int_distribution<int>(1, 6)(rng);
    const Layout layout(BlockCyclic<0>{block});
    for (int c = 0; c < ranks; ++c) {
      SCOPED_TRACE(fmt::format("n={} block={} ranks={} coord={}", n, block, ranks, c));
      const auto map = kshard::map_layout(layout.actions(), {ranks}, {c}, n, 3);
      expect_axis(map.rows, deal(iota(n), block, ranks, c), n);
      expect_axis(map.cols, iota(3), 3);
    }
  }
}

// Composed with the built-in splits on a 2-D mesh: dealt after a strided split, and split by
// Shard after dealing (each split cuts what the one before it left).
TEST(CustomPlacement, ComposesWithBuiltInSplits) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const auto n = std::uniform_int_distribution<index_t>(0, 50)(rng);
    const auto block = std::uniform_int_distribution<index_t>(1, 5)(rng);
    const auto factor = std::uniform_int_distribution<index_t>(1, 3)(rng);
    const std::array<int, 2> shape{std::uniform_int_distribution<int>(1, 3)(rng),
                                   std::uniform_int_distribution<int>(1, 3)(rng)};
    const Layout after_strided(StridedShard<0>{factor}, BlockCyclic<0>{block});
    const Layout before_shard(BlockCyclic<0>{block}, Shard<0>{});
    for (int a = 0; a < shape[0]; ++a)
      for (int b = 0; b < shape[1]; ++b) {
        SCOPED_TRACE(fmt::format("n={} block={} sf={} mesh={}x{} coord=({},{})", n, block, factor,
                                 shape[0], shape[1], a, b));
        const auto one = kshard::map_layout(after_strided.actions(), shape, {a, b}, n, 1);
        expect_axis(one.rows, deal(strided(iota(n), factor, shape[0], a), block, shape[1], b), n);
        const auto two = kshard::map_layout(before_shard.actions(), shape, {a, b}, n, 1);
        expect_axis(two.rows, chunk(deal(iota(n), block, shape[0], a), shape[1], b), n);
      }
  }
}

// A rank-3 tensor: each axis is mapped by the mesh dimensions that split it, any others whole.
TEST(CustomPlacement, RankThreeMappingMapsEachAxis) {
  const Layout layout(Shard<2>{}, BlockCyclic<0>{2}, Replicate{});
  const std::array<index_t, 3> extents{9, 4, 7};
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b) {
      const auto map = kshard::map_layout(layout.actions(), {2, 3, 2}, {a, b, 1}, extents);
      static_assert(decltype(map)::rank == 3);
      expect_axis(map.axis(0), deal(iota(9), 2, 3, b), 9);
      expect_axis(map.axis(1), iota(4), 4);
      expect_axis(map.axis(2), chunk(iota(7), 2, a), 7);
      EXPECT_EQ(map.local_size(), map.axis(0).local_extent() * 4 * map.axis(2).local_extent());
    }
}

TEST(CustomPlacement, PrintsByItsOwnName) {
  EXPECT_EQ(fmt::format("{}", Layout(BlockCyclic<0>{3}, Shard<1>{})),
            "(BlockCyclic(0, 3), Shard(1))");
}

}  // namespace
