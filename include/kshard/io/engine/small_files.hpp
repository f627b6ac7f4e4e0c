#pragma once

// The small files that describe a checkpoint (an index, a config.json): read by rank 0 and
// broadcast, compared with each rank's own copy, and parsed as JSON alike on every rank (so
// every rank throws the same error).

#include <fcntl.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/error.hpp"
#include "kshard/index.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/engine/same_copies.hpp"
#include "kshard/io/model/dtype.hpp"

namespace kshard::detail {

// The largest JSON file (index or config) kshard reads: real ones are kilobytes.
inline constexpr std::uint64_t max_json_file_size = std::uint64_t{64} << 20;

// Rank 0 reads a small text file, every rank gets its bytes (nullopt when it does not exist),
// and every other rank compares its own copy with them (node-local copies that differ are
// refused: io/engine/same_copies.hpp). Every rank throws the same error when it cannot be read
// or is too large.
inline std::optional<std::string> read_small_file(const comm::Group& group,
                                                  const std::filesystem::path& path) {
  std::optional<std::string> problem;
  std::string text;
  std::int64_t state = 0;  // 0: absent, 1: read
  std::error_code ec;      // rank 0 alone looks: it must not throw
  if (group.rank() == 0 && std::filesystem::exists(path, ec)) {
    state = 1;
    problem = attempt([&] {
      const ScopedFd fd(open_or_throw(path, O_RDONLY));  // a regular file, or refused
      const std::uint64_t size = open_file_size(fd.get(), path);
      if (size > max_json_file_size)
        throw error(
            fmt::format("kshard::io: '{}' has {} bytes, more than the {} a JSON file of a "
                        "checkpoint may have",
                        path.string(), size, max_json_file_size));
      text.resize(size);
      throw_if(pread_exactly(fd.get(), text.data(), size, 0, path.string()));
    });
  }
  agree(group, problem);
  group.bcast(&state, 1, 0);
  if (state == 0) return std::nullopt;
  broadcast_text(text, group);
  ReadLog log;  // rank 0's read: the whole file
  log.add(log.file(path, text.size()), 0, std::as_bytes(std::span(text)));
  agree_on_copies(group, log.files());
  return text;
}

// Parses JSON text that every rank holds alike (so every rank throws the same message).
inline nlohmann::json parse_json(const std::string& text, const std::filesystem::path& path) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw error(fmt::format("kshard::io: '{}' is not valid JSON: {}", path.string(), e.what()));
  }
}

// A JSON value for an error message: a scalar as written (a string shortened), a container
// by its kind only (dumping one recurses as deep as the file nests, and may be megabytes).
inline std::string json_text(const nlohmann::json& value) {
  if (value.is_string()) return "\"" + printable(value.get_ref<const std::string&>(), 64) + "\"";
  if (value.is_structured()) return fmt::format("an {}", value.type_name());
  return value.dump();
}

// Field `key` of `config` as T, unset when absent or null, an error when of another type or,
// for an integer, past int64's range.
template <class T>
std::optional<T> config_field(const nlohmann::json& config, const char* key,
                              const std::filesystem::path& path) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  const bool fits = std::is_same_v<T, bool> ? it->is_boolean() : it->is_number_integer();
  if (!fits)
    throw error(fmt::format("kshard::io: '{}' field \"{}\" is {}, not {}", path.string(), key,
                            json_text(*it),
                            std::is_same_v<T, bool> ? "true or false" : "an integer"));
  if constexpr (!std::is_same_v<T, bool>)
    if (it->is_number_unsigned() && it->template get<std::uint64_t>() >
                                        static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
      throw error(fmt::format("kshard::io: '{}' field \"{}\" is {}, more than the largest id {}",
                              path.string(), key, it->dump(), std::numeric_limits<T>::max()));
  return it->template get<T>();
}

}  // namespace kshard::detail
