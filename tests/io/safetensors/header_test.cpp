// The safetensors header reader on valid headers and on every kind of broken one, and the
// writer: its bytes against the reference implementation's own test vectors, and read-back.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kshard/io/safetensors/header.hpp"
#include "safetensors_test_support.hpp"

namespace {

using kshard::io::Dtype;
using kshard::io::SafetensorsHeader;
using kshard::io::TensorSpec;
using kshard_io_test::error_message;
using kshard_io_test::fails_with;
using kshard_io_test::file_image;
using kshard_io_test::json_fails_with;
using kshard_io_test::read_header;

std::vector<std::byte> bytes_of(std::string_view text) {
  std::vector<std::byte> out;
  for (const char c : text) out.push_back(static_cast<std::byte>(c));
  return out;
}

// --- Dtypes -------------------------------------------------------------------------------

TEST(SafetensorsDtype, SizesAndSpellingsRoundTrip) {
  const std::map<std::string, std::uint64_t> sizes{
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},   {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},     {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8}, {"U64", 8},  {"F8_E8M0", 1}};
  for (const auto& [name, size] : sizes) {
    const Dtype dtype = kshard::io::parse_dtype(name);
    EXPECT_EQ(kshard::io::to_string(dtype), name);
    EXPECT_EQ(kshard::io::dtype_size(dtype), size) << name;
  }
}

TEST(SafetensorsDtype, UnknownSpellingIsNamed) {
  for (const char* name : {"F4", "f32", "", "F32 ", "C64"}) {
    try {
      static_cast<void>(kshard::io::parse_dtype(name));
      ADD_FAILURE() << name;
    } catch (const kshard::error& error) {
      EXPECT_NE(std::string(error.what()).find("unknown dtype '" + std::string(name) + "'"),
                std::string::npos)
          << error.what();
    }
  }
}

// --- Valid headers --------------------------------------------------------------------------

TEST(SafetensorsHeader, SeveralDtypesSortedByOffset) {
  // Listed out of offset order, as some writers do; 24 + 8 + 8 + 3 = 43 data bytes.
  const std::string json = R"({"u":{"dtype":"U8","shape":[3],"data_offsets":[40,43]},)"
                           R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                           R"("h":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)"
                           R"("step":{"dtype":"I64","shape":[],"data_offsets":[32,40]}})";
  const SafetensorsHeader header = read_header(file_image(json, 43));
  EXPECT_EQ(header.header_length, json.size());
  EXPECT_EQ(header.data_offset, 8 + json.size());
  EXPECT_EQ(header.data_size, 43u);
  EXPECT_TRUE(header.metadata.empty());
  ASSERT_EQ(header.tensors.size(), 4u);
  EXPECT_EQ(header.tensors[0].name, "w");
  EXPECT_EQ(header.tensors[1].name, "h");
  EXPECT_EQ(header.tensors[2].name, "step");
  EXPECT_EQ(header.tensors[3].name, "u");

  const auto* w = header.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, Dtype::F32);
  EXPECT_EQ(w->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(w->elements(), 6);
  EXPECT_EQ(w->bytes(), 24u);
  const auto* step = header.find("step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->dtype, Dtype::I64);
  EXPECT_TRUE(step->shape.empty());
  EXPECT_EQ(step->elements(), 1);
  EXPECT_EQ(step->begin, 32u);
  EXPECT_EQ(step->end, 40u);
  EXPECT_EQ(header.find("missing"), nullptr);
}

TEST(SafetensorsHeader, EveryDtype) {
  std::string json = "{";
  std::uint64_t offset = 0;
  for (const auto& info : kshard::detail::dtype_table) {
    const std::uint64_t end = offset + 3 * info.size;
    json += (offset == 0 ? "\"" : ",\"") + std::string(info.name) + R"(":{"dtype":")" +
            std::string(info.name) + R"(","shape":[3],"data_offsets":[)" + std::to_string(offset) +
            "," + std::to_string(end) + "]}";
    offset = end;
  }
  json += "}";
  const SafetensorsHeader header = read_header(file_image(json, offset));
  ASSERT_EQ(header.tensors.size(), kshard::detail::dtype_table.size());
  for (const auto& info : kshard::detail::dtype_table) {
    const auto* tensor = header.find(info.name);
    ASSERT_NE(tensor, nullptr) << info.name;
    EXPECT_EQ(tensor->dtype, info.dtype);
    EXPECT_EQ(tensor->bytes(), 3 * info.size);
  }
}

TEST(SafetensorsHeader, EmptyTensorsWithAZeroInTheShape) {
  const std::string json = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                           R"("b":{"dtype":"F64","shape":[3,0,2],"data_offsets":[0,0]},)"
                           R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("z":{"dtype":"U8","shape":[0,0],"data_offsets":[8,8]}})";
  const SafetensorsHeader header = read_header(file_image(json, 8));
  ASSERT_EQ(header.tensors.size(), 4u);
  // Ties at one offset keep the header's order.
  EXPECT_EQ(header.tensors[0].name, "a");
  EXPECT_EQ(header.tensors[1].name, "b");
  EXPECT_EQ(header.tensors[2].name, "x");
  EXPECT_EQ(header.tensors[3].name, "z");
  EXPECT_EQ(header.find("b")->elements(), 0);
  EXPECT_EQ(header.find("b")->bytes(), 0u);
}

TEST(SafetensorsHeader, ExtentAtInt64MaxWithAZeroIsEmpty) {
  const std::string json =
      R"({"e":{"dtype":"F64","shape":[9223372036854775807,0],"data_offsets":[0,0]}})";
  const SafetensorsHeader header = read_header(file_image(json));
  EXPECT_EQ(header.tensors.at(0).shape.at(0), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(header.tensors.at(0).bytes(), 0u);
}

TEST(SafetensorsHeader, NoTensors) {
  for (const char* json : {"{}", "{}      ", " \t\r\n{ } \n", R"({"__metadata__":{}})"}) {
    const SafetensorsHeader header = read_header(file_image(json));
    EXPECT_TRUE(header.tensors.empty()) << json;
    EXPECT_TRUE(header.metadata.empty()) << json;
    EXPECT_EQ(header.data_size, 0u);
  }
}

TEST(SafetensorsHeader, Metadata) {
  const std::string json = R"({"__metadata__":{"format":"pt","note":"caf\u00e9 \"quoted\"","":""},)"
                           R"("w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  const SafetensorsHeader header = read_header(file_image(json, 4));
  const std::map<std::string, std::string> expected{
      {"format", "pt"}, {"note", "caf\xC3\xA9 \"quoted\""}, {"", ""}};
  EXPECT_EQ(header.metadata, expected);
  EXPECT_EQ(header.tensors.size(), 1u);
}

TEST(SafetensorsHeader, UnalignedHeaderLength) {
  const std::string json = R"({"w":{"dtype":"U8","shape":[5],"data_offsets":[0,5]}})";
  ASSERT_NE(json.size() % 8, 0u);
  const SafetensorsHeader header = read_header(file_image(json, 5));
  EXPECT_EQ(header.header_length, json.size());
  EXPECT_EQ(header.data_offset, 8 + json.size());
  EXPECT_EQ(header.data_size, 5u);
}

TEST(SafetensorsHeader, NamesAreAnyUnicodeString) {
  const std::string json = R"({"\u03b5.bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("a\"b\\c\u0000":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  const SafetensorsHeader header = read_header(file_image(json, 8));
  EXPECT_NE(header.find("\xCE\xB5.bias"), nullptr);
  EXPECT_NE(header.find(std::string("a\"b\\c\0", 6)), nullptr);
}

// --- The prefix and the file size ---------------------------------------------------------

TEST(SafetensorsHeaderBad, TruncatedFile) {
  for (std::size_t size = 0; size < 8; ++size)
    EXPECT_TRUE(fails_with(std::vector<std::byte>(size),
                           "the file has " + std::to_string(size) +
                               " bytes, fewer than the 8 of the header length prefix"));
  std::vector<std::byte> file =
      file_image(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4);
  file.resize(file.size() - 10);  // cuts into the header
  EXPECT_TRUE(fails_with(file, "bytes: only"));
}

TEST(SafetensorsHeaderBad, HeaderLengthBeyondTheFile) {
  EXPECT_TRUE(fails_with(file_image(100, "{}", 0),
                         "the header length is 100 bytes, but the file has 10 bytes: only 2 "
                         "after the 8-byte prefix"));
  std::array<std::byte, 8> prefix{};
  prefix.fill(std::byte{0xff});  // 2^64 - 1: 8 + N would wrap
  EXPECT_THROW(static_cast<void>(kshard::io::header_length_from_prefix(prefix, 1000)),
               kshard::error);
}

TEST(SafetensorsHeaderBad, HeaderLengthOverTheCap) {
  const std::uint64_t cap = kshard::io::max_safetensors_header_length;
  std::array<std::byte, 8> prefix{};
  for (std::size_t i = 0; i < 8; ++i)
    prefix[i] = static_cast<std::byte>((cap + 1) >> (8 * i) & 0xff);
  try {
    static_cast<void>(kshard::io::header_length_from_prefix(prefix, std::uint64_t{1} << 40));
    ADD_FAILURE();
  } catch (const kshard::error& error) {
    EXPECT_STREQ(error.what(),
                 "kshard::io: the header length is 100000001 bytes, over the limit of 100000000");
  }
  prefix[0] = static_cast<std::byte>(cap & 0xff);  // the cap itself is allowed
  EXPECT_EQ(kshard::io::header_length_from_prefix(prefix, std::uint64_t{1} << 40), cap);
}

TEST(SafetensorsHeaderBad, ParseChecksTheLengthItself) {
  const std::vector<std::byte> json = bytes_of("{}");
  EXPECT_THROW(static_cast<void>(kshard::io::parse_safetensors_header(json, 9)), kshard::error);
  EXPECT_THROW(static_cast<void>(kshard::io::parse_safetensors_header(json, 4)), kshard::error);
  EXPECT_NO_THROW(static_cast<void>(kshard::io::parse_safetensors_header(json, 10)));
}

// --- JSON ------------------------------------------------------------------------------------

TEST(SafetensorsHeaderBad, InvalidJson) {
  for (const char* json : {"", " ", "{", R"({"w":)", "{'w':1}", R"({"w":{"dtype":"F32",}})", "{}x",
                           "{}{}", "{/* comment */}", "{} // comment", R"({"w" 1})", "{,}", "NaN"})
    EXPECT_TRUE(json_fails_with(json, "the header is not valid JSON (at byte ")) << json;
  // Only whitespace may follow, not the NUL bytes some writers pad with.
  EXPECT_TRUE(fails_with(file_image(std::string_view("{}\0\0", 4)),
                         "the header has a NUL byte at byte 10 of the file"));
  EXPECT_TRUE(fails_with(file_image(std::string_view("{}\0x", 4)), "NUL byte at byte 10"));
}

TEST(SafetensorsHeaderBad, NotUtf8) {
  for (const char* json :
       {"{\"\xff\":1}", "{\"\xC0\xAF\":1}", "{\"\xED\xA0\x80\":1}", "{\"\xF4\x90\x80\x80\":1}",
        "{\"a\xE2\x82\":1}", "{}\xC2\xA0", R"({"\ud800":1})", R"({"\udc00x":1})"})
    EXPECT_TRUE(json_fails_with(json, "the header is not valid JSON")) << json;
  EXPECT_TRUE(json_fails_with("\xEF\xBB\xBF{}", "byte order mark"));
}

TEST(SafetensorsHeaderBad, JsonThatIsNotAnObject) {
  EXPECT_TRUE(json_fails_with("[]", "the header is an array, not a JSON object"));
  EXPECT_TRUE(json_fails_with(R"("w")", "the header is a string, not a JSON object"));
  EXPECT_TRUE(json_fails_with("12", "the header is a number, not a JSON object"));
  EXPECT_TRUE(json_fails_with("-1", "the header is a number, not a JSON object"));
  EXPECT_TRUE(json_fails_with("1.5", "the header is a number, not a JSON object"));
  EXPECT_TRUE(json_fails_with("null", "the header is null, not a JSON object"));
  EXPECT_TRUE(json_fails_with("true", "the header is a boolean, not a JSON object"));
}

TEST(SafetensorsHeaderBad, ErrorMessagesAreEscapedAndBounded) {
  // A raw control character ends the JSON; nlohmann's message quotes the long token before it.
  const std::string long_token = "{\"" + std::string(100'000, 'x') + "\x01\":1}";
  EXPECT_LT(error_message(file_image(long_token)).size(), 400u);
  const std::string long_name = "{\"" + std::string(100'000, 'x') + "\":1}";
  EXPECT_LT(error_message(file_image(long_name)).size(), 200u);
  EXPECT_TRUE(json_fails_with(R"({"a\n\u0001'\\\u00e9":1})",
                              R"(tensor 'a\x0a\x01'\x5c\xc3\xa9' is a number)"));
}

// --- Fields ----------------------------------------------------------------------------------

TEST(SafetensorsHeaderBad, TensorThatIsNotAnObject) {
  for (const char* value : {"1", "[0,4]", R"("F32")", "null", "false"})
    EXPECT_TRUE(json_fails_with(R"({"w":)" + std::string(value) + "}",
                                "not an object with dtype, shape and data_offsets"))
        << value;
}

TEST(SafetensorsHeaderBad, MissingField) {
  EXPECT_TRUE(
      json_fails_with(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", "tensor 'w' has no dtype"));
  EXPECT_TRUE(
      json_fails_with(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", "tensor 'w' has no shape"));
  EXPECT_TRUE(
      json_fails_with(R"({"w":{"dtype":"U8","shape":[1]}})", "tensor 'w' has no data_offsets"));
  EXPECT_TRUE(json_fails_with(R"({"w":{}})", "tensor 'w' has no dtype"));
}

TEST(SafetensorsHeaderBad, ExtraOrRepeatedField) {
  EXPECT_TRUE(
      json_fails_with(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"offsets":[0,1]}})",
                      "tensor 'w' has an unknown field 'offsets'", 1));
  EXPECT_TRUE(
      json_fails_with(R"({"w":{"dtype":"U8","Dtype":"U8","shape":[1]}})", "unknown field 'Dtype'"));
  EXPECT_TRUE(
      json_fails_with(R"({"w":{"dtype":"U8","shape":[1],"dtype":"U8","data_offsets":[0,1]}})",
                      "tensor 'w' has the field 'dtype' twice", 1));
}

TEST(SafetensorsHeaderBad, MistypedField) {
  const char* tail = R"(,"data_offsets":[0,1]}})";
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":1,"shape":[1])" + std::string(tail),
                              "the dtype of tensor 'w' is a number, not a string"));
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":["U8"],"shape":[1])" + std::string(tail),
                              "the dtype of tensor 'w' is an array, not a string"));
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":"U8","shape":1})",
                              "the shape of tensor 'w' is a number, not an array of "
                              "non-negative integers"));
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":"U8","shape":{"0":1}})",
                              "the shape of tensor 'w' is an object"));
  EXPECT_TRUE(
      json_fails_with(R"({"w":{"dtype":"U8","shape":"1"})", "the shape of tensor 'w' is a string"));
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":null}})",
                              "the data_offsets of tensor 'w' is null"));
}

TEST(SafetensorsHeaderBad, UnknownDtype) {
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}})",
                              "tensor 'w' has unknown dtype 'F4' (safetensors dtypes: BOOL U8"));
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})",
                              "unknown dtype 'f32'"));
}

TEST(SafetensorsHeaderBad, ShapeEntries) {
  const auto shape = [](const std::string& entries) {
    return R"({"w":{"dtype":"U8","shape":[)" + entries + R"(],"data_offsets":[0,0]}})";
  };
  EXPECT_TRUE(json_fails_with(shape("2,-1"),
                              "tensor 'w' has shape entry 1 that is -1, not a "
                              "non-negative integer"));
  EXPECT_TRUE(json_fails_with(shape("1.5"), "shape entry 0 that is '1.5', not a non-negative"));
  EXPECT_TRUE(json_fails_with(shape("1.0"), "shape entry 0 that is '1.0'"));
  EXPECT_TRUE(json_fails_with(shape("1e3"), "shape entry 0 that is '1e3'"));
  EXPECT_TRUE(json_fails_with(shape("18446744073709551616"), "that is '18446744073709551616'"));
  EXPECT_TRUE(json_fails_with(shape("9223372036854775808"),
                              "tensor 'w' has shape entry 9223372036854775808 at dimension 0, "
                              "over INT64_MAX = 9223372036854775807"));
  EXPECT_TRUE(json_fails_with(shape(R"("2")"), "shape entry 0 that is a string"));
  EXPECT_TRUE(json_fails_with(shape("null"), "shape entry 0 that is null"));
  EXPECT_TRUE(json_fails_with(shape("true"), "shape entry 0 that is a boolean"));
  EXPECT_TRUE(json_fails_with(shape("[2]"), "shape entry 0 that is an array"));
  EXPECT_TRUE(json_fails_with(shape("{}"), "shape entry 0 that is an object"));
}

TEST(SafetensorsHeaderBad, ShapeProductOverflow) {
  EXPECT_TRUE(json_fails_with(
      R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
      "tensor 'w' has shape [4294967296, 4294967296] (rank 2) whose element count passes "
      "INT64_MAX = 9223372036854775807 at dimension 1"));
  // Checked left to right as the reference does: a later 0 does not excuse the overflow.
  EXPECT_TRUE(json_fails_with(
      R"({"w":{"dtype":"U8","shape":[4611686018427387904,2,0],"data_offsets":[0,0]}})",
      "passes INT64_MAX"));
  // Elements fit int64, bytes do not fit 64 bits.
  EXPECT_TRUE(json_fails_with(
      R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})",
      "tensor 'w' has 4611686018427387904 elements of F64, more bytes than a 64-bit size holds"));
}

TEST(SafetensorsHeaderBad, DataOffsetsEntries) {
  const auto offsets = [](const std::string& entries) {
    return R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[)" + entries + "]}}";
  };
  EXPECT_TRUE(json_fails_with(offsets(""), "tensor 'w' has 0 data_offsets; it needs [begin, end]"));
  EXPECT_TRUE(json_fails_with(offsets("4"), "tensor 'w' has 1 data_offsets"));
  EXPECT_TRUE(json_fails_with(offsets("0,4,8"), "tensor 'w' has more than 2 data_offsets", 8));
  EXPECT_TRUE(json_fails_with(offsets("-1,3"), "data_offsets entry 0 that is -1"));
  EXPECT_TRUE(json_fails_with(offsets("0,4.0"), "data_offsets entry 1 that is '4.0'"));
  EXPECT_TRUE(json_fails_with(offsets("0,\"4\""), "data_offsets entry 1 that is a string"));
  EXPECT_TRUE(json_fails_with(offsets("0,18446744073709551616"), "data_offsets entry 1"));
}

// --- Offsets against shapes and the data section ---------------------------------------------

TEST(SafetensorsHeaderBad, ByteSizeDiffersFromTheOffsets) {
  EXPECT_TRUE(json_fails_with(
      R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
      "tensor 'w' has shape [2, 3] of F32, 24 bytes, but its data_offsets [0, 20] span 20", 20));
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,4]}})",
                              "0 bytes, but its data_offsets [0, 4] span 4", 4));
}

TEST(SafetensorsHeaderBad, OffsetsOutsideTheDataSection) {
  EXPECT_TRUE(json_fails_with(
      R"({"w":{"dtype":"U8","shape":[120],"data_offsets":[0,120]}})",
      "kshard::io: tensor 'w' ends at byte 120 of the data section, which has 100 bytes", 100));
  EXPECT_TRUE(json_fails_with(
      R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}})",
      "ends at byte 18446744073709551615 of the data section, which has 0 bytes"));
}

TEST(SafetensorsHeaderBad, BeginAfterEnd) {
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}})",
                              "tensor 'w' begins at byte 8 of the data section but ends at byte 4",
                              8));
}

TEST(SafetensorsHeaderBad, Overlap) {
  EXPECT_TRUE(json_fails_with(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                              "tensor 'b' begins at byte 4 of the data section, inside the "
                              "tensors before it, which end at byte 8",
                              12));
  // The same bytes twice.
  EXPECT_TRUE(json_fails_with(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                              "begins at byte 0 of the data section, inside", 4));
}

TEST(SafetensorsHeaderBad, Gap) {
  EXPECT_TRUE(json_fails_with(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
                              "no tensor owns bytes [4, 8) of the data section: the tensors "
                              "before 'b' end at byte 4",
                              12));
  EXPECT_TRUE(json_fails_with(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                              "no tensor owns bytes [0, 4)", 8));
}

TEST(SafetensorsHeaderBad, DataSectionNotCovered) {
  EXPECT_TRUE(json_fails_with(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                              "no tensor owns bytes [4, 6) of the data section, which has 6 bytes",
                              6));
  EXPECT_TRUE(json_fails_with("{}", "no tensor owns bytes [0, 1) of the data section", 1));
}

// --- Names and metadata ----------------------------------------------------------------------

TEST(SafetensorsHeaderBad, DuplicateNames) {
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                              "the tensor name 'w' appears twice", 8));
  // The same name spelled with an escape is the same name.
  EXPECT_TRUE(json_fails_with(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                              R"("\u0077":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})",
                              "the tensor name 'w' appears twice"));
  EXPECT_TRUE(json_fails_with(R"({"__metadata__":{},"__metadata__":{}})",
                              "the header has __metadata__ twice"));
}

TEST(SafetensorsHeaderBad, Metadata) {
  for (const char* value : {"1", "null", R"({"a":"b"})", R"(["b"])", "true"})
    EXPECT_TRUE(json_fails_with(R"({"__metadata__":{"k":)" + std::string(value) + "}}",
                                "__metadata__ value 'k' is "))
        << value;
  for (const char* value : {R"("pt")", "[]", "null", "0"})
    EXPECT_TRUE(json_fails_with(R"({"__metadata__":)" + std::string(value) + "}",
                                ", not an object of strings"))
        << value;
  EXPECT_TRUE(json_fails_with(R"({"__metadata__":{"k":"a","k":"b"}})",
                              "__metadata__ has the key 'k' twice"));
}

// --- Writing ---------------------------------------------------------------------------------

std::string text_of(const std::vector<std::byte>& bytes) {
  std::string out;
  for (const std::byte b : bytes) out += static_cast<char>(b);
  return out;
}

TEST(SafetensorsWriter, MatchesTheReferenceWritersTestVectors) {
  // safetensors/src/tensor.rs: test_serialization, test_serialization_forced_alignement and
  // test_empty, header part.
  const std::vector<TensorSpec> attn0{{"attn.0", Dtype::F32, {1, 2, 3}}};
  EXPECT_EQ(text_of(serialize_safetensors_header(kshard::io::make_safetensors_header(attn0))),
            std::string("@\0\0\0\0\0\0\0", 8) +
                R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})");
  const std::vector<TensorSpec> attn1{{"attn0", Dtype::F32, {1, 1, 2, 3}}};
  EXPECT_EQ(text_of(serialize_safetensors_header(kshard::io::make_safetensors_header(attn1))),
            std::string("H\0\0\0\0\0\0\0", 8) +
                R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       )");
  EXPECT_EQ(text_of(serialize_safetensors_header(kshard::io::make_safetensors_header({}))),
            std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  EXPECT_EQ(text_of(serialize_safetensors_header(
                kshard::io::make_safetensors_header({}, {{"framework", "pt"}}))),
            std::string("(\0\0\0\0\0\0\0", 8) + R"({"__metadata__":{"framework":"pt"}}     )");
}

TEST(SafetensorsWriter, ReadsBackAsWritten) {
  const std::vector<TensorSpec> specs{{"embed.weight", Dtype::BF16, {30522, 384}},
                                      {"empty", Dtype::F32, {0, 7}},
                                      {"step", Dtype::I64, {}},
                                      {"\xCE\xB5 \"odd\"\n", Dtype::BOOL, {3}},
                                      {"scale", Dtype::F8_E4M3, {5}}};
  const SafetensorsHeader header =
      kshard::io::make_safetensors_header(specs, {{"format", "pt"}, {"step", "1200"}});
  EXPECT_EQ(header.header_length % 8, 0u);
  EXPECT_EQ(header.data_size, 30522u * 384 * 2 + 8 + 3 + 5);
  EXPECT_EQ(header.tensors.at(2).begin, 30522u * 384 * 2);
  const std::vector<std::byte> bytes = serialize_safetensors_header(header);
  ASSERT_EQ(bytes.size(), header.data_offset);
  const SafetensorsHeader read = kshard::io::parse_safetensors_header(
      std::span(bytes).subspan(8), bytes.size() + header.data_size);
  EXPECT_EQ(read, header);
}

TEST(SafetensorsWriter, RewritesAParsedHeaderByteForByte) {
  // Empty tensors tie at one offset; the header order survives.
  const std::string json = R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                           R"("a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                           R"("m":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  std::string padded = json;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  const std::vector<std::byte> file = file_image(padded, 2);
  EXPECT_EQ(serialize_safetensors_header(read_header(file)),
            std::vector<std::byte>(file.begin(), file.end() - 2));
}

TEST(SafetensorsWriter, RefusesWhatAReaderWouldRefuse) {
  using Specs = std::vector<TensorSpec>;
  EXPECT_THROW(static_cast<void>(kshard::io::make_safetensors_header(
                   Specs{{"w", Dtype::U8, {1}}, {"w", Dtype::U8, {1}}})),
               kshard::error);
  EXPECT_THROW(static_cast<void>(
                   kshard::io::make_safetensors_header(Specs{{"__metadata__", Dtype::U8, {1}}})),
               kshard::error);
  EXPECT_THROW(
      static_cast<void>(kshard::io::make_safetensors_header(Specs{{"w", Dtype::U8, {-1}}})),
      kshard::error);
  EXPECT_THROW(
      static_cast<void>(kshard::io::make_safetensors_header(Specs{
          {"a", Dtype::U64, {std::int64_t{1} << 60}}, {"b", Dtype::U64, {std::int64_t{1} << 60}}})),
      kshard::error);
  EXPECT_THROW(
      static_cast<void>(kshard::io::make_safetensors_header(Specs{{"\xff", Dtype::U8, {1}}})),
      kshard::error);
  EXPECT_THROW(static_cast<void>(kshard::io::make_safetensors_header({}, {{"k", "\xC0\xAF"}})),
               kshard::error);

  SafetensorsHeader header =
      kshard::io::make_safetensors_header(Specs{{"a", Dtype::U8, {4}}, {"b", Dtype::U8, {4}}});
  SafetensorsHeader stale = header;
  stale.metadata["added"] = "after make";
  EXPECT_THROW(static_cast<void>(serialize_safetensors_header(stale)), kshard::error);
  SafetensorsHeader gap = header;
  gap.tensors[1].begin += 1;
  EXPECT_THROW(static_cast<void>(serialize_safetensors_header(gap)), kshard::error);
  SafetensorsHeader unsorted = header;
  std::swap(unsorted.tensors[0], unsorted.tensors[1]);
  EXPECT_THROW(static_cast<void>(serialize_safetensors_header(unsorted)), kshard::error);
  EXPECT_THROW(
      static_cast<void>(kshard::io::TensorEntry{"bad", static_cast<Dtype>(99), {1}, 0, 1}.bytes()),
      kshard::error);
}

}  // namespace
