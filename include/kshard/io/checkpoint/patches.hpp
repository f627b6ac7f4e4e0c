#pragma once

// Row patches (io::RowPatch) checked against a checkpoint, and laid on its files: the agreement
// every operation that writes one makes, and the rows each file's piece of the tensor holds
// (io::write_patch_in_place).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/row_patch.hpp"
#include "kshard/io/safetensors/undo.hpp"

namespace kshard::detail {

// Why `patch` cannot be written over `model`'s tensor of its name (the same on every rank).
inline std::optional<std::string> patch_problem(const io::Checkpoint& model,
                                                const io::RowPatch& patch) {
  if (!model.contains(patch.name))
    return fmt::format("kshard::io: the checkpoint '{}' has no tensor {} to patch",
                       model.path().string(), in_quotes(patch.name));
  const io::StoredTensor& tensor = model.tensor(patch.name);
  if (tensor.dtype != patch.dtype ||
      tensor.shape != std::vector<std::int64_t>{patch.rows, patch.cols})
    return fmt::format("kshard::io: tensor {} is {} {}, but its patch is of a {} x {} {} matrix",
                       in_quotes(patch.name), io::to_string(tensor.dtype),
                       io::shape_text(tensor.shape), patch.rows, patch.cols,
                       io::to_string(patch.dtype));
  return std::nullopt;
}

// Adds `patches` to an agreement: the same tensors and rows on every rank, each fit for `model`.
inline void agree_on_patches(Agreement& agreement, const io::Checkpoint& model,
                             const std::vector<io::RowPatch>& patches) {
  agreement.same("the number of row patches", static_cast<std::int64_t>(patches.size()));
  for (const io::RowPatch& patch : patches) {
    same_text(agreement, "the tensor of a row patch", patch.name);
    Digest rows;
    for (const index_t id : patch.ids) rows.add(id);
    rows.add(
        std::string_view(reinterpret_cast<const char*>(patch.bytes.data()), patch.bytes.size()));
    agreement.same(fmt::format("the rows of {} to patch", in_quotes(patch.name)), rows.value(),
                   [](std::int64_t) { return std::string(); });
    agreement.problem(patch_problem(model, patch));
  }
}

// The rows of `patch` one piece of its tensor holds, as an in-place write of that piece's file
// replaces them (local row ids, the piece's width), with their new bytes (the patch's columns
// of the piece); nothing where the piece holds none of the rows.
struct PieceRows {
  std::size_t file = 0;
  RowSet rows;
  std::vector<std::byte> bytes;
};

inline std::vector<PieceRows> piece_rows(const io::Checkpoint& model, const io::RowPatch& patch) {
  const io::StoredTensor& tensor = model.tensor(patch.name);
  const std::size_t element = io::dtype_size(patch.dtype);
  std::vector<PieceRows> parts;
  for (const io::StoredPiece& piece : tensor.pieces) {
    PieceRows part{
        piece.file, {patch.name, patch.dtype, piece.shape[1], {}, piece.file_offset}, {}};
    for (std::size_t k = 0; k < patch.ids.size(); ++k) {
      const index_t id = patch.ids[k];
      if (piece.shape[1] == 0 || id < piece.offsets[0] || id >= piece.offsets[0] + piece.shape[0])
        continue;
      part.rows.ids.push_back(id - piece.offsets[0]);
      const auto* row = patch.bytes.data() + (k * static_cast<std::size_t>(patch.cols) +
                                              static_cast<std::size_t>(piece.offsets[1])) *
                                                 element;
      part.bytes.insert(part.bytes.end(), row, row + part.rows.row_bytes());
    }
    if (!part.rows.ids.empty()) parts.push_back(std::move(part));
  }
  return parts;
}

// Rank 0: writes `part`'s rows into its file, fsyncs, and reads them back.
inline void write_piece_rows(const io::SafetensorsFile& file, const PieceRows& part) {
  const ScopedFd fd(open_or_throw(file.path(), O_RDWR | O_CLOEXEC));
  const std::uint64_t row_bytes = part.rows.row_bytes();
  for (std::size_t k = 0; k < part.rows.ids.size(); ++k)
    pwrite_exactly(fd.get(), part.bytes.data() + k * row_bytes, row_bytes,
                   part.rows.offset + static_cast<std::uint64_t>(part.rows.ids[k]) * row_bytes,
                   file.path());
  fsync_or_throw(fd.get(), file.path());
  if (read_rows(fd.get(), file.path().string(), part.rows.offset, part.rows.ids, row_bytes) !=
      part.bytes)
    throw error(fmt::format("kshard::io: the rows of {} written into '{}' read back otherwise",
                            in_quotes(part.rows.name), file.path().string()));
}

}  // namespace kshard::detail
