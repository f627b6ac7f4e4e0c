#include "run.hpp"

#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kshard/io/checkpoint.hpp"
#include "kshard/io/convert.hpp"
#include "kshard/io/read_checkpoint.hpp"
#include "kshard/io/rewrite.hpp"
#include "kshard/io/row_patch.hpp"
#include "kshard/kshard.hpp"
#include "paths.hpp"
#include "report.hpp"

namespace kshard_repair {

namespace {

namespace io = kshard::io;
using kshard::index_t;

// The tensor to use: the one named, else the first of `candidates` present.
std::optional<std::string> pick(const io::Checkpoint& model, const std::string& given,
                                const auto& candidates, const char* what) {
  if (!given.empty()) {
    if (!model.contains(given))
      throw Failure{refused, fmt::format("the checkpoint has no {} tensor '{}'", what, given)};
    return given;
  }
  for (const std::string_view name : candidates)
    if (model.contains(name)) return std::string(name);
  return std::nullopt;
}

// Bytes all ranks of `group` moved through files (a collective).
std::int64_t total_bytes(const kshard::comm::Group& group, std::int64_t mine) {
  group.allreduce(&mine, 1, kshard::ReduceOp::sum);
  return mine;
}

// The norm after the repair of each repaired row (each row's first copy contributes it).
template <class M>
std::vector<double> norms_of(const M& matrix, const std::vector<index_t>& ids) {
  const auto squared =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::row_squared_norms(matrix));
  std::vector<double> norms(ids.size(), -1.0);
  for (std::size_t k = 0; k < ids.size(); ++k)
    if (const index_t local = matrix.mapping().rows.to_local(ids[k]);
        local != kshard::invalid_index)
      norms[k] = std::sqrt(squared(static_cast<std::size_t>(local)));
  matrix.mesh().group().allreduce(norms.data(), static_cast<std::int64_t>(norms.size()),
                                  kshard::ReduceOp::max);
  return norms;
}

// The repair's settings from the options and the checkpoint's config (the pad row is kept
// unless --keep says otherwise).
kshard::RepairConfig repair_config(const Options& options, const io::Checkpoint& model,
                                   bool use_output) {
  auto config = kshard::RepairConfig(true, options.min_norm, options.max_rows,
                                     use_output ? kshard::RepairStrategy::output_direction
                                                : kshard::RepairStrategy::mean_direction);
  std::vector<index_t> keep = options.keep.value_or(std::vector<index_t>{});
  if (!options.keep && model.config().pad_token_id) keep.push_back(*model.config().pad_token_id);
  config = config.keep_rows(keep);
  if (options.relative_threshold) config = config.relative_threshold(*options.relative_threshold);
  return config;
}

// The repair (in memory; a dry run repairs too, so it refuses exactly where the real run
// would), its refusals exit 1.
template <class M>
kshard::RepairReport repair(const M& input, const std::optional<M>& output,
                            const kshard::RepairConfig& config, const kshard::RepairNames& names) {
  try {
    return *(output ? kshard::repair_embedding_rows(input, *output, config, names)
                    : kshard::repair_embedding_rows(input, config, names));
  } catch (const kshard::error& e) {
    throw Failure{refused, e.what()};
  }
}

// Writes the repaired rows: in place, or a new checkpoint: per-rank shards, DCP and any --to
// through a conversion carrying the rows (every rank writes its share), a Hugging Face
// checkpoint as it is stored with the rows replaced. Returns the files written.
template <std::size_t N, class M>
std::vector<std::string> write_result(const Options& options, const io::Checkpoint& model,
                                      const kshard::Mesh<N>& mesh, const std::string& embed,
                                      const M& matrix, const std::vector<index_t>& ids) {
  const bool in_pieces = io::is_per_rank(model.form());
  if (options.in_place && in_pieces) {
    std::vector<std::string> written;
    for (const auto& file :
         io::write_patch_in_place(mesh, model, io::patch_rows(embed, matrix, ids)))
      written.push_back(file.string());
    say("wrote {} row(s) in place into {} shard file(s) of '{}'; undo with: kshard-repair {} "
        "--undo\n",
        ids.size(), written.size(), options.model, options.model);
    return written;
  }
  if (options.in_place) {
    const io::SafetensorsFile& file = model.file_of(embed);
    io::write_rows_in_place(mesh, file, {io::replace_rows(embed, matrix, ids)},
                            io::undo_path_of(file.path()));
    say("wrote {} row(s) in place into '{}'; undo with: kshard-repair {} --undo\n", ids.size(),
        file.path().string(), options.model);
    return {file.path().string()};
  }
  const auto durability = options.no_sync ? io::Durability::page_cache : io::Durability::fsync;
  std::vector<std::filesystem::path> paths;
  if (writes_by_conversion(options, model)) {
    io::ConvertOptions convert;  // sharded and dcp: no mesh, the input's split
    convert.form = io::output_form_named(options.to).value_or(io::OutputForm::as_stored);
    convert.durability = durability;
    paths = io::convert_checkpoint(mesh, model, options.out, convert,
                                   {io::patch_rows(embed, matrix, ids)});
  } else {
    paths = io::write_checkpoint(mesh, model, options.out, {io::replace_rows(embed, matrix, ids)},
                                 durability);
  }
  std::vector<std::string> written;
  for (const auto& path : paths) written.push_back(path.string());
  return written;
}

// What the run is, for the report, and with it the hash of every tensor before it.
template <std::size_t N, class L>
nlohmann::json run_json(const Options& options, const io::Checkpoint& model,
                        const kshard::Mesh<N>& mesh, const L& layout, const std::string& embed,
                        const std::optional<std::string>& lm_head) {
  return {{"model", options.model},
          {"embed", embed},
          {"lm_head", lm_head ? nlohmann::json(*lm_head) : nlohmann::json(nullptr)},
          {"strategy", lm_head ? "output" : "mean"},
          {"mesh", mesh.shape()},
          {"layout", fmt::format("{}", layout)},
          {"mode", options.dry_run    ? "dry-run"
                   : options.in_place ? "in-place"
                                      : "out"},
          {"tensor_hashes_before", hashes_json(io::tensor_hashes(mesh, model))}};
}

// The report's results: what was found and written, and the hash of every tensor after.
template <std::size_t N>
void finish_report(nlohmann::json& json, const Options& options, const kshard::Mesh<N>& mesh,
                   const std::string& embed, const std::vector<std::string>& written) {
  json["files_written"] = written;
  json["tensors_touched"] =
      written.empty() ? std::vector<std::string>{} : std::vector<std::string>{embed};
  if (!written.empty())
    json["tensor_hashes_after"] = hashes_json(io::tensor_hashes(
        mesh, io::Checkpoint(mesh, options.in_place ? options.model : options.out)));
  json["status"] = "done";
  write_report(mesh.group(), options.report, json);
}

// Prints what the repair found (rank 0).
void say_found(const Options& options, const kshard::RepairReport& report) {
  say("{}{}\n", options.dry_run ? "dry run, nothing written: " : "", summary(report));
  if (!report.relative_row_ids.empty())
    say("found by the relative test (norm below {} x the median {:g}): {} row(s) {}\n",
        *options.relative_threshold, report.median_norm.value_or(0.0),
        report.relative_row_ids.size(), id_list(report.relative_row_ids));
}

// The LM head as the repair reads it: its rows at the damaged rows of `input` (found first,
// as the repair finds them), in a matrix of its stored shape left unfilled elsewhere. The repair
// reads no other row of it, so on a host those pages are never touched: the memory and the
// time of a second embedding-sized read are saved (a shape that differs from the input's reads
// nothing; the repair refuses it).
template <class M>
M lm_head_rows(const io::Checkpoint& model, const std::string& lm_head, const M& input,
               const kshard::RepairConfig& config, const kshard::RepairNames& names) {
  const std::vector<std::int64_t>& shape = model.tensor(lm_head).shape;
  M output(input.mesh(), input.layout(), shape[0], shape[1], kshard::unfilled, lm_head);
  std::vector<index_t> ids;
  if (output.rows() == input.rows() && output.cols() == input.cols()) {
    try {
      if (const auto found = kshard::find_damaged_rows(input, config, names))
        ids = found->repaired_row_ids;
    } catch (const kshard::error& e) {
      throw Failure{refused, e.what()};
    }
  }
  io::read_rows_into(model, lm_head, output, ids);
  return output;
}

// The whole job for one element type, mesh and layout: read, repair, write, report.
template <class T, std::size_t N, class L>
int run_repair(const Options& options, const io::Checkpoint& model, const kshard::Mesh<N>& mesh,
               const L& layout, const std::string& embed,
               const std::optional<std::string>& lm_head) {
  const auto start = std::chrono::steady_clock::now();
  io::reset_io_stats();
  const auto config = repair_config(options, model, lm_head.has_value());
  const kshard::RepairNames names{embed, lm_head.value_or("lm_head")};
  const auto input = io::read_matrix<T>(model, embed, mesh, layout);
  std::optional<std::remove_cv_t<decltype(input)>> output;
  if (lm_head) output.emplace(lm_head_rows(model, *lm_head, input, config, names));
  say("read {} on {} rank(s): {}\n",
      lm_head ? "the embedding and the LM head's damaged rows" : "the embedding", mesh.size(),
      throughput(total_bytes(mesh.group(), io::io_stats().bytes_read), seconds_since(start)));
  nlohmann::json json;
  if (!options.report.empty()) json = run_json(options, model, mesh, layout, embed, lm_head);
  const kshard::RepairReport report = repair(input, output, config, names);
  say_found(options, report);
  const std::vector<index_t>& ids = report.repaired_row_ids;
  std::vector<double> after;
  std::vector<std::string> written;
  if (!options.dry_run && !ids.empty()) {
    after = norms_of(input, ids);
    const auto write_start = std::chrono::steady_clock::now();
    io::reset_io_stats();
    written = write_result(options, model, mesh, embed, input, ids);
    say("wrote {}\n", throughput(total_bytes(mesh.group(), io::io_stats().bytes_written),
                                 seconds_since(write_start)));
  } else if (!options.dry_run) {
    say("nothing to repair; nothing written\n");
  }
  if (!options.report.empty()) {
    json.update(report_json(report, after));
    finish_report(json, options, mesh, embed, written);
  }
  return repaired_or_clean;
}

// A tensor kshard-repair cannot repair is a refusal (exit 1), like an unsupported dtype: a
// matrix (rows x hidden), and an LM head of the embedding's dtype.
void check_repairable(const io::Checkpoint& model, const std::string& embed,
                      const std::optional<std::string>& lm_head) {
  const io::StoredTensor& input = model.tensor(embed);
  if (input.shape.size() != 2)
    throw Failure{refused, fmt::format("'{}' has {} dimension(s) {}; kshard-repair repairs 2-D "
                                       "embeddings (rows x hidden)",
                                       embed, input.shape.size(), io::shape_text(input.shape))};
  if (!lm_head) return;
  const io::StoredTensor& output = model.tensor(*lm_head);
  if (output.shape.size() != 2)
    throw Failure{refused,
                  fmt::format("LM head '{}' has {} dimension(s) {}; kshard-repair needs "
                              "2 (rows x hidden), or --strategy mean",
                              *lm_head, output.shape.size(), io::shape_text(output.shape))};
  if (output.dtype != input.dtype)
    throw Failure{refused, fmt::format("LM head '{}' is {} but '{}' is {}; kshard-repair needs "
                                       "both of one dtype, or --strategy mean",
                                       *lm_head, io::to_string(output.dtype), embed,
                                       io::to_string(input.dtype))};
}

// Element type from the embedding's dtype, then the layout read from the command line.
template <std::size_t N>
int dispatch(const Options& options, const io::Checkpoint& model, const kshard::Mesh<N>& mesh,
             const std::vector<kshard::PlacementSpec>& layout, const std::string& embed,
             const std::optional<std::string>& lm_head) {
  const io::Dtype dtype = model.tensor(embed).dtype;
  using Set = kshard::placement_set<kshard::Replicate, kshard::Shard<0>, kshard::Shard<1>,
                                    kshard::StridedShard<0>>;
  return kshard::dispatch_layout<N, Set>(layout, [&](const auto& l) {
    switch (dtype) {
      case io::Dtype::F32:
        return run_repair<float>(options, model, mesh, l, embed, lm_head);
      case io::Dtype::F64:
        return run_repair<double>(options, model, mesh, l, embed, lm_head);
      case io::Dtype::BF16:
        return run_repair<kshard::bf16>(options, model, mesh, l, embed, lm_head);
      case io::Dtype::F16:
        return run_repair<kshard::f16>(options, model, mesh, l, embed, lm_head);
      default:
        throw Failure{refused,
                      fmt::format("'{}' is {}; kshard-repair repairs F32, F64, BF16 and F16", embed,
                                  io::to_string(dtype))};
    }
  });
}

// Restores every weights file of the checkpoint that has an undo file.
template <std::size_t N>
int undo(const io::Checkpoint& model, const kshard::Mesh<N>& mesh) {
  for (const auto& file : io::undo_checkpoint(mesh, model))
    say("restored '{}' from '{}'\n", file.string(), io::undo_path_of(file).string());
  return repaired_or_clean;
}

// Where `tensor` is: its file, or the per-rank shards that hold its pieces.
std::string where_stored(const io::Checkpoint& model, const io::StoredTensor& tensor) {
  if (model.form() == io::CheckpointForm::dcp)
    return fmt::format("{} piece(s) of the DCP checkpoint '{}'", tensor.pieces.size(),
                       model.path().string());
  if (tensor.pieces.size() == 1)
    return fmt::format("'{}'", model.data_files()[tensor.pieces[0].file].path.string());
  return fmt::format("{} per-rank shards of '{}'", tensor.pieces.size(), model.path().string());
}

std::string layout_text(const std::vector<kshard::PlacementSpec>& layout) {
  std::vector<std::string> parts;
  for (const auto& spec : layout) parts.push_back(kshard::to_string(spec));
  return fmt::format("({})", fmt::join(parts, ", "));
}

template <std::size_t N>
int run_on(const Options& options, const kshard::Mesh<N>& mesh,
           const std::vector<kshard::PlacementSpec>& layout, bool& paths_checked) {
  const io::Checkpoint model(mesh, options.model);
  check_paths(mesh.group(), options, model);
  paths_checked = true;
  // Before any work: a report that cannot be written is an error.
  if (!options.report.empty()) write_report(mesh.group(), options.report, {{"status", "running"}});
  if (options.undo) return undo(model, mesh);
  const auto embed = pick(model, options.embed, io::known_embedding_names, "input embedding");
  if (!embed)
    throw Failure{refused, fmt::format("found no input embedding in '{}' (looked for {}); name "
                                       "it with --embed",
                                       options.model, fmt::join(io::known_embedding_names, ", "))};
  auto lm_head = pick(model, options.lm_head, io::known_lm_head_names, "LM head");
  const bool tied = model.config().tie_word_embeddings.value_or(!lm_head.has_value());
  if (options.strategy == "mean" || (options.strategy.empty() && tied)) lm_head.reset();
  if (options.strategy == "output" && !lm_head)
    throw Failure{refused,
                  "--strategy output needs an LM head; the checkpoint has none (or ties "
                  "it to the input embedding): use --strategy mean"};
  const io::StoredTensor& entry = model.tensor(*embed);
  say("kshard-repair: {} {} {} in {}; {} on a {} mesh, layout {}\n", *embed,
      io::to_string(entry.dtype), io::shape_text(entry.shape), where_stored(model, entry),
      lm_head ? fmt::format("directions from {}", *lm_head)
              : std::string("directions from the mean healthy row"),
      fmt::join(mesh.shape(), "x"), layout_text(layout));
  check_repairable(model, *embed, lm_head);
  return dispatch(options, model, mesh, layout, *embed, lm_head);
}

}  // namespace

int run(const kshard::comm::Group& world, const Options& options, bool& paths_checked) {
  check_given_paths(world, options);
  std::vector<int> shape;
  std::vector<kshard::PlacementSpec> layout;
  try {
    shape = options.mesh.empty() ? std::vector<int>{world.size()}
                                 : kshard::parse_mesh_shape(options.mesh);
    const std::string text = !options.layout.empty()
                                 ? options.layout
                                 : (shape.size() == 1 ? "Shard(0)" : "Replicate(), Shard(0)");
    layout = kshard::parse_layout(text);
  } catch (const kshard::error& e) {
    throw Failure{usage_or_io, e.what()};
  }
  if (shape.size() == 1) {
    const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {shape[0]});
    return run_on(options, mesh, layout, paths_checked);
  }
  if (shape.size() == 2) {
    const kshard::Mesh<2> mesh(MPI_COMM_WORLD, {shape[0], shape[1]}, {"dp", "tp"});
    return run_on(options, mesh, layout, paths_checked);
  }
  throw Failure{usage_or_io, fmt::format("--mesh {} has {} dimensions; kshard-repair takes 1 or 2",
                                         options.mesh, shape.size())};
}

}  // namespace kshard_repair
