// Byte runs between boxes (io/engine/box_runs.hpp), the arithmetic of every byte move: checked
// against an element-by-element copy, and linear ranges cut into contiguous boxes checked against
// their row-major order.

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kshard/io/engine/box_runs.hpp"

namespace {

using kshard::detail::BoxStorage;
using kshard::detail::ByteRun;
using Shape = std::vector<std::int64_t>;

std::int64_t volume(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

// Calls f(index) for every global index of the box at `offsets` of `shape`, in row-major order.
template <class F>
void for_each_index(const Shape& offsets, const Shape& shape, F&& f) {
  if (volume(shape) == 0) return;
  Shape index = offsets;
  while (true) {
    f(index);
    std::size_t d = shape.size();
    while (d > 0 && ++index[d - 1] == offsets[d - 1] + shape[d - 1]) {
      index[d - 1] = offsets[d - 1];
      --d;
    }
    if (d == 0) return;
  }
}

// The value the tests give the element at global `index` of a tensor of `shape`: its row-major
// position + 1 (so 0 means "not written").
std::uint32_t value_of(const Shape& index, const Shape& shape) {
  const auto strides = kshard::detail::row_major_strides(shape);
  std::int64_t linear = 0;
  for (std::size_t d = 0; d < index.size(); ++d) linear += index[d] * strides[d];
  return static_cast<std::uint32_t>(linear + 1);
}

bool inside(const Shape& index, const Shape& offsets, const Shape& shape) {
  for (std::size_t d = 0; d < index.size(); ++d)
    if (index[d] < offsets[d] || index[d] >= offsets[d] + shape[d]) return false;
  return true;
}

TEST(BoxRuns, CopyWhatTheBoxesShareAndNothingElse) {
  std::mt19937 random(38);
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t rank = trial % 5;
    Shape shape(rank), from_off(rank), from_shape(rank), to_off(rank), to_shape(rank);
    for (std::size_t d = 0; d < rank; ++d) {
      shape[d] = 1 + random() % 6;
      from_off[d] = random() % shape[d];
      from_shape[d] = random() % (shape[d] - from_off[d] + 1);
      to_off[d] = random() % shape[d];
      to_shape[d] = random() % (shape[d] - to_off[d] + 1);
    }
    const BoxStorage from = kshard::detail::row_major_box(from_off, from_shape, 8);
    // The destination with padded rows, as a shard's part of a wider buffer.
    BoxStorage to = kshard::detail::row_major_box(to_off, to_shape, 4);
    if (rank > 1) to.strides[rank - 2] += 3;
    std::vector<std::uint32_t> source(volume(from_shape) + 2, 0), target(4096, 0);
    for_each_index(from_off, from_shape, [&](const Shape& index) {
      source[kshard::detail::byte_at(from, index, 4) / 4] = value_of(index, shape);
    });
    std::vector<ByteRun> runs;
    kshard::detail::append_shared_runs(from, to, 4, runs);
    for (const ByteRun& run : runs)
      for (std::uint64_t b = 0; b < run.bytes / 4; ++b)
        target[run.to / 4 + b] = source[run.from / 4 + b];
    std::int64_t checked = 0;
    for_each_index(to_off, to_shape, [&](const Shape& index) {
      const std::uint32_t got = target[kshard::detail::byte_at(to, index, 4) / 4];
      ASSERT_EQ(got, inside(index, from_off, from_shape) ? value_of(index, shape) : 0u)
          << "trial " << trial;
      checked += got != 0;
    });
    std::int64_t written = 0;  // nothing outside the destination box
    for (std::uint32_t v : target) written += v != 0;
    ASSERT_EQ(written, checked) << "trial " << trial;
  }
}

TEST(BoxRuns, RowWisePiecesMoveAsOneRun) {
  const BoxStorage piece = kshard::detail::row_major_box({4, 0}, {4, 8}, 100);
  const BoxStorage whole = kshard::detail::row_major_box({0, 0}, {10, 8}, 1000);
  std::vector<ByteRun> runs;
  kshard::detail::append_shared_runs(piece, whole, 2, runs);
  EXPECT_EQ(runs, (std::vector<ByteRun>{{100, 1000 + 4 * 8 * 2, 4 * 8 * 2}}));
  runs.clear();
  const BoxStorage column_piece = kshard::detail::row_major_box({0, 4}, {10, 4}, 0);
  kshard::detail::append_shared_runs(column_piece, whole, 2, runs);
  EXPECT_EQ(runs.size(), 10u);
  EXPECT_EQ(runs[1], (ByteRun{8, 1000 + (8 + 4) * 2, 8}));
}

TEST(BoxRuns, AnEmptyBoxOfHugeExtentsMovesNothing) {
  // [0, 2^40, 2^40] passes the left-to-right element count; its row-major strides would pass
  // INT64_MAX (UBSan's signed overflow, found by sharded_folder_fuzz).
  const Shape huge{0, std::int64_t{1} << 40, std::int64_t{1} << 40};
  EXPECT_EQ(kshard::detail::row_major_strides(huge), (Shape{1, 1, 1}));
  const BoxStorage empty = kshard::detail::row_major_box({0, 0, 0}, huge, 0);
  std::vector<ByteRun> runs;
  kshard::detail::append_shared_runs(empty, empty, 4, runs);
  EXPECT_TRUE(runs.empty());
}

TEST(BoxesOfRange, AreTheRangeInOrder) {
  std::mt19937 random(39);
  for (int trial = 0; trial < 500; ++trial) {
    const std::size_t rank = trial % 5;
    Shape shape(rank);
    for (auto& s : shape) s = 1 + random() % 5;
    const std::int64_t n = volume(shape);
    const std::int64_t begin = random() % (n + 1);
    const std::int64_t end = begin + random() % (n - begin + 1);
    const auto strides = kshard::detail::row_major_strides(shape);
    std::int64_t next = begin;
    int boxes = 0;
    kshard::detail::boxes_of_range(shape, begin, end, [&](const Shape& at, const Shape& extent) {
      ++boxes;
      std::int64_t first = 0;
      for (std::size_t d = 0; d < rank; ++d) first += at[d] * strides[d];
      ASSERT_EQ(first, next) << "trial " << trial;
      // Contiguous: the box's row-major order is the array's from `first`.
      for (std::size_t d = 0; d + 1 < rank; ++d) {
        if (extent[d] <= 1) continue;
        for (std::size_t k = d + 1; k < rank; ++k) ASSERT_EQ(extent[k], shape[k]);
      }
      next += volume(extent);
    });
    EXPECT_EQ(next, end) << "trial " << trial;
    EXPECT_LE(boxes, static_cast<int>(2 * rank + 1));
  }
}

}  // namespace
