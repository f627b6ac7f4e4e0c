// kshard-convert: rewrite a checkpoint in another form under mpiexec: a training job's per-rank
// safetensors shards consolidated into a Hugging Face model (--to hf), or any checkpoint
// resharded into the per-rank shards a job on another mesh writes (--to sharded). Every rank
// writes an equal share of the output straight into the final files; the folder appears
// complete or not at all. See docs/convert-tool.md.
//
// Exit codes: 0 written, 2 usage or I/O error. Every rank exits with the same code.

#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../common/command_line.hpp"
#include "../common/console.hpp"
#include "kshard/comm/program_agreement.hpp"
#include "kshard/error.hpp"
#include "kshard/io/convert.hpp"
#include "kshard/io/run_paths.hpp"
#include "kshard/io/verify.hpp"
#include "kshard/mesh.hpp"
#include "options.hpp"

namespace {

using namespace kshard_convert;
using kshard_tools::say;

enum ExitCode { written = 0, usage_or_io = 2 };

// Names what the output cannot hold: the items of a DCP folder that are not tensors (a DCP
// output carries them).
void say_left_out(const std::vector<kshard::io::StoredItem>& items, kshard::io::OutputForm form) {
  if (items.empty() || form == kshard::io::OutputForm::dcp) return;
  constexpr std::size_t shown = 8;
  std::string names;
  for (std::size_t i = 0; i < std::min(items.size(), shown); ++i)
    names += fmt::format("{}'{}'", i == 0 ? "" : ", ", items[i].name);
  if (items.size() > shown) names += fmt::format(", ... {} more", items.size() - shown);
  say("kshard-convert: left out {} item{} that {} not a tensor (a Hugging Face model and "
      "per-rank shards hold tensors only): {}\n",
      items.size(), items.size() == 1 ? "" : "s", items.size() == 1 ? "is" : "are", names);
}

// Names the per-rank files found: a folder that lost its last rank's file is not seen in the
// tensors' shapes unless the config gives them (Checkpoint checks the embedding against it).
void say_rank_files(const kshard::io::Checkpoint& model) {
  if (model.form() != kshard::io::CheckpointForm::per_rank_shards) return;
  const auto& files = model.data_files();
  const auto name = [&](std::size_t f) { return files[f].path.filename().string(); };
  say("kshard-convert: found {} per-rank file{}: {}{}\n", files.size(),
      files.size() == 1 ? "" : "s", name(0),
      files.size() == 1 ? "" : fmt::format(" ... {}", name(files.size() - 1)));
  if (!model.config().vocab_size)
    say("kshard-convert: no config.json gives vocab_size: a missing last rank's file would go "
        "unnoticed (its rows of sharded tensors, and tensors only it held)\n");
}

// The conversion; its errors (the same on every rank) become the exit code.
int convert(const kshard::Mesh<1>& world, const Options& options) {
  try {
    auto settings = convert_options(options);
    kshard_tools::Progress progress;
    if (!options.quiet)
      settings.progress = [&](std::uint64_t done, std::uint64_t total) {
        progress.update(done, total);
      };
    const auto start = std::chrono::steady_clock::now();
    kshard::io::refuse_unusable_paths(world.group(), {{"output folder OUT", options.out, true}});
    const kshard::io::Checkpoint model(world, options.in);
    say_rank_files(model);
    if (options.verify)
      say("kshard-convert: verified {} checksum(s) of '{}'\n",
          kshard::io::verify_checksums(world, model), options.in);
    const auto files = kshard::io::convert_checkpoint(world, model, options.out, settings);
    std::uint64_t bytes = 0;
    for (const auto& name : model.tensor_names()) bytes += model.tensor(name).bytes();
    say("kshard-convert: wrote {} file{} to {}: {}\n", files.size(), files.size() == 1 ? "" : "s",
        options.out,
        kshard_tools::throughput(static_cast<std::int64_t>(bytes),
                                 kshard_tools::seconds_since(start)));
    say_left_out(model.other_items(), settings.form);
    return written;
  } catch (const kshard::error& e) {
    say("kshard-convert: error: {}\n", e.what());
    return usage_or_io;
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = written;
  {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const kshard::Mesh<1> world(MPI_COMM_WORLD, {size});
    CLI::App app("kshard-convert: consolidate or reshard a safetensors checkpoint",
                 "kshard-convert");
    Options options;
    if (const auto done = kshard_tools::read_command_line(world.group(), "kshard-convert", app,
                                                          options, argc, argv))
      code = *done;
    else
      code = convert(world, options);
  }
  MPI_Finalize();
  return code;
}
