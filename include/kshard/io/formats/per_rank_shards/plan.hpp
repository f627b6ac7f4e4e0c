#pragma once

// The files of per-rank shards a conversion writes: one safetensors file per rank holding its
// boxes, placed by the DCP_SHARDING_INFO torch's HuggingFaceStorageWriter writes.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/io/engine/conversion_plan.hpp"
#include "kshard/io/safetensors/output_file.hpp"
#include "kshard/io/safetensors/sharding_info.hpp"

namespace kshard::detail {

// The DCP_SHARDING_INFO of a shard holding `tensors`, as torch writes it.
inline std::map<std::string, std::string> shard_metadata(const std::vector<OutputTensor>& tensors) {
  nlohmann::json info = nlohmann::json::object();
  for (const OutputTensor& t : tensors) info[t.tensor->name] = {{saved_offsets_key, t.offsets}};
  return {{std::string(sharding_info_key), info.dump()}, {"DCP_VERSION", "1.0"}, {"format", "pt"}};
}

// Per-rank shards of `split`: a file per rank holding boxes
// (`shard-0000{r+1}-model-00001-of-00001.safetensors`, as torch and NeMo AutoModel name them).
inline std::vector<OutputFile> plan_shards(RankBoxes split) {
  std::vector<OutputFile> files;
  for (auto& [rank, held] : split) {
    if (held.empty()) continue;
    auto metadata = shard_metadata(held);
    files.push_back(
        output_file(fmt::format("shard-{:05}-model-00001-of-00001.safetensors", rank + 1),
                    std::move(held), std::move(metadata)));
  }
  return files;
}

}  // namespace kshard::detail
