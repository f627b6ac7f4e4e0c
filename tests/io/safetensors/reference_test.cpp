// kshard's reader against the reference implementation: files written by PyPI safetensors
// (tests/io/safetensors/make_reference.py, run by ctest as io_reference_files) and what safe_open
// reports about them in reference.json. Skipped when the files were not made.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kshard/io/safetensors/header.hpp"
#include "safetensors_test_support.hpp"

#ifndef KSHARD_IO_REFERENCE_DIR
#error "define KSHARD_IO_REFERENCE_DIR: where make_reference.py writes its files"
#endif

namespace {

namespace fs = std::filesystem;
using kshard::io::SafetensorsHeader;

const fs::path reference_dir = KSHARD_IO_REFERENCE_DIR;

std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars{std::istreambuf_iterator<char>(in), {}};
  std::vector<std::byte> bytes(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) bytes[i] = static_cast<std::byte>(chars[i]);
  return bytes;
}

// The tensors in offset order, as TensorSpecs to write them again.
std::vector<kshard::io::TensorSpec> specs_of(const SafetensorsHeader& header) {
  std::vector<kshard::io::TensorSpec> specs;
  for (const auto& tensor : header.tensors)
    specs.push_back({tensor.name, tensor.dtype, tensor.shape});
  return specs;
}

void expect_as_reported(const SafetensorsHeader& header, const nlohmann::json& reported) {
  EXPECT_EQ(header.header_length, reported.at("header_length").get<std::uint64_t>());
  EXPECT_EQ(header.data_offset + header.data_size, reported.at("file_size").get<std::uint64_t>());
  using Metadata = std::map<std::string, std::string>;
  const auto& metadata = reported.at("metadata");
  EXPECT_EQ(header.metadata, metadata.is_null() ? Metadata{} : metadata.get<Metadata>());
  const auto& tensors = reported.at("tensors");
  ASSERT_EQ(header.tensors.size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& tensor = header.tensors[i];
    SCOPED_TRACE(tensor.name);
    EXPECT_EQ(tensor.name, tensors[i].at("name").get<std::string>());
    EXPECT_EQ(kshard::io::to_string(tensor.dtype), tensors[i].at("dtype").get<std::string>());
    EXPECT_EQ(tensor.shape, tensors[i].at("shape").get<std::vector<std::int64_t>>());
    EXPECT_EQ(tensor.begin, tensors[i].at("begin").get<std::uint64_t>());
    EXPECT_EQ(tensor.end, tensors[i].at("end").get<std::uint64_t>());
  }
}

TEST(SafetensorsReference, ReadsWhatTheReferenceWrote) {
  const fs::path listing = reference_dir / "reference.json";
  if (!fs::exists(listing))
    GTEST_SKIP() << "no " << listing
                 << ": tests/io/safetensors/make_reference.py has not written the "
                 << "reference files (ctest runs it as io_reference_files when python3 can "
                 << "import safetensors and numpy: pip install safetensors numpy)";
  std::ifstream in(listing);
  const auto reported_files = nlohmann::json::parse(in).at("files");
  ASSERT_FALSE(reported_files.empty());
  for (const auto& reported : reported_files) {
    const auto name = reported.at("file").get<std::string>();
    SCOPED_TRACE(name);
    const std::vector<std::byte> file = read_file(reference_dir / name);
    const SafetensorsHeader header = kshard_io_test::read_header(file);
    expect_as_reported(header, reported);
    // The reference writes its metadata from a hash map, in no fixed order: with more than one
    // entry, only the content can match.
    if (header.metadata.size() > 1) continue;
    const auto rewritten = kshard::io::serialize_safetensors_header(
        kshard::io::make_safetensors_header(specs_of(header), header.metadata));
    EXPECT_EQ(rewritten,
              std::vector<std::byte>(
                  file.begin(), file.begin() + static_cast<std::ptrdiff_t>(header.data_offset)));
  }
}

}  // namespace
