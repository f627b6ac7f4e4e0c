// Fuzzes the reading of a folder of per-rank shards (torch's HuggingFaceStorageWriter layout)
// up to its stored tensors: kshard/io/safetensors/sharding_info.hpp and
// kshard/io/safetensors/pieces.hpp, and the byte runs of kshard/io/engine/box_runs.hpp over what
// they accept.
//
// The input is up to 4 files' header JSON (the bytes after the 8-byte length prefix), separated
// by NUL bytes (which a valid header cannot hold: the first 3 split, a 4th stays in the last
// file, whose JSON it breaks). Each file's size is its header and the data section its tensors
// claim (the largest data_offsets end), so that a header that agrees with itself reads. Each
// file is read with parse_safetensors_header; a file whose metadata has DCP_SHARDING_INFO has
// it read with parse_sharding_info; then stored_tensors tiles them all. Any step may throw
// kshard::error. What stored_tensors returns must keep its promises: every piece inside its
// tensor, no two sharing an element, their volumes summing to the tensor's, sorted by offsets,
// the global shape the maximum of offset + shape, each file's tensors all present. For a tensor
// of at most 4096 elements the runs that copy its pieces into one row-major buffer of the whole
// tensor must write each of its bytes exactly once, reading only the piece's bytes. Any other
// outcome traps; another exception aborts; ASan, UBSan and libFuzzer's -malloc_limit_mb /
// -rss_limit_mb catch the rest.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "kshard/error.hpp"
#include "kshard/io/engine/box_runs.hpp"
#include "kshard/io/model/stored_tensor.hpp"
#include "kshard/io/safetensors/header.hpp"
#include "kshard/io/safetensors/pieces.hpp"
#include "kshard/io/safetensors/sharding_info.hpp"

namespace {

namespace io = kshard::io;
namespace detail = kshard::detail;
using Shape = std::vector<std::int64_t>;

constexpr std::size_t max_files = 4;
constexpr std::int64_t max_copied_elements = 4096;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

// The input cut at its first max_files - 1 NUL bytes.
std::vector<std::string_view> split_files(std::string_view input) {
  std::vector<std::string_view> files;
  while (files.size() + 1 < max_files) {
    const std::size_t nul = input.find('\0');
    if (nul == std::string_view::npos) break;
    files.push_back(input.substr(0, nul));
    input.remove_prefix(nul + 1);
  }
  files.push_back(input);
  return files;
}

// The data size `json` claims: the largest end of a tensor's data_offsets (0 if none reads).
std::uint64_t claimed_data_size(std::string_view json) {
  const nlohmann::json header = nlohmann::json::parse(json, nullptr, false);
  std::uint64_t size = 0;
  if (header.is_discarded() || !header.is_object()) return size;
  for (const auto& [name, entry] : header.items()) {
    if (!entry.is_object()) continue;
    const auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2) continue;
    if ((*offsets)[1].is_number_unsigned())
      size = std::max(size, (*offsets)[1].get<std::uint64_t>());
  }
  return size;
}

// One file, parsed: its header and, where its metadata has it, its sharding info.
struct File {
  io::SafetensorsHeader header;
  std::optional<detail::ShardingInfo> info;
};

File read_file(std::string_view json, std::size_t index) {
  const std::string path = "shard-0000" + std::to_string(index + 1) + "-model-00001-of-00001";
  std::uint64_t file_size = claimed_data_size(json);
  if (file_size > std::numeric_limits<std::uint64_t>::max() - 8 - json.size()) file_size = 0;
  file_size += 8 + json.size();
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(json.data()),
                                         json.size());
  File file{io::parse_safetensors_header(bytes, file_size), std::nullopt};
  const auto it = file.header.metadata.find(std::string(detail::sharding_info_key));
  if (it != file.header.metadata.end()) file.info = detail::parse_sharding_info(it->second, path);
  return file;
}

__int128 volume(const Shape& shape) {
  __int128 count = 1;
  for (const std::int64_t extent : shape) {
    require(extent >= 0);
    if (extent == 0) return 0;
  }
  for (const std::int64_t extent : shape) {
    count *= extent;
    require(count <= std::numeric_limits<std::int64_t>::max());
  }
  return count;
}

bool share_an_element(const io::StoredPiece& a, const io::StoredPiece& b) {
  for (std::size_t d = 0; d < a.shape.size(); ++d) {
    const __int128 low = std::max(a.offsets[d], b.offsets[d]);
    const __int128 high = std::min<__int128>(__int128{a.offsets[d]} + a.shape[d],
                                             __int128{b.offsets[d]} + b.shape[d]);
    if (low >= high) return false;
  }
  return true;
}

// The piece matches the tensor its file holds: shape, dtype, where its bytes lie, and offsets.
void check_source(const io::StoredTensor& tensor, const io::StoredPiece& piece,
                  const std::vector<File>& files) {
  require(piece.file < files.size());
  const File& file = files[piece.file];
  const io::TensorEntry* entry = file.header.find(tensor.name);
  require(entry != nullptr);
  require(entry->dtype == tensor.dtype && entry->shape == piece.shape);
  require(piece.file_offset == file.header.data_offset + entry->begin);
  if (file.info) {
    const auto it = file.info->find(tensor.name);
    require(it != file.info->end() && it->second == piece.offsets);
  } else {
    require(std::all_of(piece.offsets.begin(), piece.offsets.end(),
                        [](std::int64_t offset) { return offset == 0; }));
  }
}

void check_tiling(const io::StoredTensor& tensor, const std::vector<File>& files) {
  const std::size_t rank = tensor.shape.size();
  require(!tensor.pieces.empty());
  Shape reach(rank, 0);
  __int128 covered = 0;
  for (std::size_t i = 0; i < tensor.pieces.size(); ++i) {
    const io::StoredPiece& piece = tensor.pieces[i];
    require(piece.offsets.size() == rank && piece.shape.size() == rank);
    check_source(tensor, piece, files);
    for (std::size_t d = 0; d < rank; ++d) {
      require(piece.offsets[d] >= 0 && piece.shape[d] >= 0);
      const __int128 end = __int128{piece.offsets[d]} + piece.shape[d];
      require(end <= tensor.shape[d]);
      reach[d] = std::max<std::int64_t>(reach[d], static_cast<std::int64_t>(end));
    }
    covered += volume(piece.shape);
    for (std::size_t j = 0; j < i; ++j) require(!share_an_element(tensor.pieces[j], piece));
    if (i > 0) {
      const io::StoredPiece& last = tensor.pieces[i - 1];
      require(std::tie(last.offsets, last.file) < std::tie(piece.offsets, piece.file));
    }
  }
  require(reach == tensor.shape);
  require(covered == volume(tensor.shape));
}

// The runs that copy each piece of a small `tensor` into a row-major buffer of all of it.
void check_runs(const io::StoredTensor& tensor) {
  if (volume(tensor.shape) > max_copied_elements) return;
  const std::uint64_t element_bytes = io::dtype_size(tensor.dtype);
  const std::uint64_t bytes = tensor.bytes();
  const detail::BoxStorage whole =
      detail::row_major_box(Shape(tensor.shape.size(), 0), tensor.shape, 0);
  std::vector<bool> written(bytes, false);
  std::uint64_t total = 0;
  for (const io::StoredPiece& piece : tensor.pieces) {
    const detail::BoxStorage stored = detail::stored_box(piece);
    const auto piece_bytes = static_cast<std::uint64_t>(volume(piece.shape)) * element_bytes;
    std::vector<detail::ByteRun> runs;
    detail::append_shared_runs(stored, whole, element_bytes, runs);
    for (const detail::ByteRun& run : runs) {
      require(run.bytes > 0);
      require(run.from >= piece.file_offset && run.bytes <= piece_bytes &&
              run.from - piece.file_offset <= piece_bytes - run.bytes);
      require(run.to <= bytes && run.bytes <= bytes - run.to);
      for (std::uint64_t b = run.to; b < run.to + run.bytes; ++b) {
        require(!written[b]);
        written[b] = true;
      }
      total += run.bytes;
    }
  }
  require(total == bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<File> files;
  std::vector<detail::PieceSource> sources;
  std::map<std::string, io::StoredTensor> tensors;
  try {
    const std::vector<std::string_view> texts = split_files(input);
    for (std::size_t f = 0; f < texts.size(); ++f) files.push_back(read_file(texts[f], f));
    for (std::size_t f = 0; f < files.size(); ++f)
      sources.push_back({"shard-" + std::to_string(f), &files[f].header,
                         files[f].info ? &*files[f].info : nullptr});
    tensors = detail::stored_tensors(sources);
  } catch (const kshard::error&) {
    return 0;
  }
  std::size_t pieces = 0, entries = 0;
  for (const File& file : files) entries += file.header.tensors.size();
  for (const auto& [name, tensor] : tensors) {
    require(name == tensor.name);
    check_tiling(tensor, files);
    check_runs(tensor);
    pieces += tensor.pieces.size();
  }
  require(pieces == entries);
  return 0;
}
