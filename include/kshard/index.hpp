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

/// `ceil(a / b)` for `a >= 0`, `b > 0`. Never overflows, unlike `(a + b - 1) / b`: the `+ 1`
/// comes only when `a % b != 0`, so `b >= 2` and `a / b + 1 <= a`.
KSHARD_FUNCTION index_t ceil_div(index_t a, index_t b) { return a / b + (a % b != 0 ? 1 : 0); }

namespace detail {
/// `n - i * ceil(n / k)` for `n >= 0`, `0 <= i <= k`, `k > 0`: how many of the `n` items are left
/// from chunk `i`'s start on (negative past the end), without forming `i * ceil(n / k)`, which
/// can pass INT64_MAX (n = INT64_MAX, k = n - 1: chunks of 2, chunk k - 1 "starts" near 2^64).
/// With `n = q * k + r`: `i * q <= k * q <= n`, so `n - i * q` is in `[0, n]`; subtracting
/// `i <= k` (only when `r > 0`) stays above `-k > INT64_MIN`.
KSHARD_FUNCTION index_t chunk_left(index_t n, index_t k, index_t i) {
  const index_t q = n / k;
  return n - i * q - (n % k != 0 ? i : 0);
}
}  // namespace detail

/// The torch.chunk rule: `n` items split in `k` chunks of `ceil(n / k)`; trailing chunks
/// may be short or empty. These return chunk `i`'s size and first item, for `n >= 0`, `k > 0`
/// and `0 <= i < k`, exactly for every such value (no intermediate leaves int64).
KSHARD_FUNCTION index_t chunk_extent(index_t n, index_t k, index_t i) {
  const index_t full = ceil_div(n, k);
  const index_t left = detail::chunk_left(n, k, i);
  return left <= 0 ? 0 : (left < full ? left : full);
}

/// First item of chunk `i` of `n` items in `k` chunks (clamped to `n` for empty chunks):
/// `n - left` with `0 < left <= n` is in `[0, n)`.
KSHARD_FUNCTION index_t chunk_begin(index_t n, index_t k, index_t i) {
  const index_t left = detail::chunk_left(n, k, i);
  return left <= 0 ? n : n - left;
}

}  // namespace kshard
