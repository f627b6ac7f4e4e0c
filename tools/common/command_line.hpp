#pragma once

// The command line of kshard's commands: parsed on every rank, then agreed on (every rank got
// the same one: the command's collectives depend on it, and ranks that differ would wait for
// each other forever).

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "console.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/comm/program_agreement.hpp"
#include "kshard/error.hpp"
#include "kshard/io/model/convert_options.hpp"

namespace kshard_tools {

// A path argument must not be empty: `OUT=""` or an unset `$OUT` would otherwise name the
// current folder's `.kshard-partial` (a usage error, exit 2, before anything is read).
inline const CLI::Validator non_empty_path(
    [](const std::string& text) {
      return text.empty() ? std::string("an empty path (an unset variable?); name a file or folder")
                          : std::string();
    },
    "PATH");

// `--to FORM` for a command that writes a checkpoint: the forms and their help come from the
// library's table (io::named_output_forms); `lead` and `tail` frame the list in the help.
inline CLI::Option* add_output_form(CLI::App& app, std::string& to, std::string_view lead,
                                    std::string_view tail) {
  std::vector<std::string> names;
  std::string help(lead);
  for (const kshard::io::NamedOutputForm& named : kshard::io::named_output_forms) {
    help += fmt::format("{}{}: {}", names.empty() ? "" : "; ", named.name, named.writes);
    names.emplace_back(named.name);
  }
  return app.add_option("--to", to, help + std::string(tail))->check(CLI::IsMember(names));
}

// Defines `options` on `app` and parses the command line into them on every rank (rank 0
// prints CLI's messages), through the command's own `define`, `parse` and `command_line_texts`
// (found beside its Options), then agrees on it. Returns the exit code to end with now (0 after
// --help or --version, 2 for a command line that does not parse or differs between ranks), or
// nothing to go on.
template <class Options>
std::optional<int> read_command_line(const kshard::comm::Group& world, std::string_view command,
                                     CLI::App& app, Options& options, int argc, char** argv) {
  define(app, options);
  const int parsed = parse(app, options, argc, argv, world.rank() == 0);
  try {
    kshard::comm::agree_on_arguments(world, command_line_texts(options, parsed));
  } catch (const kshard::error& e) {
    say("{}: error: {}\n", command, e.what());
    return 2;
  }
  if (parsed == -1) return std::nullopt;
  return parsed == 0 ? 0 : 2;
}

}  // namespace kshard_tools
