// kshard-repair: detect and repair damaged input-embedding rows of a safetensors checkpoint
// under mpiexec. Each rank reads only its rows (collective MPI-IO), the repair runs on the
// distributed matrix, and the result goes to a new checkpoint (--out), back into the same one
// (--in-place, with an undo file), or nowhere (--dry-run). See docs/repair-tool.md.
//
// Exit codes: 0 repaired or nothing to do, 1 refused (the repair, or a tensor kshard cannot
// repair), 2 usage or I/O error. Every rank exits with the same code.

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "kshard/io/checkpoint.hpp"
#include "kshard/kshard.hpp"

namespace {

namespace fs = std::filesystem;
namespace io = kshard::io;
using kshard::index_t;

enum ExitCode { repaired_or_clean = 0, refused = 1, usage_or_io = 2 };

// A kshard::error with the exit code it ends the run with.
struct Failure {
  ExitCode code;
  std::string message;
  bool report_writable = true;  // false: the report path is the problem; leave it alone
};

struct Options {
  std::string model;
  std::string out;
  bool in_place = false;
  bool dry_run = false;
  bool undo = false;
  std::string report;
  std::string embed;
  std::string lm_head;
  std::string strategy;  // "output", "mean" or "" (chosen from the checkpoint)
  index_t max_rows = 256;
  double min_norm = 1e-6;
  std::optional<double> relative_threshold;
  std::optional<std::vector<index_t>> keep;
  std::string mesh;
  std::string layout;
};

// Names the first found is taken for, when --embed / --lm-head are not given.
constexpr std::array embed_names{"model.embed_tokens.weight",
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
constexpr std::array lm_head_names{"lm_head.weight", "model.lm_head.weight", "embed_out.weight",
                                   "output.weight"};

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Rank 0 prints (progress and the summary); the other ranks stay quiet.
template <class... Args>
void say(fmt::format_string<Args...> format, Args&&... args) {
  if (world_rank() == 0) {
    fmt::print(format, std::forward<Args>(args)...);
    std::fflush(stdout);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Bytes all ranks moved through files since `before` (a collective).
std::int64_t io_bytes(std::int64_t mine) {
  MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return mine;
}

std::string throughput(std::int64_t bytes, double seconds) {
  return fmt::format("{:.1f} MB in {:.3f} s ({:.0f} MB/s)", static_cast<double>(bytes) / 1e6,
                     seconds, static_cast<double>(bytes) / 1e6 / std::max(seconds, 1e-9));
}

// The tensor to use: the one named, else the first of `candidates` present.
std::optional<std::string> pick(const io::Checkpoint& model, const std::string& given,
                                const auto& candidates, const char* what) {
  if (!given.empty()) {
    if (!model.contains(given))
      throw Failure{refused, fmt::format("the checkpoint has no {} tensor '{}'", what, given)};
    return given;
  }
  for (const char* name : candidates)
    if (model.contains(name)) return std::string(name);
  return std::nullopt;
}

// FNV-1a of every tensor's bytes, computed in parallel (tensor i by rank i % size), as hex.
nlohmann::json tensor_hashes(const io::Checkpoint& model) {
  std::vector<std::pair<const io::SafetensorsFile*, const io::TensorEntry*>> tensors;
  for (const auto& file : model.files())
    for (const auto& entry : file.header().tensors) tensors.emplace_back(&file, &entry);
  std::vector<std::uint64_t> hashes(tensors.size() + 1, 0);  // the last: read failures
  std::vector<char> buffer(std::size_t{1} << 22);
  for (std::size_t i = static_cast<std::size_t>(world_rank()); i < tensors.size();
       i += static_cast<std::size_t>(world_size())) {
    const auto& [file, entry] = tensors[i];
    std::ifstream in(file->path(), std::ios::binary);
    in.seekg(static_cast<std::streamoff>(file->file_offset(*entry)));
    std::uint64_t hash = 0xcbf29ce484222325ull;  // the FNV-1a 64 offset basis
    for (std::uint64_t left = entry->bytes(); left > 0;) {
      const auto n = static_cast<std::streamsize>(std::min<std::uint64_t>(left, buffer.size()));
      if (!in.read(buffer.data(), n)) {
        hashes.back() = 1;
        break;
      }
      for (std::streamsize b = 0; b < n; ++b)
        hash = (hash ^ static_cast<unsigned char>(buffer[static_cast<std::size_t>(b)])) *
               1099511628211ull;
      left -= static_cast<std::uint64_t>(n);
    }
    hashes[i] = hash;
  }
  MPI_Allreduce(MPI_IN_PLACE, hashes.data(), static_cast<int>(hashes.size()), MPI_UINT64_T,
                MPI_BXOR, MPI_COMM_WORLD);
  if (hashes.back() != 0) throw Failure{usage_or_io, "reading a tensor to hash it failed"};
  nlohmann::json result = nlohmann::json::object();
  for (std::size_t i = 0; i < tensors.size(); ++i)
    result[tensors[i].second->name] = fmt::format("fnv1a64:{:016x}", hashes[i]);
  return result;
}

// Where the output of `file` goes: `out` itself for a single file, `out`/name for a folder.
fs::path output_of(const Options& options, const io::Checkpoint& model,
                   const io::SafetensorsFile& file) {
  return model.is_folder() ? fs::path(options.out) / file.path().filename() : fs::path(options.out);
}

fs::path undo_path(const io::SafetensorsFile& file) {
  return file.path().string() + ".kshard-undo";
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
  MPI_Allreduce(MPI_IN_PLACE, norms.data(), static_cast<int>(norms.size()), MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  return norms;
}

nlohmann::json number_or_null(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

// What the run found and did, as JSON (--report).
nlohmann::json report_json(const kshard::RepairReport& report, const std::vector<double>& after) {
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t k = 0; k < report.repaired_row_ids.size(); ++k) {
    const index_t id = report.repaired_row_ids[k];
    const bool relative =
        std::binary_search(report.relative_row_ids.begin(), report.relative_row_ids.end(), id);
    rows.push_back(
        {{"id", id},
         {"norm_before", number_or_null(report.repaired_norms_before[k])},
         {"norm_after", after.empty() ? nlohmann::json(nullptr) : number_or_null(after[k])},
         {"found_by", relative ? "relative" : "absolute"}});
  }
  return {{"rows", rows},
          {"kept_row_ids", report.kept_row_ids},
          {"target_norm", report.target_norm ? nlohmann::json(*report.target_norm) : nullptr},
          {"median_norm", report.median_norm ? nlohmann::json(*report.median_norm) : nullptr},
          {"min_norm_before", number_or_null(report.min_norm_before)},
          {"direction_from", report.output_name ? *report.output_name : "mean of healthy rows"}};
}

// Rank 0 writes `json` to the report file; every rank learns whether it could.
void write_report(const std::string& path, const nlohmann::json& json) {
  int ok = 1;
  if (world_rank() == 0) {
    std::ofstream out(path, std::ios::trunc);
    // Paths and names are bytes, not always UTF-8: replaced (U+FFFD) rather than a throw on
    // rank 0 alone.
    out << json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    ok = out.good() ? 1 : 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (ok == 0) throw Failure{usage_or_io, fmt::format("cannot write the report '{}'", path), false};
}

// Ids as "[a, b, c]", the middle of a long list left out.
std::string id_list(const std::vector<index_t>& ids) {
  constexpr std::size_t shown = 16;
  if (ids.size() <= shown) return fmt::format("[{}]", fmt::join(ids, ", "));
  const std::vector<index_t> head(ids.begin(), ids.begin() + shown - 4);
  const std::vector<index_t> tail(ids.end() - 4, ids.end());
  return fmt::format("[{}, ... {} more ..., {}]", fmt::join(head, ", "), ids.size() - shown,
                     fmt::join(tail, ", "));
}

// The report in one line: kshard's own printing, or counts when the lists are long.
std::string summary(const kshard::RepairReport& report) {
  if (report.repaired_row_ids.size() <= 16) return fmt::format("{}", report);
  return fmt::format("{}: {} damaged row(s) {}; min norm before {:g}, target norm {:g}; kept {}",
                     report.input_name, report.repaired_row_ids.size(),
                     id_list(report.repaired_row_ids), report.min_norm_before,
                     report.target_norm.value_or(0.0), id_list(report.kept_row_ids));
}

// True for what the output folder gets from the tool itself (the weights) or must not get at
// all (kshard's undo and temporary files).
bool not_copied(const io::Checkpoint& model, const fs::path& name) {
  for (const auto& file : model.files())
    if (file.path().filename() == name) return true;
  return name.string().find(".kshard-") != std::string::npos;
}

// Copies one entry of the checkpoint folder into `out`: a file, or a folder with everything
// in it (sentence-transformers keep 1_Pooling/ and the like next to the weights). Symbolic
// links are followed (a Hugging Face snapshot links to its blobs); other kinds are skipped.
void copy_entry(const fs::directory_entry& entry, const fs::path& out, std::error_code& failed) {
  const fs::file_status status = entry.status(failed);  // a link loop is an error, not a throw
  if (failed) return;
  const fs::path target = out / entry.path().filename();
  if (fs::is_directory(status))
    fs::copy(entry.path(), target,
             fs::copy_options::recursive | fs::copy_options::overwrite_existing, failed);
  else if (fs::is_regular_file(status))
    fs::copy_file(entry.path(), target, fs::copy_options::overwrite_existing, failed);
}

// Rank 0 removes what a failed run made (the output folder, what was copied into one that
// existed, the weights files written): a checkpoint it started would load with some shards
// repaired and others missing, or look like a finished output.
void remove_on_rank0(const std::vector<fs::path>& paths) {
  if (world_rank() != 0) return;
  std::error_code ignored;  // best effort: the error that brought us here is what is reported
  for (const auto& path : paths) fs::remove_all(path, ignored);
}

// Rank 0 makes the output folder and copies the checkpoint folder's other contents into it
// (config, tokenizer, index, subfolders); every rank learns whether that worked. Returns what
// it made, for remove_on_rank0 if the run fails later: the folder, or what it copied into a
// folder that existed (empty on the other ranks); after a failure here that is removed
// already. Filesystem calls report through error codes: a throw on rank 0 alone would leave
// the others waiting.
std::vector<fs::path> prepare_output_folder(const io::Checkpoint& model, const fs::path& out) {
  std::error_code failed;
  fs::path where;  // the entry that failed, for the message
  std::vector<fs::path> made;
  if (world_rank() == 0) {
    const bool existed = fs::exists(out, failed);
    if (!existed && !failed && fs::create_directories(out, failed)) made.push_back(out);
    for (fs::directory_iterator it(model.path(), failed), end; !failed && it != end;
         it.increment(failed)) {
      std::error_code differs;  // --out inside the checkpoint folder: never copied into itself
      if (not_copied(model, it->path().filename()) || fs::equivalent(it->path(), out, differs))
        continue;
      const fs::path target = out / it->path().filename();
      std::error_code absent;
      if (existed && !fs::exists(target, absent)) made.push_back(target);  // not what it had
      copy_entry(*it, out, failed);
      if (failed) {  // before increment(), which would clear it
        where = it->path();
        break;
      }
    }
    if (failed) remove_on_rank0(made);
  }
  int ok = failed ? 0 : 1;
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (ok == 0)
    throw Failure{usage_or_io,
                  fmt::format("cannot prepare the output folder '{}'{}{}", out.string(),
                              where.empty() ? std::string() : " (copying '" + where.string() + "')",
                              failed ? ": " + failed.message() : std::string())};
  return made;
}

// Writes the repaired rows: a new checkpoint or in place. Returns the files written.
template <std::size_t N, class M>
std::vector<std::string> write_result(const Options& options, const io::Checkpoint& model,
                                      const kshard::Mesh<N>& mesh, const std::string& embed,
                                      const M& matrix, const std::vector<index_t>& ids) {
  const io::SafetensorsFile& file = model.file_of(embed);
  const std::vector<io::TensorUpdate> update{io::replace_rows(embed, matrix, ids)};
  std::vector<std::string> written;
  if (options.in_place) {
    io::write_rows_in_place(mesh, file, update, undo_path(file));
    say("wrote {} row(s) in place into '{}'; undo with: kshard-repair {} --undo\n", ids.size(),
        file.path().string(), options.model);
    return {file.path().string()};
  }
  std::vector<fs::path> made;
  if (model.is_folder()) made = prepare_output_folder(model, options.out);
  try {
    for (const auto& each : model.files()) {  // untouched files are copied in parallel too
      const bool holds = &each == &file;
      io::write_safetensors(mesh, each, output_of(options, model, each),
                            holds ? update : std::vector<io::TensorUpdate>{});
      written.push_back(output_of(options, model, each).string());
    }
  } catch (const kshard::error&) {  // every rank: an output is whole or absent
    made.insert(made.end(), written.begin(), written.end());
    remove_on_rank0(made);
    throw;
  }
  return written;
}

// The whole job for one element type, mesh and layout.
template <class T, std::size_t N, class L>
int run_repair(const Options& options, const io::Checkpoint& model, const kshard::Mesh<N>& mesh,
               const L& layout, const std::string& embed,
               const std::optional<std::string>& lm_head) {
  const bool use_output = lm_head.has_value();
  const auto start = std::chrono::steady_clock::now();
  io::reset_io_stats();
  const auto input = io::read_matrix<T>(model.file_of(embed), embed, mesh, layout);
  std::optional<std::remove_cv_t<decltype(input)>> output;
  if (use_output)
    output.emplace(io::read_matrix<T>(model.file_of(*lm_head), *lm_head, mesh, layout));
  say("read {} on {} rank(s): {}\n", use_output ? "both embeddings" : "the embedding", mesh.size(),
      throughput(io_bytes(io::io_stats().bytes_read), seconds_since(start)));

  auto config = kshard::RepairConfig(true, options.min_norm, options.max_rows,
                                     use_output ? kshard::RepairStrategy::output_direction
                                                : kshard::RepairStrategy::mean_direction);
  std::vector<index_t> keep = options.keep.value_or(std::vector<index_t>{});
  if (!options.keep && model.config().pad_token_id) keep.push_back(*model.config().pad_token_id);
  config = config.keep_rows(keep);
  if (options.relative_threshold) config = config.relative_threshold(*options.relative_threshold);
  const kshard::RepairNames names{embed, lm_head.value_or("lm_head")};

  nlohmann::json json{{"model", options.model},
                      {"embed", embed},
                      {"lm_head", lm_head ? nlohmann::json(*lm_head) : nlohmann::json(nullptr)},
                      {"strategy", use_output ? "output" : "mean"},
                      {"mesh", mesh.shape()},
                      {"layout", fmt::format("{}", layout)},
                      {"mode", options.dry_run    ? "dry-run"
                               : options.in_place ? "in-place"
                                                  : "out"}};
  if (!options.report.empty()) json["tensor_hashes_before"] = tensor_hashes(model);

  std::optional<kshard::RepairReport> report;
  std::vector<double> after;
  std::vector<std::string> written;
  try {  // a dry run repairs too, in memory only: it refuses exactly where the real run would
    report = use_output ? kshard::repair_embedding_rows(input, *output, config, names)
                        : kshard::repair_embedding_rows(input, config, names);
  } catch (const kshard::error& e) {
    throw Failure{refused, e.what()};
  }
  const std::vector<index_t>& ids = report->repaired_row_ids;
  say("{}{}\n", options.dry_run ? "dry run, nothing written: " : "", summary(*report));
  if (!report->relative_row_ids.empty())
    say("found by the relative test (norm below {} x the median {:g}): {} row(s) {}\n",
        *options.relative_threshold, report->median_norm.value_or(0.0),
        report->relative_row_ids.size(), id_list(report->relative_row_ids));
  if (!options.dry_run && !ids.empty()) {
    after = norms_of(input, ids);
    const auto write_start = std::chrono::steady_clock::now();
    io::reset_io_stats();
    written = write_result(options, model, mesh, embed, input, ids);
    say("wrote {}\n",
        throughput(io_bytes(io::io_stats().bytes_written), seconds_since(write_start)));
  } else if (!options.dry_run) {
    say("nothing to repair; nothing written\n");
  }
  if (!options.report.empty()) {
    json.update(report_json(*report, after));
    json["files_written"] = written;
    json["tensors_touched"] =
        written.empty() ? std::vector<std::string>{} : std::vector<std::string>{embed};
    if (!written.empty() && !options.in_place)
      json["tensor_hashes_after"] = tensor_hashes(io::Checkpoint(mesh, options.out));
    else if (options.in_place && !written.empty())
      json["tensor_hashes_after"] = tensor_hashes(io::Checkpoint(mesh, options.model));
    json["status"] = "done";
    write_report(options.report, json);
  }
  return repaired_or_clean;
}

// A tensor kshard-repair cannot repair is a refusal (exit 1), like an unsupported dtype: a
// matrix (rows x hidden), and an LM head of the embedding's dtype.
void check_repairable(const io::Checkpoint& model, const std::string& embed,
                      const std::optional<std::string>& lm_head) {
  const auto& input = *model.file_of(embed).header().find(embed);
  if (input.shape.size() != 2)
    throw Failure{refused,
                  fmt::format("'{}' has {} dimension(s) {}; kshard-repair repairs 2-D "
                              "embeddings (rows x hidden)",
                              embed, input.shape.size(), io::detail::shape_text(input.shape))};
  if (!lm_head) return;
  const auto& output = *model.file_of(*lm_head).header().find(*lm_head);
  if (output.shape.size() != 2)
    throw Failure{refused,
                  fmt::format("LM head '{}' has {} dimension(s) {}; kshard-repair needs "
                              "2 (rows x hidden), or --strategy mean",
                              *lm_head, output.shape.size(), io::detail::shape_text(output.shape))};
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
  const io::Dtype dtype = model.file_of(embed).header().find(embed)->dtype;
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

// The undo file next to `file` must have been made for it: it records its target's absolute
// path, so in a copied checkpoint it still names the original, which must not be restored.
template <std::size_t N>
void check_undo_target(const kshard::Mesh<N>& mesh, const io::SafetensorsFile& file) {
  const io::SafetensorsFile saved(mesh, undo_path(file));
  const auto& metadata = saved.header().metadata;
  const auto target = metadata.find(std::string(io::detail::undo_target));
  if (target == metadata.end()) return;  // not kshard's: undo_in_place says so
  int same = 1;
  if (world_rank() == 0) {
    std::error_code ignored;  // a target that is gone is not this file either
    same = fs::equivalent(target->second, file.path(), ignored) ? 1 : 0;
  }
  MPI_Bcast(&same, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (same == 0)
    throw Failure{usage_or_io,
                  fmt::format("the undo file '{}' was made for '{}', not for '{}' next to it (a "
                              "copied checkpoint?); nothing restored",
                              undo_path(file).string(), target->second, file.path().string())};
}

// Restores every file of the checkpoint that has an undo file.
template <std::size_t N>
int undo(const io::Checkpoint& model, const kshard::Mesh<N>& mesh) {
  std::vector<const io::SafetensorsFile*> with_undo;
  for (const auto& file : model.files()) {
    std::error_code ignored;  // rank 0 alone looks: it must not throw
    int exists = world_rank() == 0 && fs::exists(undo_path(file), ignored);
    MPI_Bcast(&exists, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (exists != 0) with_undo.push_back(&file);
  }
  for (const auto* file : with_undo) check_undo_target(mesh, *file);  // all before restoring any
  for (const auto* file : with_undo) {
    io::undo_in_place(mesh, undo_path(*file));
    say("restored '{}' from '{}'\n", file->path().string(), undo_path(*file).string());
  }
  if (with_undo.empty())
    throw Failure{usage_or_io,
                  fmt::format("no undo file next to the weights of '{}'", model.path().string())};
  return repaired_or_clean;
}

// `path` made absolute and canonical as far as it exists, without a trailing separator.
fs::path canonical_of(const fs::path& path) {
  std::error_code ignored;  // on failure: the path as given, made absolute
  fs::path result = fs::weakly_canonical(fs::absolute(path, ignored), ignored);
  if (result.empty()) result = fs::absolute(path, ignored).lexically_normal();
  return result.has_filename() ? result : result.parent_path();
}

// True when `inner` is `outer` (the same file, through a link too) or lies inside it.
bool within(const fs::path& inner, const fs::path& outer) {
  std::error_code ignored;
  if (fs::equivalent(inner, outer, ignored)) return true;
  const fs::path a = canonical_of(inner), b = canonical_of(outer);
  return std::mismatch(b.begin(), b.end(), a.begin(), a.end()).first == b.end();
}

// Rank 0, before the checkpoint is opened: why the report would overwrite the checkpoint or
// the output, or nothing. A file the checkpoint folder holds is judged by its name here (the
// weights, their index, the config, kshard's undo files); run_on checks the weights exactly.
std::optional<std::string> report_clash(const Options& options) {
  if (world_rank() != 0) return std::nullopt;  // rank 0 alone looks
  const fs::path report = options.report;
  std::error_code ignored;
  const bool folder = fs::is_directory(options.model, ignored);
  const std::string name = report.filename().string();
  const bool checkpoint_name = name.ends_with(".safetensors") || name.ends_with(".index.json") ||
                               name == "config.json" || name.find(".kshard-") != name.npos;
  if (within(report, options.model) && (!folder || checkpoint_name))
    return fmt::format("--report '{}' is {} of MODEL '{}'", options.report,
                       folder ? "a file" : "the checkpoint", options.model);
  if (!options.out.empty() && within(report, options.out))
    return fmt::format("--report '{}' is {} --out '{}'", options.report,
                       folder ? "inside" : "the same file as", options.out);
  return std::nullopt;
}

// Rank 0's text, or none, on every rank.
std::optional<std::string> from_rank0(const std::optional<std::string>& text) {
  int length = world_rank() == 0 && text ? static_cast<int>(text->size()) : -1;
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (length < 0) return std::nullopt;
  std::string message =
      world_rank() == 0 ? *text : std::string(static_cast<std::size_t>(length), ' ');
  MPI_Bcast(message.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return message;
}

// Rank 0's verdict on the report path, on every rank: refused before anything is written,
// the report included (it would overwrite what it is about).
void check_report_path(std::optional<std::string> clash) {
  if (const auto message = from_rank0(clash))
    throw Failure{usage_or_io,
                  fmt::format("{}; it would overwrite it: name another report file", *message),
                  false};
}

// The files this run reads: the checkpoint's weights, its config and index, and with --undo
// the undo files next to the weights (rank 0 looks).
std::vector<io::detail::NamedPath> inputs_of(const Options& options, const io::Checkpoint& model) {
  std::vector<io::detail::NamedPath> inputs;
  for (const auto& file : model.files()) {
    inputs.push_back({"checkpoint file", file.path()});
    if (options.undo) inputs.push_back({"undo file", undo_path(file)});
  }
  const fs::path folder = model.is_folder() ? model.path() : model.path().parent_path();
  for (const fs::path& json : {folder / "config.json", folder / io::safetensors_index_name}) {
    std::error_code absent;
    if (fs::exists(json, absent)) inputs.push_back({"checkpoint file", json});
  }
  return inputs;
}

// The files this run creates, replaces or removes, the report aside: with --out each output,
// its temporary and the copies of the JSON files; in place the undo files and their
// temporaries.
std::vector<io::detail::NamedPath> made_by(const Options& options, const io::Checkpoint& model) {
  std::vector<io::detail::NamedPath> made;
  for (const auto& file : model.files()) {
    if (!options.out.empty()) {
      const fs::path out = output_of(options, model, file);
      made.push_back({"output", out});
      made.push_back({"output's temporary", io::detail::partial_path(out)});
    }
    if (options.in_place) {
      made.push_back({"undo file", undo_path(file)});
      made.push_back({"undo file's temporary", io::detail::partial_path(undo_path(file))});
    }
  }
  if (!options.out.empty() && model.is_folder())
    for (const auto& input : inputs_of(options, model))
      if (input.path.extension() == ".json")
        made.push_back({"copy", fs::path(options.out) / input.path.filename()});
  return made;
}

// After opening, before anything is written: no path this run makes is one it reads, and the
// report is neither (by device and inode: through links and `..` too). Rank 0 decides.
void check_paths(const Options& options, const io::Checkpoint& model) {
  std::vector<io::detail::NamedPath> inputs, made;
  if (world_rank() == 0) {
    inputs = inputs_of(options, model);
    made = made_by(options, model);
  }
  if (!options.report.empty()) {
    std::vector<io::detail::NamedPath> all = inputs;
    all.insert(all.end(), made.begin(), made.end());
    check_report_path(world_rank() == 0
                          ? io::detail::first_clash({{"--report", options.report}}, all)
                          : std::nullopt);
  }
  if (const auto clash =
          from_rank0(world_rank() == 0 ? io::detail::first_clash(made, inputs) : std::nullopt))
    throw Failure{usage_or_io, fmt::format("{}; nothing was written", *clash)};
}

std::string layout_text(const std::vector<kshard::PlacementSpec>& layout) {
  std::vector<std::string> parts;
  for (const auto& spec : layout) parts.push_back(kshard::to_string(spec));
  return fmt::format("({})", fmt::join(parts, ", "));
}

template <std::size_t N>
int run_on(const Options& options, const kshard::Mesh<N>& mesh,
           const std::vector<kshard::PlacementSpec>& layout) {
  const io::Checkpoint model(mesh, options.model);
  check_paths(options, model);
  // Before any work: a report that cannot be written is an error.
  if (!options.report.empty()) write_report(options.report, {{"status", "running"}});
  if (options.undo) return undo(model, mesh);
  const auto embed = pick(model, options.embed, embed_names, "input embedding");
  if (!embed)
    throw Failure{refused, fmt::format("found no input embedding in '{}' (looked for {}); name "
                                       "it with --embed",
                                       options.model, fmt::join(embed_names, ", "))};
  auto lm_head = pick(model, options.lm_head, lm_head_names, "LM head");
  const bool tied = model.config().tie_word_embeddings.value_or(!lm_head.has_value());
  if (options.strategy == "mean" || (options.strategy.empty() && tied)) lm_head.reset();
  if (options.strategy == "output" && !lm_head)
    throw Failure{refused,
                  "--strategy output needs an LM head; the checkpoint has none (or ties "
                  "it to the input embedding): use --strategy mean"};
  const auto& entry = *model.file_of(*embed).header().find(*embed);
  say("kshard-repair: {} {} {} in '{}'; {} on a {} mesh, layout {}\n", *embed,
      io::to_string(entry.dtype), io::detail::shape_text(entry.shape),
      model.file_of(*embed).path().string(),
      lm_head ? fmt::format("directions from {}", *lm_head)
              : std::string("directions from the mean healthy row"),
      fmt::join(mesh.shape(), "x"), layout_text(layout));
  check_repairable(model, *embed, lm_head);
  return dispatch(options, model, mesh, layout, *embed, lm_head);
}

int run(const Options& options) {
  if (!options.report.empty()) check_report_path(report_clash(options));
  std::vector<int> shape;
  std::vector<kshard::PlacementSpec> layout;
  try {
    shape = options.mesh.empty() ? std::vector<int>{world_size()}
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
    return run_on(options, mesh, layout);
  }
  if (shape.size() == 2) {
    const kshard::Mesh<2> mesh(MPI_COMM_WORLD, {shape[0], shape[1]}, {"dp", "tp"});
    return run_on(options, mesh, layout);
  }
  throw Failure{usage_or_io, fmt::format("--mesh {} has {} dimensions; kshard-repair takes 1 or 2",
                                         options.mesh, shape.size())};
}

// Prints the failure (rank 0), records it in the report when there is one, and returns its
// exit code.
int fail(const Options& options, const Failure& failure) {
  const char* kind = failure.code == refused ? "refused" : "error";
  say("kshard-repair: {}: {}\n", kind, failure.message);
  if (!options.report.empty() && failure.report_writable) {
    try {
      write_report(options.report, {{"status", kind},
                                    {"message", failure.message},
                                    {"exit_code", static_cast<int>(failure.code)}});
    } catch (const Failure&) {  // the failure being reported is the one that matters
    }
  }
  return failure.code;
}

// Every option as the text it was given as, named as on the command line.
std::vector<std::pair<std::string, std::string>> option_texts(const Options& o) {
  const auto flag = [](bool on) { return std::string(on ? "on" : "off"); };
  return {{"MODEL", o.model},
          {"--out", o.out},
          {"--in-place", flag(o.in_place)},
          {"--dry-run", flag(o.dry_run)},
          {"--undo", flag(o.undo)},
          {"--report", o.report},
          {"--embed", o.embed},
          {"--lm-head", o.lm_head},
          {"--strategy", o.strategy},
          {"--max-rows", fmt::format("{}", o.max_rows)},
          {"--min-norm", fmt::format("{}", o.min_norm)},
          {"--relative-threshold",
           o.relative_threshold ? fmt::format("{}", *o.relative_threshold) : std::string()},
          {"--keep", o.keep ? fmt::format("[{}]", fmt::join(*o.keep, ",")) : std::string("none")},
          {"--mesh", o.mesh},
          {"--layout", o.layout}};
}

// One all-reduce before any other collective: every rank got the same command line (`parsed`:
// CLI's exit code, -1 when it parsed). The tool's collectives depend on the options; ranks
// that differ would wait for each other forever. Returns what differs, the same on every rank.
std::optional<std::string> options_differ(const Options& options, int parsed) {
  const auto texts = option_texts(options);
  std::vector<std::int64_t> values{parsed};
  for (const auto& [name, text] : texts)
    values.push_back(kshard::detail::Digest().add(text).value());
  const std::size_t n = values.size();
  values.resize(2 * n);
  for (std::size_t i = 0; i < n; ++i) values[n + i] = ~values[i];  // MAX of ~v: ~MIN of v
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_INT64_T, MPI_MAX,
                MPI_COMM_WORLD);
  if (values[0] != ~values[n])
    return std::string(
        "the command line parses on some ranks but not on others; every rank must "
        "be given the same options");
  if (parsed != -1) return std::nullopt;  // the same parse error everywhere: CLI says it
  for (std::size_t i = 1; i < n; ++i)
    if (values[i] != ~values[n + i])
      return fmt::format(
          "{} differs between ranks ('{}' on rank 0, another value on some other "
          "rank); every rank must be given the same options",
          texts[i - 1].first, texts[i - 1].second);
  return std::nullopt;
}

void define(CLI::App& app, Options& o) {
  app.add_option("MODEL", o.model, "a .safetensors file or a checkpoint folder")->required();
  auto* out = app.add_option("--out", o.out,
                             "write the repaired checkpoint here (a file for a file, a folder "
                             "for a folder)");
  auto* in_place = app.add_flag("--in-place", o.in_place,
                                "write the repaired rows into MODEL (an undo file is kept)");
  auto* dry_run = app.add_flag("--dry-run", o.dry_run, "only report what would be repaired");
  auto* undo = app.add_flag("--undo", o.undo, "restore the rows of the last --in-place run");
  out->excludes(in_place, dry_run, undo);
  in_place->excludes(dry_run, undo);
  dry_run->excludes(undo);
  app.add_option("--report", o.report, "write a JSON report here");
  app.add_option("--embed", o.embed, "input embedding tensor (default: detected)");
  app.add_option("--lm-head", o.lm_head, "output embedding tensor (default: detected)");
  app.add_option("--strategy", o.strategy, "where repaired rows take their direction from")
      ->check(CLI::IsMember({"output", "mean"}));
  app.add_option("--max-rows", o.max_rows, "refuse when more rows are damaged (default 256)")
      ->check(CLI::PositiveNumber);
  app.add_option("--min-norm", o.min_norm, "rows with a norm <= this are damaged (default 1e-6)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--relative-threshold", o.relative_threshold,
                 "rows below R x the median healthy norm are damaged too (0 < R <= 1)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--keep", o.keep, "row ids to leave alone (default: pad_token_id)")
      ->delimiter(',');
  app.add_option("--mesh", o.mesh, "mesh shape, e.g. 4 or 2x2 (default: all ranks in one line)");
  app.add_option("--layout", o.layout,
                 "placements, e.g. \"Shard(0)\" or \"Replicate(), Shard(0)\" (default: rows "
                 "sharded on the last mesh dimension)");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = repaired_or_clean;
  {
    CLI::App app("kshard-repair: repair damaged embedding rows of a safetensors checkpoint",
                 "kshard-repair");
    Options options;
    define(app, options);
    int parsed = -1;  // CLI's exit code when the command line did not parse
    try {
      app.parse(argc, argv);
      if (options.out.empty() && !options.in_place && !options.dry_run && !options.undo)
        throw CLI::RequiredError("one of --out, --in-place, --dry-run or --undo");
    } catch (const CLI::ParseError& e) {
      parsed = e.get_exit_code();
      if (world_rank() == 0) app.exit(e);
    }
    const auto differ = options_differ(options, parsed);
    if (differ || parsed != -1) {
      if (differ) say("kshard-repair: error: {}\n", *differ);
      code = !differ && parsed == 0 ? repaired_or_clean : usage_or_io;
      MPI_Finalize();
      return code;
    }
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      code = run(options);
    } catch (const Failure& failure) {
      code = fail(options, failure);
    } catch (const kshard::error& e) {
      code = fail(options, Failure{usage_or_io, e.what()});
    }
  }
  MPI_Finalize();
  return code;
}
