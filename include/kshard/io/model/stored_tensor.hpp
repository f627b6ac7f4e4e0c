#pragma once

/// \file
/// A tensor as a checkpoint stores it: its dtype, its global shape, and the pieces that tile
/// it, each a box of the tensor stored row-major in one file. A consolidated checkpoint stores
/// each tensor as one piece; per-rank shards (torch's and NeMo AutoModel's
/// `shard-*-model-*.safetensors`) store one piece per rank that held part of it.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kshard/io/model/dtype.hpp"
#include "kshard/io/model/messages.hpp"

namespace kshard::detail {

// A file tensors are read from, with its size when the checkpoint was opened.
struct DataFile {
  std::filesystem::path path;
  std::uint64_t size = 0;
};

}  // namespace kshard::detail

namespace kshard::io {

/// A file the tensors are read from, with its size when the checkpoint was opened.
using DataFile = detail::DataFile;

/// One piece of a stored tensor: the box `[offsets, offsets + shape)` of the global tensor,
/// stored from byte `file_offset` of one file, row-major unless it has `strides` (a PyTorch DCP
/// piece saved from a transposed view).
struct StoredPiece {
  std::size_t file = 0;               ///< the file's position in `Checkpoint::files()`
  std::vector<std::int64_t> offsets;  ///< global index of its first element, per dimension
  std::vector<std::int64_t> shape;    ///< its extents (empty for a scalar)
  std::uint64_t file_offset = 0;      ///< where its first byte lies in the file
  std::vector<std::int64_t> strides;  ///< element strides per dimension; empty: row-major

  /// Equal when every field is.
  friend bool operator==(const StoredPiece&, const StoredPiece&) = default;
};

/// A checksum a checkpoint records for a range of one of its files (a PyTorch DCP piece's
/// torch.save entry: CRC-32), for `io::verify_checksums`.
struct StoredChecksum {
  std::size_t file = 0;      ///< the file's position in `Checkpoint::data_files()`
  std::uint64_t offset = 0;  ///< where the range begins
  std::uint64_t bytes = 0;   ///< its length
  std::uint32_t crc32 = 0;   ///< the CRC-32 recorded for it
  std::string name;          ///< what it is, for messages

  /// Equal when every field is.
  friend bool operator==(const StoredChecksum&, const StoredChecksum&) = default;
};

/// A value a checkpoint holds beside its tensors (a DCP bytes item: an optimizer step, a learning
/// rate, pickled by torch), which kshard carries as bytes and never unpickles.
struct StoredItem {
  std::string name;          ///< its key in the checkpoint
  std::size_t file = 0;      ///< the file's position in `Checkpoint::data_files()`
  std::uint64_t offset = 0;  ///< where its bytes begin in the file
  std::uint64_t bytes = 0;   ///< how many

  /// Equal when every field is.
  friend bool operator==(const StoredItem&, const StoredItem&) = default;
};

/// A tensor of a checkpoint: dtype, global shape, and its pieces (an exact tiling: every
/// element in exactly one piece), sorted by their offsets.
struct StoredTensor {
  std::string name;                 ///< its name in the checkpoint
  Dtype dtype = Dtype::U8;          ///< element type, the same in every piece
  std::vector<std::int64_t> shape;  ///< global extents (row-major; empty for a scalar)
  std::vector<StoredPiece> pieces;  ///< the pieces, sorted by offsets

  /// Bytes of the whole tensor.
  [[nodiscard]] std::uint64_t bytes() const { return detail::byte_count(name, dtype, shape); }
  /// Equal when every field is.
  friend bool operator==(const StoredTensor&, const StoredTensor&) = default;
};

/// What a checkpoint holds, whatever its format: the files its tensors' pieces lie in, its
/// tensors by name, the values it carries beside them and the checksums it records.
struct StoredContents {
  std::vector<DataFile> data_files;             ///< where `StoredPiece::file` points
  std::map<std::string, StoredTensor> tensors;  ///< by name
  std::vector<StoredItem> other_items;          ///< in the checkpoint's order
  std::vector<StoredChecksum> checksums;        ///< none for safetensors
};

}  // namespace kshard::io
