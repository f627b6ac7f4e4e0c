#pragma once

// kshard-convert's command line: the options, their definition for CLI11, their texts for the
// agreement that every rank was given the same ones, and the library's options made of them.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kshard/comm/program_agreement.hpp"
#include "kshard/io/model/convert_options.hpp"

namespace kshard_convert {

struct Options {
  std::string in;
  std::string out;
  std::string to = "hf";
  std::string mesh;
  std::string layout;
  std::vector<std::string> layout_for;  // "PATTERN=LAYOUT"
  std::string max_shard_size = "5GB";
  std::string buffer_size = "64MiB";
  bool quiet = false;
  bool verify = false;
  bool no_sync = false;
};

// Defines every option of `o` on `app` (with --version).
void define(CLI::App& app, Options& o);

// Parses the command line into `o`; returns CLI's exit code when it does not parse (rank 0
// prints CLI's message then), -1 when it does.
int parse(CLI::App& app, Options& o, int argc, char** argv, bool print);

// What every rank must have been given alike (see kshard::comm::agree_on_arguments).
std::vector<kshard::comm::NamedText> command_line_texts(const Options& o, int parsed);

// "5GB" (10^9), "64MiB" (2^20), "123" (bytes): the size in bytes; kshard::error otherwise.
std::uint64_t parse_size(const std::string& text, const std::string& option);

// The library's options for `o` (kshard::error for a mesh, layout or size that does not parse).
kshard::io::ConvertOptions convert_options(const Options& o);

}  // namespace kshard_convert
