// Layout mappings against the spec's worked examples and, for random shapes and every layout
// of Replicate / Shard / StridedShard over meshes of rank 1-3, against a reference that
// applies the spec's rules literally to explicit lists of global indices.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "kshard/layout_mapping.hpp"

namespace {

using kshard::index_t;
using kshard::IndexRun;
using kshard::MeshDimAction;
using kshard::PlacementKind;

// The spec, literally: the ordered global indices a coordinate holds along one axis.
std::vector<index_t> reference_indices(index_t n, const std::vector<MeshDimAction>& actions,
                                       const std::vector<int>& shape, const std::vector<int>& coord,
                                       int axis) {
  std::vector<index_t> held(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) held[static_cast<std::size_t>(i)] = i;
  auto chunk = [](const std::vector<index_t>& v, index_t k, index_t i) {
    const auto size = static_cast<index_t>(v.size());
    const index_t full = (size + k - 1) / k;
    const index_t begin = std::min(size, i * full);
    const index_t end = std::min(size, begin + full);
    return std::vector<index_t>(v.begin() + begin, v.begin() + end);
  };
  for (std::size_t m = 0; m < actions.size(); ++m) {
    if (actions[m].tensor_dim != axis) continue;
    std::vector<index_t> next;
    for (index_t p = 0; p < actions[m].split_factor; ++p) {
      const auto sub = chunk(chunk(held, actions[m].split_factor, p), shape[m], coord[m]);
      next.insert(next.end(), sub.begin(), sub.end());
    }
    held = next;
  }
  return held;
}

template <std::size_t N>
kshard::LayoutMapping<N> mapping(const std::array<MeshDimAction, N>& actions,
                                 const std::array<int, N>& shape, const std::array<int, N>& coord,
                                 index_t rows, index_t cols = 1) {
  return kshard::map_layout(actions, shape, coord, rows, cols);
}

std::vector<index_t> expand(const std::vector<IndexRun>& runs) {
  std::vector<index_t> out;
  for (const IndexRun& run : runs)
    for (index_t i = 0; i < run.size; ++i) out.push_back(run.global_begin + i);
  return out;
}

constexpr MeshDimAction replicate{PlacementKind::replicate, -1, 1};
constexpr MeshDimAction shard0{PlacementKind::shard, 0, 1};
constexpr MeshDimAction strided0(index_t s) { return {PlacementKind::strided_shard, 0, s}; }

// Spec section 1, worked examples on a (dp=2, tp=2) mesh.
std::vector<index_t> rows_of(const std::array<MeshDimAction, 2>& actions, index_t v, int dp,
                             int tp) {
  return expand(mapping<2>(actions, {2, 2}, {dp, tp}, v).rows.runs());
}

TEST(LayoutMapping, SpecExamples) {
  using V = std::vector<index_t>;
  const std::array<MeshDimAction, 2> ss{shard0, shard0};
  EXPECT_EQ(rows_of(ss, 8, 0, 0), (V{0, 1}));
  EXPECT_EQ(rows_of(ss, 8, 0, 1), (V{2, 3}));
  EXPECT_EQ(rows_of(ss, 8, 1, 0), (V{4, 5}));
  EXPECT_EQ(rows_of(ss, 8, 1, 1), (V{6, 7}));
  const std::array<MeshDimAction, 2> fsdp_tp{strided0(2), shard0};
  EXPECT_EQ(rows_of(fsdp_tp, 8, 0, 0), (V{0, 1}));
  EXPECT_EQ(rows_of(fsdp_tp, 8, 0, 1), (V{4, 5}));
  EXPECT_EQ(rows_of(fsdp_tp, 8, 1, 0), (V{2, 3}));
  EXPECT_EQ(rows_of(fsdp_tp, 8, 1, 1), (V{6, 7}));
  EXPECT_EQ(rows_of(fsdp_tp, 10, 0, 0), (V{0, 1, 2}));
  EXPECT_EQ(rows_of(fsdp_tp, 10, 0, 1), (V{5, 6, 7}));
  EXPECT_EQ(rows_of(fsdp_tp, 10, 1, 0), (V{3, 4}));
  EXPECT_EQ(rows_of(fsdp_tp, 10, 1, 1), (V{8, 9}));
  const std::array<MeshDimAction, 2> strided_inner{shard0, strided0(2)};
  EXPECT_EQ(rows_of(strided_inner, 8, 0, 0), (V{0, 2}));
  EXPECT_EQ(rows_of(strided_inner, 8, 0, 1), (V{1, 3}));
  EXPECT_EQ(rows_of(strided_inner, 8, 1, 0), (V{4, 6}));
  EXPECT_EQ(rows_of(strided_inner, 8, 1, 1), (V{5, 7}));
  // The FSDP x TP rows are contiguous; the last layout is not.
  EXPECT_TRUE(mapping<2>(fsdp_tp, {2, 2}, {1, 0}, 10).rows.is_contiguous());
  EXPECT_FALSE(mapping<2>(strided_inner, {2, 2}, {1, 0}, 8).rows.is_contiguous());
}

TEST(LayoutMapping, MapsAreConstexprAndTriviallyCopyable) {
  constexpr auto m = kshard::map_layout<2>({strided0(2), shard0}, {2, 2}, {0, 1}, 10, 4);
  static_assert(m.rows.local_extent() == 3);
  static_assert(m.rows.to_global(0) == 5);
  static_assert(m.rows.to_local(7) == 2);
  static_assert(m.rows.to_local(3) == kshard::invalid_index);
  static_assert(m.cols.local_extent() == 4);
  static_assert(std::is_trivially_copyable_v<kshard::LayoutMapping<3>>);
}

TEST(LayoutMapping, EmptyShardsAndMisses) {
  // V = 3 rows over 4 ranks: the last rank is empty; its offset is the end of the axis.
  const auto empty = mapping<1>({shard0}, {4}, {3}, 3);
  EXPECT_EQ(empty.rows.local_extent(), 0);
  EXPECT_EQ(empty.rows.global_offset(), 3);
  EXPECT_TRUE(empty.rows.runs().empty());
  EXPECT_TRUE(empty.rows.is_contiguous());
  for (index_t g = -2; g < 5; ++g) EXPECT_EQ(empty.rows.to_local(g), kshard::invalid_index);
  const auto zero = mapping<1>({strided0(3)}, {2}, {1}, 0);
  EXPECT_EQ(zero.rows.local_extent(), 0);
  const auto held = mapping<1>({shard0}, {4}, {1}, 10);
  EXPECT_EQ(held.rows.to_global(-1), kshard::invalid_index);
  EXPECT_EQ(held.rows.to_global(3), kshard::invalid_index);
  EXPECT_EQ(held.rows.global_offset(), 3);
}

// For one layout and shape: every coordinate against the reference, and every global index
// owned by exactly as many coordinates as the mesh dims that do not split its axis allow.
template <std::size_t N>
void check_layout(const std::array<MeshDimAction, N>& actions, const std::array<int, N>& shape,
                  index_t rows, index_t cols) {
  int size = 1;
  for (int e : shape) size *= e;
  std::map<std::pair<index_t, index_t>, int> owners;
  for (int r = 0; r < size; ++r) {
    std::array<int, N> coord{};
    for (std::size_t m = N, rest = static_cast<std::size_t>(r); m-- > 0;) {
      coord[m] = static_cast<int>(rest % static_cast<std::size_t>(shape[m]));
      rest /= static_cast<std::size_t>(shape[m]);
    }
    const auto map = mapping<N>(actions, shape, coord, rows, cols);
    for (int axis = 0; axis < 2; ++axis) {
      const auto& axis_map = map.axis(axis);
      const index_t n = axis == 0 ? rows : cols;
      const auto expected =
          reference_indices(n, std::vector<MeshDimAction>(actions.begin(), actions.end()),
                            std::vector<int>(shape.begin(), shape.end()),
                            std::vector<int>(coord.begin(), coord.end()), axis);
      SCOPED_TRACE(::testing::Message() << "rank " << r << " axis " << axis << " n " << n);
      ASSERT_EQ(axis_map.local_extent(), static_cast<index_t>(expected.size()));
      ASSERT_EQ(axis_map.global_extent(), n);
      const auto runs = axis_map.runs();
      EXPECT_EQ(expand(runs), expected);
      index_t local = 0;
      for (std::size_t i = 0; i < runs.size(); ++i) {
        EXPECT_EQ(runs[i].local_begin, local);
        local += runs[i].size;
        if (i > 0) {
          EXPECT_GT(runs[i].global_begin, runs[i - 1].global_end());  // maximal runs
        }
      }
      EXPECT_EQ(axis_map.is_contiguous(), runs.size() <= 1);
      EXPECT_EQ(axis_map.global_offset(), expected.empty() ? n : expected.front());
      std::vector<index_t> local_of(static_cast<std::size_t>(n), kshard::invalid_index);
      for (std::size_t l = 0; l < expected.size(); ++l) {
        EXPECT_EQ(axis_map.to_global(static_cast<index_t>(l)), expected[l]);
        local_of[static_cast<std::size_t>(expected[l])] = static_cast<index_t>(l);
      }
      for (index_t g = 0; g < n; ++g) {
        EXPECT_EQ(axis_map.to_local(g), local_of[static_cast<std::size_t>(g)]);
        EXPECT_EQ(axis_map.is_local(g), local_of[static_cast<std::size_t>(g)] >= 0);
      }
      EXPECT_EQ(axis_map.to_local(n), kshard::invalid_index);
      EXPECT_EQ(axis_map.to_global(axis_map.local_extent()), kshard::invalid_index);
    }
    for (const IndexRun& rr : map.rows.runs())
      for (const IndexRun& cr : map.cols.runs())
        for (index_t i = 0; i < rr.size; ++i)
          for (index_t j = 0; j < cr.size; ++j)
            ++owners[{rr.global_begin + i, cr.global_begin + j}];
  }
  int replicas = 1;
  for (std::size_t m = 0; m < N; ++m)
    if (actions[m].tensor_dim < 0) replicas *= shape[m];
  EXPECT_EQ(static_cast<index_t>(owners.size()), rows * cols);
  for (const auto& [element, count] : owners) EXPECT_EQ(count, replicas);
}

constexpr std::array<MeshDimAction, 5> kinds{replicate, shard0,
                                             MeshDimAction{PlacementKind::shard, 1, 1}, strided0(1),
                                             MeshDimAction{PlacementKind::strided_shard, 1, 1}};

template <std::size_t N>
void check_random_layouts(int shapes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::size_t combos = 1;
  for (std::size_t m = 0; m < N; ++m) combos *= kinds.size();
  for (std::size_t combo = 0; combo < combos; ++combo) {
    std::array<MeshDimAction, N> actions{};
    for (std::size_t m = 0, rest = combo; m < N; ++m, rest /= kinds.size()) {
      actions[m] = kinds[rest % kinds.size()];
      if (actions[m].kind == PlacementKind::strided_shard) actions[m].split_factor = pick(1, 4);
    }
    for (int t = 0; t < shapes; ++t) {
      std::array<int, N> shape{};
      for (int& e : shape) e = pick(1, 4);
      // Small extents (0, fewer than ranks) often; larger ones sometimes.
      const index_t rows = t % 3 == 0 ? pick(0, 4) : pick(0, 40);
      const index_t cols = t % 4 == 0 ? pick(0, 3) : pick(0, 12);
      SCOPED_TRACE(::testing::Message()
                   << "combo " << combo << " rows " << rows << " cols " << cols);
      check_layout<N>(actions, shape, rows, cols);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(LayoutMapping, RandomLayoutsMeshRank1) { check_random_layouts<1>(200, 1); }
TEST(LayoutMapping, RandomLayoutsMeshRank2) { check_random_layouts<2>(40, 2); }
TEST(LayoutMapping, RandomLayoutsMeshRank3) { check_random_layouts<3>(8, 3); }

// Extreme extents and factors, against the spec's rule in 128-bit arithmetic, applied
// literally: no 64-bit intermediate, so nothing here can overflow.
__extension__ typedef __int128 wide;

constexpr index_t max = std::numeric_limits<index_t>::max();
constexpr index_t invalid = kshard::invalid_index;

wide ceil_w(wide a, wide b) { return (a + b - 1) / b; }
wide chunk_w(wide m, wide k, wide i) {
  return std::clamp<wide>(m - i * ceil_w(m, k), 0, ceil_w(m, k));
}

// One split (StridedShard(s) over k ranks) of n items: F pieces of P items, then R items.
struct WideSplit {
  wide n, k, piece, full, rest;
  WideSplit(index_t n_, index_t s, index_t k_)
      : n(n_), k(k_), piece(n_ == 0 ? 1 : ceil_w(n_, s)), full(n / piece), rest(n - full * piece) {}
  wide extent(wide c) const { return full * chunk_w(piece, k, c) + chunk_w(rest, k, c); }
  // Owner and its local index of item x in [0, n): every piece before x's is a full one.
  std::pair<wide, wide> locate(wide x) const {
    const wide p = x / piece, within = x % piece;
    const wide sub = ceil_w(std::min(piece, n - p * piece), k);
    return {within / sub, p * chunk_w(piece, k, within / sub) + within % sub};
  }
  wide parent(wide c, wide l) const {
    const wide e = chunk_w(piece, k, c);
    if (l < full * e) return l / e * piece + c * ceil_w(piece, k) + l % e;
    return full * piece + c * ceil_w(rest, k) + (l - full * e);
  }
};

struct Split {
  index_t factor;
  index_t ranks;
  index_t coord;
};

// Checks one coordinate's axis map for n items split by `splits` (outermost first).
void check_extreme_axis(index_t n, const std::vector<Split>& splits) {
  ::testing::Message trace;
  trace << "n " << n;
  for (const Split& s : splits)
    trace << " (" << s.factor << ", " << s.ranks << ", " << s.coord << ")";
  SCOPED_TRACE(trace);
  kshard::AxisMap<4> map(n);
  std::vector<WideSplit> ref;
  index_t extent = n;
  for (const Split& s : splits) {
    map.add_split(s.factor, s.ranks, s.coord);
    ref.emplace_back(extent, s.factor, s.ranks);
    const wide expected = ref.back().extent(s.coord);
    ASSERT_TRUE(expected == map.local_extent()) << map.local_extent();
    extent = map.local_extent();
  }
  const index_t local_extent = map.local_extent();
  ASSERT_GE(local_extent, 0);
  auto global_of = [&](index_t local) {
    wide x = local;
    for (std::size_t j = splits.size(); j-- > 0;) x = ref[j].parent(splits[j].coord, x);
    return static_cast<index_t>(x);
  };
  auto local_of = [&](index_t global) {
    wide x = global;
    for (std::size_t j = 0; j < splits.size(); ++j) {
      const auto [owner, local] = ref[j].locate(x);
      if (owner != splits[j].coord) return invalid;
      x = local;
    }
    return static_cast<index_t>(x);
  };
  for (index_t local :
       {index_t{0}, index_t{1}, local_extent / 2, local_extent - 2, local_extent - 1}) {
    if (local < 0 || local >= local_extent) continue;
    const index_t global = map.to_global(local);
    EXPECT_EQ(global, global_of(local)) << "local " << local;
    EXPECT_EQ(map.to_local(global), local) << "local " << local;
    const index_t run = map.run_length(local);
    EXPECT_GE(run, 1);
    EXPECT_LE(run, local_extent - local);
    EXPECT_EQ(map.to_global(local + run - 1), global + run - 1) << "local " << local;
    if (local + run < local_extent) {
      EXPECT_GT(map.to_global(local + run), global + run) << "local " << local;  // maximal
    }
  }
  for (index_t global : {index_t{0}, index_t{1}, n / 2, n - 2, n - 1}) {
    if (global < 0 || global >= n) continue;
    const index_t local = map.to_local(global);
    EXPECT_EQ(local, local_of(global)) << "global " << global;
    if (local != invalid) {
      EXPECT_EQ(map.to_global(local), global) << "global " << global;
    }
  }
  for (index_t out : {std::numeric_limits<index_t>::min(), index_t{-1}, n, max}) {
    if (out >= 0 && out < n) continue;
    EXPECT_EQ(map.to_local(out), invalid) << "global " << out;
  }
  for (index_t out : {std::numeric_limits<index_t>::min(), index_t{-1}, local_extent, max}) {
    if (out >= 0 && out < local_extent) continue;
    EXPECT_EQ(map.to_global(out), invalid) << "local " << out;
    EXPECT_EQ(map.run_length(out), 0) << "local " << out;
  }
  EXPECT_EQ(map.global_offset(), local_extent == 0 ? n : global_of(0));
  EXPECT_EQ(map.is_contiguous(), local_extent == 0 || map.run_length(0) == local_extent);
}

const std::vector<index_t> extreme_extents{0, 1, 2, 3, 5, max, max - 1, max / 2 + 1};
const std::vector<index_t> extreme_factors{1, 2, 3, max, max - 1};

TEST(LayoutMapping, ExtremeSingleSplits) {
  for (index_t n : extreme_extents)
    for (index_t s : extreme_factors)
      for (index_t k = 1; k <= 4; ++k) {
        wide total = 0;
        for (index_t c = 0; c < k; ++c) {
          check_extreme_axis(n, {{s, k, c}});
          if (::testing::Test::HasFatalFailure()) return;
          kshard::AxisMap<1> map(n);
          map.add_split(s, k, c);
          total += map.local_extent();
        }
        EXPECT_TRUE(total == n) << n << " " << s << " " << k;  // the coordinates partition
      }
}

TEST(LayoutMapping, ExtremeRankCounts) {
  constexpr index_t int_max = std::numeric_limits<int>::max();
  for (index_t n : extreme_extents)
    for (index_t s : extreme_factors)
      for (index_t k : {int_max, int_max - 1, index_t{1} << 30})
        for (index_t c : {index_t{0}, index_t{1}, k / 2, k - 2, k - 1}) {
          check_extreme_axis(n, {{s, k, c}});
          if (::testing::Test::HasFatalFailure()) return;
        }
}

TEST(LayoutMapping, ExtremeComposedSplits) {
  for (index_t n : extreme_extents)
    for (index_t s1 : extreme_factors)
      for (index_t s2 : extreme_factors)
        for (index_t k1 = 1; k1 <= 3; ++k1)
          for (index_t k2 = 1; k2 <= 3; ++k2) {
            wide total = 0;
            for (index_t c1 = 0; c1 < k1; ++c1)
              for (index_t c2 = 0; c2 < k2; ++c2) {
                check_extreme_axis(n, {{s1, k1, c1}, {s2, k2, c2}});
                if (::testing::Test::HasFatalFailure()) return;
                kshard::AxisMap<2> map(n);
                map.add_split(s1, k1, c1);
                map.add_split(s2, k2, c2);
                total += map.local_extent();
              }
            EXPECT_TRUE(total == n) << n << " " << s1 << " " << s2 << " " << k1 << " " << k2;
          }
  // Deeper compositions with huge factors and rank counts in between.
  check_extreme_axis(max, {{max, 3, 2}, {2, 4, 3}, {max - 1, 2, 1}, {1, 1, 0}});
  check_extreme_axis(max, {{2, 2, 1}, {2, 2, 1}, {2, 2, 1}, {2, 2, 1}});
  check_extreme_axis(max - 1, {{3, 1 << 30, (1 << 30) - 1}, {max, 7, 6}, {5, 3, 0}});
}

TEST(LayoutMapping, ExtremeLayouts) {
  // The example: StridedShard(INT64_MAX) divided by zero. With more pieces than rows,
  // each piece is one row, all of it held by coordinate 0.
  const auto first = mapping<1>({strided0(max)}, {2}, {0}, 10, 4);
  EXPECT_EQ(first.rows.local_extent(), 10);
  EXPECT_EQ(first.rows.to_global(9), 9);
  EXPECT_TRUE(first.rows.is_contiguous());
  const auto second = mapping<1>({strided0(max)}, {2}, {1}, 10, 4);
  EXPECT_EQ(second.rows.local_extent(), 0);
  EXPECT_EQ(second.rows.global_offset(), 10);
  // Rows = INT64_MAX over every coordinate of a 2 x 2 mesh: extents are positive and add up.
  wide total = 0;
  for (int dp = 0; dp < 2; ++dp)
    for (int tp = 0; tp < 2; ++tp) {
      const auto map = mapping<2>({strided0(2), shard0}, {2, 2}, {dp, tp}, max, max);
      EXPECT_GT(map.rows.local_extent(), 0);
      EXPECT_EQ(map.cols.local_extent(), max);
      EXPECT_EQ(map.local_size(), max);  // saturated: the product does not fit
      total += map.rows.local_extent();
    }
  EXPECT_TRUE(total == max);
  EXPECT_EQ(mapping<1>({replicate}, {1}, {0}, index_t{1} << 31, index_t{1} << 31).local_size(),
            index_t{1} << 62);
  EXPECT_EQ(mapping<1>({replicate}, {1}, {0}, index_t{1} << 32, index_t{1} << 31).local_size(),
            max);
  EXPECT_EQ(mapping<1>({replicate}, {1}, {0}, max, 1).local_size(), max);
  EXPECT_EQ(mapping<1>({replicate}, {1}, {0}, 0, max).local_size(), 0);
}

}  // namespace
