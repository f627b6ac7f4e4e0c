#pragma once

/// \file
/// What `repair_embedding_rows` and `find_damaged_rows` are asked: `RepairConfig` (when and how
/// to repair), `RepairStrategy` (where repaired rows take their direction from) and
/// `RepairNames` (the names reports and errors use). Include `kshard/repair.hpp`.

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/error.hpp"
#include "kshard/index.hpp"

namespace kshard {

/// Where a repaired row takes its direction from.
enum class RepairStrategy {
  output_direction,  ///< the output embedding (LM head) row of the same token (default)
  mean_direction,    ///< the mean of the healthy input rows (tied or missing output embedding)
};

/// When and how to repair. Validated at construction: `min_norm` finite and >= 0, `max_rows`
/// > 0; anything else throws `kshard::error`. Every rank must pass the same config (agreed on by
/// `repair_embedding_rows` and `find_damaged_rows`, kept rows and the relative threshold
/// included).
class RepairConfig {
 public:
  /// enabled, min_norm = 1e-6, max_rows = 256, output_direction.
  RepairConfig() = default;
  /// Sets every setting; throws `kshard::error` (locally, no communication) when `min_norm` is
  /// negative or not finite, or `max_rows` <= 0.
  RepairConfig(bool enabled, double min_norm, index_t max_rows,
               RepairStrategy strategy = RepairStrategy::output_direction)
      : enabled_(enabled), min_norm_(min_norm), max_rows_(max_rows), strategy_(strategy) {
    if (!std::isfinite(min_norm) || min_norm < 0)
      throw error(fmt::format("kshard::RepairConfig: min_norm is {}; it must be finite and >= 0",
                              min_norm));
    if (max_rows <= 0)
      throw error(fmt::format("kshard::RepairConfig: max_rows is {}; it must be > 0", max_rows));
  }

  /// False: `repair_embedding_rows` returns no report and touches nothing.
  [[nodiscard]] bool enabled() const { return enabled_; }
  /// A row whose norm is `<= min_norm` (or non-finite) is damaged.
  [[nodiscard]] double min_norm() const { return min_norm_; }
  /// More damaged rows than this (those of the relative test included) is a refusal: the
  /// checkpoint is broken, not a few rows.
  [[nodiscard]] index_t max_rows() const { return max_rows_; }
  /// Where repaired rows take their direction from.
  [[nodiscard]] RepairStrategy strategy() const { return strategy_; }

  /// The same config, leaving rows `ids` alone: never repaired, and left out of the detection,
  /// of `max_rows` and of the healthy-row statistics. For the padding id(s), zeroed on purpose
  /// (`zero_row(table, padding_id)` first, then repair with `.keep_rows({padding_id})`). Ids
  /// count from the end when negative, as in `zero_row`; `repair_embedding_rows` refuses ids
  /// outside [-V, V).
  [[nodiscard]] RepairConfig keep_rows(std::vector<index_t> ids) const {
    RepairConfig config = *this;
    config.kept_rows_ = std::move(ids);
    return config;
  }
  /// The rows to leave alone, as given.
  [[nodiscard]] const std::vector<index_t>& kept_rows() const { return kept_rows_; }

  /// The same config with the relative test on (it is off by default): a row whose norm is
  /// below `ratio` x M is damaged too, where M is the median norm of the healthy rows (finite,
  /// > `min_norm`, not kept; each global row counted once, however many ranks hold it) and
  /// "below" is `norm < ratio * M` in fp64. For never-trained rows that are small but not tiny
  /// (the `[unused*]` rows of a BERT vocabulary sit near 0.4 x the median). The median of an
  /// even count is the lower middle: the value of rank floor((n - 1) / 2) in ascending order,
  /// ties counted with their multiplicity. The rows it finds are repaired like any damaged row,
  /// count towards `max_rows`, are left out of the target norm and the mean direction, and are
  /// listed in `RepairReport::relative_row_ids`. Cost: an exact distributed selection on the
  /// fp64 bit patterns of the norms already computed, with no further pass over the matrix: 8
  /// SUM all-reduces of 256 counts (2 KiB each; 1 when no row is healthy) and 8 host passes
  /// over a shrinking list of this rank's row norms, whatever the vocabulary size. Throws
  /// `kshard::error` (locally, no communication) unless `ratio` is in (0, 1].
  [[nodiscard]] RepairConfig relative_threshold(double ratio) const {
    if (!(ratio > 0 && ratio <= 1))  // NaN included
      throw error(fmt::format(
          "kshard::RepairConfig: relative_threshold is {}; it must be in (0, 1]", ratio));
    RepairConfig config = *this;
    config.relative_threshold_ = ratio;
    return config;
  }
  /// The ratio of the relative test, when it is on.
  [[nodiscard]] std::optional<double> relative_threshold() const { return relative_threshold_; }

 private:
  bool enabled_ = true;
  double min_norm_ = 1e-6;
  index_t max_rows_ = 256;
  RepairStrategy strategy_ = RepairStrategy::output_direction;
  std::vector<index_t> kept_rows_;
  std::optional<double> relative_threshold_;
};

/// Names the embeddings carry in reports and errors.
struct RepairNames {
  std::string input = "embed_tokens";  ///< the input embedding
  std::string output = "lm_head";      ///< the output embedding (unused without one)
};

}  // namespace kshard
