// The torch.chunk rule, against the spec's table and a direct transcription of the rule.

#include <gtest/gtest.h>

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

}  // namespace
