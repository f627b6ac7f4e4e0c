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
#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"
#include "kshard/io/detail/checkpoint_json.hpp"
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

/// A checkpoint opened on a mesh: its safetensors files (headers validated), which file holds
/// each tensor, and its config. Collective to open; the queries are local.
class Checkpoint {
 public:
  /// Opens `path`: a `.safetensors` file, or a folder with `model.safetensors.index.json` (a
  /// sharded checkpoint) or `model.safetensors`, and optionally `config.json`. Collective over
  /// `mesh`; see the file comment for the errors.
  template <std::size_t N>
  Checkpoint(const Mesh<N>& mesh, std::filesystem::path path) : path_(std::move(path)) {
    const detail::Operation operation("io::Checkpoint");
    const comm::Group& group = mesh.group();
    detail::Agreement agreement(group);
    detail::same_text(agreement, "the checkpoint path", path_.string());
    agreement.settle();
    std::error_code ec;  // rank 0 alone looks: it must not throw
    std::int64_t is_folder = mesh.my_rank() == 0 && std::filesystem::is_directory(path_, ec);
    group.bcast(&is_folder, 1, 0);
    folder_ = is_folder != 0;
    // A single file's config.json is the one beside it, as in a checkpoint folder.
    const auto folder = folder_ ? path_ : path_.parent_path();
    if (auto text = detail::read_small_file(group, folder / "config.json"))
      config_ = parse_config(*text, folder / "config.json");
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
  // config.json's fields, every rank parsing the same text (so throwing the same error).
  static ModelConfig parse_config(const std::string& text, const std::filesystem::path& path) {
    const nlohmann::json config = detail::parse_json(text, path);
    if (!config.is_object())
      throw error(fmt::format("kshard::io: '{}' is not a JSON object", path.string()));
    auto pad = detail::config_field<index_t>(config, "pad_token_id", path);
    if (pad && *pad < 0) pad.reset();  // Hugging Face configs write -1 for "no padding token"
    return {detail::config_field<bool>(config, "tie_word_embeddings", path), pad,
            detail::config_field<index_t>(config, "vocab_size", path)};
  }

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
