#pragma once

/// \file
/// Detect and repair damaged input-embedding rows (zero, tiny or non-finite, and optionally far
/// below the median norm) before training starts, on any layout, or only find them
/// (`find_damaged_rows`). One full pass over the input shard, work proportional to the local
/// rows or the damaged rows for everything else, and a constant number of collectives whatever
/// the vocabulary size.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/bfloat16.hpp"
#include "kshard/kernels/column_sums.hpp"
#include "kshard/kernels/copies.hpp"
#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/format.hpp"
#include "kshard/log.hpp"
#include "kshard/rowwise.hpp"

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

// Before the first use below: nvcc's front end checks the non-dependent fmt::format call in
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

namespace kshard {

namespace detail {

// Local rows of the damaged ids this rank holds: `position` indexes the sorted id list.
template <class MemSpace>
struct HeldRows {
  Kokkos::View<index_t*, MemSpace> position;
  Kokkos::View<index_t*, MemSpace> local_row;
  index_t count = 0;
};

template <class MemSpace, class ExecSpace, class Map>
HeldRows<MemSpace> held_rows(const ExecSpace& space, const Map& rows,
                             const std::vector<index_t>& ids) {
  std::vector<index_t> position;
  std::vector<index_t> local_row;
  for (std::size_t k = 0; k < ids.size(); ++k)
    if (const index_t l = rows.to_local(ids[k]); l != invalid_index) {
      position.push_back(static_cast<index_t>(k));
      local_row.push_back(l);
    }
  const auto [on_space, row_on_space] =
      vectors_to_space<MemSpace>(space, "kshard::held_rows", position, local_row);
  return {on_space, row_on_space, static_cast<index_t>(position.size())};
}

// The squared value of element j of held row h, cast to T first, for row_sums.
template <class T, class MemSpace, class Value>
struct HeldSquares {
  HeldRows<MemSpace> held;
  Value value;
  KOKKOS_INLINE_FUNCTION double operator()(index_t h, index_t j) const {
    return squared(static_cast<T>(value(held.position(h), held.local_row(h), j)));
  }
};

// partial(position(h)) = sum, for row_sums.
template <class MemSpace>
struct StoreAtPosition {
  Kokkos::View<index_t*, MemSpace> position;
  Kokkos::View<double*, MemSpace> partial;
  KOKKOS_INLINE_FUNCTION void operator()(index_t h, double sum) const {
    partial(position(h)) = sum;
  }
};

// Full-row squared norms of `value(position, local_row, local_col)` cast to T, for the
// damaged ids, on every rank: local partial sums on `space` from the first copy of each
// element, then one all-reduce over the mesh.
template <class T, class ExecSpace, class MemSpace, class Value>
std::vector<double> damaged_row_norms(const ExecSpace& space, const char* label,
                                      const HeldRows<MemSpace>& held, std::size_t num_ids,
                                      index_t cols, bool first_copy, const comm::Group& group,
                                      const Value& value) {
  Kokkos::View<double*, MemSpace> partial(Kokkos::view_alloc(space, "kshard::damaged_row_norms"),
                                          num_ids);
  if (first_copy)
    row_sums(space, label, held.count, cols, HeldSquares<T, MemSpace, Value>{held, value},
             StoreAtPosition<MemSpace>{held.position, partial});
  group.allreduce(space, partial, ReduceOp::sum);
  const auto host = to_host(space, partial,
                            "kshard::repair_embedding_rows: the damaged rows' norms, for the host");
  std::vector<double> norms(num_ids);
  for (std::size_t k = 0; k < num_ids; ++k) norms[k] = std::sqrt(host(k));
  return norms;
}

inline bool is_damaged(double norm, double min_norm) {
  return !std::isfinite(norm) || norm <= min_norm;
}

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

// Whether local row i is healthy, for add_column_sums.
template <class MemSpace>
struct IsHealthy {
  Kokkos::View<std::uint8_t*, MemSpace> healthy;
  KOKKOS_INLINE_FUNCTION bool operator()(index_t i) const { return healthy(i) != 0; }
};

// The mean of the healthy rows (`healthy_on_host`: 1 per healthy local row, `count` of them over
// the whole matrix): returns its full norm, and its local columns in `direction` (a new view).
// A second pass over the input shard, on `space`, needed only by the mean_direction strategy.
template <class ExecSpace, class In>
double mean_healthy_direction(const ExecSpace& space, const In& input,
                              const std::vector<std::uint8_t>& healthy_on_host, double count,
                              bool first_copy,
                              Kokkos::View<double*, typename In::memory_space>& direction) {
  using MemSpace = typename In::memory_space;
  const auto local = input.local();
  const auto cols = static_cast<index_t>(local.extent(1));
  Kokkos::View<double*, MemSpace> column_sums(Kokkos::view_alloc(space, "kshard::column_sums"),
                                              cols);
  if (first_copy) {
    const auto healthy = vector_to_space<MemSpace>(space, healthy_on_host, "kshard::healthy");
    // Each work item sums a block of columns down the rows: contiguous reads along every row.
    add_column_sums<32>(space, "kshard::repair::mean_direction", local, column_sums,
                        IsHealthy<MemSpace>{healthy});
  }
  // Every rank assembles all columns, then keeps its own.
  const auto host_sums =
      to_host(space, column_sums, "kshard::repair_embedding_rows: the column sums, for the host");
  const auto& col_map = input.mapping().cols;
  std::vector<double> mean(static_cast<std::size_t>(input.cols()), 0.0);
  for (index_t j = 0; j < cols; ++j)
    mean[static_cast<std::size_t>(col_map.to_global(j))] = host_sums(static_cast<std::size_t>(j));
  input.mesh().group().allreduce(mean.data(), mpi_count(input.cols()), ReduceOp::sum);
  double norm = 0;
  for (double& m : mean) {
    m /= count;
    norm += m * m;
  }
  std::vector<double> mine(static_cast<std::size_t>(cols));
  for (index_t j = 0; j < cols; ++j)
    mine[static_cast<std::size_t>(j)] = mean[static_cast<std::size_t>(col_map.to_global(j))];
  direction = vector_to_space<MemSpace>(space, mine, "kshard::mean_direction");
  return std::sqrt(norm);
}

// The exact median of the `values` of every rank (each a finite double >= 0, each global value
// on one rank only), or nullopt when there are none: the lower middle for an even count, the
// value of rank floor((n - 1) / 2). Radix selection on the fp64 bit patterns, whose unsigned
// order is the numeric order of non-negative doubles: 8 rounds of one SUM all-reduce of 256
// counts, each fixing the next 8 bits of the median's pattern and keeping only the values that
// share them (1 round when there are no values).
inline std::optional<double> distributed_median(const std::vector<double>& values,
                                                const comm::Group& group) {
  std::vector<std::uint64_t> candidates(values.size());
  std::transform(values.begin(), values.end(), candidates.begin(),
                 [](double v) { return std::bit_cast<std::uint64_t>(v); });
  std::uint64_t median = 0;
  std::int64_t rank = 0;  // of the median among the candidates left on all ranks
  for (int shift = 56; shift >= 0; shift -= 8) {
    std::array<std::int64_t, 256> counts{};
    for (const std::uint64_t bits : candidates) ++counts[(bits >> shift) & 0xff];
    group.allreduce(counts.data(), static_cast<int>(counts.size()), ReduceOp::sum);
    if (shift == 56) {
      const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
      if (total == 0) return std::nullopt;  // the same on every rank
      rank = (total - 1) / 2;
    }
    std::uint64_t digit = 0;
    for (; rank >= counts[digit]; ++digit) rank -= counts[digit];
    median |= digit << shift;
    std::erase_if(candidates,
                  [&](std::uint64_t bits) { return ((bits >> shift) & 0xff) != digit; });
  }
  return std::bit_cast<double>(median);
}

// What the detection counts over the local rows (each global row once, on its first copy),
// then over the whole mesh with one all-reduce.
struct RowTally {
  double damaged = 0;          // damaged rows, by either test
  double relative = 0;         // of which found by the relative test only
  double healthy = 0;          // healthy rows
  double healthy_squares = 0;  // the sum of their squared norms
  double tied = 0;             // ranks whose output embedding is the input's storage

  // One SUM all-reduce of the five counts over `comm`.
  void sum_over(const comm::Group& group) {
    std::array<double, 5> values{damaged, relative, healthy, healthy_squares, tied};
    group.allreduce(values.data(), static_cast<int>(values.size()), ReduceOp::sum);
    damaged = values[0];
    relative = values[1];
    healthy = values[2];
    healthy_squares = values[3];
    tied = values[4];
  }
};

// What the detection found, for a repair or a dry run.
struct Detection {
  RepairReport report;                // output_name and target_norm set when rows were found
  std::vector<std::uint8_t> healthy;  // per local row: 1 when it passes every test, not kept
  double healthy_rows = 0;            // over the whole matrix
  bool output_is_input = false;       // on some rank (tied weights)
};

// The largest fp64 `s` with sqrt(s) <= bound (square roots rounded as std::sqrt rounds them):
// `s <= it` decides `sqrt(s) <= bound` exactly, so the detection compares each squared norm
// with it and takes no square root per row (a twentieth of a bf16 norms pass otherwise).
// Finite `bound` >= 0 only.
inline double largest_square_with_root_at_most(double bound) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double s = bound * bound;
  if (std::isinf(s)) s = std::numeric_limits<double>::max();
  while (s > 0 && std::sqrt(s) > bound) s = std::nextafter(s, 0.0);
  while (s < std::numeric_limits<double>::max() && std::sqrt(std::nextafter(s, inf)) <= bound)
    s = std::nextafter(s, inf);
  return s;
}

// The tests of the detection on squared norms (each decides exactly what its test on the
// norm, the rounded square root, decides): damaged when not finite or norm <= min_norm
// (`is_damaged`), and, when the relative test is on, when norm < ratio x median.
struct SquaredNormTests {
  double absolute_limit = 0;             // norm <= min_norm  <=>  square <= absolute_limit
  std::optional<double> relative_limit;  // norm < bound  <=>  square <= relative_limit

  explicit SquaredNormTests(double min_norm)
      : absolute_limit(largest_square_with_root_at_most(min_norm)) {}

  // norm < ratio x median is norm <= the double just below that bound.
  void set_relative(double ratio, double median) {
    const double bound = ratio * median;
    relative_limit = bound > 0 ? largest_square_with_root_at_most(std::nextafter(bound, 0.0))
                               : -1.0;  // no norm is below 0
  }
  [[nodiscard]] bool absolute(double square) const {
    return !std::isfinite(square) || square <= absolute_limit;
  }
  [[nodiscard]] bool relative(double square) const {
    return relative_limit && square <= *relative_limit;
  }
};

// The local rows as the detection sees them: their squared full-row norms on the host (the one
// full pass over the input, on `space`; no copy on a host backend), which rows are kept, and
// whether this rank holds the first copy of its rows.
template <class HostNorms>
struct LocalRows {
  HostNorms squared_norms;
  std::vector<bool> kept;  // per local row; empty when no row is kept
  bool first_copy = false;

  [[nodiscard]] std::size_t size() const { return squared_norms.extent(0); }
  [[nodiscard]] double square(std::size_t i) const { return squared_norms(i); }
  [[nodiscard]] bool is_kept(std::size_t i) const { return !kept.empty() && kept[i]; }
};

template <class ExecSpace, class In>
auto local_rows(const ExecSpace& space, const In& input, const std::vector<index_t>& kept) {
  using L = typename In::layout_type;
  auto host = to_host(space, agreed_row_squared_norms(space, input),
                      "kshard::detect_damaged_rows: the row norms, for the host");
  LocalRows<decltype(host)> local{
      std::move(host), {}, L::is_first_copy(input.mesh().coords(), {0})};
  const auto& rows = input.mapping().rows;
  if (!kept.empty()) {
    local.kept.assign(local.size(), false);
    for (std::size_t i = 0; i < local.size(); ++i)
      local.kept[i] =
          std::binary_search(kept.begin(), kept.end(), rows.to_global(static_cast<index_t>(i)));
  }
  return local;
}

// The relative test's median: of the healthy rows by the absolute test (finite, > min_norm,
// not kept), each global row once (on its first copy); nullopt when the test is off or no row
// is healthy. The median of their squares, then its square root: the same value, the root
// being monotonic.
template <class HostNorms>
std::optional<double> healthy_median(const LocalRows<HostNorms>& local, const RepairConfig& config,
                                     const SquaredNormTests& tests, const comm::Group& group) {
  if (!config.relative_threshold()) return std::nullopt;
  std::vector<double> healthy_squares;
  for (std::size_t i = 0; local.first_copy && i < local.size(); ++i)
    if (!local.is_kept(i) && !tests.absolute(local.square(i)))
      healthy_squares.push_back(local.square(i));
  const std::optional<double> median = distributed_median(healthy_squares, group);
  if (!median) return std::nullopt;
  return std::sqrt(*median);
}

// The local rows sorted into healthy (flags in `found.healthy`) and damaged (as pairs (id, bits
// of the norm), for one gather), counted in `tally`; returns the smallest squared norm (NaN
// ignored).
template <class HostNorms, class Map>
double classify_rows(const LocalRows<HostNorms>& local, const Map& rows,
                     const SquaredNormTests& tests, Detection& found,
                     std::vector<std::int64_t>& local_damaged, RowTally& tally) {
  double smallest = std::numeric_limits<double>::infinity();
  found.healthy.assign(local.size(), 0);
  for (std::size_t i = 0; i < local.size(); ++i) {
    if (local.is_kept(i)) continue;  // left alone: not damaged, not healthy
    const double square = local.square(i);
    if (!std::isnan(square)) smallest = std::min(smallest, square);
    const bool absolute = tests.absolute(square);
    const bool relative = !absolute && tests.relative(square);
    found.healthy[i] = !absolute && !relative ? 1 : 0;
    if (!local.first_copy) continue;  // count every global row once
    if (found.healthy[i] != 0) {
      tally.healthy += 1;
      tally.healthy_squares += square;
    } else {
      tally.damaged += 1;
      tally.relative += relative ? 1 : 0;
      local_damaged.push_back(rows.to_global(static_cast<index_t>(i)));
      local_damaged.push_back(std::bit_cast<std::int64_t>(std::sqrt(square)));
    }
  }
  return smallest;
}

// Every rank's damaged rows, as (id, bits of the norm) pairs, into the report sorted by id
// (`damaged` of them over the ranks of `group`): one all-gather of the counts, one of the pairs.
inline void gather_damaged_rows(const std::vector<std::int64_t>& local_damaged, index_t damaged,
                                double min_norm, const comm::Group& group, RepairReport& report) {
  const int size = group.size();
  std::vector<int> counts(static_cast<std::size_t>(size));
  const int mine = static_cast<int>(local_damaged.size());
  group.allgather(&mine, 1, counts.data());
  std::vector<int> displs(static_cast<std::size_t>(size), 0);
  for (std::size_t r = 1; r < displs.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  std::vector<std::int64_t> pairs(2 * static_cast<std::size_t>(damaged));
  group.allgatherv(local_damaged.data(), mine, pairs.data(), counts.data(), displs.data());
  std::vector<std::size_t> order(static_cast<std::size_t>(damaged));
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return pairs[2 * a] < pairs[2 * b]; });
  for (const std::size_t k : order) {
    const index_t id = pairs[2 * k];
    const double norm = std::bit_cast<double>(pairs[2 * k + 1]);
    report.repaired_row_ids.push_back(id);
    report.repaired_norms_before.push_back(norm);
    if (!is_damaged(norm, min_norm)) report.relative_row_ids.push_back(id);
  }
}

// The detection shared by repair_embedding_rows and find_damaged_rows, on `space`: the one full
// pass over the input (full-row norms of the local rows), the relative test's median when it
// is on, then the damaged ids and their norms on every rank. Refuses more than max_rows
// damaged rows.
template <class ExecSpace, class In, class Out>
Detection detect_damaged_rows(const ExecSpace& space, const In& input, const Out* output,
                              const RepairConfig& config, const RepairNames& names,
                              std::vector<index_t> kept) {
  const comm::Group& group = input.mesh().group();
  const auto local = local_rows(space, input, kept);
  SquaredNormTests tests(config.min_norm());
  const std::optional<double> median = healthy_median(local, config, tests, group);
  if (median) tests.set_relative(*config.relative_threshold(), *median);

  Detection found;
  RowTally tally;
  std::vector<std::int64_t> local_damaged;
  double smallest_square =
      classify_rows(local, input.mapping().rows, tests, found, local_damaged, tally);
  const auto* input_data = static_cast<const void*>(input.local().data());
  if (output != nullptr && input.local().size() > 0 &&
      input_data == static_cast<const void*>(output->local().data()))
    tally.tied = 1;
  tally.sum_over(group);
  group.allreduce(&smallest_square, 1, ReduceOp::min);
  found.healthy_rows = tally.healthy;
  found.output_is_input = tally.tied > 0;

  RepairReport& report = found.report;
  report.input_name = names.input;
  report.min_norm_before = std::sqrt(smallest_square);
  report.kept_row_ids = std::move(kept);
  report.median_norm = median;
  const auto damaged = static_cast<index_t>(tally.damaged);
  if (damaged == 0) return found;
  if (damaged > config.max_rows())
    throw error(fmt::format(
        "kshard::{}: {} rows of '{}' are damaged, more than max_rows = {}{}; nothing was changed",
        operation_name(), damaged, names.input, config.max_rows(),
        median ? fmt::format(" ({} of them below {} x the median norm {:g})",
                             static_cast<index_t>(tally.relative), *config.relative_threshold(),
                             *median)
               : std::string()));
  gather_damaged_rows(local_damaged, damaged, config.min_norm(), group, report);
  if (config.strategy() == RepairStrategy::output_direction) report.output_name = names.output;
  if (tally.healthy > 0) report.target_norm = std::sqrt(tally.healthy_squares / tally.healthy);
  return found;
}

// ---- The repair's steps after the detection ----

// The value a repaired element takes: source(l, j) * scale(k), the source being the output
// row (output_direction) or the mean healthy direction.
template <class OutView, class MemSpace>
struct RepairedValue {
  OutView out;                                // the output embedding's shard (output_direction)
  Kokkos::View<double*, MemSpace> direction;  // the mean direction's local columns (mean)
  Kokkos::View<double*, MemSpace> scale;      // per damaged id
  bool use_output = true;

  KOKKOS_INLINE_FUNCTION double operator()(index_t k, index_t l, index_t j) const {
    return (use_output ? widen(out(l, j)) : direction(j)) * scale(k);
  }
};

// The ids of `ids` whose norm in `norms` is damaged.
inline std::vector<index_t> damaged_ids(const std::vector<index_t>& ids,
                                        const std::vector<double>& norms, double min_norm) {
  std::vector<index_t> bad;
  for (std::size_t k = 0; k < ids.size(); ++k)
    if (is_damaged(norms[k], min_norm)) bad.push_back(ids[k]);
  return bad;
}

// The target norm of the repaired rows, or the refusal when there is none worth scaling to.
inline double target_norm_or_refuse(const RepairReport& report, double min_norm,
                                    const RepairNames& names) {
  if (!report.target_norm)
    throw error(fmt::format(
        "kshard::repair_embedding_rows: '{}' has no healthy rows to take a norm from; nothing "
        "was changed",
        names.input));
  const double target = *report.target_norm;
  if (is_damaged(target, min_norm))
    throw error(fmt::format(
        "kshard::repair_embedding_rows: the RMS norm of the healthy rows of '{}' is {}, not "
        "finite and > min_norm = {}; nothing was changed",
        names.input, target, min_norm));
  return target;
}

// Element (l, j) of the output embedding's shard, for held row l of any damaged id.
template <class OutView>
struct OutputValue {
  OutView out;
  KOKKOS_INLINE_FUNCTION double operator()(index_t, index_t l, index_t j) const {
    return widen(out(l, j));
  }
};

// The damaged rows of `output` must be healthy to give directions: their norms (for the
// scales), or the refusal. One all-reduce.
template <class ExecSpace, class In, class Out, class MemSpace>
std::vector<double> output_row_norms(const ExecSpace& space, const In& input, const Out& output,
                                     const HeldRows<MemSpace>& held, const RepairReport& report,
                                     bool first_copy, double min_norm, const RepairNames& names) {
  const std::vector<index_t>& ids = report.repaired_row_ids;
  const auto norms = damaged_row_norms<typename Out::value_type>(
      space, "kshard::repair::output_norms", held, ids.size(), input.mapping().cols.local_extent(),
      first_copy, input.mesh().group(), OutputValue<typename Out::view_type>{output.local()});
  if (const auto bad = damaged_ids(ids, norms, min_norm); !bad.empty())
    throw error(fmt::format(
        "kshard::repair_embedding_rows: rows [{}] of '{}' are damaged too and cannot give "
        "directions; nothing was changed",
        fmt::join(bad, ", "), names.output));
  return norms;
}

// The repaired values of the held rows, as the repair will write them: the output rows
// (`use_output`, with `out_norms`) or the mean healthy direction (a second pass over the input),
// times the scale of each id.
template <class ExecSpace, class In, class Out>
RepairedValue<typename Out::view_type, typename In::memory_space> repaired_values(
    const ExecSpace& space, const In& input, const Out* output, const Detection& found,
    bool use_output, const std::vector<double>& out_norms, double target, bool first_copy,
    const RepairNames& names) {
  using MemSpace = typename In::memory_space;
  const std::size_t num_ids = found.report.repaired_row_ids.size();
  RepairedValue<typename Out::view_type, MemSpace> value;
  value.use_output = use_output;
  if (output != nullptr) value.out = output->local();
  if (value.use_output) {
    std::vector<double> scales(num_ids);
    for (std::size_t k = 0; k < num_ids; ++k) scales[k] = target / out_norms[k];
    value.scale = vector_to_space<MemSpace>(space, scales, "kshard::repair_scale");
    return value;
  }
  const double norm = mean_healthy_direction(space, input, found.healthy, found.healthy_rows,
                                             first_copy, value.direction);
  if (!std::isfinite(norm) || norm <= 0)
    throw error(fmt::format(
        "kshard::repair_embedding_rows: the mean of the healthy rows of '{}' has norm {}, "
        "no direction to repair with; nothing was changed",
        names.input, norm));
  value.scale = vector_to_space<MemSpace>(space, std::vector<double>(num_ids, target / norm),
                                          "kshard::repair_scale");
  return value;
}

// Verify before writing: the rows as they will be stored, cast to T, must be healthy. One
// all-reduce.
template <class ExecSpace, class In, class MemSpace, class Value>
void verify_repaired_rows(const ExecSpace& space, const In& input, const HeldRows<MemSpace>& held,
                          const RepairReport& report, bool first_copy, double min_norm,
                          const Value& value, const RepairNames& names) {
  const std::vector<index_t>& ids = report.repaired_row_ids;
  const auto after = damaged_row_norms<typename In::value_type>(
      space, "kshard::repair::candidate_norms", held, ids.size(),
      input.mapping().cols.local_extent(), first_copy, input.mesh().group(), value);
  if (const auto still = damaged_ids(ids, after, min_norm); !still.empty())
    throw error(fmt::format(
        "kshard::repair_embedding_rows: rows [{}] of '{}' would still be damaged after the "
        "repair (not representable in the element type); nothing was changed",
        fmt::join(still, ", "), names.input));
}

// local(local_row(h), j) = value(position(h), local_row(h), j), cast to the element type.
template <class Local, class MemSpace, class Value>
struct WriteHeldRows {
  Local local;
  HeldRows<MemSpace> held;
  Value value;
  KOKKOS_INLINE_FUNCTION void operator()(index_t h, index_t j) const {
    const index_t l = held.local_row(h);
    local(l, j) = static_cast<typename Local::value_type>(value(held.position(h), l, j));
  }
};

// Writes the repaired values into the held rows of `input`, on `space`.
template <class ExecSpace, class In, class MemSpace, class Value>
void write_repaired_rows(const ExecSpace& space, const In& input, const HeldRows<MemSpace>& held,
                         const Value& value) {
  Kokkos::parallel_for(
      "kshard::repair::write",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<index_t>>(
          space, {0, 0}, {held.count, input.mapping().cols.local_extent()}),
      WriteHeldRows<typename In::view_type, MemSpace, Value>{input.local(), held, value});
}

// The repair, in its steps: agree on the arguments, detect, refuse tied weights, check the
// output rows, take the target norm and the repaired values, verify them, write them.
template <class ExecSpace, class In, class Out>
std::optional<RepairReport> repair_rows(const ExecSpace& space, const In& input, const Out* output,
                                        const RepairConfig& config, const RepairNames& names) {
  static_assert(ValuedMatrix<In> && ValuedMatrix<Out>,
                "kshard::repair_embedding_rows: a Partial matrix has no values until it is "
                "reduced; redistribute it to Replicate or Shard first");
  using L = typename In::layout_type;
  using MemSpace = typename In::memory_space;
  const Operation operation("repair_embedding_rows");
  std::vector<index_t> kept = agree_on_repair(input, output, config, names);
  if (!config.enabled()) return std::nullopt;  // after the agreement: every rank returns here
  Detection found = detect_damaged_rows(space, input, output, config, names, std::move(kept));
  const RepairReport& report = found.report;
  const std::vector<index_t>& ids = report.repaired_row_ids;
  if (ids.empty()) return report;

  const bool first_copy = L::is_first_copy(input.mesh().coords(), {0, 1});
  const double min_norm = config.min_norm();
  const bool use_output = config.strategy() == RepairStrategy::output_direction;
  if (use_output && found.output_is_input)
    throw error(fmt::format(
        "kshard::repair_embedding_rows: '{}' is the same storage as '{}' (tied weights) and "
        "cannot give directions for damaged rows [{}]; nothing was changed (use "
        "RepairStrategy::mean_direction)",
        names.output, names.input, fmt::join(ids, ", ")));
  const auto held = held_rows<MemSpace>(space, input.mapping().rows, ids);
  std::vector<double> out_norms;
  if (use_output)
    out_norms = output_row_norms(space, input, *output, held, report, first_copy, min_norm, names);
  const double target = target_norm_or_refuse(report, min_norm, names);
  const auto value = repaired_values(space, input, output, found, use_output, out_norms, target,
                                     first_copy, names);
  verify_repaired_rows(space, input, held, report, first_copy, min_norm, value, names);
  write_repaired_rows(space, input, held, value);
  fence(space, "kshard::repair_embedding_rows: the repaired rows are written");
  if (input.mesh().my_rank() == 0 && logging()) log_line(fmt::format("{}", report));
  return report;
}

}  // namespace detail

/// Repairs the damaged rows of `input` (norm non-finite or <= min_norm, or below
/// `RepairConfig::relative_threshold` x the median norm when that is on) with the direction of
/// the same rows of `output` (the LM head), scaled to the RMS norm of the healthy input rows;
/// or, with `RepairStrategy::mean_direction`, with the mean direction of the healthy input
/// rows. Rows kept with `RepairConfig::keep_rows` (the padding id) are left alone. Collective
/// over the mesh: every rank must call it, with the same config (a disabled one too: it returns
/// no report after the agreement). Refusals (a config, kept ids, element type, shape or layout
/// that differs between ranks, too many damaged rows, kept ids out of range, shapes, layouts or
/// meshes of input and output that differ, tied storage, damaged output rows, no valid target
/// norm) throw the same `kshard::error` on every rank and change nothing. Every kernel and copy
/// runs on `space`, which is fenced before MPI reads what it wrote and before returning.
template <class ExecSpace, DistributedMatrix In, DistributedMatrix Out>
requires detail::ExecutionSpaceFor<ExecSpace, In> && detail::ExecutionSpaceFor<ExecSpace, Out>
    std::optional<RepairReport> repair_embedding_rows(const ExecSpace& space, const In& input,
                                                      const Out& output,
                                                      const RepairConfig& config = {},
                                                      const RepairNames& names = {}) {
  return detail::repair_rows(space, input, &output, config, names);
}

/// `repair_embedding_rows(space, input, output, config, names)` on a default instance of the
/// input's execution space.
template <DistributedMatrix In, DistributedMatrix Out>
std::optional<RepairReport> repair_embedding_rows(const In& input, const Out& output,
                                                  const RepairConfig& config = {},
                                                  const RepairNames& names = {}) {
  return detail::repair_rows(typename In::execution_space{}, input, &output, config, names);
}

/// Repairs `input` without an output embedding (tied or missing LM head), on `space`: `config`
/// must use `RepairStrategy::mean_direction`.
template <class ExecSpace, DistributedMatrix In>
requires detail::ExecutionSpaceFor<ExecSpace, In> std::optional<RepairReport> repair_embedding_rows(
    const ExecSpace& space, const In& input, const RepairConfig& config,
    const RepairNames& names = {}) {
  return detail::repair_rows(space, input, static_cast<const In*>(nullptr), config, names);
}

/// `repair_embedding_rows(space, input, config, names)` on a default instance of the input's
/// execution space.
template <DistributedMatrix In>
std::optional<RepairReport> repair_embedding_rows(const In& input, const RepairConfig& config,
                                                  const RepairNames& names = {}) {
  return detail::repair_rows(typename In::execution_space{}, input, static_cast<const In*>(nullptr),
                             config, names);
}

/// A dry run of `repair_embedding_rows`: finds the damaged rows of `input` as the repair would
/// (the same detection code, the relative test included) and returns the report the repair
/// would return, changing nothing: the ids, their norms before, the relative rows and the
/// median, the kept rows, `output_name` (`names.output`) under the output_direction strategy,
/// and `target_norm` (the RMS norm of the healthy rows: free, from the same all-reduce) when
/// rows were found and some rows are healthy. Collective over the mesh, with the same
/// agreement on the config as the repair (any strategy, no output embedding needed); a
/// disabled config returns no report. Refuses, like the repair, more than `max_rows` damaged
/// rows (raise it to list more) and kept ids out of range; what the repair checks on the
/// output embedding or the repaired values (tied storage, damaged output rows, a valid target
/// norm and direction) is not checked. Cost: the repair's detection: one pass over the input
/// shard, on `space`, 2 all-reduces (plus those of the norms when columns are split, and 8 for
/// the relative test), and 2 more collectives when rows are found.
template <class ExecSpace, DistributedMatrix In>
requires detail::ExecutionSpaceFor<ExecSpace, In> std::optional<RepairReport> find_damaged_rows(
    const ExecSpace& space, const In& input, const RepairConfig& config = {},
    const RepairNames& names = {}) {
  static_assert(ValuedMatrix<In>,
                "kshard::find_damaged_rows: a Partial matrix has no values until it is reduced; "
                "redistribute it to Replicate or Shard first");
  const detail::Operation operation("find_damaged_rows");
  const auto* none = static_cast<const In*>(nullptr);
  std::vector<index_t> kept = detail::agree_on_repair(input, none, config, names, true);
  if (!config.enabled()) return std::nullopt;  // after the agreement: every rank returns here
  return detail::detect_damaged_rows(space, input, none, config, names, std::move(kept)).report;
}

/// `find_damaged_rows(space, input, config, names)` on a default instance of the input's
/// execution space.
template <DistributedMatrix In>
std::optional<RepairReport> find_damaged_rows(const In& input, const RepairConfig& config = {},
                                              const RepairNames& names = {}) {
  return find_damaged_rows(typename In::execution_space{}, input, config, names);
}

}  // namespace kshard
