#pragma once

/// \file
/// What a repair answers: `RepairReport`, identical on every rank, and its one-line {fmt} form.
/// Include `kshard/repair.hpp`.

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/format.hpp"
#include "kshard/index.hpp"

namespace kshard {

/// What a repair found and did (or, from `find_damaged_rows`, would do); identical on every
/// rank. {fmt} prints it in one line.
struct RepairReport {
  std::string input_name;                  ///< the input embedding's name
  std::optional<std::string> output_name;  ///< set when output rows gave the directions
  std::vector<index_t> repaired_row_ids;   ///< sorted unique global row ids that were rewritten
  double min_norm_before = 0;  ///< smallest input row norm before (NaN rows ignored; +inf if none)
  std::optional<double> target_norm;  ///< norm of the repaired rows, when any were repaired
  std::vector<index_t> kept_row_ids;  ///< sorted unique row ids left alone (`keep_rows`)
  /// Sorted ids found by the relative test only (finite, > min_norm, below the ratio times the
  /// median); they are in `repaired_row_ids` too.
  std::vector<index_t> relative_row_ids;
  /// The median norm of the healthy rows, when the relative test ran over at least one.
  std::optional<double> median_norm;
  /// The norm of each row of `repaired_row_ids` before, in that order (NaN and inf as they were).
  std::vector<double> repaired_norms_before;
};

}  // namespace kshard

// Declared with the type: nvcc's front end checks the non-dependent fmt::format call in
// repair_rows when it is defined, and wants the specialisation declared by then.
/// @cond INTERNAL
template <>
struct fmt::formatter<kshard::RepairReport> : kshard::detail::plain_formatter {
  template <class Ctx>
  auto format(const kshard::RepairReport& r, Ctx& ctx) const {
    auto out = ctx.out();
    if (r.repaired_row_ids.empty())
      out = fmt::format_to(out, "{}: no damaged rows (min norm {:g})", r.input_name,
                           r.min_norm_before);
    else
      out = fmt::format_to(
          out,
          "{}: repaired {} row(s) [{}] with {} directions; min norm before {:g}, "
          "target norm {:g}; norms before [{:g}]",
          r.input_name, r.repaired_row_ids.size(), fmt::join(r.repaired_row_ids, ", "),
          r.output_name ? *r.output_name : std::string("mean healthy-row"), r.min_norm_before,
          r.target_norm ? *r.target_norm : 0.0, fmt::join(r.repaired_norms_before, ", "));
    if (r.median_norm)
      out = fmt::format_to(out, "; median norm {:g}, relative row(s) [{}]", *r.median_norm,
                           fmt::join(r.relative_row_ids, ", "));
    if (!r.kept_row_ids.empty())
      out = fmt::format_to(out, "; kept row(s) [{}] as they were", fmt::join(r.kept_row_ids, ", "));
    return out;
  }
};
/// @endcond
