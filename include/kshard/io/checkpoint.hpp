#pragma once

/// \file
/// A checkpoint in any of the three forms training and serving code write, with the
/// `config.json` fields the repair needs:
/// - one `.safetensors` file, or a folder holding `model.safetensors` (Hugging Face, unsharded);
/// - a folder whose `model.safetensors.index.json` maps each tensor to one of its files
///   (Hugging Face, sharded by tensor);
/// - a folder of per-rank shards, as a training job writes them (torch's
///   HuggingFaceStorageWriter, NeMo AutoModel's default save): each `.safetensors` file holds
///   one rank's pieces of the tensors, placed by the `DCP_SHARDING_INFO` of its metadata;
/// - a PyTorch Distributed Checkpoint (`torch.distributed.checkpoint.save`): `.metadata` and
///   `__<rank>_<k>.distcp` files, each tensor piece a torch.save archive. `.metadata` is read by
///   a restricted unpickler that builds only DCP's classes and calls nothing (any other global
///   is refused by name); each piece's place comes from its archive's ZIP directory and
///   `data.pkl`, checked against `.metadata`.
/// The form is recognised by the folder's contents, in that order: an index, then
/// `model.safetensors`, then `.metadata` (or the `__<rank>.metadata` files each rank writes
/// with `use_collectives=False`, merged), then `.safetensors` files that all carry sharding
/// info.
///
///     kshard::io::Checkpoint model(mesh, "path/to/model");   // collective
///     const kshard::io::StoredTensor& embed = model.tensor("model.embed_tokens.weight");
///     auto pad = model.config().pad_token_id;
///
/// Every tensor is a `StoredTensor`: dtype, global shape (for per-rank shards the maximum of
/// offset + shape over its pieces, as torch computes it) and the pieces that tile it.
/// A single file's `config.json` is the one in its folder. Opening a DCP folder costs rank 0 the
/// `.metadata` and a few small reads per piece (the end of its archive, two local headers, its
/// `data.pkl`), then one broadcast of the table; opening the others costs one header read per
/// file on every rank (ranks that see different files under one path are refused) and one
/// broadcast per JSON file and folder listing; every rank throws the same `kshard::error` for a
/// missing path, an index that is not JSON, names a file outside the folder or a tensor its file
/// lacks, a tensor in two shards, per-rank shards whose pieces do not tile a tensor exactly (a
/// gap, an overlap, a dtype or rank that differs between files, sharding info that is not JSON
/// or names a tensor its file lacks, a file without it), a config.json field of the wrong
/// type or range, per-rank shards whose embedding or LM head (`known_embedding_names`,
/// `known_lm_head_names`) has other rows or columns than the config's `vocab_size` and
/// `hidden_size` (a rank's file missing: shards store no global shape), any input that is not a
/// regular file (a FIFO, socket, device or folder: opened non-blocking, never waited on), and
/// a DCP folder whose files are other bytes on some rank than on rank 0 (node-local copies that
/// differ: each file's size and every byte rank 0 read to learn the layout are compared;
/// tensor bytes only by `io::verify_checksums`).

#include <array>
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
#include "kshard/io/engine/small_files.hpp"
#include "kshard/io/formats/dcp/reader.hpp"
#include "kshard/io/formats/hugging_face/index.hpp"
#include "kshard/io/formats/per_rank_shards/listing.hpp"
#include "kshard/io/model/stored_tensor.hpp"
#include "kshard/io/safetensors.hpp"
#include "kshard/io/safetensors/pieces.hpp"
#include "kshard/mesh.hpp"

namespace kshard::io {

/// The `config.json` fields kshard uses; each unset when absent or null.
struct ModelConfig {
  std::optional<bool> tie_word_embeddings;  ///< the LM head shares the input embedding's storage
  /// The padding id (zeroed on purpose in many models); also unset when negative (Hugging Face
  /// writes -1 for none).
  std::optional<index_t> pad_token_id;
  std::optional<index_t> vocab_size;   ///< the tokenizer's vocabulary size
  std::optional<index_t> hidden_size;  ///< the width of the embedding
};

/// The names models give their input embedding, most common first (kshard-repair takes the
/// first one present, and opening per-rank shards checks its shape against config.json).
inline constexpr std::array<std::string_view, 12> known_embedding_names{
    "model.embed_tokens.weight",
    "transformer.wte.weight",
    "embeddings.word_embeddings.weight",
    "bert.embeddings.word_embeddings.weight",
    "model.embeddings.word_embeddings.weight",
    "gpt_neox.embed_in.weight",
    "transformer.word_embeddings.weight",
    "model.decoder.embed_tokens.weight",
    "tok_embeddings.weight",
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight"};
/// The names models give their LM head (output embedding).
inline constexpr std::array<std::string_view, 4> known_lm_head_names{
    "lm_head.weight", "model.lm_head.weight", "embed_out.weight", "output.weight"};

/// The name of the index file of a sharded checkpoint.
inline constexpr std::string_view safetensors_index_name = "model.safetensors.index.json";
/// The name of the single file of an unsharded checkpoint folder.
inline constexpr std::string_view safetensors_single_name = "model.safetensors";

/// The forms of a checkpoint (see the file comment).
enum class CheckpointForm : std::uint8_t {
  single_file,      ///< one safetensors file (given, or `model.safetensors` in the folder)
  indexed,          ///< files listed by `model.safetensors.index.json`, each tensor whole in one
  per_rank_shards,  ///< one file per rank, each tensor in pieces placed by `DCP_SHARDING_INFO`
  dcp               ///< PyTorch DCP: `.metadata` and `.distcp` files of torch.save archives
};

/// A form of checkpoint as kshard names it, what it is, and how its tensors are stored.
struct NamedCheckpointForm {
  CheckpointForm form;     ///< the form
  std::string_view name;   ///< as messages spell it
  std::string_view holds;  ///< what it is, one phrase
  bool per_rank;           ///< its tensors in per-rank pieces, as a training job saves them
};

/// Every form, in the order a folder is recognised (a single file given by its path aside).
inline constexpr std::array<NamedCheckpointForm, 4> named_checkpoint_forms{{
    {CheckpointForm::indexed, "indexed", "a Hugging Face folder with an index", false},
    {CheckpointForm::single_file, "single_file", "one safetensors file", false},
    {CheckpointForm::dcp, "dcp", "a PyTorch DCP folder", true},
    {CheckpointForm::per_rank_shards, "per_rank_shards", "per-rank safetensors shards", true},
}};

/// The name of `form`.
constexpr std::string_view to_string(CheckpointForm form) {
  for (const NamedCheckpointForm& named : named_checkpoint_forms)
    if (named.form == form) return named.name;
  return "?";
}

/// True for the forms that store tensors in per-rank pieces (per-rank shards, DCP): their
/// files beside the weights live in `.hf_metadata/`, and a new copy is written by conversion.
constexpr bool is_per_rank(CheckpointForm form) {
  for (const NamedCheckpointForm& named : named_checkpoint_forms)
    if (named.form == form) return named.per_rank;
  return false;
}

/// A checkpoint opened on a mesh: its safetensors files (headers validated), its tensors (where
/// each piece of each lies), and its config. Collective to open; the queries are local.
class Checkpoint {
 public:
  /// Opens `path`: a `.safetensors` file, or a folder with `model.safetensors.index.json` (a
  /// sharded checkpoint), `model.safetensors`, or per-rank shards, and optionally
  /// `config.json`. Collective over `mesh`; see the file comment for the errors.
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
    const bool configured = read_config(group, folder / "config.json");
    if (!folder_) {
      open_single(mesh, path_);
      return;
    }
    const auto index_path = path_ / safetensors_index_name;
    if (const auto index = detail::read_small_file(group, index_path)) {
      description_files_.push_back(index_path);
      open_indexed(mesh, detail::parse_weight_map(*index, index_path), index_path);
    } else if (rank0_sees(group, path_ / safetensors_single_name)) {
      open_single(mesh, path_ / safetensors_single_name);
    } else if (rank0_sees_dcp(group, path_)) {
      open_dcp(group);
      if (!configured) read_config(group, path_ / ".hf_metadata" / "config.json");
    } else {
      open_shards(mesh, detail::list_safetensors(group, path_));
      // A training job keeps the config beside its shards in .hf_metadata/ (NeMo AutoModel).
      if (!configured) read_config(group, path_ / ".hf_metadata" / "config.json");
      check_inferred_shapes();
    }
  }

  /// The path it was opened from.
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// True for a checkpoint folder, false for a single file.
  [[nodiscard]] bool is_folder() const { return folder_; }
  /// config.json's fields (all unset without one).
  [[nodiscard]] const ModelConfig& config() const { return config_; }
  /// Its safetensors files, in the order first named (none for a DCP folder).
  [[nodiscard]] const std::vector<SafetensorsFile>& files() const { return files_; }
  /// The files its tensors' pieces lie in (`StoredPiece::file` indexes them): its safetensors
  /// files, or a DCP folder's `.distcp` files.
  [[nodiscard]] const std::vector<DataFile>& data_files() const { return contents_.data_files; }
  /// What it holds beside tensors: a DCP folder's bytes items (optimizer steps, learning
  /// rates, ...), in `.metadata`'s order; none for safetensors.
  [[nodiscard]] const std::vector<StoredItem>& other_items() const { return contents_.other_items; }
  /// The checksums it records (a DCP folder: each piece's CRC-32), which opening does not check
  /// (`io::verify_checksums` does); none for safetensors.
  [[nodiscard]] const std::vector<StoredChecksum>& checksums() const { return contents_.checksums; }
  /// What it holds, whatever its form: data files, tensors, other items, checksums.
  [[nodiscard]] const StoredContents& contents() const { return contents_; }
  /// How it is stored.
  [[nodiscard]] CheckpointForm form() const { return form_; }
  /// The files read to learn what it holds, beside `data_files()`: the index, the config.json
  /// read, a DCP folder's `.metadata` (or each rank's), as rank 0 found them.
  [[nodiscard]] const std::vector<std::filesystem::path>& description_files() const {
    return description_files_;
  }
  /// True when it holds tensor `name`.
  [[nodiscard]] bool contains(std::string_view name) const {
    return contents_.tensors.find(std::string(name)) != contents_.tensors.end();
  }
  /// Every tensor name, sorted.
  [[nodiscard]] std::vector<std::string> tensor_names() const {
    std::vector<std::string> names;
    for (const auto& [name, tensor] : contents_.tensors) names.push_back(name);
    return names;
  }
  /// Tensor `name`: dtype, global shape and pieces. Throws `kshard::error` (locally: the names
  /// are the same on every rank) when there is none.
  [[nodiscard]] const StoredTensor& tensor(std::string_view name) const {
    const auto it = contents_.tensors.find(std::string(name));
    if (it == contents_.tensors.end())
      throw error(fmt::format("kshard::io: the checkpoint '{}' has no tensor {}", path_.string(),
                              detail::in_quotes(name)));
    return it->second;
  }
  /// The safetensors file holding tensor `name` whole. Throws `kshard::error` (locally) when
  /// there is no such tensor or it is stored in pieces or in a DCP folder (read it with the
  /// `read_matrix` that takes a checkpoint).
  [[nodiscard]] const SafetensorsFile& file_of(std::string_view name) const {
    const StoredTensor& stored = tensor(name);
    if (form_ == CheckpointForm::dcp)
      throw error(
          fmt::format("kshard::io: tensor {} of '{}' is in a PyTorch DCP archive, not "
                      "a safetensors file",
                      detail::in_quotes(name), path_.string()));
    if (stored.pieces.size() != 1)
      throw error(
          fmt::format("kshard::io: tensor {} of '{}' is stored in {} pieces, not whole in "
                      "one file",
                      detail::in_quotes(name), path_.string(), stored.pieces.size()));
    return files_[stored.pieces[0].file];
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
            detail::config_field<index_t>(config, "vocab_size", path),
            detail::config_field<index_t>(config, "hidden_size", path)};
  }

  // Reads config.json at `path` when it exists; says whether it did.
  bool read_config(const comm::Group& group, const std::filesystem::path& path) {
    const auto text = detail::read_small_file(group, path);
    if (text) {
      config_ = parse_config(*text, path);
      description_files_.push_back(path);
    }
    return text.has_value();
  }

  // True when rank 0 sees something at `path` (the same answer on every rank); one that is not
  // a regular file is refused when it is opened.
  static bool rank0_sees(const comm::Group& group, const std::filesystem::path& path) {
    std::error_code ec;  // rank 0 alone looks: it must not throw
    std::int64_t seen = group.rank() == 0 && std::filesystem::exists(path, ec);
    group.bcast(&seen, 1, 0);
    return seen != 0;
  }

  static bool rank0_sees_dcp(const comm::Group& group, const std::filesystem::path& folder) {
    std::int64_t seen = group.rank() == 0 && !detail::dcp_metadata_paths(folder).empty();
    group.bcast(&seen, 1, 0);
    return seen != 0;
  }

  template <std::size_t N>
  void open_single(const Mesh<N>& mesh, const std::filesystem::path& file) {
    form_ = CheckpointForm::single_file;
    files_.emplace_back(mesh, file);
    place_pieces(files_.size());
  }

  template <std::size_t N>
  void open_indexed(const Mesh<N>& mesh, const std::map<std::string, std::string>& weight_map,
                    const std::filesystem::path& index_path) {
    form_ = CheckpointForm::indexed;
    std::map<std::string, std::size_t> opened;
    std::map<std::string, std::size_t> file_index;
    for (const auto& [tensor, file] : weight_map) {
      auto [it, added] = opened.emplace(file, files_.size());
      if (added) files_.emplace_back(mesh, path_ / file);
      if (files_[it->second].header().find(tensor) == nullptr)
        throw error(
            fmt::format("kshard::io: '{}' maps tensor {} to '{}', which has no such "
                        "tensor",
                        index_path.string(), detail::in_quotes(tensor), file));
      file_index[tensor] = it->second;
    }
    refuse_second_copies(file_index, index_path);
    place_pieces(files_.size());
    std::erase_if(contents_.tensors,
                  [&](const auto& entry) { return !file_index.contains(entry.first); });
  }

  // Opens the per-rank shards `names` of the folder; each must carry sharding info.
  template <std::size_t N>
  void open_shards(const Mesh<N>& mesh, const std::vector<std::string>& names) {
    form_ = CheckpointForm::per_rank_shards;
    if (names.empty())
      throw error(fmt::format(
          "kshard::io: '{}' holds no {}, no {} and no .safetensors files (per-rank shards)",
          path_.string(), safetensors_index_name, safetensors_single_name));
    for (const auto& name : names) files_.emplace_back(mesh, path_ / name);
    place_pieces(0);
  }

  // Per-rank shards store no global shape: a tensor's is inferred from its pieces, so a folder
  // that lost its last rank's file reads as smaller tensors. Where the config names the
  // vocabulary size and width, the embedding and LM head must have them. The config and the
  // headers are alike on every rank, so is the error.
  void check_inferred_shapes() const {
    const auto check = [&](std::string_view name) {
      if (!contains(name)) return;
      const std::vector<std::int64_t>& shape = this->tensor(name).shape;
      const auto rows = shape.empty() ? 0 : shape[0];
      const auto cols = shape.size() < 2 ? 0 : shape[1];
      if ((config_.vocab_size && rows != *config_.vocab_size) ||
          (config_.hidden_size && cols != *config_.hidden_size))
        throw error(fmt::format(
            "kshard::io: the per-rank shards of '{}' ({} files) make {} of shape {}, but the "
            "config gives vocab_size {} and hidden_size {}: a rank's file is missing, or the "
            "config is another model's",
            path_.string(), files_.size(), detail::in_quotes(name), shape_text(shape),
            config_.vocab_size ? fmt::format("{}", *config_.vocab_size) : "(none)",
            config_.hidden_size ? fmt::format("{}", *config_.hidden_size) : "(none)"));
    };
    for (const std::string_view name : known_embedding_names) check(name);
    for (const std::string_view name : known_lm_head_names) check(name);
  }

  // Reads a PyTorch DCP folder (rank 0, then a broadcast).
  void open_dcp(const comm::Group& group) {
    form_ = CheckpointForm::dcp;
    detail::DcpContents contents = detail::read_dcp_folder(group, path_);
    contents_ = std::move(contents.stored);
    description_files_.insert(description_files_.end(), contents.metadata_files.begin(),
                              contents.metadata_files.end());
  }

  // The stored tensors of the files: whole tensors, or pieces where the files carry sharding
  // info (which per-rank shards must: all of them from `first_shard` on).
  void place_pieces(std::size_t first_shard) {
    std::vector<std::optional<detail::ShardingInfo>> infos;
    std::vector<detail::PieceSource> sources;
    for (const SafetensorsFile& file : files_) infos.push_back(detail::sharding_info_of(file));
    for (std::size_t f = 0; f < files_.size(); ++f) {
      if (f >= first_shard && !infos[f])
        throw error(fmt::format(
            "kshard::io: '{}' has no {} in its metadata; a folder without {} or {} is read as "
            "per-rank shards, each placed by it",
            files_[f].path().string(), detail::sharding_info_key, safetensors_index_name,
            safetensors_single_name));
      sources.push_back(
          {files_[f].path().string(), &files_[f].header(), infos[f] ? &*infos[f] : nullptr});
    }
    contents_.tensors = detail::stored_tensors(sources);
    for (const SafetensorsFile& file : files_)
      contents_.data_files.push_back({file.path(), file.file_size()});
  }

  // A tensor the index maps to one shard but that another shard holds too: a repair would
  // change one copy and leave the other, which a loader reading every shard may take. The
  // headers are the same on every rank, so is the error.
  void refuse_second_copies(const std::map<std::string, std::size_t>& file_index,
                            const std::filesystem::path& index_path) const {
    for (std::size_t f = 0; f < files_.size(); ++f)
      for (const auto& tensor : files_[f].header().tensors) {
        const auto mapped = file_index.find(tensor.name);
        if (mapped != file_index.end() && mapped->second != f)
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
  CheckpointForm form_ = CheckpointForm::single_file;
  std::vector<SafetensorsFile> files_;
  StoredContents contents_;
  std::vector<std::filesystem::path> description_files_;
};

}  // namespace kshard::io
