#pragma once

/// \file
/// A safetensors file opened on a mesh: its validated header on every rank, and the element
/// types kshard reads from and writes to it (`dtype_of`). Reading and writing its tensors:
/// kshard/io/safetensors.hpp.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "kshard/bfloat16.hpp"
#include "kshard/comm/agreement.hpp"
#include "kshard/detail/element.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"
#include "kshard/float16.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/safetensors/header.hpp"
#include "kshard/mesh.hpp"

namespace kshard::detail {

// What a rank found in a file's first bytes.
struct HeaderBytes {
  std::optional<std::string> problem;
  std::uint64_t file_size = 0;
  std::vector<std::byte> json;
};

// An error of the header parser about the file at `path`, its "kshard::io: " said once.
inline std::string about_file(std::string_view path, std::string_view what) {
  constexpr std::string_view prefix = "kshard::io: ";
  if (what.starts_with(prefix)) what.remove_prefix(prefix.size());
  return fmt::format("kshard::io: '{}': {}", path, what);
}

// This rank's read of the length prefix and the header JSON (the only bytes a header needs).
inline HeaderBytes read_header_bytes(const std::string& path) {
  HeaderBytes result;
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; fstat then refuses it.
  const ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  struct stat info {};
  if (!fd) {
    result.problem = fmt::format("kshard::io: cannot open '{}': {}", path, std::strerror(errno));
  } else if (::fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode)) {
    result.problem = fmt::format("kshard::io: '{}' is not a regular file", path);
  } else {
    result.file_size = static_cast<std::uint64_t>(info.st_size);
    std::array<std::byte, 8> prefix{};
    try {
      if (result.file_size < 8)
        throw error(fmt::format(
            "kshard::io: '{}' has {} bytes, fewer than the 8 of a safetensors header length", path,
            result.file_size));
      result.problem = pread_exactly(fd.get(), prefix.data(), 8, 0, path);
      if (!result.problem) {
        result.json.resize(io::header_length_from_prefix(prefix, result.file_size));
        result.problem = pread_exactly(fd.get(), result.json.data(), result.json.size(), 8, path);
      }
    } catch (const error& e) {
      result.problem = about_file(path, e.what());
    }
  }
  return result;
}

}  // namespace kshard::detail

namespace kshard::io {

static_assert(std::endian::native == std::endian::little,
              "kshard::io reads safetensors (little-endian) elements as they are stored");

/// The safetensors dtype that stores elements of `T`: F32, F64, BF16 or F16 (the element
/// table's, detail/element.hpp).
template <class T>
constexpr Dtype dtype_of() {
  if constexpr (detail::TableElement<T> && !std::is_integral_v<T>) {
    for (const detail::DtypeInfo& info : detail::dtype_table)
      if (info.name == detail::element_info<T>().safetensors_dtype) return info.dtype;
    throw error("kshard::io: the element table names a dtype safetensors lacks");
  } else {
    static_assert(sizeof(T) == 0,
                  "kshard::io reads and writes float, double, kshard::bf16 and kshard::f16");
  }
}

/// A safetensors file whose validated header every rank holds. Opened collectively; holds no
/// file handle (reads and writes open the file on the mesh they use).
class SafetensorsFile {
 public:
  /// Collective over `mesh`: every rank reads the header and validates it. Every rank throws
  /// the same `kshard::error` for a path that differs between ranks, a file that cannot be
  /// opened, any header parse_safetensors_header refuses, and a file whose size or header
  /// differs between ranks (node-local copies that are not the same checkpoint).
  template <std::size_t N>
  SafetensorsFile(const Mesh<N>& mesh, std::filesystem::path path) : path_(std::move(path)) {
    const detail::Operation operation("io::SafetensorsFile");
    const comm::Group& group = mesh.group();
    detail::Agreement same_path(group);
    detail::same_text(same_path, "the file path", path_.string());
    same_path.settle();
    // Every rank reads the header itself (a small read; the data are read by their owners
    // only): a rank that sees another file under this path is refused here rather than
    // reading rows of another layout later.
    const detail::HeaderBytes bytes = detail::read_header_bytes(path_.string());
    detail::Agreement same_file(group);
    same_file.problem(bytes.problem)
        .same(fmt::format("the size of '{}'", path_.string()),
              static_cast<std::int64_t>(bytes.file_size))
        .same(fmt::format("the header of '{}' (the same path holds another file)", path_.string()),
              detail::Digest()
                  .add(std::string_view(reinterpret_cast<const char*>(bytes.json.data()),
                                        bytes.json.size()))
                  .value(),
              [](std::int64_t) { return ""; })
        .settle();
    try {
      header_ = parse_safetensors_header(bytes.json, bytes.file_size);
    } catch (const error& e) {  // the same bytes on every rank: the same message
      throw error(detail::about_file(path_.string(), e.what()));
    }
  }

  /// The file's path.
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// The validated header.
  [[nodiscard]] const SafetensorsHeader& header() const { return header_; }
  /// The file's size in bytes.
  [[nodiscard]] std::uint64_t file_size() const { return header_.data_offset + header_.data_size; }
  /// Byte offset of tensor `entry`'s first element in the file.
  [[nodiscard]] std::uint64_t file_offset(const TensorEntry& entry) const {
    return header_.data_offset + entry.begin;
  }

 private:
  std::filesystem::path path_;
  SafetensorsHeader header_;
};

}  // namespace kshard::io
