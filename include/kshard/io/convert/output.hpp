#pragma once

// The folder a conversion publishes (io::convert_checkpoint): its options checked and spelled
// alike on every rank, rank 0's checks of the paths, the output files created at their final
// size under a temporary folder, the files beside the weights copied (config, tokenizer: from
// NeMo AutoModel's `.hf_metadata/` for per-rank shards), and the folder renamed into place.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kshard/io/checkpoint.hpp"
#include "kshard/io/checkpoint/folder_copy.hpp"
#include "kshard/io/engine/conversion_plan.hpp"
#include "kshard/io/engine/paths.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/model/convert_options.hpp"

namespace kshard::detail {

// The folder per-rank shards keep the files beside the weights in (NeMo AutoModel's name).
inline constexpr std::string_view hf_metadata_folder = ".hf_metadata";

// The options as one text (the agreement compares it; messages quote it).
inline std::string options_text(const io::ConvertOptions& o) {
  const auto layout = [](const std::vector<PlacementSpec>& specs) {
    std::vector<std::string> parts;
    for (const PlacementSpec& s : specs) parts.push_back(to_string(s));
    return fmt::format("({})", fmt::join(parts, ", "));
  };
  std::string text = fmt::format("form {}, max shard {} bytes, buffer {} bytes, durability {}",
                                 io::to_string(o.form), o.max_shard_bytes, o.buffer_bytes,
                                 to_string(o.durability));
  if (io::is_per_rank(o.form)) {
    text += fmt::format(", mesh ({}), layout {}", fmt::join(o.sharding.mesh, ", "),
                        layout(o.sharding.layout));
    for (const auto& [pattern, specs] : o.sharding.layout_for)
      text += fmt::format(", {} -> {}", in_quotes(pattern), layout(specs));
  }
  return text;
}

// Why a layout of a sharded output cannot be written: a placement count other than the mesh's,
// a Partial, a custom placement or a split factor below 1.
inline std::optional<std::string> layout_problem(const std::vector<PlacementSpec>& layout,
                                                 std::size_t mesh_rank, std::string_view what) {
  if (layout.size() != mesh_rank)
    return fmt::format("kshard::io: {} has {} placements for a mesh of {} dimensions", what,
                       layout.size(), mesh_rank);
  for (const PlacementSpec& p : layout)
    if (p.kind == PlacementKind::partial || p.kind == PlacementKind::custom ||
        (p.kind == PlacementKind::strided_shard && p.split_factor < 1))
      return fmt::format(
          "kshard::io: {} holds {}; per-rank shards take Replicate(), Shard(d) "
          "and StridedShard(d, sf >= 1)",
          what, to_string(p));
  return std::nullopt;
}

// Why `options` cannot be carried out (the same answer on every rank that has them).
inline std::optional<std::string> options_problem(const io::ConvertOptions& o) {
  if (o.max_shard_bytes == 0) return "kshard::io: the maximum shard size is 0 bytes";
  if (o.buffer_bytes < 4096)
    return fmt::format("kshard::io: the buffer of {} bytes is below the 4096 a conversion needs",
                       o.buffer_bytes);
  const auto& mesh = o.sharding.mesh;
  if (!io::is_per_rank(o.form) || mesh.empty())
    return std::nullopt;  // no mesh: the split the input is stored in
  std::int64_t world = 1;
  for (const int extent : mesh)
    if (extent < 1 || (world *= extent) > (1 << 20))
      return fmt::format("kshard::io: the mesh ({}) has an extent below 1 or more than 2^20 ranks",
                         fmt::join(mesh, ", "));
  if (mesh.size() > 8)
    return fmt::format("kshard::io: the mesh ({}) has {} dimensions; 1 to 8 are written",
                       fmt::join(mesh, ", "), mesh.size());
  if (auto problem = layout_problem(o.sharding.layout, mesh.size(), "the layout")) return problem;
  for (const auto& [pattern, layout] : o.sharding.layout_for)
    if (auto problem = layout_problem(layout, mesh.size(), "the layout for " + in_quotes(pattern)))
      return problem;
  return std::nullopt;
}

// Rank 0's checks of the output paths, before anything is made: the output does not exist, nor
// does its temporary folder (an interrupted conversion's: removed only by the user). That its
// parent folder exists is unusable_path_problem's check.
inline std::optional<std::string> output_folder_problem(const std::filesystem::path& out) {
  std::error_code ec;
  const auto partial = partial_path(out);
  if (std::filesystem::exists(std::filesystem::symlink_status(out, ec)))
    return fmt::format("kshard::io: the output '{}' exists; a conversion writes a new folder",
                       out.string());
  if (std::filesystem::exists(std::filesystem::symlink_status(partial, ec)))
    return fmt::format(
        "kshard::io: '{}' exists (an interrupted conversion left it?); remove it "
        "to write '{}'",
        partial.string(), out.string());
  return std::nullopt;
}

// Copies the bytes of `items` of `model` into `out` (the file at `path`), 1 MiB at a time.
inline void copy_items(const io::Checkpoint& model, const std::vector<OutputItem>& items, int out,
                       const std::filesystem::path& path) {
  std::vector<std::byte> buffer;
  for (const OutputItem& copy : items) {
    const DataFile& source = model.data_files()[copy.item->file];
    const ScopedFd in(open_or_throw(source.path, O_RDONLY | O_CLOEXEC));
    for (std::uint64_t done = 0; done < copy.item->bytes;) {
      const std::uint64_t bytes = std::min<std::uint64_t>(copy.item->bytes - done, 1 << 20);
      buffer.resize(bytes);
      throw_if(pread_exactly(in.get(), buffer.data(), bytes, copy.item->offset + done,
                             source.path.string()));
      pwrite_exactly(out, buffer.data(), bytes, copy.at + done, path);
      done += bytes;
    }
  }
}

// Rank 0: creates the temporary folder (`created` says it did: its to remove after a failure)
// and every output file in it at its final size, its headers (framing) and the items of `model`
// it carries written; throws (for the agreement) on failure.
inline void create_outputs(const io::Checkpoint& model, const std::filesystem::path& partial,
                           const std::vector<OutputFile>& files, bool& created) {
  std::error_code ec;
  if (!std::filesystem::create_directory(partial, ec) || ec)
    throw error(fmt::format("kshard::io: cannot create the folder '{}': {}", partial.string(),
                            ec ? ec.message() : "it exists"));
  created = true;
  for (const OutputFile& file : files) {
    const auto path = partial / file.name;
    const ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd)
      throw error(
          fmt::format("kshard::io: cannot create '{}': {}", path.string(), std::strerror(errno)));
    for (const FileBytes& bytes : file.framing)
      pwrite_exactly(fd.get(), bytes.bytes.data(), bytes.bytes.size(), bytes.at, path);
    copy_items(model, file.items, fd.get(), path);
    if (::ftruncate(fd.get(), static_cast<off_t>(file.size)) != 0)
      throw error(
          fmt::format("kshard::io: cannot size '{}': {}", path.string(), std::strerror(errno)));
    fsync_or_throw(fd.get(), path);
  }
}

// Rank 0: copies the entries of folder `from` into `to` (made if missing) but those `skip` names.
template <class Skip>
void copy_entries(const std::filesystem::path& from, const std::filesystem::path& to, Skip&& skip) {
  std::error_code failed;
  std::filesystem::create_directories(to, failed);
  for (std::filesystem::directory_iterator it(from, failed), end; !failed && it != end;
       it.increment(failed)) {
    if (skip(it->path().filename().string())) continue;
    copy_entry(*it, to, failed);
    if (failed)
      throw error(fmt::format("kshard::io: cannot copy '{}' into '{}': {}", it->path().string(),
                              to.string(), failed.message()));
  }
  if (failed)
    throw error(fmt::format("kshard::io: cannot list '{}': {}", from.string(), failed.message()));
}

// True for a weights file: never copied beside the weights a conversion writes (a stale file
// the checkpoint does not use would take an output's name, or confuse a reader of the folder).
inline bool weights_name(const std::string& name) { return name.ends_with(".safetensors"); }

// Rank 0: copies what the converted checkpoint keeps beside its weights into `partial`. From
// per-rank shards: `.hf_metadata/` (the folder into per-rank output; its files but the job's
// tensor maps into a consolidated one). From a Hugging Face folder: its entries but the weights,
// kshard's files and the index (kept for a copy as stored, whose files it names), into
// `.hf_metadata/` of per-rank output.
inline void copy_side_files(const io::Checkpoint& model, const std::filesystem::path& partial,
                            io::OutputForm form) {
  std::error_code ec;
  const bool from_shards = io::is_per_rank(model.form());
  const bool per_rank_out =
      io::is_per_rank(form) || (form == io::OutputForm::as_stored && from_shards);
  const auto into = per_rank_out ? partial / hf_metadata_folder : partial;
  if (from_shards) {
    const auto metadata = model.path() / hf_metadata_folder;
    if (!std::filesystem::is_directory(metadata, ec)) return;
    copy_entries(metadata, into, [&](const std::string& name) {
      return weights_name(name) || (!per_rank_out && (name == "fqn_to_file_index_mapping.json" ||
                                                      name == "fqn_to_dtype_mapping.json"));
    });
  } else if (model.is_folder()) {
    copy_entries(model.path(), into, [&](const std::string& name) {
      return weights_name(name) || left_out_of_copy(model, name) ||
             (name == io::safetensors_index_name && form != io::OutputForm::as_stored) ||
             std::filesystem::equivalent(model.path() / name, partial, ec);
    });
  }
}

}  // namespace kshard::detail
