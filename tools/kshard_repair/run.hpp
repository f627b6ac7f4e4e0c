#pragma once

// The whole kshard-repair job on the mesh and layout the options give: open the checkpoint,
// check its paths, then undo, or read, repair and write (or only report).

#include "kshard/comm/group.hpp"
#include "options.hpp"

namespace kshard_repair {

// Runs the job; returns the exit code, or throws a Failure or a kshard::error (exit 2), the
// same on every rank. Collective over `world` (every rank of MPI_COMM_WORLD).
// `paths_checked` is set once every path the run writes was checked (check_paths): from then
// on the report may replace a file.
int run(const kshard::comm::Group& world, const Options& options, bool& paths_checked);

}  // namespace kshard_repair
