#pragma once

#include "kshard/index.hpp"

namespace kshard::detail {

// One mesh dimension's split of one tensor axis. `Shard` is the special case of one piece:
// StridedShard(s) chunks the current extent into `s` pieces, each piece into `k` sub-pieces,
// and coordinate `c` keeps sub-piece `c` of every piece, in piece order.
//
// By the chunk rule the pieces are `full_pieces` pieces of size `piece`, then at most one
// shorter remainder piece, then empty ones; so every map below is O(1) arithmetic on a few
// numbers instead of a list of runs, and the type is trivially copyable for device kernels.
//
// Exact for every extent in [0, INT64_MAX], factor and rank count in [1, INT64_MAX] and
// coordinate in [0, ranks): `make` only calls the overflow-free chunk helpers, and it stores
// the sub-pieces' clamped starts rather than `coord * stride`, which can pass INT64_MAX when
// the sub-piece is empty. Every value the maps form is then a sum of non-negative terms that
// is itself an index below `parent_extent` (or a local index below `local_extent()`).
struct SplitLevel {
  index_t parent_extent = 0;  // extent of the axis this level splits
  index_t piece = 0;          // size of a full piece (> 0 unless parent_extent == 0)
  index_t full_pieces = 0;    // number of full pieces: full_pieces * piece <= parent_extent
  index_t sub_begin = 0;      // start of this coordinate's share inside a full piece
  index_t sub_extent = 0;     // this coordinate's share of a full piece
  index_t rem_begin = 0;      // start of this coordinate's share inside the remainder piece
  index_t rem_extent = 0;     // this coordinate's share of the remainder piece

  static KSHARD_FUNCTION SplitLevel make(index_t n, index_t pieces, index_t ranks, index_t coord) {
    SplitLevel level;
    level.parent_extent = n;
    if (n == 0) return level;
    level.piece = ceil_div(n, pieces);  // in [1, n]: pieces > n gives pieces of one item
    level.full_pieces = n / level.piece;
    const index_t remainder = n - level.full_pieces * level.piece;  // in [0, piece)
    level.sub_begin = chunk_begin(level.piece, ranks, coord);
    level.sub_extent = chunk_extent(level.piece, ranks, coord);
    level.rem_begin = chunk_begin(remainder, ranks, coord);
    level.rem_extent = chunk_extent(remainder, ranks, coord);
    return level;
  }

  // full_pieces * sub_extent <= full_pieces * piece <= parent_extent.
  [[nodiscard]] KSHARD_FUNCTION index_t full_region() const { return full_pieces * sub_extent; }
  // At most full_pieces * piece + remainder == parent_extent.
  [[nodiscard]] KSHARD_FUNCTION index_t local_extent() const { return full_region() + rem_extent; }

  // Local index in [0, local_extent()) -> index along the parent extent. In the first branch
  // p < full_pieces, so p * piece + (sub_begin + offset < piece) < parent_extent; in the
  // second, full_pieces * piece + (rem_begin + offset < remainder) == the parent index.
  [[nodiscard]] KSHARD_FUNCTION index_t to_parent(index_t local) const {
    if (local < full_region()) {
      const index_t p = local / sub_extent;
      return p * piece + sub_begin + (local - p * sub_extent);
    }
    return full_pieces * piece + rem_begin + (local - full_region());
  }

  // Parent index in [0, parent_extent) -> local index, or invalid_index when not owned here.
  // `within` and the starts are in [0, piece], so `offset` cannot overflow; an owned result
  // is a local index (< local_extent()).
  [[nodiscard]] KSHARD_FUNCTION index_t from_parent(index_t parent) const {
    const index_t p = parent / piece;
    const index_t within = parent - p * piece;
    if (p < full_pieces) {
      const index_t offset = within - sub_begin;
      return offset >= 0 && offset < sub_extent ? p * sub_extent + offset : invalid_index;
    }
    const index_t offset = within - rem_begin;
    return offset >= 0 && offset < rem_extent ? full_region() + offset : invalid_index;
  }

  // How many local indices from `local` (in range) on map to consecutive parent indices.
  [[nodiscard]] KSHARD_FUNCTION index_t run_remaining(index_t local) const {
    // A sub-piece that is its whole piece (one rank, or pieces of one item) joins the next.
    if (sub_extent == piece) return local_extent() - local;
    if (local < full_region()) return sub_extent - local % sub_extent;
    return local_extent() - local;
  }
};

}  // namespace kshard::detail
