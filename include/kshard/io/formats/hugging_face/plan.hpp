#pragma once

// The files of a consolidated Hugging Face checkpoint a conversion writes: whole tensors in
// `model.safetensors`, or in numbered files beside `model.safetensors.index.json`.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/io/engine/conversion_plan.hpp"
#include "kshard/io/safetensors/output_file.hpp"

namespace kshard::detail {

// Consolidated Hugging Face files: whole tensors in `tensors`' order, a new file begun where the
// next tensor would pass `max_bytes` (a larger tensor has a file of its own): `model.safetensors`
// alone, or `model-0000i-of-0000n.safetensors`.
inline std::vector<OutputFile> plan_hf(const std::vector<const io::StoredTensor*>& tensors,
                                       std::uint64_t max_bytes) {
  std::vector<std::vector<OutputTensor>> groups(1);
  std::uint64_t bytes = 0;
  for (const io::StoredTensor* tensor : tensors) {
    const std::uint64_t size = tensor->bytes();
    if (!groups.back().empty() && size > max_bytes - std::min(max_bytes, bytes)) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(
        {tensor, std::vector<std::int64_t>(tensor->shape.size(), 0), tensor->shape, 0});
    bytes += size;
  }
  std::vector<OutputFile> files;
  for (std::size_t i = 0; i < groups.size(); ++i)
    files.push_back(output_file(
        groups.size() == 1 ? std::string("model.safetensors")
                           : fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, groups.size()),
        std::move(groups[i]), {{"format", "pt"}}));
  return files;
}

// The text of model.safetensors.index.json for consolidated `files`.
inline std::string hf_index_text(const std::vector<OutputFile>& files) {
  nlohmann::ordered_json index;
  std::uint64_t total = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const OutputFile& file : files)
    for (const OutputTensor& t : file.tensors) {
      weight_map[t.tensor->name] = file.name;
      total += t.bytes();
    }
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = std::move(weight_map);
  return index.dump(2) + "\n";
}

}  // namespace kshard::detail
