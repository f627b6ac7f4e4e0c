#pragma once
// A relative include names a kshard header too.
#include "../error.hpp"
#include "macros.hpp"

namespace kshard::detail {
KSHARD_INLINE int limit() { return 1'000'000; }
}  // namespace kshard::detail
