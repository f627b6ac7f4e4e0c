#pragma once
// The floor: error.hpp may include detail/ (same layer).
#include "kshard/detail/macros.hpp"

namespace kshard {
struct error {
  const char* what;
};
}  // namespace kshard
