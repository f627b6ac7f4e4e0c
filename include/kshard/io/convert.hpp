#pragma once

/// \file
/// A checkpoint rewritten in another form, collectively and straight into the final files: a
/// training job's per-rank shards or DCP consolidated into a Hugging Face model, or any
/// checkpoint resharded into the per-rank shards or the PyTorch DCP a job on another mesh would
/// have written.
///
///     kshard::io::Checkpoint model(mesh, "ckpt/epoch_0_step_1000/model");   // 8 shards
///     kshard::io::convert_checkpoint(mesh, model, "hf", {});                 // consolidated
///     kshard::io::ConvertOptions tp;
///     tp.form = kshard::io::OutputForm::sharded;
///     tp.sharding = {{2}, kshard::parse_layout("Shard(0)"),
///                    {{"*o_proj*", kshard::parse_layout("Shard(1)")}}};  // as a 2-rank TP job
///     kshard::io::convert_checkpoint(mesh, model, "tp2", tp);
///
/// Costs. No rank assembles anything: the output files are laid out first (headers alike on
/// every rank), rank 0 creates them at their final size, and every rank writes an equal share of
/// their bytes, reading (pread) only the runs of the stored pieces that fill it, through a buffer
/// of at most `buffer_bytes` (a piece that fills a whole buffer's worth is copied inside the
/// kernel with copy_file_range, as cp copies). Memory per rank: the buffer and its run lists,
/// whatever the checkpoint's size. Every rank fsyncs what it wrote, each buffer's writeback
/// started as soon as it is written (none of it under `Durability::page_cache`, as cp); rank 0
/// copies the files beside the weights, writes the index, and renames the folder into place.
///
/// Consolidated output (`OutputForm::hf`): whole tensors in name order, `model.safetensors`, or
/// `model-0000i-of-0000n.safetensors` split at `max_shard_bytes` with
/// `model.safetensors.index.json` (weight_map, metadata.total_size), headers padded to 8 bytes
/// with `{"format": "pt"}`, and the config and tokenizer files (from `.hf_metadata/` of per-rank
/// shards). Per-rank output (`OutputForm::sharded`): for each rank of `sharding.mesh` holding a
/// first copy of some tensor, `shard-0000{r+1}-model-00001-of-00001.safetensors` with its boxes
/// and their `DCP_SHARDING_INFO`, which torch's HuggingFaceStorageReader and kshard read; the
/// files beside the weights go to `.hf_metadata/`. DCP output (`OutputForm::dcp`): the same
/// boxes as `__<r>_0.distcp` files of torch.save archives (one per box, CRC-32 of every entry:
/// each rank checksums its share, rank 0 combines the CRCs and writes the ZIP records), the
/// input's bytes items carried after rank 0's archives, and `.metadata` (rank 0), which
/// `torch.distributed.checkpoint.load` reads at any world size. Per-rank or DCP output without
/// a mesh keeps the input's split (each data file's pieces in one file); `as_stored` copies a
/// DCP as DCP. Tensors of every rank and dtype move as bytes.

#include <fcntl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/checkpoint/patches.hpp"
#include "kshard/io/convert/output.hpp"
#include "kshard/io/engine/byte_mover.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/conversion_plan.hpp"
#include "kshard/io/formats/dcp/output.hpp"
#include "kshard/io/formats/hugging_face/plan.hpp"
#include "kshard/io/formats/per_rank_shards/plan.hpp"
#include "kshard/io/model/convert_options.hpp"
#include "kshard/io/row_patch.hpp"
#include "kshard/io/run_paths.hpp"
#include "kshard/io/safetensors/output_file.hpp"
#include "kshard/mesh.hpp"

namespace kshard::detail {

// The output files of `model` converted with `options` (laid out alike on every rank).
inline std::vector<OutputFile> plan_conversion(const io::Checkpoint& model,
                                               const io::ConvertOptions& options) {
  switch (options.form) {
    case io::OutputForm::hf: {
      std::vector<const io::StoredTensor*> tensors;
      for (const auto& name : model.tensor_names()) tensors.push_back(&model.tensor(name));
      return plan_hf(tensors, options.max_shard_bytes);
    }
    case io::OutputForm::sharded:
      return plan_shards(output_split(model.contents(), options.sharding));
    case io::OutputForm::dcp:
      return plan_dcp(output_split(model.contents(), options.sharding), model.other_items());
    case io::OutputForm::as_stored:
      break;
  }
  return model.form() == io::CheckpointForm::dcp ? plan_dcp_as_stored(model.contents())
                                                 : plan_as_stored(model.files(), model.contents());
}

// The patch of tensor `name`, or nullptr.
inline const io::RowPatch* patch_of(const std::vector<io::RowPatch>& patches,
                                    const std::string& name) {
  for (const io::RowPatch& patch : patches)
    if (patch.name == name) return &patch;
  return nullptr;
}

// True when `files` hold archives, whose records need the CRC-32 of their tensors' bytes.
inline bool has_archives(const std::vector<OutputFile>& files) {
  return std::any_of(files.begin(), files.end(), [](const OutputFile& f) { return f.archives; });
}

// Every rank writes its share of `files` (in `partial`) from `model`'s files and `patches`, then
// fsyncs; returns the CRC-32 of each of its stretches when the files hold archives.
inline std::vector<std::uint32_t> write_shares(const comm::Group& group,
                                               const io::Checkpoint& model,
                                               const std::filesystem::path& partial,
                                               const std::vector<OutputFile>& files,
                                               const io::ConvertOptions& options,
                                               const std::vector<io::RowPatch>& patches) {
  std::vector<std::filesystem::path> sources, outputs;
  for (const auto& file : model.data_files()) sources.push_back(file.path);
  for (const OutputFile& file : files) outputs.push_back(partial / file.name);
  const std::uint64_t total = tensor_bytes(files);
  ByteMover mover(sources, outputs, options.buffer_bytes, has_archives(files));
  std::uint64_t done = 0;
  const auto report = [&](std::uint64_t bytes) {
    done += bytes;
    if (group.rank() == 0 && options.progress)
      options.progress(std::min(total, done * static_cast<std::uint64_t>(group.size())), total);
  };
  std::vector<std::uint32_t> crcs;
  for (const Stretch& stretch : stretches_of(files, group.rank(), group.size()))
    crcs.push_back(mover.write(stretch, patch_of(patches, stretch.tensor->tensor->name), report));
  mover.sync();
  if (group.rank() == 0 && options.progress) options.progress(total, total);  // its share written
  return crcs;
}

// Rank 0: the side files, the index, and the folder in place, durably.
inline void publish_folder(const io::Checkpoint& model, const std::filesystem::path& partial,
                           const std::filesystem::path& out, const std::vector<OutputFile>& files,
                           const io::ConvertOptions& options) {
  copy_side_files(model, partial, options.form);
  if (has_archives(files)) write_dcp_metadata(partial, files);
  if (options.form == io::OutputForm::hf && files.size() > 1) {
    const std::string index = hf_index_text(files);
    const auto path = partial / io::safetensors_index_name;
    const ScopedFd fd(open_or_throw(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC));
    pwrite_exactly(fd.get(), index.data(), index.size(), 0, path);
    fsync_or_throw(fd.get(), path);
  }
  const ScopedFd folder(open_or_throw(partial, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  fsync_or_throw(folder.get(), partial);  // its entries, before the name that publishes them
  publish(partial, out);
}

}  // namespace kshard::detail

namespace kshard::io {

/// Writes `model` in the form `options` asks for as the new folder `out` (see the file comment),
/// and returns the paths of its weights files. Collective over `mesh`, at any rank count (the
/// output's mesh is `options.sharding.mesh`, not this one). The folder is written as `out` +
/// ".kshard-partial", every file fsynced (`options.durability`), then renamed: `out` appears
/// complete or not at all (a rank killed mid-write leaves the temporary folder, which a later
/// run refuses to touch until it is removed). Every rank throws the same `kshard::error`, with
/// `out` absent and nothing of `model` changed, for options that differ between ranks or cannot be
/// written (a layout that does not fit the mesh, a Partial, a layout giving a rank a non-contiguous
/// part of a tensor), an empty `out`, an `out` or temporary folder that exists, a missing parent
/// folder, an `out` inside a folder the conversion copies (`conversion_paths`: a Hugging Face
/// folder, `.hf_metadata/`), and any failed read or write.
template <std::size_t N>
std::vector<std::filesystem::path> convert_checkpoint(const Mesh<N>& mesh, const Checkpoint& model,
                                                      const std::filesystem::path& out_given,
                                                      const ConvertOptions& options,
                                                      const std::vector<RowPatch>& patches = {}) {
  const std::filesystem::path out = detail::folder_path(out_given);
  const detail::Operation operation("io::convert_checkpoint");
  const comm::Group& group = mesh.group();
  detail::Agreement agreement(group);
  detail::same_text(agreement, "the output folder", out.string());
  detail::same_text(agreement, "the checkpoint path", model.path().string());
  detail::same_text(agreement, "the options", detail::options_text(options));
  agreement.problem(detail::options_problem(options));
  detail::agree_on_patches(agreement, model, patches);
  if (mesh.my_rank() == 0) {
    agreement.problem(detail::unusable_path_problem({"output folder", out_given, true}));
    agreement.problem(detail::output_folder_problem(out));
    agreement.problem(detail::clash_problem(conversion_paths(model, out), "nothing was written"));
  }
  agreement.settle();
  const detail::DurabilityScope scope(options.durability);
  std::vector<detail::OutputFile> files;
  detail::agree(group, detail::attempt([&] { files = detail::plan_conversion(model, options); }));
  const auto partial = detail::partial_path(out);
  bool created = false;  // rank 0 made the temporary folder: its to remove after a failure
  try {
    detail::agree(group, detail::attempt([&] {
                    if (mesh.my_rank() == 0) detail::create_outputs(model, partial, files, created);
                  }));
    std::vector<std::uint32_t> crcs;
    detail::agree(group, detail::attempt([&] {
                    crcs = detail::write_shares(group, model, partial, files, options, patches);
                  }));
    if (detail::has_archives(files)) {
      const auto checksums = detail::gather_checksums(group, files, crcs);
      detail::agree(group, detail::attempt([&] {
                      if (mesh.my_rank() == 0)
                        detail::write_archive_checksums(partial, files, checksums);
                    }));
    }
    detail::agree(group, detail::attempt([&] {
                    if (mesh.my_rank() == 0)
                      detail::publish_folder(model, partial, out, files, options);
                  }));
  } catch (const error&) {
    if (created) detail::remove_quietly({partial});
    throw;
  }
  std::vector<std::filesystem::path> written;
  for (const auto& file : files) written.push_back(out / file.name);
  return written;
}

}  // namespace kshard::io
