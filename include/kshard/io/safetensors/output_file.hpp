#pragma once

// Safetensors files a conversion writes: one file's layout (its header as framing, each tensor's
// place), and a checkpoint's own files laid out again as they are stored.

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kshard/io/engine/conversion_plan.hpp"
#include "kshard/io/safetensors/file.hpp"
#include "kshard/io/safetensors/header.hpp"

namespace kshard::detail {

// The safetensors file holding `tensors` in that order, with `metadata`.
inline OutputFile output_file(std::string name, std::vector<OutputTensor> tensors,
                              std::map<std::string, std::string> metadata) {
  std::vector<io::TensorSpec> specs;
  for (const OutputTensor& t : tensors) specs.push_back({t.tensor->name, t.tensor->dtype, t.shape});
  const io::SafetensorsHeader header = io::make_safetensors_header(specs, std::move(metadata));
  for (OutputTensor& t : tensors) t.at = header.data_offset + header.find(t.tensor->name)->begin;
  return {std::move(name),
          header.data_offset + header.data_size,
          {{0, io::serialize_safetensors_header(header)}},
          std::move(tensors),
          {},
          false};
}

// A checkpoint's own safetensors `stored` holding `model`: each file's tensors (in its header's
// order) as the pieces it holds, its metadata kept.
inline std::vector<OutputFile> plan_as_stored(std::span<const io::SafetensorsFile> stored,
                                              const io::StoredContents& model) {
  std::vector<OutputFile> files;
  for (std::size_t f = 0; f < stored.size(); ++f) {
    const io::SafetensorsFile& file = stored[f];
    std::vector<OutputTensor> held;
    for (const io::TensorEntry& entry : file.header().tensors) {
      const auto found = model.tensors.find(entry.name);
      if (found == model.tensors.end()) continue;  // not in the index: not the checkpoint's
      const io::StoredTensor& tensor = found->second;
      for (const io::StoredPiece& piece : tensor.pieces)
        if (piece.file == f) held.push_back({&tensor, piece.offsets, piece.shape, 0});
    }
    files.push_back(
        output_file(file.path().filename().string(), std::move(held), file.header().metadata));
  }
  return files;
}

}  // namespace kshard::detail
