#pragma once

// Pieces that tile a tensor, whatever format stored them: each piece a box of the global
// tensor, and together an exact tiling (sorted by offset; no two share an element; none
// missing), refused by name otherwise. Formats gather the pieces (io/safetensors/pieces.hpp,
// io/formats/dcp/reader.hpp) and tile them here.

#include <fmt/format.h>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kshard/io/model/messages.hpp"
#include "kshard/io/model/stored_tensor.hpp"

namespace kshard::detail {

// "[0:4, 0:8]": the box a piece covers, for messages.
inline std::string box_text(const io::StoredPiece& piece) {
  std::string text = "[";
  for (std::size_t d = 0; d < piece.shape.size(); ++d)
    text += fmt::format("{}{}:{}", d == 0 ? "" : ", ", piece.offsets[d],
                        piece.offsets[d] + piece.shape[d]);
  return text + "]";
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
inline void refuse_overlaps(const io::StoredTensor& tensor, std::span<const std::string> files) {
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
                       files[other->file], "' holds ", box_text(*other), " and '",
                       files[piece.file], "' holds ", box_text(piece));
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
// that overlap and pieces that leave a gap (`files` names the files in messages).
inline void tile_tensor(io::StoredTensor& tensor, std::span<const std::string> files) {
  std::sort(tensor.pieces.begin(), tensor.pieces.end(),
            [](const io::StoredPiece& a, const io::StoredPiece& b) {
              return std::tie(a.offsets, a.file) < std::tie(b.offsets, b.file);
            });
  element_count(tensor.name, tensor.shape);
  refuse_overlaps(tensor, files);
  refuse_gaps(tensor);
}

}  // namespace kshard::detail
