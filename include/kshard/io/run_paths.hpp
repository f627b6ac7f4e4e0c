#pragma once

/// \file
/// What an operation over a checkpoint reads, copies and makes, checked before anything is
/// written: no path it makes (an output, a temporary, an undo file, a report) may name a file it
/// reads, in any form of checkpoint, however the path is spelled (links, `..`, hard links), nor
/// lie inside a folder it copies or makes.
///
///     kshard::io::Checkpoint model(mesh, "ckpt");
///     auto paths = kshard::io::conversion_paths(model, "out");
///     paths.makes.push_back({"report", "report.json"});
///     kshard::io::refuse_clashes(mesh.group(), paths, "nothing was written");   // collective
///
/// `convert_checkpoint`, `write_checkpoint` and the in-place writes run the same check on their
/// own paths; a program adds the files it writes itself. `refuse_unusable_paths` checks the
/// paths a program was given before it reads anything.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/engine/paths.hpp"
#include "kshard/io/model/named_path.hpp"

namespace kshard::io {

/// The undo file an in-place write of the weights file `weights` keeps beside it (the name
/// `kshard-repair --in-place` gives it, and `undo_checkpoint` looks for): `weights` +
/// ".kshard-undo".
[[nodiscard]] inline std::filesystem::path undo_path_of(const std::filesystem::path& weights) {
  return weights.string() + ".kshard-undo";
}

/// Where weights file `file` of `model` goes when `model` is written to `out`: `out` itself for
/// a single file, `out`/its name for a folder.
[[nodiscard]] inline std::filesystem::path output_path_of(const Checkpoint& model,
                                                          const SafetensorsFile& file,
                                                          const std::filesystem::path& out) {
  return model.is_folder() ? out / file.path().filename() : out;
}

/// The files a run over `model` reads, in every form: its data files (safetensors files, a DCP
/// folder's `.distcp` files), the files that describe it (`description_files()`: the index,
/// the config.json read, a DCP's `.metadata`), config.json and the index beside a single file,
/// and with `with_undo_files` the undo file beside each weights file (`undo_path_of`). Local:
/// looks at the file system, changes nothing.
[[nodiscard]] inline std::vector<NamedPath> checkpoint_inputs(const Checkpoint& model,
                                                              bool with_undo_files) {
  std::vector<NamedPath> inputs;
  for (const auto& file : model.data_files()) {
    inputs.push_back({"checkpoint file", file.path});
    if (with_undo_files && model.form() != CheckpointForm::dcp)
      inputs.push_back({"undo file", undo_path_of(file.path)});
  }
  std::vector<std::filesystem::path> others = model.description_files();
  const auto folder = model.is_folder() ? model.path() : model.path().parent_path();
  for (const auto& json : {folder / "config.json", folder / safetensors_index_name}) {
    std::error_code absent;
    if (std::filesystem::exists(json, absent) &&
        std::find(others.begin(), others.end(), json) == others.end())
      others.push_back(json);
  }
  for (const auto& file : others) inputs.push_back({"checkpoint file", file});
  return inputs;
}

/// The folders whose contents a new checkpoint written from `model` copies (the files beside
/// the weights): `.hf_metadata/` of per-rank shards and DCP folders, a Hugging Face folder
/// itself; none for a single file given by its path. Local.
[[nodiscard]] inline std::vector<NamedPath> copied_folders(const Checkpoint& model) {
  std::error_code absent;
  const bool in_pieces = is_per_rank(model.form());
  const auto metadata = model.path() / ".hf_metadata";
  if (in_pieces && std::filesystem::is_directory(metadata, absent))
    return {{"folder of side files the run copies", metadata, true}};
  if (!in_pieces && model.is_folder())
    return {{"checkpoint folder the run copies", model.path(), true}};
  return {};
}

/// The files `write_checkpoint(mesh, model, out, ...)` creates or replaces: each weights file's
/// output and its temporary, and for a folder the copies of its JSON files. Local.
[[nodiscard]] inline std::vector<NamedPath> checkpoint_outputs(const Checkpoint& model,
                                                               const std::filesystem::path& out) {
  std::vector<NamedPath> made;
  for (const auto& file : model.files()) {
    const auto output = output_path_of(model, file, out);
    made.push_back({"output", output});
    made.push_back({"output's temporary", detail::partial_path(output)});
  }
  if (model.is_folder())
    for (const auto& input : checkpoint_inputs(model, false))
      if (input.path.extension() == ".json") made.push_back({"copy", out / input.path.filename()});
  return made;
}

/// The files in-place writes of every weights file of `model` make, with undo files named by
/// `undo_path_of`: the undo files and their temporaries. Local.
[[nodiscard]] inline std::vector<NamedPath> undo_outputs(const Checkpoint& model) {
  std::vector<NamedPath> made;
  for (const auto& file : model.files()) {
    made.push_back({"undo file", undo_path_of(file.path())});
    made.push_back({"undo file's temporary", detail::partial_path(undo_path_of(file.path()))});
  }
  return made;
}

/// What `write_checkpoint(mesh, model, out, ...)` reads, copies and makes. Local.
[[nodiscard]] inline RunPaths rewrite_paths(const Checkpoint& model,
                                            const std::filesystem::path& out) {
  return {checkpoint_inputs(model, false), copied_folders(model), checkpoint_outputs(model, out)};
}

/// What `convert_checkpoint(mesh, model, out, ...)` reads, copies and makes: the output folder
/// and its temporary folder (`out` + ".kshard-partial"), the files inside them. Local.
[[nodiscard]] inline RunPaths conversion_paths(const Checkpoint& model,
                                               const std::filesystem::path& out) {
  const auto folder = detail::folder_path(out);
  return {checkpoint_inputs(model, false),
          copied_folders(model),
          {{"output folder", folder, true},
           {"output's temporary folder", detail::partial_path(folder), true}}};
}

/// What in-place writes into `model` (`write_patch_in_place`, `write_rows_in_place` of each
/// weights file) read and make: the undo files beside the weights. Local.
[[nodiscard]] inline RunPaths in_place_paths(const Checkpoint& model) {
  return {checkpoint_inputs(model, false), {}, undo_outputs(model)};
}

/// Collective over `group` (a mesh's `group()`), before anything is written: rank 0 checks
/// `paths` (io::RunPaths) by the files they name (device and inode, through symbolic links, `..`
/// and hard links; a path that does not exist yet by its folder and name) and the folders they
/// lie in. Where a path the run makes names a file it reads or makes otherwise, or lies inside a
/// folder it copies or makes, every rank throws the same `kshard::error`, "kshard::io: the ROLE
/// 'PATH' is the ROLE 'PATH' (one file); " (or "lies inside the ROLE 'PATH'; ") followed by
/// `consequence`. Only rank 0's lists are read. Cost: a stat per path and a path resolution
/// per path made on rank 0, one agreement.
inline void refuse_clashes(const comm::Group& group, const RunPaths& paths,
                           std::string_view consequence) {
  detail::agree(group,
                group.rank() == 0 ? detail::clash_problem(paths, consequence) : std::nullopt);
}

/// Collective over `group`, before anything is read: each path of `given` (what a program
/// writes, as its user gave it; `folder` set for a folder it makes) is spelled alike on every
/// rank and usable (rank 0's view: not empty, in a folder that exists, nothing of
/// another kind already there), else every rank throws the same
/// `kshard::error`. Cost: a few stats on rank 0, one agreement.
inline void refuse_unusable_paths(const comm::Group& group, const std::vector<NamedPath>& given) {
  detail::Agreement agreement(group);
  for (const NamedPath& path : given) {
    detail::same_text(agreement, "the " + path.role, path.path.string());
    if (group.rank() == 0) agreement.problem(detail::unusable_path_problem(path));
  }
  agreement.settle();
}

}  // namespace kshard::io
