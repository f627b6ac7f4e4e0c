#pragma once

/// \file
/// A path an operation reads or makes, named for messages: what kshard::io compares by file
/// identity so that no operation writes over its own input (io/checkpoint_folder.hpp).

#include <filesystem>
#include <string>

namespace kshard::io {

/// A path an operation reads or makes, and what it is to the operation ("output", "undo
/// file"): the role names it in messages.
struct NamedPath {
  std::string role;            ///< what the path is to the operation
  std::filesystem::path path;  ///< the path as given
};

}  // namespace kshard::io
