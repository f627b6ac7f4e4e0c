#include "options.hpp"

#include "../common/command_line.hpp"

#include <cctype>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kshard/error.hpp"
#include "kshard/layout_dispatch.hpp"

namespace kshard_convert {

void define(CLI::App& app, Options& o) {
  app.set_version_flag("--version", fmt::format("kshard-convert {}", KSHARD_VERSION_TEXT));
  app.add_option("IN", o.in,
                 "a checkpoint: .safetensors file, Hugging Face folder, a folder "
                 "of per-rank shards, or a PyTorch DCP folder")
      ->required()
      ->check(kshard_tools::non_empty_path);
  app.add_option("OUT", o.out, "the new folder to write (must not exist)")
      ->required()
      ->check(kshard_tools::non_empty_path);
  kshard_tools::add_output_form(
      app, o.to, "", " (default hf; the mesh and layouts: --mesh, --layout, --layout-for)");
  app.add_option("--mesh", o.mesh, "the job's mesh for --to sharded or dcp, e.g. 8 or 2x4");
  app.add_option("--layout", o.layout,
                 "its placements, one per mesh dimension, e.g. \"Shard(0)\" or \"Replicate(), "
                 "Shard(1)\" (default: Shard(0) on every dimension)");
  app.add_option("--layout-for", o.layout_for,
                 "PATTERN=LAYOUT: the layout of tensors whose name matches the glob PATTERN "
                 "(first match wins), e.g. '*o_proj*=Shard(1)'");
  app.add_option("--max-shard-size", o.max_shard_size,
                 "largest consolidated file, e.g. 5GB (default) or 500MiB");
  app.add_option("--buffer-size", o.buffer_size, "largest buffer per rank (default 64MiB)");
  app.add_flag("--quiet", o.quiet, "no progress");
  app.add_flag("--verify", o.verify,
               "first check every checksum the input records (a PyTorch DCP folder's CRC-32s)");
  app.add_flag("--no-sync", o.no_sync,
               "do not fsync the output, as cp does not: faster by the storage's write time, but "
               "a crash soon after may leave the published OUT with lost bytes");
}

int parse(CLI::App& app, Options& o, int argc, char** argv, bool print) {
  try {
    app.parse(argc, argv);
    if (!kshard::io::is_per_rank(*kshard::io::output_form_named(o.to)) &&
        (!o.mesh.empty() || !o.layout.empty() || !o.layout_for.empty()))
      throw CLI::ValidationError("--mesh, --layout and --layout-for", "need --to sharded or dcp");
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
  if (parsed != -1) return texts;
  const std::vector<kshard::comm::NamedText> options{
      {"IN", o.in},
      {"OUT", o.out},
      {"--to", o.to},
      {"--mesh", o.mesh},
      {"--layout", o.layout},
      {"--layout-for", fmt::format("[{}]", fmt::join(o.layout_for, "; "))},
      {"--max-shard-size", o.max_shard_size},
      {"--buffer-size", o.buffer_size},
      {"--quiet", o.quiet ? "on" : "off"},
      {"--verify", o.verify ? "on" : "off"},
      {"--no-sync", o.no_sync ? "on" : "off"}};
  texts.insert(texts.end(), options.begin(), options.end());
  return texts;
}

std::uint64_t parse_size(const std::string& text, const std::string& option) {
  static const std::pair<const char*, std::uint64_t> units[] = {{"", 1},
                                                                {"B", 1},
                                                                {"KB", 1000},
                                                                {"MB", 1000'000},
                                                                {"GB", 1000'000'000},
                                                                {"TB", 1000'000'000'000},
                                                                {"KiB", 1ULL << 10},
                                                                {"MiB", 1ULL << 20},
                                                                {"GiB", 1ULL << 30},
                                                                {"TiB", 1ULL << 40}};
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  for (const auto& [name, scale] : units) {
    if (digits == 0 || digits > 15 || unit != name) continue;
    const std::uint64_t count = std::stoull(text.substr(0, digits));
    if (count > std::numeric_limits<std::uint64_t>::max() / scale) break;
    return count * scale;
  }
  throw kshard::error(
      fmt::format("{} '{}' is not a size such as 5GB, 500MiB or "
                  "4096 (bytes)",
                  option, text));
}

kshard::io::ConvertOptions convert_options(const Options& o) {
  kshard::io::ConvertOptions options;
  options.max_shard_bytes = parse_size(o.max_shard_size, "--max-shard-size");
  options.buffer_bytes = parse_size(o.buffer_size, "--buffer-size");
  if (o.no_sync) options.durability = kshard::io::Durability::page_cache;
  options.form = *kshard::io::output_form_named(o.to);
  if (!kshard::io::is_per_rank(options.form)) return options;
  options.sharding.mesh = o.mesh.empty() ? std::vector<int>{1} : kshard::parse_mesh_shape(o.mesh);
  options.sharding.layout =
      o.layout.empty() ? std::vector<kshard::PlacementSpec>(options.sharding.mesh.size(),
                                                            kshard::parse_placement("Shard(0)"))
                       : kshard::parse_layout(o.layout);
  for (const std::string& rule : o.layout_for) {
    const auto equals = rule.find('=');  // a layout holds '=' too: sf=2
    if (equals == std::string::npos || equals == 0)
      throw kshard::error(fmt::format("--layout-for '{}' is not PATTERN=LAYOUT", rule));
    options.sharding.layout_for.emplace_back(rule.substr(0, equals),
                                             kshard::parse_layout(rule.substr(equals + 1)));
  }
  return options;
}

}  // namespace kshard_convert
