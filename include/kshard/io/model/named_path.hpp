#pragma once

/// \file
/// The paths an operation reads and makes, named for messages: what kshard::io compares by file
/// identity so that no operation writes over its own input (io/checkpoint_folder.hpp).

#include <filesystem>
#include <string>
#include <vector>

namespace kshard::io {

/// A path an operation reads or makes, and what it is to the operation ("output", "undo
/// file"): the role names it in messages.
struct NamedPath {
  std::string role;            ///< what the path is to the operation
  std::filesystem::path path;  ///< the path as given
  bool folder = false;         ///< a folder: nothing else the operation makes may lie inside it
};

/// Every path an operation over a checkpoint touches: no path of `makes` may name a file of
/// `reads` or of `makes` (through links, `..` and hard links), or lie inside a folder of
/// `copies` or of `makes`.
struct RunPaths {
  std::vector<NamedPath> reads;   ///< the files it reads
  std::vector<NamedPath> copies;  ///< the folders whose whole contents it copies
  std::vector<NamedPath> makes;   ///< what it creates, truncates, renames or removes
};

}  // namespace kshard::io
