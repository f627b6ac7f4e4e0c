#pragma once

// Whole-file images for the safetensors header tests, read the way a reader reads a file: the
// 8-byte prefix first, then the header it announces; and the message a refusal carries.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/io/safetensors/header.hpp"

namespace kshard_io_test {

// The message kshard::error carries for `f`, or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kshard::error& e) {
    return e.what();
  }
  return "";
}

// A file of the prefix `header_length`, the bytes of `json`, and `data_size` zero bytes.
inline std::vector<std::byte> file_image(std::uint64_t header_length, std::string_view json,
                                         std::uint64_t data_size) {
  std::vector<std::byte> file(8);
  for (std::size_t i = 0; i < 8; ++i)
    file[i] = static_cast<std::byte>(header_length >> (8 * i) & 0xff);
  for (const char c : json) file.push_back(static_cast<std::byte>(c));
  file.resize(file.size() + data_size);
  return file;
}

// A file whose prefix tells the length of `json` truly.
inline std::vector<std::byte> file_image(std::string_view json, std::uint64_t data_size = 0) {
  return file_image(json.size(), json, data_size);
}

// header_length_from_prefix, then parse_safetensors_header on the bytes it announces. A file
// shorter than 8 bytes gets a zero-padded prefix: the file size must refuse it.
inline kshard::io::SafetensorsHeader read_header(std::span<const std::byte> file) {
  std::array<std::byte, 8> prefix{};
  std::copy_n(file.begin(), std::min<std::size_t>(file.size(), 8), prefix.begin());
  const std::uint64_t length = kshard::io::header_length_from_prefix(prefix, file.size());
  return kshard::io::parse_safetensors_header(file.subspan(8, length), file.size());
}

// The message of the kshard::error reading `file` throws, or "" when it reads.
inline std::string error_message(std::span<const std::byte> file) {
  try {
    static_cast<void>(read_header(file));
  } catch (const kshard::error& error) {
    return error.what();
  }
  return "";
}

// Success when reading `file` throws kshard::error with `expected` in its message.
inline ::testing::AssertionResult fails_with(std::span<const std::byte> file,
                                             std::string_view expected) {
  const std::string message = error_message(file);
  if (message.empty())
    return ::testing::AssertionFailure()
           << "no kshard::error, expected one with \"" << expected << "\"";
  if (message.find(expected) == std::string::npos)
    return ::testing::AssertionFailure()
           << "message \"" << message << "\" lacks \"" << expected << "\"";
  return ::testing::AssertionSuccess();
}

// fails_with for a file holding `json` and `data_size` data bytes.
inline ::testing::AssertionResult json_fails_with(std::string_view json, std::string_view expected,
                                                  std::uint64_t data_size = 0) {
  return fails_with(file_image(json, data_size), expected);
}

}  // namespace kshard_io_test
