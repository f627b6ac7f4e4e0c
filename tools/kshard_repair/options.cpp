#include "options.hpp"

#include "../common/command_line.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kshard_repair {

void define(CLI::App& app, Options& o) {
  app.set_version_flag("--version", fmt::format("kshard-repair {}", KSHARD_VERSION_TEXT));
  app.add_option("MODEL", o.model, "a .safetensors file or a checkpoint folder")
      ->required()
      ->check(kshard_tools::non_empty_path);
  auto* out = app.add_option("--out", o.out,
                             "write the repaired checkpoint here (a file for a file, a folder "
                             "for a folder)")
                  ->check(kshard_tools::non_empty_path);
  kshard_tools::add_output_form(
      app, o.to, "with --out, the form to write: ",
      " (per-rank forms with the input's split; default: the input's form)")
      ->needs(out);
  auto* in_place = app.add_flag("--in-place", o.in_place,
                                "write the repaired rows into MODEL (an undo file is kept)");
  auto* dry_run = app.add_flag("--dry-run", o.dry_run, "only report what would be repaired");
  auto* undo = app.add_flag("--undo", o.undo, "restore the rows of the last --in-place run");
  app.add_flag("--no-sync", o.no_sync,
               "with --out: do not fsync the output, as cp does not: faster by the storage's "
               "write time, but a crash soon after may leave it with lost bytes")
      ->needs(out);
  out->excludes(in_place, dry_run, undo);
  in_place->excludes(dry_run, undo);
  dry_run->excludes(undo);
  app.add_option("--report", o.report, "write a JSON report here")
      ->check(kshard_tools::non_empty_path);
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

int parse(CLI::App& app, Options& o, int argc, char** argv, bool print) {
  try {
    app.parse(argc, argv);
    if (o.out.empty() && !o.in_place && !o.dry_run && !o.undo)
      throw CLI::RequiredError("one of --out, --in-place, --dry-run or --undo");
  } catch (const CLI::ParseError& e) {
    if (print) app.exit(e);
    return e.get_exit_code();
  }
  return -1;
}

std::vector<kshard::comm::NamedText> command_line_texts(const Options& o, int parsed) {
  std::vector<kshard::comm::NamedText> texts{
      {"whether the command line parses",
       parsed == -1 ? std::string("it does") : fmt::format("no (exit code {})", parsed)}};
  if (parsed != -1) return texts;  // the same parse error everywhere: CLI says it
  const auto flag = [](bool on) { return std::string(on ? "on" : "off"); };
  const std::vector<kshard::comm::NamedText> options{
      {"MODEL", o.model},
      {"--out", o.out},
      {"--to", o.to},
      {"--in-place", flag(o.in_place)},
      {"--dry-run", flag(o.dry_run)},
      {"--undo", flag(o.undo)},
      {"--no-sync", flag(o.no_sync)},
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
  texts.insert(texts.end(), options.begin(), options.end());
  return texts;
}

}  // namespace kshard_repair
