// kshard-repair: detect and repair damaged input-embedding rows of a safetensors checkpoint
// under mpiexec. Each rank reads only its rows (collective MPI-IO), the repair runs on the
// distributed matrix, and the result goes to a new checkpoint (--out), back into the same one
// (--in-place, with an undo file), or nowhere (--dry-run). See docs/repair-tool.md.
//
// Exit codes: 0 repaired or nothing to do, 1 refused (the repair, or a tensor kshard cannot
// repair), 2 usage or I/O error. Every rank exits with the same code.
//
// A thin shell over the library: options.cpp reads the command line, run.cpp does the job with
// kshard::io, paths.cpp keeps it from writing over what it reads, report.cpp says what it did.

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>

#include "../common/command_line.hpp"
#include "kshard/comm/program_agreement.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh.hpp"
#include "options.hpp"
#include "report.hpp"
#include "run.hpp"

namespace {

using namespace kshard_repair;

// The job, its failures turned into their exit codes (the same on every rank).
int run_job(const kshard::comm::Group& world, const Options& options) {
  bool paths_checked = false;
  const auto how = [&] {
    return paths_checked ? ReportWrite::replace : ReportWrite::new_file_only;
  };
  try {
    return run(world, options, paths_checked);
  } catch (const Failure& failure) {
    return fail(world, options, failure, how());
  } catch (const kshard::error& e) {
    return fail(world, options, Failure{usage_or_io, e.what()}, how());
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = repaired_or_clean;
  {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const kshard::Mesh<1> world(MPI_COMM_WORLD, {size});  // its group: every rank
    CLI::App app("kshard-repair: repair damaged embedding rows of a safetensors checkpoint",
                 "kshard-repair");
    Options options;
    if (const auto done = kshard_tools::read_command_line(world.group(), "kshard-repair", app,
                                                          options, argc, argv)) {
      code = *done;
    } else {
      Kokkos::ScopeGuard kokkos(argc, argv);
      code = run_job(world.group(), options);
    }
  }
  MPI_Finalize();
  return code;
}
