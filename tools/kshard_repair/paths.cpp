#include "paths.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agree.hpp"
#include "kshard/error.hpp"
#include "kshard/io/checkpoint_folder.hpp"
#include "report.hpp"

namespace kshard_repair {

namespace {

namespace fs = std::filesystem;
namespace io = kshard::io;

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

// Rank 0: why the report would overwrite the checkpoint or the output, or nothing.
std::optional<std::string> report_clash(const Options& options) {
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

// The report must not be written at all where it would overwrite what it is about.
constexpr const char* report_refused = "it would overwrite it: name another report file";

}  // namespace

void check_report_path(const kshard::comm::Group& group, const Options& options) {
  std::optional<std::string> clash;
  if (group.rank() == 0)
    if (const auto found = report_clash(options))
      clash = fmt::format("{}; {}", *found, report_refused);
  try {
    kshard::comm::throw_if_any(group, clash);
  } catch (const kshard::error& e) {
    throw Failure{usage_or_io, e.what(), false};
  }
}

void check_paths(const kshard::comm::Group& group, const Options& options,
                 const io::Checkpoint& model) {
  const std::vector<io::NamedPath> inputs = io::checkpoint_inputs(model, options.undo);
  std::vector<io::NamedPath> made;
  if (!options.out.empty()) made = io::checkpoint_outputs(model, options.out);
  if (options.in_place) made = io::undo_outputs(model);
  if (!options.report.empty()) {
    std::vector<io::NamedPath> all = inputs;
    all.insert(all.end(), made.begin(), made.end());
    try {
      io::refuse_clashes(group, {{"--report", options.report}}, all, report_refused);
    } catch (const kshard::error& e) {
      throw Failure{usage_or_io, e.what(), false};
    }
  }
  try {
    io::refuse_clashes(group, made, inputs, "nothing was written");
  } catch (const kshard::error& e) {
    throw Failure{usage_or_io, e.what()};
  }
}

}  // namespace kshard_repair
