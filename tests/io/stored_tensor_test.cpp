// The pure arithmetic of stored tensors: DCP_SHARDING_INFO parsed, pieces tiled into global
// tensors (and every lie refused), byte runs between boxes checked against an element-by-element
// copy, and linear ranges cut into contiguous boxes checked against their row-major order.

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/io/engine/box_runs.hpp"
#include "kshard/io/safetensors/pieces.hpp"
#include "kshard/io/safetensors/sharding_info.hpp"
#include "safetensors_test_support.hpp"

namespace {

using kshard::detail::BoxStorage;
using kshard::detail::ByteRun;
using Shape = std::vector<std::int64_t>;

std::int64_t volume(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

using kshard_io_test::error_of;

TEST(ShardingInfo, ParsesTorchsText) {
  const auto info = kshard::detail::parse_sharding_info(
      R"({"model.embed_tokens.weight": {"saved_offsets": [4, 0]}, "model.norm.weight": )"
      R"({"saved_offsets": [0]}, "step": {"saved_offsets": []}})",
      "shard-00002-model-00001-of-00001.safetensors");
  ASSERT_EQ(info.size(), 3u);
  EXPECT_EQ(info.at("model.embed_tokens.weight"), (Shape{4, 0}));
  EXPECT_EQ(info.at("model.norm.weight"), (Shape{0}));
  EXPECT_TRUE(info.at("step").empty());
}

TEST(ShardingInfo, RefusesWhatIsNotOffsets) {
  const auto parse = [](const char* text) {
    return error_of([&] { kshard::detail::parse_sharding_info(text, "f.safetensors"); });
  };
  EXPECT_NE(parse("[1, 2]").find("is not a JSON object"), std::string::npos);
  EXPECT_NE(parse("{\"w\": ").find("is not a JSON object"), std::string::npos);
  EXPECT_NE(parse(R"({"w": {"offsets": [0]}})").find("has no \"saved_offsets\" array"),
            std::string::npos);
  EXPECT_NE(parse(R"({"w": [0]})").find("has no \"saved_offsets\" array"), std::string::npos);
  EXPECT_NE(parse(R"({"w": {"saved_offsets": [-1]}})").find("the offset -1;"), std::string::npos);
  EXPECT_NE(parse(R"({"w": {"saved_offsets": [1.5]}})").find("the offset 1.5;"), std::string::npos);
  EXPECT_NE(parse(R"({"w": {"saved_offsets": [9223372036854775807]}})").find("2^62"),
            std::string::npos);
  EXPECT_NE(parse(R"({"w": {"saved_offsets": ["0"]}})").find("'f.safetensors' for tensor 'w'"),
            std::string::npos);
}

TEST(ShardingInfo, RefusesADeeplyNestedOffsetWithoutRecursing) {
  // 200000 levels: describing the offset by nlohmann's dump() overflowed the stack (the
  // fuzzer's stack under ASan already at 30000, a 60 KB header).
  constexpr std::size_t depth = 200'000;
  const std::string text =
      R"({"w": {"saved_offsets": [)" + std::string(depth, '[') + std::string(depth, ']') + "]}}";
  const std::string message =
      error_of([&] { kshard::detail::parse_sharding_info(text, "f.safetensors"); });
  EXPECT_NE(message.find("has the offset [...];"), std::string::npos) << message;
  EXPECT_NE(error_of([] {
              kshard::detail::parse_sharding_info(R"({"w": {"saved_offsets": [{"a": 1}]}})", "f");
            }).find("has the offset {...};"),
            std::string::npos);
}

// A header holding `tensors` (name, shape) of F32 back to back.
kshard::io::SafetensorsHeader header_of(const std::vector<std::pair<std::string, Shape>>& tensors,
                                        kshard::io::Dtype dtype = kshard::io::Dtype::F32) {
  std::vector<kshard::io::TensorSpec> specs;
  for (const auto& [name, shape] : tensors) specs.push_back({name, dtype, shape});
  return kshard::io::make_safetensors_header(specs);
}

TEST(Tiling, PlacesPiecesAndComputesTheGlobalShape) {
  // A 7 x 3 tensor on 2 ranks by torch.chunk (4 + 3 rows), a replicated norm in file 1 only,
  // and an empty shard of a 1 x 4 tensor recorded at offset 1 (the dimension's size), as torch
  // writes it.
  const auto h0 = header_of({{"w", {4, 3}}, {"b", {1, 4}}});
  const auto h1 = header_of({{"w", {3, 3}}, {"norm", {5}}, {"b", {0, 4}}});
  const kshard::detail::ShardingInfo i0{{"w", {0, 0}}, {"b", {0, 0}}};
  const kshard::detail::ShardingInfo i1{{"w", {4, 0}}, {"norm", {0}}, {"b", {1, 0}}};
  const std::vector<kshard::detail::PieceSource> files{{"a", &h0, &i0}, {"b", &h1, &i1}};
  const auto tensors = kshard::detail::stored_tensors(files);
  ASSERT_EQ(tensors.size(), 3u);
  const auto& w = tensors.at("w");
  EXPECT_EQ(w.shape, (Shape{7, 3}));
  ASSERT_EQ(w.pieces.size(), 2u);
  EXPECT_EQ(w.pieces[1].file, 1u);
  EXPECT_EQ(w.pieces[1].offsets, (Shape{4, 0}));
  EXPECT_EQ(w.pieces[1].file_offset, h1.data_offset + h1.find("w")->begin);
  EXPECT_EQ(tensors.at("b").shape, (Shape{1, 4}));
  EXPECT_EQ(tensors.at("norm").shape, (Shape{5}));
  EXPECT_EQ(w.bytes(), 7u * 3u * 4u);
}

TEST(Tiling, RefusesEveryLie) {
  const auto h4 = header_of({{"w", {4, 3}}});
  const auto h4f16 = header_of({{"w", {4, 3}}}, kshard::io::Dtype::F16);
  const auto h1d = header_of({{"w", {12}}});
  const auto tile = [](const kshard::io::SafetensorsHeader& a, kshard::detail::ShardingInfo ia,
                       const kshard::io::SafetensorsHeader& b, kshard::detail::ShardingInfo ib) {
    const std::vector<kshard::detail::PieceSource> files{{"a", &a, &ia}, {"b", &b, &ib}};
    return error_of([&] { kshard::detail::stored_tensors(files); });
  };
  EXPECT_NE(tile(h4, {{"w", {0, 0}}}, h4, {{"w", {2, 0}}})
                .find("overlap: 'a' holds [0:4, 0:3] "
                      "and 'b' holds [2:6, 0:3]"),
            std::string::npos);
  EXPECT_NE(tile(h4, {{"w", {0, 0}}}, h4, {{"w", {5, 0}}}).find("cover 24 of its 27 elements"),
            std::string::npos);
  EXPECT_NE(tile(h4, {{"w", {0, 0}}}, h4f16, {{"w", {4, 0}}})
                .find("is F32 of rank 2 in 'a' but "
                      "F16 of rank 2 in 'b'"),
            std::string::npos);
  EXPECT_NE(tile(h4, {{"w", {0, 0}}}, h1d, {{"w", {0}}}).find("of rank 1 in 'b'"),
            std::string::npos);
  EXPECT_NE(tile(h4, {{"w", {0, 0}}, {"x", {0}}}, h4, {{"w", {4, 0}}})
                .find("of 'a' names tensor 'x', which the file does not hold"),
            std::string::npos);
  EXPECT_NE(tile(h4, {{"w", {0, 0}}}, h4, {})
                .find("'b' holds tensor 'w' but its "
                      "DCP_SHARDING_INFO gives no offsets"),
            std::string::npos);
  EXPECT_NE(tile(h4, {{"w", {0, 0}}}, h4, {{"w", {4}}}).find("1 saved offsets; it needs 2"),
            std::string::npos);
  EXPECT_NE(tile(h4, {{"w", {0, 0}}}, h4, {{"w", {std::int64_t{1} << 40, 0}}})
                .find("cover 24 of its 3298534883340 elements"),
            std::string::npos);
  EXPECT_NE(
      tile(h4, {{"w", {0, 0}}}, h4, {{"w", {std::int64_t{1} << 62, 0}}}).find("passes INT64_MAX"),
      std::string::npos);
  const auto scalar = header_of({{"s", {}}});
  EXPECT_NE(tile(scalar, {{"s", {}}}, scalar, {{"s", {}}}).find("overlap"), std::string::npos);
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
