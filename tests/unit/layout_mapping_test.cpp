// Layout mappings against the spec's worked examples and, for random shapes and every layout
// of Replicate / Shard / StridedShard over meshes of rank 1-3, against a reference that
// applies the spec's rules literally to explicit lists of global indices.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
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

}  // namespace
