// Safetensors files' tensors as pieces (io/safetensors/pieces.hpp, sharding_info.hpp, and the
// tiling of io/engine/tiling.hpp): DCP_SHARDING_INFO parsed, pieces tiled into global tensors,
// and every lie refused.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/io/safetensors/pieces.hpp"
#include "kshard/io/safetensors/sharding_info.hpp"
#include "safetensors_test_support.hpp"

namespace {

using Shape = std::vector<std::int64_t>;

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

}  // namespace
