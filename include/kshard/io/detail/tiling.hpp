#pragma once

// The tensors of a checkpoint's files as pieces of global tensors (io::StoredTensor): each
// file's tensors placed at their saved offsets (or at zero for a consolidated file), the global
// shape the maximum of offset + shape over the pieces (torch stores no global shape; its reader
// and its consolidation compute it so), and the pieces checked to tile each tensor exactly.
// Pure: the headers are parsed already; the fuzzer runs it as it is.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "kshard/io/detail/sharding_info.hpp"
#include "kshard/io/safetensors_header.hpp"
#include "kshard/io/stored_tensor.hpp"

namespace kshard::detail {

// One file as the tiling sees it: its path (for messages), its parsed header, and its sharding
// info (nullptr for a consolidated file: every tensor whole, at offset zero).
struct PieceSource {
  std::string path;
  const io::SafetensorsHeader* header = nullptr;
  const ShardingInfo* info = nullptr;
};

// "[0:4, 0:8]": the box a piece covers, for messages.
inline std::string box_text(const io::StoredPiece& piece) {
  std::string text = "[";
  for (std::size_t d = 0; d < piece.shape.size(); ++d)
    text += fmt::format("{}{}:{}", d == 0 ? "" : ", ", piece.offsets[d],
                        piece.offsets[d] + piece.shape[d]);
  return text + "]";
}

// The piece `entry` of file `file` makes, at `offsets`; refuses offsets of another rank than the
// shape's, or that overflow beside it.
inline io::StoredPiece piece_of(const PieceSource& source, std::size_t file,
                                const io::TensorEntry& entry, std::vector<std::int64_t> offsets) {
  if (offsets.size() != entry.shape.size())
    throw_io_error("'", source.path, "' gives tensor ", in_quotes(entry.name), " of shape ",
                   io::shape_text(entry.shape), " ", offsets.size(), " saved offsets; it needs ",
                   entry.shape.size());
  for (std::size_t d = 0; d < offsets.size(); ++d)
    if (entry.shape[d] > std::numeric_limits<std::int64_t>::max() - offsets[d])
      throw_io_error("'", source.path, "' places tensor ", in_quotes(entry.name), " at offset ",
                     offsets[d], " of dimension ", d, ", past INT64_MAX with its extent ",
                     entry.shape[d]);
  return {file, std::move(offsets), entry.shape, source.header->data_offset + entry.begin, {}};
}

// Adds `piece` to `tensor` (new, or holding pieces of other files): same dtype and rank.
inline void add_piece(io::StoredTensor& tensor, const io::TensorEntry& entry, io::StoredPiece piece,
                      std::span<const PieceSource> files) {
  if (tensor.pieces.empty()) {
    tensor.name = entry.name;
    tensor.dtype = entry.dtype;
    tensor.shape.assign(entry.shape.size(), 0);
  } else if (tensor.dtype != entry.dtype || tensor.shape.size() != entry.shape.size()) {
    throw_io_error("tensor ", in_quotes(entry.name), " is ", io::to_string(tensor.dtype),
                   " of rank ", tensor.shape.size(), " in '", files[tensor.pieces[0].file].path,
                   "' but ", io::to_string(entry.dtype), " of rank ", entry.shape.size(), " in '",
                   files[piece.file].path, "'");
  }
  for (std::size_t d = 0; d < entry.shape.size(); ++d)
    tensor.shape[d] = std::max(tensor.shape[d], piece.offsets[d] + piece.shape[d]);
  tensor.pieces.push_back(std::move(piece));
}

// Every file's pieces, grouped by tensor; refuses sharding info that names a tensor its file
// lacks, and a tensor without offsets in a file that has sharding info.
inline std::map<std::string, io::StoredTensor> gather_pieces(std::span<const PieceSource> files) {
  std::map<std::string, io::StoredTensor> tensors;
  for (std::size_t f = 0; f < files.size(); ++f) {
    const PieceSource& source = files[f];
    if (source.info != nullptr)
      for (const auto& [name, offsets] : *source.info)
        if (source.header->find(name) == nullptr)
          throw_io_error("the ", sharding_info_key, " of '", source.path, "' names tensor ",
                         in_quotes(name), ", which the file does not hold");
    for (const io::TensorEntry& entry : source.header->tensors) {
      std::vector<std::int64_t> offsets(entry.shape.size(), 0);
      if (source.info != nullptr) {
        const auto it = source.info->find(entry.name);
        if (it == source.info->end())
          throw_io_error("'", source.path, "' holds tensor ", in_quotes(entry.name), " but its ",
                         sharding_info_key, " gives no offsets for it");
        offsets = it->second;
      }
      add_piece(tensors[entry.name], entry, piece_of(source, f, entry, std::move(offsets)), files);
    }
  }
  return tensors;
}

// True when the boxes of `a` and `b` share an element.
inline bool boxes_overlap(const io::StoredPiece& a, const io::StoredPiece& b) {
  for (std::size_t d = 0; d < a.shape.size(); ++d)
    if (a.offsets[d] >= b.offsets[d] + b.shape[d] || b.offsets[d] >= a.offsets[d] + a.shape[d])
      return false;
  return true;
}

// Refuses two pieces of `tensor` that share an element: a sweep over dimension 0 (pieces sorted
// by offset) compares each piece with those whose rows it meets.
inline void refuse_overlaps(const io::StoredTensor& tensor, std::span<const PieceSource> files) {
  std::vector<const io::StoredPiece*> open;
  for (const io::StoredPiece& piece : tensor.pieces) {
    if (element_count(tensor.name, piece.shape) == 0) continue;
    if (!piece.shape.empty())
      std::erase_if(open, [&](const io::StoredPiece* p) {
        return p->offsets[0] + p->shape[0] <= piece.offsets[0];
      });
    for (const io::StoredPiece* other : open)
      if (boxes_overlap(*other, piece))
        throw_io_error("pieces of tensor ", in_quotes(tensor.name), " overlap: '",
                       files[other->file].path, "' holds ", box_text(*other), " and '",
                       files[piece.file].path, "' holds ", box_text(piece));
    open.push_back(&piece);
  }
}

// Refuses a tensor whose pieces, not overlapping, do not cover it.
inline void refuse_gaps(const io::StoredTensor& tensor) {
  const std::int64_t total = element_count(tensor.name, tensor.shape);
  std::int64_t covered = 0;  // <= total: the pieces lie inside the shape and do not overlap
  for (const io::StoredPiece& piece : tensor.pieces)
    covered += element_count(tensor.name, piece.shape);
  if (covered != total)
    throw_io_error("the pieces of tensor ", in_quotes(tensor.name), " (shape ",
                   io::shape_text(tensor.shape), ", in ", tensor.pieces.size(), " pieces) cover ",
                   covered, " of its ", total, " elements: a piece is missing");
}

// Sorts the pieces of `tensor` by offset and refuses a shape past INT64_MAX elements, pieces
// that overlap and pieces that leave a gap (`sources` names the files in messages).
inline void tile_tensor(io::StoredTensor& tensor, std::span<const PieceSource> sources) {
  std::sort(tensor.pieces.begin(), tensor.pieces.end(),
            [](const io::StoredPiece& a, const io::StoredPiece& b) {
              return std::tie(a.offsets, a.file) < std::tie(b.offsets, b.file);
            });
  element_count(tensor.name, tensor.shape);
  refuse_overlaps(tensor, sources);
  refuse_gaps(tensor);
}

// The stored tensors of `files`, each an exact tiling. Throws kshard::error, naming the files,
// for sharding info that does not match its file, a tensor whose dtype or rank differs between
// files, pieces that overlap, and pieces that leave a gap.
inline std::map<std::string, io::StoredTensor> stored_tensors(std::span<const PieceSource> files) {
  std::map<std::string, io::StoredTensor> tensors = gather_pieces(files);
  for (auto& [name, tensor] : tensors) tile_tensor(tensor, files);
  return tensors;
}

}  // namespace kshard::detail
