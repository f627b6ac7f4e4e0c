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

#include "kshard/io/engine/tiling.hpp"
#include "kshard/io/model/stored_tensor.hpp"
#include "kshard/io/safetensors/header.hpp"
#include "kshard/io/safetensors/sharding_info.hpp"

namespace kshard::detail {

// One file as the tiling sees it: its path (for messages), its parsed header, and its sharding
// info (nullptr for a consolidated file: every tensor whole, at offset zero).
struct PieceSource {
  std::string path;
  const io::SafetensorsHeader* header = nullptr;
  const ShardingInfo* info = nullptr;
};

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

// The stored tensors of `files`, each an exact tiling. Throws kshard::error, naming the files,
// for sharding info that does not match its file, a tensor whose dtype or rank differs between
// files, pieces that overlap, and pieces that leave a gap.
inline std::map<std::string, io::StoredTensor> stored_tensors(std::span<const PieceSource> files) {
  std::map<std::string, io::StoredTensor> tensors = gather_pieces(files);
  std::vector<std::string> paths;
  for (const PieceSource& file : files) paths.push_back(file.path);
  for (auto& [name, tensor] : tensors) tile_tensor(tensor, paths);
  return tensors;
}

}  // namespace kshard::detail
