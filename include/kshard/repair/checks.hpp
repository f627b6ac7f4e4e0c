#pragma once

// The checks of a repair's arguments, settled in one agreement so that every rank refuses
// alike: the config, the names and the matrices the same on every rank, the kept row ids in
// range, and an output embedding of the input's shape, mesh and layout.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/format.hpp"
#include "kshard/index.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/repair/config.hpp"
#include "kshard/rowwise.hpp"

namespace kshard::detail {

// Why `output` cannot give the directions of `input`'s rows: another shape, mesh or layout.
template <class In, class Out>
std::optional<std::string> output_problem(const In& input, const Out& output,
                                          const RepairNames& names) {
  if (output.rows() != input.rows() || output.cols() != input.cols())
    return fmt::format(
        "kshard::repair_embedding_rows: output embedding '{}' is {} x {} but input embedding "
        "'{}' is {} x {}; nothing was changed",
        names.output, output.rows(), output.cols(), names.input, input.rows(), input.cols());
  if (input.mesh().shape() != output.mesh().shape() ||
      !input.mesh().group().same_ranks_as(output.mesh().group()))
    return fmt::format(
        "kshard::repair_embedding_rows: '{}' is on {} and '{}' on {}, not the same mesh",
        names.input, input.mesh(), names.output, output.mesh());
  bool same_layout = false;
  if constexpr (std::is_same_v<typename In::layout_type, typename Out::layout_type>)
    same_layout = input.layout() == output.layout();
  if (!same_layout)
    return fmt::format(
        "kshard::repair_embedding_rows: layouts differ: '{}' is {} but '{}' is {}; rows must "
        "be placed alike",
        names.input, input.layout(), names.output, output.layout());
  return std::nullopt;
}

// The kept row ids, wrapped and sorted unique; an id outside [-rows, rows) is a problem.
inline std::optional<std::string> kept_rows_problem(const std::vector<index_t>& given, index_t rows,
                                                    std::vector<index_t>& kept) {
  for (const index_t id : given) {
    if (auto problem = row_range_problem(id, rows, operation_name(), "kept row")) return problem;
    kept.push_back(id < 0 ? id + rows : id);
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  return std::nullopt;
}

// The agreement of every rank on the config, the matrices and the output's presence, with each
// rank's own checks of them; returns the kept row ids. A dry run (`find_damaged_rows`) takes no
// directions, so needs no output embedding whatever the strategy.
template <class In, class Out>
std::vector<index_t> agree_on_repair(const In& input, const Out* output, const RepairConfig& config,
                                     const RepairNames& names, bool dry_run = false) {
  Agreement agreement(input.mesh().group());
  agreement.same("RepairConfig::enabled()", config.enabled())
      .same("RepairConfig::min_norm()", std::bit_cast<std::int64_t>(config.min_norm()),
            [](std::int64_t bits) { return fmt::format("{}", std::bit_cast<double>(bits)); })
      .same("RepairConfig::max_rows()", config.max_rows())
      .same("RepairConfig::strategy()", static_cast<std::int64_t>(config.strategy()),
            [](std::int64_t v) {
              return std::string(v == static_cast<std::int64_t>(RepairStrategy::output_direction)
                                     ? "output_direction"
                                     : "mean_direction");
            })
      .same("RepairConfig::relative_threshold()",
            std::bit_cast<std::int64_t>(config.relative_threshold().value_or(0.0)),
            [](std::int64_t bits) {  // 0: off (an on ratio is > 0)
              return bits == 0 ? std::string("off")
                               : fmt::format("{}", std::bit_cast<double>(bits));
            })
      .same("the number of kept rows", static_cast<std::int64_t>(config.kept_rows().size()));
  Digest kept_digest;
  for (const index_t id : config.kept_rows()) kept_digest.add(id);
  agreement.same("the list of kept row ids", kept_digest.value(), [&](std::int64_t v) {
    return v == kept_digest.value() ? fmt::format("[{}]", fmt::join(config.kept_rows(), ", "))
                                    : std::string("other ids");
  });
  agreement.same("whether an output embedding is given", output != nullptr);
  same_text(agreement, "the name of the input embedding", names.input);  // in every message
  same_text(agreement, "the name of the output embedding", names.output);
  same_matrix(agreement, input, fmt::format("'{}'", names.input));
  if (output != nullptr) same_matrix(agreement, *output, fmt::format("'{}'", names.output));
  std::vector<index_t> kept;
  agreement.problem(kept_rows_problem(config.kept_rows(), input.rows(), kept));
  if (!dry_run && output == nullptr && config.strategy() == RepairStrategy::output_direction)
    agreement.problem(fmt::format(
        "kshard::repair_embedding_rows: the output_direction strategy needs an output "
        "embedding for '{}'; use RepairStrategy::mean_direction when it is tied or missing",
        names.input));
  if (output != nullptr) agreement.problem(output_problem(input, *output, names));
  agreement.settle();
  return kept;
}

}  // namespace kshard::detail
