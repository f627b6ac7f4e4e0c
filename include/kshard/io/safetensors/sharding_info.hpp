#pragma once

// The `DCP_SHARDING_INFO` entry of a per-rank shard's `__metadata__` (torch's
// HuggingFaceStorageWriter and NeMo AutoModel write it): a JSON string
// `{"name": {"saved_offsets": [o0, o1, ...]}, ...}` giving the global index of the first element
// of each tensor the file holds. Pure parsing, no I/O: the fuzzer runs it as it is.

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/io/safetensors/header.hpp"

namespace kshard::detail {

// The `__metadata__` keys of a per-rank shard (torch's _hf_utils.py).
inline constexpr std::string_view sharding_info_key = "DCP_SHARDING_INFO";
inline constexpr std::string_view saved_offsets_key = "saved_offsets";

// Tensor name -> its global offsets, one per dimension.
using ShardingInfo = std::map<std::string, std::vector<std::int64_t>>;

// A saved offset that is not one, for a message: a scalar as JSON (at most 40 bytes of it), an
// array or object as "[...]" or "{...}": nlohmann's dump() recurses once per level of nesting,
// and a header of 60 KB nests deeply enough to overflow the stack.
inline std::string offset_text(const nlohmann::json& value) {
  if (value.is_array()) return "[...]";
  if (value.is_object()) return "{...}";
  return printable(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 40);
}

// One tensor's saved offsets: an array of integers in [0, 2^62] (room for an extent beside).
inline std::vector<std::int64_t> saved_offsets(const nlohmann::json& entry, std::string_view file,
                                               std::string_view tensor) {
  const auto where = [&] {
    return fmt::format("the {} of '{}' for tensor {}", sharding_info_key, file, in_quotes(tensor));
  };
  const auto it = entry.is_object() ? entry.find(saved_offsets_key) : entry.end();
  if (it == entry.end() || !it->is_array())
    throw_io_error(where(), " has no \"saved_offsets\" array");
  constexpr std::int64_t limit = std::int64_t{1} << 62;
  std::vector<std::int64_t> offsets;
  for (const nlohmann::json& value : *it) {
    const bool whole = value.is_number_unsigned() || value.is_number_integer();
    if (!whole || value.get<std::int64_t>() < 0 || value.get<std::int64_t>() > limit)
      throw_io_error(where(), " has the offset ", offset_text(value),
                     "; offsets are integers from 0 to 2^62");
    offsets.push_back(value.get<std::int64_t>());
  }
  return offsets;
}

// The sharding info of file `file` from its metadata's JSON `text`. Throws kshard::error naming
// the file for text that is not a JSON object of objects with "saved_offsets" arrays. The
// parser keeps no more than the text's size in memory and recurses no deeper than nlohmann's
// parser does for the document (arrays of numbers, objects two deep are all it accepts).
inline ShardingInfo parse_sharding_info(std::string_view text, std::string_view file) {
  const nlohmann::json info = nlohmann::json::parse(text, nullptr, false);
  if (info.is_discarded() || !info.is_object())
    throw_io_error("the ", sharding_info_key, " of '", file,
                   "' is not a JSON object: ", in_quotes(text, 80));
  ShardingInfo offsets;
  for (const auto& [name, entry] : info.items())
    offsets.emplace(name, saved_offsets(entry, file, name));
  return offsets;
}

}  // namespace kshard::detail
