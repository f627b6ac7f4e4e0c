#pragma once

// Which files a kshard-repair run reads and makes: none it makes may be one it reads, and the
// report may be none of them, however the paths are spelled. Rank 0 looks; every rank gets its
// verdict as the same Failure (exit 2), before anything is written.

#include "kshard/comm/group.hpp"
#include "kshard/io/checkpoint.hpp"
#include "options.hpp"

namespace kshard_repair {

// Before the checkpoint is opened: --report must not overwrite MODEL or --out. A file of a
// checkpoint folder is judged by its name here (the weights, their index, the config, kshard's
// undo files); check_paths checks the files exactly, once the checkpoint is open.
void check_report_path(const kshard::comm::Group& group, const Options& options);

// After opening `model`, before anything is written: no file the run makes (--out: each
// output, its temporary and the copies of the folder's JSON files; --in-place: the undo files
// and their temporaries) is a file it reads (the weights, config.json, the index; with --undo
// the undo files), and --report is none of these, by device and inode (through links and `..`).
void check_paths(const kshard::comm::Group& group, const Options& options,
                 const kshard::io::Checkpoint& model);

}  // namespace kshard_repair
