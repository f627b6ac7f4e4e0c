#pragma once

// Finding the damaged rows, for a repair or a dry run: one full pass over the input shard for
// the row norms, the absolute and relative tests on their squares (the relative one against an
// exact distributed median), and the damaged ids with their norms on every rank.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/group.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"
#include "kshard/index.hpp"
#include "kshard/kernels/copies.hpp"
#include "kshard/placement.hpp"
#include "kshard/repair/config.hpp"
#include "kshard/repair/report.hpp"
#include "kshard/rowwise.hpp"

namespace kshard::detail {

// The absolute test on a norm: not finite, or at most `min_norm`.
inline bool is_damaged(double norm, double min_norm) {
  return !std::isfinite(norm) || norm <= min_norm;
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

}  // namespace kshard::detail
