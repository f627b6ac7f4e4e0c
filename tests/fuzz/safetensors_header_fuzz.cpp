// Fuzzes the safetensors header reader (kshard/io/safetensors/header.hpp). The input is a whole
// file image, read as a reader reads a file: header_length_from_prefix on its first 8 bytes
// (zero-padded when the file is shorter), then parse_safetensors_header on the bytes that
// announces. Each input must either throw kshard::error or give a header that keeps its promises:
// lengths that add up to the file size, tensors sorted, contiguous from byte 0 to the end of the
// data section, byte counts that match dtype and shape, unique names. A header read must also
// write back (make_safetensors_header + serialize_safetensors_header) and read again to the same
// tensors and metadata. Any other outcome traps; another exception aborts; ASan, UBSan and
// libFuzzer's -malloc_limit_mb / -rss_limit_mb catch the rest.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kshard/io/safetensors/header.hpp"

namespace {

namespace io = kshard::io;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

std::optional<io::SafetensorsHeader> read(std::span<const std::byte> file) {
  std::array<std::byte, 8> prefix{};
  std::copy_n(file.begin(), std::min<std::size_t>(file.size(), 8), prefix.begin());
  try {
    const std::uint64_t length = io::header_length_from_prefix(prefix, file.size());
    return io::parse_safetensors_header(file.subspan(8, length), file.size());
  } catch (const kshard::error&) {
    return std::nullopt;
  }
}

void check_lengths(const io::SafetensorsHeader& header, std::size_t file_size) {
  require(header.header_length <= io::max_safetensors_header_length);
  require(header.data_offset == 8 + header.header_length);
  require(header.data_offset + header.data_size == file_size);
}

void check_tensors(const io::SafetensorsHeader& header) {
  std::uint64_t covered = 0;
  for (const auto& tensor : header.tensors) {
    require(tensor.begin == covered && tensor.begin <= tensor.end);
    require(std::all_of(tensor.shape.begin(), tensor.shape.end(),
                        [](std::int64_t extent) { return extent >= 0; }));
    require(tensor.bytes() == tensor.end - tensor.begin);
    require(static_cast<std::uint64_t>(tensor.elements()) * io::dtype_size(tensor.dtype) ==
            tensor.bytes());
    require(io::parse_dtype(io::to_string(tensor.dtype)) == tensor.dtype);
    covered = tensor.end;
  }
  require(covered == header.data_size);
}

void check_names(const io::SafetensorsHeader& header) {
  std::vector<std::string_view> names;
  for (const auto& tensor : header.tensors) names.emplace_back(tensor.name);
  std::sort(names.begin(), names.end());
  require(std::adjacent_find(names.begin(), names.end()) == names.end());
  // find is a linear search: the first and last tensor are enough to check it.
  if (header.tensors.empty()) return;
  require(header.find(header.tensors.front().name) == &header.tensors.front());
  require(header.find(header.tensors.back().name) == &header.tensors.back());
}

// Throws (and so aborts the run) where the writer refuses what the reader accepted.
void check_round_trip(const io::SafetensorsHeader& header) {
  std::vector<io::TensorSpec> specs;
  for (const auto& tensor : header.tensors)
    specs.push_back({tensor.name, tensor.dtype, tensor.shape});
  const io::SafetensorsHeader written = io::make_safetensors_header(specs, header.metadata);
  require(written.tensors == header.tensors && written.metadata == header.metadata);
  require(written.data_size == header.data_size && written.data_offset % 8 == 0);
  const std::vector<std::byte> bytes = io::serialize_safetensors_header(written);
  require(bytes.size() == written.data_offset);
  const auto reread =
      io::parse_safetensors_header(std::span(bytes).subspan(8), bytes.size() + written.data_size);
  require(reread == written);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  const std::optional<io::SafetensorsHeader> header = read(file);
  if (!header) return 0;
  check_lengths(*header, size);
  check_tensors(*header);
  check_names(*header);
  check_round_trip(*header);
  return 0;
}
