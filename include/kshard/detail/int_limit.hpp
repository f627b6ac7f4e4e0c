#pragma once

// The one check behind every count that must fit an int: MPI and MPI-IO counts, Kokkos team
// league sizes. A value past INT_MAX is refused, never truncated.

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kshard/error.hpp"

namespace kshard::detail {

// Why `value` does not fit an int, naming the operation `who` and the quantity `what`.
inline std::optional<std::string> int_limit_problem(std::int64_t value, std::string_view who,
                                                    std::string_view what) {
  if (value >= 0 && value <= INT_MAX) return std::nullopt;
  return fmt::format("kshard::{}: {} is {}; the limit is {}", who, what, value, INT_MAX);
}

// `value` as an int; throws that problem otherwise.
inline int checked_int(std::int64_t value, std::string_view who, std::string_view what) {
  if (auto problem = int_limit_problem(value, who, what)) throw error(*problem);
  return static_cast<int>(value);
}

}  // namespace kshard::detail
