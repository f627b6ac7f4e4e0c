#include "paths.hpp"

#include <filesystem>
#include <system_error>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/io/run_paths.hpp"
#include "report.hpp"

namespace kshard_repair {

namespace io = kshard::io;

bool writes_by_conversion(const Options& options, const io::Checkpoint& model) {
  return io::is_per_rank(model.form()) || !options.to.empty();
}

void check_given_paths(const kshard::comm::Group& group, const Options& options) {
  std::vector<io::NamedPath> given;
  if (!options.out.empty()) {
    std::error_code ec;  // only rank 0's view is used: a folder for a folder, or with --to
    const bool folder = std::filesystem::is_directory(options.model, ec) || !options.to.empty();
    given.push_back({"--out", options.out, folder});
  }
  if (!options.report.empty()) given.push_back({"--report", options.report});
  try {
    io::refuse_unusable_paths(group, given);
  } catch (const kshard::error& e) {
    throw Failure{usage_or_io, e.what(), false};
  }
}

void check_paths(const kshard::comm::Group& group, const Options& options,
                 const io::Checkpoint& model) {
  io::RunPaths paths{io::checkpoint_inputs(model, options.undo), {}, {}};
  if (!options.out.empty())
    paths = writes_by_conversion(options, model) ? io::conversion_paths(model, options.out)
                                                 : io::rewrite_paths(model, options.out);
  if (options.in_place) paths = io::in_place_paths(model);
  if (!options.report.empty()) paths.makes.push_back({"--report", options.report});
  try {
    io::refuse_clashes(group, paths, "nothing was written: name another path");
  } catch (const kshard::error& e) {
    throw Failure{usage_or_io, e.what(), false};
  }
}

}  // namespace kshard_repair
