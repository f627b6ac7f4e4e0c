#pragma once

/// \file
/// A checkpoint's files as a whole, for programs that repair or rewrite checkpoints
/// (kshard-repair is one): a new checkpoint written beside the old one, its folder copied but
/// its weights (`write_checkpoint`); the undo files of in-place writes found, checked and
/// restored (`files_with_undo`, `undo_checkpoint`); the paths a run reads and makes, checked so
/// that none it makes is one it reads or lies inside a folder it copies (`rewrite_paths`,
/// `conversion_paths`, `in_place_paths`, `refuse_clashes`); and a hash of every tensor
/// (`tensor_hashes`).
///
///     kshard::io::Checkpoint model(mesh, "path/to/model");
///     auto written = kshard::io::write_checkpoint(
///         mesh, model, "repaired", {kshard::io::replace_rows("embed.weight", embed, ids)});
///     auto hashes = kshard::io::tensor_hashes(mesh, kshard::io::Checkpoint(mesh, "repaired"));
///
/// Each function that communicates refuses with the same `kshard::error` on every rank, having
/// changed nothing or removed again what it made.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/checkpoint/folder_copy.hpp"
#include "kshard/io/checkpoint/patches.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/paths.hpp"
#include "kshard/io/model/durability.hpp"
#include "kshard/io/model/named_path.hpp"
#include "kshard/io/row_patch.hpp"
#include "kshard/io/run_paths.hpp"
#include "kshard/io/safetensors.hpp"
#include "kshard/io/safetensors/write.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"

namespace kshard::detail {

// A PyTorch DCP folder is read, not written, by the safetensors writes: its tensors reach a new
// checkpoint (DCP too) through io::convert_checkpoint.
inline std::optional<std::string> dcp_problem(const io::Checkpoint& model, std::string_view what) {
  if (model.form() != io::CheckpointForm::dcp) return std::nullopt;
  return fmt::format(
      "kshard::io::{}: '{}' is a PyTorch DCP checkpoint, which this safetensors write does "
      "not change; nothing was written (io::convert_checkpoint writes it, with row patches, as "
      "a new DCP, per-rank shards or a Hugging Face model)",
      what, model.path().string());
}

}  // namespace kshard::detail

namespace kshard::io {

/// Writes `model` as a new checkpoint at `out`, with the tensors (or rows) `updates` name
/// replaced: for a single file, `write_safetensors(mesh, file, out, updates)`; for a folder,
/// rank 0 makes `out` (it may exist) and copies the folder into it but the weights and kshard's
/// undo and temporary files (config, tokenizer, index, subfolders; links followed), then each
/// weights file is written by `write_safetensors` with the updates of its tensors. Returns the
/// weights files written, the same on every rank. Collective over `mesh`. Every rank throws the
/// same `kshard::error`, nothing written, for an `out` or update that differs between ranks, an
/// update of a tensor the checkpoint lacks, an `out` that is empty, in a missing folder or of
/// another kind, and a path it makes that `model` reads or that lies inside the folder it copies
/// (`rewrite_paths`); after a failed copy or write, rank 0
/// removes what the call made (the folder it created, or what it added to one that existed,
/// and the weights written), so that no half-written checkpoint is left. Cost: the copies,
/// then `write_safetensors`' per file, each written with `durability`.
template <std::size_t N>
std::vector<std::filesystem::path> write_checkpoint(const Mesh<N>& mesh, const Checkpoint& model,
                                                    const std::filesystem::path& out,
                                                    const std::vector<TensorUpdate>& updates,
                                                    Durability durability = Durability::fsync) {
  const detail::Operation operation("io::write_checkpoint");
  detail::Agreement agreement(mesh.group());
  detail::same_text(agreement, "the output path", out.string());
  detail::same_text(agreement, "the durability", std::string(to_string(durability)));
  agreement.same("the number of tensors to replace", static_cast<std::int64_t>(updates.size()));
  if (auto problem = detail::dcp_problem(model, "write_checkpoint")) {
    agreement.problem(std::move(problem));
    agreement.settle();
  }
  for (const TensorUpdate& u : updates) {
    detail::UpdateAccess::agree_on(agreement, u);
    agreement.problem(
        model.contains(u.name())
            ? detail::UpdateAccess::problem(u, model.file_of(u.name()), mesh.group())
            : fmt::format("kshard::io: the checkpoint '{}' has no tensor {} to replace",
                          model.path().string(), detail::in_quotes(u.name())));
  }
  if (mesh.my_rank() == 0) {
    agreement.problem(detail::unusable_path_problem({"output", out, model.is_folder()}));
    agreement.problem(detail::clash_problem(rewrite_paths(model, out), "nothing was written"));
  }
  agreement.settle();
  if (!model.is_folder()) {
    write_safetensors(mesh, model.files().front(), out, updates, durability);
    return {out};
  }
  detail::FolderCopy copy;
  if (mesh.my_rank() == 0) copy = detail::copy_folder_but_weights(model, out);
  detail::agree(mesh.group(), copy.problem);
  std::vector<std::filesystem::path> written;
  try {
    for (const auto& file : model.files()) {  // untouched files are copied in parallel too
      std::vector<TensorUpdate> mine;
      for (const TensorUpdate& u : updates)
        if (&model.file_of(u.name()) == &file) mine.push_back(u);
      write_safetensors(mesh, file, output_path_of(model, file, out), mine, durability);
      written.push_back(output_path_of(model, file, out));
    }
  } catch (const error&) {  // every rank: the output is whole or absent
    copy.made.insert(copy.made.end(), written.begin(), written.end());
    if (mesh.my_rank() == 0) detail::remove_quietly(copy.made);
    throw;
  }
  return written;
}

/// Writes the rows of `patch` into the files of `model` that hold them, and nothing else: for a
/// tensor stored whole, its file; for per-rank shards, each shard whose piece holds some of the
/// rows (their columns of the piece). File by file, rank 0 first saves the rows' current bytes
/// to the undo file beside it (`undo_path_of`, as `write_rows_in_place` does), writes the rows,
/// fsyncs, reads them back and records their hash in the undo file; `undo_checkpoint` restores
/// them. A failed write or verification restores every file written so far. Returns the files
/// written, the same on every rank. Collective over `mesh`. Every rank throws the same
/// `kshard::error`, nothing written, for a patch that differs between ranks or does not fit its
/// tensor (name, dtype, shape), a file whose mode is read-only, and an undo file that exists
/// already. Cost: rank 0 reads and writes the rows' bytes twice (undo, write) and reads them back.
template <std::size_t N>
std::vector<std::filesystem::path> write_patch_in_place(const Mesh<N>& mesh,
                                                        const Checkpoint& model,
                                                        const RowPatch& patch) {
  const detail::Operation operation("io::write_patch_in_place");
  detail::Agreement agreement(mesh.group());
  detail::same_text(agreement, "the checkpoint path", model.path().string());
  agreement.problem(detail::dcp_problem(model, "write_patch_in_place"));
  detail::agree_on_patches(agreement, model, {patch});
  agreement.settle();
  const std::vector<detail::PieceRows> parts = detail::piece_rows(model, patch);
  if (mesh.my_rank() == 0)
    for (const auto& part : parts) {
      const SafetensorsFile& file = model.files()[part.file];
      agreement.problem(detail::in_place_problem(file, undo_path_of(file.path())));
    }
  agreement.settle();
  std::vector<std::filesystem::path> written;
  try {
    for (const auto& part : parts) {
      const SafetensorsFile& file = model.files()[part.file];
      std::optional<detail::UndoImage> image;  // rank 0's
      detail::agree(mesh.group(), detail::attempt([&] {
                      if (mesh.my_rank() == 0)
                        image = detail::write_undo(file, {part.rows}, undo_path_of(file.path()));
                    }));
      written.push_back(file.path());
      detail::agree(mesh.group(), detail::attempt([&] {
                      if (mesh.my_rank() != 0) return;
                      detail::write_piece_rows(file, part);
                      detail::mark_undo_written(file, {part.rows}, *image,
                                                undo_path_of(file.path()));
                    }));
    }
  } catch (const error& e) {
    for (const auto& file : written) undo_in_place(mesh, undo_path_of(file));
    throw error(fmt::format("{} (the rows were restored)", e.what()));
  }
  return written;
}

/// The weights files of `model` that have an undo file beside them (`undo_path_of`), as rank 0
/// finds them, in the order of `model.files()`; the same on every rank. Collective over
/// `mesh`. Cost: a stat per weights file on rank 0, one broadcast.
template <std::size_t N>
std::vector<std::filesystem::path> files_with_undo(const Mesh<N>& mesh, const Checkpoint& model) {
  std::vector<std::int64_t> found(model.files().size(), 0);
  for (std::size_t f = 0; f < found.size() && mesh.my_rank() == 0; ++f) {
    std::error_code ignored;  // rank 0 alone looks: it must not throw
    found[f] = std::filesystem::exists(undo_path_of(model.files()[f].path()), ignored) ? 1 : 0;
  }
  mesh.group().bcast(found.data(), static_cast<std::int64_t>(found.size()), 0);
  std::vector<std::filesystem::path> files;
  for (std::size_t f = 0; f < found.size(); ++f)
    if (found[f] != 0) files.push_back(model.files()[f].path());
  return files;
}

/// Restores every weights file of `model` that has an undo file beside it (`undo_in_place`),
/// after checking, for all of them before restoring any, that each undo file was made for the
/// file beside it (it records that file's path: in a copied checkpoint it names the original,
/// which must not be restored). Returns the weights files restored, the same on every rank.
/// Collective over `mesh`. Every rank throws the same `kshard::error`, nothing restored, for a
/// checkpoint that differs between ranks, no undo file beside any weights file, or one made for
/// another file; then `undo_in_place`'s refusals, file by file (the files before it restored).
/// Cost: per undo file, opening it (a header read on every rank), one agreement, and
/// `undo_in_place`'s.
template <std::size_t N>
std::vector<std::filesystem::path> undo_checkpoint(const Mesh<N>& mesh, const Checkpoint& model) {
  const detail::Operation operation("io::undo_checkpoint");
  detail::Agreement agreement(mesh.group());
  detail::same_text(agreement, "the checkpoint path", model.path().string());
  agreement.settle();
  const std::vector<std::filesystem::path> files = files_with_undo(mesh, model);
  if (files.empty())
    throw error(
        fmt::format("kshard::io: no undo file next to the weights of '{}'", model.path().string()));
  for (const auto& file : files) {
    const SafetensorsFile undo(mesh, undo_path_of(file));
    detail::agree(mesh.group(),
                  mesh.my_rank() == 0 ? detail::undo_target_problem(undo, file) : std::nullopt);
  }
  for (const auto& file : files) undo_in_place(mesh, undo_path_of(file));
  return files;
}

/// The FNV-1a 64 hash of every tensor's bytes in `model` (plain FNV-1a over the tensor's bytes
/// in row-major order, no separator: for a tensor stored whole, what any FNV-1a 64 of the file's
/// slice gives; for per-rank shards, the hash of the tensor they make, so a checkpoint and its
/// consolidation hash alike), by tensor name, the same on every rank. Collective over `mesh`:
/// tensor i (in name order) is hashed by rank i % size, so each byte is read once over all
/// ranks. Every rank throws the same `kshard::error` when a read fails. Cost: every tensor's
/// bytes read once (pread, 4 MiB at a time), one agreement and one all-reduce of one value per
/// tensor.
template <std::size_t N>
std::map<std::string, std::uint64_t> tensor_hashes(const Mesh<N>& mesh, const Checkpoint& model) {
  const detail::Operation operation("io::tensor_hashes");
  detail::Agreement agreement(mesh.group());
  detail::same_text(agreement, "the checkpoint path", model.path().string());
  agreement.settle();
  const std::vector<std::string> names = model.tensor_names();
  std::vector<std::uint64_t> hashes(names.size(), 0);
  std::vector<char> buffer(std::size_t{1} << 22);
  detail::agree(mesh.group(), detail::attempt([&] {
                  for (auto i = static_cast<std::size_t>(mesh.my_rank()); i < names.size();
                       i += static_cast<std::size_t>(mesh.size()))
                    hashes[i] = detail::stored_tensor_hash(model, model.tensor(names[i]), buffer);
                }));
  // A sum (one rank's hash, zeros elsewhere), not a max: MPICH 4.0 compares MPI_UINT64_T as
  // signed, so a hash >= 2^63 lost to 0 there.
  mesh.group().allreduce(hashes.data(), static_cast<std::int64_t>(hashes.size()), ReduceOp::sum);
  std::map<std::string, std::uint64_t> result;
  for (std::size_t i = 0; i < names.size(); ++i) result[names[i]] = hashes[i];
  return result;
}

}  // namespace kshard::io
