#pragma once

// kshard-repair's command line: the options, their definition for CLI11, and their texts for
// the agreement that every rank was given the same ones.

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "kshard/comm/program_agreement.hpp"
#include "kshard/index.hpp"

namespace kshard_repair {

struct Options {
  std::string model;
  std::string out;
  std::string to;  // "hf": --out consolidates; "" keeps the input's form
  bool in_place = false;
  bool dry_run = false;
  bool undo = false;
  bool no_sync = false;  // --out is not fsynced
  std::string report;
  std::string embed;
  std::string lm_head;
  std::string strategy;  // "output", "mean" or "" (chosen from the checkpoint)
  kshard::index_t max_rows = 256;
  double min_norm = 1e-6;
  std::optional<double> relative_threshold;
  std::optional<std::vector<kshard::index_t>> keep;
  std::string mesh;
  std::string layout;
};

// Defines every option of `o` on `app`.
void define(CLI::App& app, Options& o);

// Parses the command line into `o`; returns CLI's exit code when it does not parse (rank 0
// prints CLI's message then), -1 when it does.
int parse(CLI::App& app, Options& o, int argc, char** argv, bool print);

// What every rank must have been given alike: the outcome of the parse (`parsed`, as parse()
// returns it) and, where it parsed, every option as the text it was given as, named as on the
// command line.
std::vector<kshard::comm::NamedText> command_line_texts(const Options& o, int parsed);

}  // namespace kshard_repair
