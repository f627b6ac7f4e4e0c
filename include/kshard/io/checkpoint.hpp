#pragma once

/// \file
/// A Hugging Face checkpoint: one `.safetensors` file, or a folder holding `model.safetensors`
/// or shards listed by `model.safetensors.index.json` (its `weight_map` names each tensor's
/// file), with the `config.json` fields the repair needs.
///
///     kshard::io::Checkpoint model(mesh, "path/to/model");   // collective
///     const auto& file = model.file_of("model.embed_tokens.weight");
///     auto pad = model.config().pad_token_id;
///
/// A single file's `config.json` is the one in its folder. Opening costs one header read per
/// file on every rank (ranks that see different files under one path are refused) and one
/// broadcast per JSON file; every rank throws the same `kshard::error` for a missing path, an
/// index that is not JSON, names a file outside the folder or a tensor its file lacks, a tensor
/// in two shards, and a config.json field of the wrong type or range.

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/comm/agreement.hpp"
#include "kshard/error.hpp"
#include "kshard/io/safetensors.hpp"
#include "kshard/mesh.hpp"

namespace kshard::io {

/// The `config.json` fields kshard uses; each unset when absent or null.
struct ModelConfig {
  std::optional<bool> tie_word_embeddings;  ///< the LM head shares the input embedding's storage
  /// The padding id (zeroed on purpose in many models); also unset when negative (Hugging Face
  /// writes -1 for none).
  std::optional<index_t> pad_token_id;
  std::optional<index_t> vocab_size;  ///< the tokenizer's vocabulary size
};

/// The name of the index file of a sharded checkpoint.
inline constexpr std::string_view safetensors_index_name = "model.safetensors.index.json";
/// The name of the single file of an unsharded checkpoint folder.
inline constexpr std::string_view safetensors_single_name = "model.safetensors";

namespace detail {

// The largest JSON file (index or config) kshard reads: real ones are kilobytes.
inline constexpr std::uint64_t max_json_file_size = std::uint64_t{64} << 20;

// Rank 0 reads a small text file, every rank gets its bytes (nullopt when it does not exist).
// Every rank throws the same error when it cannot be read or is too large.
inline std::optional<std::string> read_small_file(const kshard::comm::Group& group,
                                                  const std::filesystem::path& path) {
  std::optional<std::string> problem;
  std::string text;
  std::int64_t state = 0;  // 0: absent, 1: read
  std::error_code ec;      // rank 0 alone looks: it must not throw
  if (group.rank() == 0 && std::filesystem::exists(path, ec)) {
    state = 1;
    problem = attempt([&] {
      const std::uint64_t size = std::filesystem::file_size(path);
      if (size > max_json_file_size)
        throw error(
            fmt::format("kshard::io: '{}' has {} bytes, more than the {} a JSON file of a "
                        "checkpoint may have",
                        path.string(), size, max_json_file_size));
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        throw error(
            fmt::format("kshard::io: cannot open '{}': {}", path.string(), std::strerror(errno)));
      text.resize(size);
      auto failed = pread_exactly(fd, text.data(), size, 0, path.string());
      ::close(fd);
      if (failed) throw error(*failed);
    });
  }
  agree(group, problem);
  std::array<std::int64_t, 2> header{state, static_cast<std::int64_t>(text.size())};
  group.bcast(header.data(), 2, 0);
  if (header[0] == 0) return std::nullopt;
  text.resize(static_cast<std::size_t>(header[1]));
  broadcast_bytes(text.data(), text.size(), group);
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

inline ModelConfig parse_config(const std::string& text, const std::filesystem::path& path) {
  const nlohmann::json config = parse_json(text, path);
  if (!config.is_object())
    throw error(fmt::format("kshard::io: '{}' is not a JSON object", path.string()));
  auto pad = config_field<index_t>(config, "pad_token_id", path);
  if (pad && *pad < 0) pad.reset();  // Hugging Face configs write -1 for "no padding token"
  return {config_field<bool>(config, "tie_word_embeddings", path), pad,
          config_field<index_t>(config, "vocab_size", path)};
}

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

}  // namespace detail

/// A checkpoint opened on a mesh: its safetensors files (headers validated), which file holds
/// each tensor, and its config. Collective to open; the queries are local.
class Checkpoint {
 public:
  /// Opens `path`: a `.safetensors` file, or a folder with `model.safetensors.index.json` (a
  /// sharded checkpoint) or `model.safetensors`, and optionally `config.json`. Collective over
  /// `mesh`; see the file comment for the errors.
  template <std::size_t N>
  Checkpoint(const Mesh<N>& mesh, std::filesystem::path path) : path_(std::move(path)) {
    const kshard::detail::Operation operation("io::Checkpoint");
    const kshard::comm::Group& group = mesh.group();
    detail::Agreement agreement(group);
    kshard::detail::same_text(agreement, "the checkpoint path", path_.string());
    agreement.settle();
    std::error_code ec;  // rank 0 alone looks: it must not throw
    std::int64_t is_folder = mesh.my_rank() == 0 && std::filesystem::is_directory(path_, ec);
    group.bcast(&is_folder, 1, 0);
    folder_ = is_folder != 0;
    // A single file's config.json is the one beside it, as in a checkpoint folder.
    const auto folder = folder_ ? path_ : path_.parent_path();
    if (auto text = detail::read_small_file(group, folder / "config.json"))
      config_ = detail::parse_config(*text, folder / "config.json");
    if (!folder_) {
      open_single(mesh, path_);
      return;
    }
    const auto index_path = path_ / safetensors_index_name;
    const auto index = detail::read_small_file(group, index_path);
    if (!index) {
      open_single(mesh, path_ / safetensors_single_name);
      return;
    }
    const auto weight_map = detail::parse_weight_map(*index, index_path);
    std::map<std::string, std::size_t> opened;
    for (const auto& [tensor, file] : weight_map) {
      auto [it, added] = opened.emplace(file, files_.size());
      if (added) files_.emplace_back(mesh, path_ / file);
      if (files_[it->second].header().find(tensor) == nullptr)
        throw error(
            fmt::format("kshard::io: '{}' maps tensor {} to '{}', which has no such "
                        "tensor",
                        index_path.string(), detail::in_quotes(tensor), file));
      file_index_[tensor] = it->second;
    }
    refuse_second_copies(index_path);
  }

  /// The path it was opened from.
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// True for a checkpoint folder, false for a single file.
  [[nodiscard]] bool is_folder() const { return folder_; }
  /// config.json's fields (all unset without one).
  [[nodiscard]] const ModelConfig& config() const { return config_; }
  /// Its safetensors files, in the order first named.
  [[nodiscard]] const std::vector<SafetensorsFile>& files() const { return files_; }
  /// True when some file holds tensor `name`.
  [[nodiscard]] bool contains(std::string_view name) const {
    return file_index_.find(std::string(name)) != file_index_.end();
  }
  /// Every tensor name, sorted.
  [[nodiscard]] std::vector<std::string> tensor_names() const {
    std::vector<std::string> names;
    for (const auto& [name, file] : file_index_) names.push_back(name);
    return names;
  }
  /// The file holding tensor `name`; throws `kshard::error` (locally: the names are the same on
  /// every rank) when none does.
  [[nodiscard]] const SafetensorsFile& file_of(std::string_view name) const {
    const auto it = file_index_.find(std::string(name));
    if (it == file_index_.end())
      throw error(fmt::format("kshard::io: the checkpoint '{}' has no tensor {}", path_.string(),
                              detail::in_quotes(name)));
    return files_[it->second];
  }

 private:
  template <std::size_t N>
  void open_single(const Mesh<N>& mesh, const std::filesystem::path& file) {
    files_.emplace_back(mesh, file);
    for (const auto& tensor : files_[0].header().tensors) file_index_[tensor.name] = 0;
  }

  // A tensor the index maps to one shard but that another shard holds too: a repair would
  // change one copy and leave the other, which a loader reading every shard may take. The
  // headers are the same on every rank, so is the error.
  void refuse_second_copies(const std::filesystem::path& index_path) const {
    for (std::size_t f = 0; f < files_.size(); ++f)
      for (const auto& tensor : files_[f].header().tensors) {
        const auto mapped = file_index_.find(tensor.name);
        if (mapped != file_index_.end() && mapped->second != f)
          throw error(
              fmt::format("kshard::io: tensor {} is in '{}' and in '{}' ('{}' names the first); a "
                          "tensor must be in one shard only",
                          detail::in_quotes(tensor.name), files_[mapped->second].path().string(),
                          files_[f].path().string(), index_path.string()));
      }
  }

  std::filesystem::path path_;
  bool folder_ = false;
  ModelConfig config_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::size_t> file_index_;
};

}  // namespace kshard::io
