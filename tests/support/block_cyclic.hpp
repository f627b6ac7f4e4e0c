#pragma once

// A placement defined outside kshard, as mdspan's tests define `layout_foo`: ScaLAPACK's
// block-cyclic distribution, blocks of `block` indices dealt to the ranks in turn. Nothing in
// include/ knows it; the type carries its own split rule, and the tests check that mappings,
// distribute, gather, redistribution plans, printing and the collective checks all work
// through that seam.

#include <string_view>

#include "kshard/axis_split.hpp"
#include "kshard/placement.hpp"

namespace kshard::test {

// Coordinate `coord` of `ranks` keeps blocks coord, coord + ranks, ... of `n` indices: one
// round of `ranks` blocks is a piece, in which the coordinate holds one block (clamped where a
// round is cut short by the end of the axis).
inline AxisSplit deal_blocks(index_t n, index_t block, index_t ranks, index_t coord) {
  AxisSplit split;
  split.parent_extent = n;
  if (n == 0) return split;
  // A round, or the whole axis when one round is longer: block * ranks cannot overflow when
  // block <= n / ranks, and exceeds n otherwise.
  split.piece = block > n / ranks ? n : block * ranks;
  split.full_pieces = n / split.piece;
  const index_t remainder = n - split.full_pieces * split.piece;
  auto start = [&](index_t extent) { return coord > extent / block ? extent : coord * block; };
  auto length = [&](index_t begin, index_t extent) {
    return extent - begin < block ? extent - begin : block;
  };
  split.sub_begin = start(split.piece);
  split.sub_extent = length(split.sub_begin, split.piece);
  split.rem_begin = start(remainder);
  split.rem_extent = length(split.rem_begin, remainder);
  return split;
}

template <int D>
struct BlockCyclic {
  static constexpr PlacementKind kind = PlacementKind::custom;
  static constexpr std::string_view name = "BlockCyclic";
  static constexpr int tensor_dim = D;
  static constexpr SplitRule split_rule = &deal_blocks;
  index_t block = 1;

  [[nodiscard]] constexpr index_t split_factor() const { return block; }
  friend constexpr bool operator==(BlockCyclic, BlockCyclic) = default;
};

// The owner of global index `i` under block-cyclic dealing: the reference the tests check the
// split rule against.
inline index_t block_owner(index_t i, index_t block, index_t ranks) { return (i / block) % ranks; }

}  // namespace kshard::test
