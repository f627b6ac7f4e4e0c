#pragma once

/// \file
/// `AxisSplit`: how one mesh dimension cuts one tensor axis for one mesh coordinate. A
/// splitting placement's rule returns one; `AxisMap` composes them. The built-in rule is the
/// chunk rule (`AxisSplit::chunked`); a placement with another rule builds its own.

#include "kshard/index.hpp"

namespace kshard {

/// One mesh dimension's split of one tensor axis, for one coordinate, in a form every split
/// kshard knows shares: the parent extent is cut into `full_pieces` pieces of size `piece`,
/// then at most one shorter remainder piece; the coordinate keeps the run
/// `[sub_begin, sub_begin + sub_extent)` of every full piece and
/// `[rem_begin, rem_begin + rem_extent)` of the remainder, in piece order. So every map below
/// is O(1) arithmetic on a few numbers, and the type is trivially copyable for device kernels.
///
/// A rule must return values with `0 <= sub_begin`, `sub_begin + sub_extent <= piece`,
/// `full_pieces * piece <= parent_extent`, `piece > 0` unless `parent_extent == 0`, and
/// `rem_begin + rem_extent <= parent_extent - full_pieces * piece < piece` (or `piece` when
/// there are no full pieces), and the coordinates of a mesh dimension must keep disjoint runs
/// that cover the axis. Then every value the maps form is a sum of non-negative terms that is
/// itself an index below `parent_extent` (or a local index below `local_extent()`): exact for
/// every extent in [0, INT64_MAX].
struct AxisSplit {
  index_t parent_extent = 0;  ///< extent of the axis this split cuts
  index_t piece = 0;          ///< size of a full piece (> 0 unless parent_extent == 0)
  index_t full_pieces = 0;    ///< number of full pieces: full_pieces * piece <= parent_extent
  index_t sub_begin = 0;      ///< start of this coordinate's run inside a full piece
  index_t sub_extent = 0;     ///< length of this coordinate's run inside a full piece
  index_t rem_begin = 0;      ///< start of this coordinate's run inside the remainder piece
  index_t rem_extent = 0;     ///< length of this coordinate's run inside the remainder piece

  /// The chunk rule of `Shard` (`pieces == 1`) and `StridedShard` (`pieces` = its factor):
  /// `n` is chunked into `pieces` pieces, each piece into `ranks` sub-pieces by torch.chunk,
  /// and coordinate `coord` keeps sub-piece `coord` of every piece. Exact for `n` in
  /// [0, INT64_MAX], `pieces` and `ranks` in [1, INT64_MAX] and `coord` in [0, ranks): it calls
  /// only the overflow-free chunk helpers and stores the sub-pieces' clamped starts rather than
  /// `coord * stride`, which can pass INT64_MAX when the sub-piece is empty.
  static KSHARD_FUNCTION AxisSplit chunked(index_t n, index_t pieces, index_t ranks,
                                           index_t coord) {
    AxisSplit level;
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

  /// Local indices in the full pieces: full_pieces * sub_extent <= parent_extent.
  [[nodiscard]] KSHARD_FUNCTION index_t full_region() const { return full_pieces * sub_extent; }
  /// Number of indices this coordinate keeps (at most parent_extent).
  [[nodiscard]] KSHARD_FUNCTION index_t local_extent() const { return full_region() + rem_extent; }

  /// Local index in [0, local_extent()) -> index along the parent extent. In the first branch
  /// p < full_pieces, so p * piece + (sub_begin + offset < piece) < parent_extent; in the
  /// second, full_pieces * piece + (rem_begin + offset < remainder) == the parent index.
  [[nodiscard]] KSHARD_FUNCTION index_t to_parent(index_t local) const {
    if (local < full_region()) {
      const index_t p = local / sub_extent;
      return p * piece + sub_begin + (local - p * sub_extent);
    }
    return full_pieces * piece + rem_begin + (local - full_region());
  }

  /// Parent index in [0, parent_extent) -> local index, or invalid_index when not owned here.
  /// `within` and the starts are in [0, piece], so `offset` cannot overflow; an owned result
  /// is a local index (< local_extent()).
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

  /// How many local indices from `local` (in range) on map to consecutive parent indices.
  [[nodiscard]] KSHARD_FUNCTION index_t run_remaining(index_t local) const {
    if (local >= full_region()) return local_extent() - local;
    // Runs that are whole pieces (one rank, or pieces of one item) join one another, and the
    // remainder's run when it starts its piece.
    if (sub_extent == piece) return (rem_begin == 0 ? local_extent() : full_region()) - local;
    return sub_extent - local % sub_extent;
  }
};

}  // namespace kshard
