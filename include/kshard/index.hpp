#pragma once

/// \file
/// Index types and the torch.chunk rule that every Shard placement follows.

#include <cstdint>

#include "kshard/detail/macros.hpp"

namespace kshard {

/// Signed 64-bit global and local indices: vocabularies times hidden sizes pass 2^31.
using index_t = std::int64_t;

/// Returned by index maps for an index the map does not own (Tpetra's "invalid" sentinel).
inline constexpr index_t invalid_index = -1;

/// A run of consecutive global indices owned by one rank, and where it starts locally.
struct IndexRun {
  index_t global_begin = 0;  ///< first global index of the run
  index_t local_begin = 0;   ///< local index of `global_begin`
  index_t size = 0;          ///< number of indices in the run

  /// One past the last global index of the run.
  [[nodiscard]] constexpr index_t global_end() const { return global_begin + size; }
  /// Equal when all three fields are.
  friend constexpr bool operator==(const IndexRun&, const IndexRun&) = default;
};

/// `ceil(a / b)` for `a >= 0`, `b > 0`.
KSHARD_FUNCTION index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }

/// The torch.chunk rule: `n` items split in `k` chunks of `ceil(n / k)`; trailing chunks
/// may be short or empty. These return chunk `i`'s size and first item.
KSHARD_FUNCTION index_t chunk_extent(index_t n, index_t k, index_t i) {
  const index_t full = ceil_div(n, k);
  const index_t left = n - i * full;
  return left <= 0 ? 0 : (left < full ? left : full);
}

/// First item of chunk `i` of `n` items in `k` chunks (clamped to `n` for empty chunks).
KSHARD_FUNCTION index_t chunk_begin(index_t n, index_t k, index_t i) {
  const index_t begin = i * ceil_div(n, k);
  return begin < n ? begin : n;
}

}  // namespace kshard
