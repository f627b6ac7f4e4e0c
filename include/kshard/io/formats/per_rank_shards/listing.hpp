#pragma once

// A folder of per-rank shards (io::Checkpoint): its `.safetensors` files listed by rank 0 and
// broadcast, and each file's DCP_SHARDING_INFO parsed (every rank parses the same agreed
// header, so every rank throws the same error).

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/error.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/safetensors/file.hpp"
#include "kshard/io/safetensors/sharding_info.hpp"

namespace kshard::detail {

// The names of the `.safetensors` files directly in `folder`, sorted: not those of sub-folders
// (NeMo AutoModel's consolidated/ and torch's sharded/ are checkpoints of their own). Rank 0
// lists; every rank gets the names, or throws the same error when the folder cannot be listed.
inline std::vector<std::string> list_safetensors(const comm::Group& group,
                                                 const std::filesystem::path& folder) {
  std::string joined;  // the names, each ended by '\n' (a name holding one is left out)
  agree(group, attempt([&] {
          if (group.rank() != 0) return;
          std::vector<std::string> names;
          for (const auto& entry : std::filesystem::directory_iterator(folder)) {
            const std::string name = entry.path().filename().string();
            // Of any kind: one that is not a regular file is refused by name when opened.
            if (entry.path().extension() == ".safetensors" && name.find('\n') == std::string::npos)
              names.push_back(name);
          }
          std::sort(names.begin(), names.end());
          for (const auto& name : names) joined += name + '\n';
        }));
  broadcast_text(joined, group);
  std::vector<std::string> names;
  for (std::size_t begin = 0, end; (end = joined.find('\n', begin)) != std::string::npos;
       begin = end + 1)
    names.push_back(joined.substr(begin, end - begin));
  return names;
}

// The sharding info of `file`, or nullopt when its metadata has none (a consolidated file).
inline std::optional<ShardingInfo> sharding_info_of(const io::SafetensorsFile& file) {
  const auto& metadata = file.header().metadata;
  const auto it = metadata.find(std::string(sharding_info_key));
  if (it == metadata.end()) return std::nullopt;
  return parse_sharding_info(it->second, file.path().string());
}

}  // namespace kshard::detail
