#pragma once

// Which paths a kshard-repair run writes, checked with kshard::io's guard (io/run_paths.hpp):
// first the paths as given (none empty, each in a folder that exists), then, once the checkpoint
// is open, every path the run makes (the output, its temporaries, undo files, the report)
// against every file it reads in every form and every folder it copies. Every rank gets the
// verdict as the same Failure (exit 2), before anything is written.

#include "kshard/comm/group.hpp"
#include "kshard/io/checkpoint.hpp"
#include "options.hpp"

namespace kshard_repair {

// True when --out is written by a conversion (per-rank shards, DCP, or --to), false when the
// checkpoint is rewritten as it is stored (io::write_checkpoint).
bool writes_by_conversion(const Options& options, const kshard::io::Checkpoint& model);

// Before the checkpoint is opened: --out and --report are usable paths.
void check_given_paths(const kshard::comm::Group& group, const Options& options);

// After opening `model`, before anything is written, the report included: no path the run
// makes is a file it reads or makes otherwise, or lies inside a folder it copies or makes.
void check_paths(const kshard::comm::Group& group, const Options& options,
                 const kshard::io::Checkpoint& model);

}  // namespace kshard_repair
