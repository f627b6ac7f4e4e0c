#pragma once

/// \file
/// The reductions of kshard's collectives (`comm::Group::allreduce` and the like) and of the
/// `Partial` placements a layout may be pending.

#include <string_view>

namespace kshard {

/// A reduction: of a collective, or pending in a `Partial` placement.
enum class ReduceOp { sum, max, min, avg };

/// Lower-case name of a reduction, as printed by the formatters ("sum", "max", ...).
constexpr std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
    case ReduceOp::avg:
      return "avg";
  }
  return "?";
}

}  // namespace kshard
