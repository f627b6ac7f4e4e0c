#pragma once

#include "kshard/index.hpp"

namespace kshard::detail {

// One mesh dimension's split of one tensor axis. `Shard` is the special case of one piece:
// StridedShard(s) chunks the current extent into `s` pieces, each piece into `k` sub-pieces,
// and coordinate `c` keeps sub-piece `c` of every piece, in piece order.
//
// By the chunk rule the pieces are `full_pieces` pieces of size `piece`, then at most one
// shorter remainder piece, then empty ones; so every map below is O(1) arithmetic on six
// numbers instead of a list of runs, and the type is trivially copyable for device kernels.
struct SplitLevel {
  index_t parent_extent = 0;  // extent of the axis this level splits
  index_t piece = 0;          // size of a full piece
  index_t full_pieces = 0;    // number of full pieces
  index_t sub_stride = 0;     // sub-piece size inside a full piece (chunk rule over k)
  index_t sub_extent = 0;     // this coordinate's share of a full piece
  index_t rem_stride = 0;     // sub-piece size inside the remainder piece
  index_t rem_extent = 0;     // this coordinate's share of the remainder piece
  index_t coord = 0;

  static KSHARD_FUNCTION SplitLevel make(index_t n, index_t pieces, index_t ranks, index_t coord) {
    SplitLevel level;
    level.parent_extent = n;
    level.coord = coord;
    if (n == 0) return level;
    level.piece = ceil_div(n, pieces);
    level.full_pieces = n / level.piece;
    const index_t remainder = n - level.full_pieces * level.piece;
    level.sub_stride = ceil_div(level.piece, ranks);
    level.sub_extent = chunk_extent(level.piece, ranks, coord);
    level.rem_stride = ceil_div(remainder, ranks);
    level.rem_extent = chunk_extent(remainder, ranks, coord);
    return level;
  }

  [[nodiscard]] KSHARD_FUNCTION index_t full_region() const { return full_pieces * sub_extent; }
  [[nodiscard]] KSHARD_FUNCTION index_t local_extent() const { return full_region() + rem_extent; }

  // Local index (assumed in range) -> index along the parent extent.
  [[nodiscard]] KSHARD_FUNCTION index_t to_parent(index_t local) const {
    if (local < full_region()) {
      const index_t p = local / sub_extent;
      return p * piece + coord * sub_stride + (local - p * sub_extent);
    }
    return full_pieces * piece + coord * rem_stride + (local - full_region());
  }

  // Parent index (assumed in range) -> local index, or invalid_index when not owned here.
  [[nodiscard]] KSHARD_FUNCTION index_t from_parent(index_t parent) const {
    const index_t p = parent / piece;
    const index_t within = parent - p * piece;
    if (p < full_pieces) {
      const index_t offset = within - coord * sub_stride;
      return offset >= 0 && offset < sub_extent ? p * sub_extent + offset : invalid_index;
    }
    const index_t offset = within - coord * rem_stride;
    return offset >= 0 && offset < rem_extent ? full_region() + offset : invalid_index;
  }

  // How many local indices from `local` on map to consecutive parent indices.
  [[nodiscard]] KSHARD_FUNCTION index_t run_remaining(index_t local) const {
    // A sub-piece that is its whole piece (one rank, or pieces of one item) joins the next.
    if (sub_extent == piece) return local_extent() - local;
    if (local < full_region()) return sub_extent - local % sub_extent;
    return local_extent() - local;
  }
};

}  // namespace kshard::detail
