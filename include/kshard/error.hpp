#pragma once

/// \file
/// The one exception type kshard throws. Errors found inside collective operations are
/// agreed on first, so every rank of the communicator throws the same message.

#include <stdexcept>
#include <string>

namespace kshard {

/// Thrown for invalid arguments and failed collective checks, identically on every rank
/// involved. The message names the offending value and the limit it broke.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace kshard
