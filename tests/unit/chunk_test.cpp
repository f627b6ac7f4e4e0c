// The torch.chunk rule, against the spec's table and a direct transcription of the rule.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kshard/index.hpp"

namespace {

using kshard::index_t;

std::vector<index_t> sizes(index_t n, index_t k) {
  std::vector<index_t> out;
  for (index_t i = 0; i < k; ++i) out.push_back(kshard::chunk_extent(n, k, i));
  return out;
}

TEST(ChunkRule, SpecTable) {
  EXPECT_EQ(sizes(10, 4), (std::vector<index_t>{3, 3, 3, 1}));
  EXPECT_EQ(sizes(5, 4), (std::vector<index_t>{2, 2, 1, 0}));
  EXPECT_EQ(sizes(6, 4), (std::vector<index_t>{2, 2, 2, 0}));
  EXPECT_EQ(sizes(3, 4), (std::vector<index_t>{1, 1, 1, 0}));
  EXPECT_EQ(sizes(0, 3), (std::vector<index_t>{0, 0, 0}));
}

TEST(ChunkRule, IsConstexpr) {
  static_assert(kshard::chunk_extent(10, 4, 3) == 1);
  static_assert(kshard::chunk_begin(5, 4, 3) == 5);
  static_assert(kshard::ceil_div(7, 2) == 4);
}

TEST(ChunkRule, ChunksTileTheExtent) {
  for (index_t n = 0; n <= 40; ++n)
    for (index_t k = 1; k <= 9; ++k) {
      const index_t full = (n + k - 1) / k;  // torch: chunk size ceil(n / k)
      index_t next = 0;
      for (index_t i = 0; i < k; ++i) {
        const index_t size = kshard::chunk_extent(n, k, i);
        EXPECT_EQ(kshard::chunk_begin(n, k, i), next) << n << " " << k << " " << i;
        EXPECT_LE(size, full);
        if (size > 0) {
          EXPECT_EQ(next, i * full);
        }
        next += size;
      }
      EXPECT_EQ(next, n) << n << " " << k;
    }
}

// The rule at the ends of the index range, against 128-bit arithmetic that applies it
// literally: (n + k - 1) / k and i * ceil(n / k) do not overflow there.
__extension__ typedef __int128 wide;

constexpr index_t max = std::numeric_limits<index_t>::max();

wide wide_full(index_t n, index_t k) { return (wide{n} + k - 1) / k; }
index_t wide_begin(index_t n, index_t k, index_t i) {
  return static_cast<index_t>(std::min<wide>(wide{i} * wide_full(n, k), n));
}
index_t wide_extent(index_t n, index_t k, index_t i) {
  return static_cast<index_t>(std::clamp<wide>(n - wide{i} * wide_full(n, k), 0, wide_full(n, k)));
}

TEST(ChunkRule, ExactAtTheExtremes) {
  const std::vector<index_t> extents{0,
                                     1,
                                     2,
                                     3,
                                     max,
                                     max - 1,
                                     max / 2,
                                     max / 2 + 1,
                                     index_t{1} << 62,
                                     (index_t{1} << 62) + 1,
                                     (index_t{1} << 32) - 1,
                                     std::numeric_limits<int>::max()};
  const std::vector<index_t> counts{1,
                                    2,
                                    3,
                                    4,
                                    7,
                                    max,
                                    max - 1,
                                    max / 2,
                                    max / 3,
                                    index_t{1} << 62,
                                    (index_t{1} << 62) - 1,
                                    std::numeric_limits<int>::max()};
  for (index_t n : extents) {
    for (index_t k : counts) {
      EXPECT_EQ(kshard::ceil_div(n, k), static_cast<index_t>(wide_full(n, k))) << n << " " << k;
      std::vector<index_t> chunks{0, 1, 2, k / 2, k / 2 + 1, k - 3, k - 2, k - 1};
      if (n > 0) chunks.push_back(std::min(k - 1, n / kshard::ceil_div(n, k)));  // last full
      for (index_t i : chunks) {
        if (i < 0 || i >= k) continue;
        SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k << " i " << i);
        const index_t size = kshard::chunk_extent(n, k, i);
        const index_t begin = kshard::chunk_begin(n, k, i);
        EXPECT_EQ(size, wide_extent(n, k, i));
        EXPECT_EQ(begin, wide_begin(n, k, i));
        EXPECT_GE(size, 0);
        EXPECT_LE(size, n - begin);
        if (i + 1 < k) {
          EXPECT_EQ(kshard::chunk_begin(n, k, i + 1), begin + size);  // chunks tile the items
        }
      }
    }
    for (index_t k = 1; k <= 4; ++k) {
      wide total = 0;
      for (index_t i = 0; i < k; ++i) total += kshard::chunk_extent(n, k, i);
      EXPECT_TRUE(total == n) << n << " " << k;
    }
  }
  // Chunks past the items: empty, starting at the end.
  EXPECT_EQ(kshard::chunk_extent(max, max, max - 1), 1);
  EXPECT_EQ(kshard::chunk_extent(max - 1, max, max - 1), 0);
  EXPECT_EQ(kshard::chunk_begin(max - 1, max, max - 1), max - 1);
  EXPECT_EQ(kshard::chunk_extent(max, max - 1, max - 2), 0);  // i * ceil(n / k) is ~2^64
  EXPECT_EQ(kshard::chunk_begin(max, max - 1, max - 2), max);
  EXPECT_EQ(kshard::chunk_extent(max, index_t{1} << 62, (index_t{1} << 62) - 1), 1);
  EXPECT_EQ(kshard::chunk_begin(max, index_t{1} << 62, (index_t{1} << 62) - 1), max - 1);
  static_assert(kshard::ceil_div(max, max) == 1);
  static_assert(kshard::ceil_div(max, 2) == index_t{1} << 62);
  static_assert(kshard::chunk_extent(max, 2, 1) == max / 2);
}

}  // namespace
