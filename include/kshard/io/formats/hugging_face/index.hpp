#pragma once

// The index of a sharded Hugging Face checkpoint, `model.safetensors.index.json`: its
// weight_map, each tensor's file named plainly inside the folder.

#include <filesystem>
#include <map>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/error.hpp"
#include "kshard/io/engine/small_files.hpp"
#include "kshard/io/model/messages.hpp"

namespace kshard::detail {

// The index's weight_map: tensor name -> file name, each a plain name inside the folder.
inline std::map<std::string, std::string> parse_weight_map(const std::string& text,
                                                           const std::filesystem::path& path) {
  const nlohmann::json index = parse_json(text, path);
  const auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (map == index.end() || !map->is_object())
    throw error(fmt::format("kshard::io: '{}' has no \"weight_map\" object", path.string()));
  std::map<std::string, std::string> result;
  for (const auto& [tensor, file] : map->items()) {
    const std::string name = file.is_string() ? file.get<std::string>() : std::string();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      throw error(
          fmt::format("kshard::io: '{}' maps tensor {} to {}, which is not a file name "
                      "in the checkpoint's folder",
                      path.string(), in_quotes(tensor), json_text(file)));
    result.emplace(tensor, name);
  }
  return result;
}

}  // namespace kshard::detail
