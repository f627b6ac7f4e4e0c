#pragma once

/// \file
/// Detect and repair damaged input-embedding rows (zero, tiny or non-finite) before training
/// starts, on any layout. One full pass over the input shard, work proportional to the damaged
/// rows for everything else, and a constant number of collectives whatever the vocabulary size.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/bfloat16.hpp"
#include "kshard/detail/staging.hpp"
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
/// `repair_embedding_rows`, kept rows included).
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
  /// More damaged rows than this is a refusal: the checkpoint is broken, not a few rows.
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

 private:
  bool enabled_ = true;
  double min_norm_ = 1e-6;
  index_t max_rows_ = 256;
  RepairStrategy strategy_ = RepairStrategy::output_direction;
  std::vector<index_t> kept_rows_;
};

/// Names the embeddings carry in reports and errors.
struct RepairNames {
  std::string input = "embed_tokens";  ///< the input embedding
  std::string output = "lm_head";      ///< the output embedding (unused without one)
};

/// What a repair found and did; identical on every rank. {fmt} prints it in one line.
struct RepairReport {
  std::string input_name;                  ///< the input embedding's name
  std::optional<std::string> output_name;  ///< set when output rows gave the directions
  std::vector<index_t> repaired_row_ids;   ///< sorted unique global row ids that were rewritten
  double min_norm_before = 0;  ///< smallest input row norm before (NaN rows ignored; +inf if none)
  std::optional<double> target_norm;  ///< norm of the repaired rows, when any were repaired
  std::vector<index_t> kept_row_ids;  ///< sorted unique row ids left alone (`keep_rows`)
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
      out = fmt::format_to(out,
                           "{}: repaired {} row(s) [{}] with {} directions; min norm before {:g}, "
                           "target norm {:g}",
                           r.input_name, r.repaired_row_ids.size(),
                           fmt::join(r.repaired_row_ids, ", "),
                           r.output_name ? *r.output_name : std::string("mean healthy-row"),
                           r.min_norm_before, r.target_norm ? *r.target_norm : 0.0);
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

template <class MemSpace, class Map>
HeldRows<MemSpace> held_rows(const Map& rows, const std::vector<index_t>& ids) {
  std::vector<index_t> position;
  std::vector<index_t> local_row;
  for (std::size_t k = 0; k < ids.size(); ++k)
    if (const index_t l = rows.to_local(ids[k]); l != invalid_index) {
      position.push_back(static_cast<index_t>(k));
      local_row.push_back(l);
    }
  HeldRows<MemSpace> held{
      Kokkos::View<index_t*, MemSpace>("kshard::held_position", position.size()),
      Kokkos::View<index_t*, MemSpace>("kshard::held_row", position.size()),
      static_cast<index_t>(position.size())};
  using Unmanaged = Kokkos::View<const index_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  Kokkos::deep_copy(held.position, Unmanaged(position.data(), position.size()));
  Kokkos::deep_copy(held.local_row, Unmanaged(local_row.data(), local_row.size()));
  return held;
}

// Full-row squared norms of `value(position, local_row, local_col)` cast to T, for the
// damaged ids, on every rank: local partial sums from the first copy of each element, then one
// all-reduce over the mesh.
template <class T, class ExecSpace, class MemSpace, class Value>
std::vector<double> damaged_row_norms(const char* label, const HeldRows<MemSpace>& held,
                                      std::size_t num_ids, index_t cols, bool first_copy,
                                      MPI_Comm comm, const Value& value) {
  Kokkos::View<double*, MemSpace> partial("kshard::damaged_row_norms", num_ids);
  if (first_copy) {
    const auto position = held.position;
    const auto local_row = held.local_row;
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(0, held.count),
        KOKKOS_LAMBDA(const index_t h) {
          double sum = 0;
          for (index_t j = 0; j < cols; ++j)
            sum += squared(static_cast<T>(value(position(h), local_row(h), j)));
          partial(position(h)) = sum;
        });
  }
  allreduce_view(ExecSpace(), partial, MPI_SUM, comm);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), partial);
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
      !congruent(input.mesh().comm(), output.mesh().comm()))
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
    if (auto problem = row_range_problem(id, rows, "repair_embedding_rows", "kept row"))
      return problem;
    kept.push_back(id < 0 ? id + rows : id);
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  return std::nullopt;
}

// The agreement of every rank on the config, the matrices and the output's presence, with each
// rank's own checks of them; returns the kept row ids.
template <class In, class Out>
std::vector<index_t> agree_on_repair(const In& input, const Out* output, const RepairConfig& config,
                                     const RepairNames& names) {
  Agreement agreement(input.mesh().comm());
  agreement.same("RepairConfig::enabled()", config.enabled())
      .same("RepairConfig::min_norm()", std::bit_cast<std::int64_t>(config.min_norm()),
            [](std::int64_t bits) { return fmt::format("{}", std::bit_cast<double>(bits)); })
      .same("RepairConfig::max_rows()", config.max_rows())
      .same("RepairConfig::strategy()", static_cast<std::int64_t>(config.strategy()))
      .same("the number of kept rows", static_cast<std::int64_t>(config.kept_rows().size()));
  Digest kept_digest;
  for (const index_t id : config.kept_rows()) kept_digest.add(id);
  agreement.same("the list of kept row ids", kept_digest.value(), [&](std::int64_t v) {
    return v == kept_digest.value() ? fmt::format("[{}]", fmt::join(config.kept_rows(), ", "))
                                    : std::string("other ids");
  });
  agreement.same("whether an output embedding is given", output != nullptr);
  same_matrix(agreement, input, fmt::format("'{}'", names.input));
  if (output != nullptr) same_matrix(agreement, *output, fmt::format("'{}'", names.output));
  std::vector<index_t> kept;
  agreement.problem(kept_rows_problem(config.kept_rows(), input.rows(), kept));
  if (output == nullptr && config.strategy() == RepairStrategy::output_direction)
    agreement.problem(fmt::format(
        "kshard::repair_embedding_rows: the output_direction strategy needs an output "
        "embedding for '{}'; use RepairStrategy::mean_direction when it is tied or missing",
        names.input));
  if (output != nullptr) agreement.problem(output_problem(input, *output, names));
  agreement.settle();
  return kept;
}

// The mean of the healthy rows (`healthy`: one flag per local row, `count` of them over the
// whole matrix): its local columns go to `direction`; returns its full norm. A second pass over
// the input shard, needed only by the mean_direction strategy.
template <class In>
double mean_healthy_direction(const In& input,
                              const Kokkos::View<bool*, Kokkos::HostSpace>& healthy_on_host,
                              double count, bool first_copy,
                              const Kokkos::View<double*, typename In::memory_space>& direction) {
  using ExecSpace = typename In::execution_space;
  using MemSpace = typename In::memory_space;
  const auto local = input.local();
  const auto rows = static_cast<index_t>(local.extent(0));
  const auto cols = static_cast<index_t>(local.extent(1));
  Kokkos::View<double*, MemSpace> column_sums("kshard::column_sums", cols);
  if (first_copy) {
    const auto healthy = Kokkos::create_mirror_view_and_copy(MemSpace(), healthy_on_host);
    // Each thread sums a block of columns down the rows: contiguous reads along every row.
    constexpr index_t block = 32;
    Kokkos::parallel_for(
        "kshard::repair::mean_direction",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(0, (cols + block - 1) / block),
        KOKKOS_LAMBDA(const index_t b) {
          const index_t begin = b * block;
          const index_t width = cols - begin < block ? cols - begin : block;
          double sum[block] = {};
          for (index_t i = 0; i < rows; ++i)
            if (healthy(i))
              for (index_t t = 0; t < width; ++t) sum[t] += widen(local(i, begin + t));
          for (index_t t = 0; t < width; ++t) column_sums(begin + t) = sum[t];
        });
  }
  // Every rank assembles all columns, then keeps its own.
  const auto host_sums = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), column_sums);
  const auto& col_map = input.mapping().cols;
  std::vector<double> mean(static_cast<std::size_t>(input.cols()), 0.0);
  for (index_t j = 0; j < cols; ++j)
    mean[static_cast<std::size_t>(col_map.to_global(j))] = host_sums(static_cast<std::size_t>(j));
  allreduce(mean.data(), mpi_count(input.cols(), "kshard::repair_embedding_rows"), MPI_SUM,
            input.mesh().comm());
  double norm = 0;
  for (double& m : mean) {
    m /= count;
    norm += m * m;
  }
  auto host_direction = Kokkos::create_mirror_view(direction);
  for (index_t j = 0; j < cols; ++j)
    host_direction(static_cast<std::size_t>(j)) =
        mean[static_cast<std::size_t>(col_map.to_global(j))];
  Kokkos::deep_copy(direction, host_direction);
  return std::sqrt(norm);
}

template <class In, class Out>
std::optional<RepairReport> repair_rows(const In& input, const Out* output,
                                        const RepairConfig& config, const RepairNames& names) {
  using T = typename In::value_type;
  using L = typename In::layout_type;
  using ExecSpace = typename In::execution_space;
  using MemSpace = typename In::memory_space;
  const Operation operation("repair_embedding_rows");
  const auto& mesh = input.mesh();
  const MPI_Comm comm = mesh.comm();
  const std::vector<index_t> kept = agree_on_repair(input, output, config, names);
  if (!config.enabled()) return std::nullopt;  // after the agreement: every rank returns here

  // The one full pass over the input: full-row norms of the local rows.
  const auto norms = row_squared_norms(input);
  const auto host_norms = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), norms);
  const auto& rows = input.mapping().rows;
  const bool first_copy_of_rows = L::is_first_copy(mesh.coords(), {0});
  const bool first_copy_of_elements = L::is_first_copy(mesh.coords(), {0, 1});
  const double min_norm = config.min_norm();
  std::vector<index_t> local_damaged;
  Kokkos::View<bool*, Kokkos::HostSpace> healthy("kshard::healthy", host_norms.extent(0));
  // {damaged rows, healthy rows, sum of healthy squared norms, ranks whose output is the input}
  double sums[4] = {0, 0, 0, 0};
  double smallest = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < host_norms.extent(0); ++i) {
    if (std::binary_search(kept.begin(), kept.end(), rows.to_global(static_cast<index_t>(i))))
      continue;  // left alone: not damaged, not healthy (healthy(i) stays false)
    const double norm = std::sqrt(host_norms(i));
    if (!std::isnan(norm)) smallest = std::min(smallest, norm);
    healthy(i) = !is_damaged(norm, min_norm);
    if (!first_copy_of_rows) continue;  // count every global row once
    if (healthy(i)) {
      sums[1] += 1;
      sums[2] += host_norms(i);
    } else {
      sums[0] += 1;
      local_damaged.push_back(rows.to_global(static_cast<index_t>(i)));
    }
  }
  const auto* input_data = static_cast<const void*>(input.local().data());
  if (output != nullptr && input.local().size() > 0 &&
      input_data == static_cast<const void*>(output->local().data()))
    sums[3] = 1;
  allreduce(sums, 4, MPI_SUM, comm);
  allreduce(&smallest, 1, MPI_MIN, comm);

  RepairReport report{names.input, std::nullopt, {}, smallest, std::nullopt, kept};
  const auto damaged = static_cast<index_t>(sums[0]);
  if (damaged == 0) return report;
  if (damaged > config.max_rows())
    throw error(fmt::format(
        "kshard::repair_embedding_rows: {} rows of '{}' are damaged, more than max_rows = {}; "
        "nothing was changed",
        damaged, names.input, config.max_rows()));

  // The damaged ids, sorted, on every rank.
  const int size = mesh.size();
  std::vector<int> counts(static_cast<std::size_t>(size));
  const int mine = static_cast<int>(local_damaged.size());
  allgather(&mine, 1, counts.data(), comm);
  std::vector<int> displs(static_cast<std::size_t>(size), 0);
  for (std::size_t r = 1; r < displs.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  std::vector<index_t> ids(static_cast<std::size_t>(damaged));
  allgatherv(local_damaged.data(), mine, ids.data(), counts.data(), displs.data(), comm);
  std::sort(ids.begin(), ids.end());
  report.repaired_row_ids = ids;

  const bool use_output = config.strategy() == RepairStrategy::output_direction;
  if (use_output && sums[3] > 0)
    throw error(fmt::format(
        "kshard::repair_embedding_rows: '{}' is the same storage as '{}' (tied weights) and "
        "cannot give directions for damaged rows [{}]; nothing was changed (use "
        "RepairStrategy::mean_direction)",
        names.output, names.input, fmt::join(ids, ", ")));
  const auto held = held_rows<MemSpace>(rows, ids);
  const index_t cols = input.mapping().cols.local_extent();
  typename Out::view_type out;  // empty without an output embedding
  if (output != nullptr) out = output->local();
  std::vector<double> out_norms;
  if (use_output) {
    out_norms = damaged_row_norms<typename Out::value_type, ExecSpace, MemSpace>(
        "kshard::repair::output_norms", held, ids.size(), cols, first_copy_of_elements, comm,
        KOKKOS_LAMBDA(index_t, index_t l, index_t j) { return widen(out(l, j)); });
    std::vector<index_t> bad;
    for (std::size_t k = 0; k < ids.size(); ++k)
      if (is_damaged(out_norms[k], min_norm)) bad.push_back(ids[k]);
    if (!bad.empty())
      throw error(fmt::format(
          "kshard::repair_embedding_rows: rows [{}] of '{}' are damaged too and cannot give "
          "directions; nothing was changed",
          fmt::join(bad, ", "), names.output));
  }
  if (sums[1] == 0)
    throw error(fmt::format(
        "kshard::repair_embedding_rows: '{}' has no healthy rows to take a norm from; nothing "
        "was changed",
        names.input));
  const double target = std::sqrt(sums[2] / sums[1]);
  if (is_damaged(target, min_norm))
    throw error(fmt::format(
        "kshard::repair_embedding_rows: the RMS norm of the healthy rows of '{}' is {}, not "
        "finite and > min_norm = {}; nothing was changed",
        names.input, target, min_norm));

  // Repaired value = source * scale(k): the output row, or the mean healthy direction.
  Kokkos::View<double*, MemSpace> scale("kshard::repair_scale", ids.size());
  Kokkos::View<double*, MemSpace> direction("kshard::mean_direction", use_output ? 0 : cols);
  if (use_output) {
    auto host_scale = Kokkos::create_mirror_view(scale);
    for (std::size_t k = 0; k < ids.size(); ++k) host_scale(k) = target / out_norms[k];
    Kokkos::deep_copy(scale, host_scale);
    report.output_name = names.output;
  } else {
    const double norm =
        mean_healthy_direction(input, healthy, sums[1], first_copy_of_elements, direction);
    if (!std::isfinite(norm) || norm <= 0)
      throw error(fmt::format(
          "kshard::repair_embedding_rows: the mean of the healthy rows of '{}' has norm {}, "
          "no direction to repair with; nothing was changed",
          names.input, norm));
    Kokkos::deep_copy(scale, target / norm);
  }
  auto value = KOKKOS_LAMBDA(index_t k, index_t l, index_t j)->double {
    return (use_output ? widen(out(l, j)) : direction(j)) * scale(k);
  };
  // Verify before writing: the rows as they will be stored, cast to T, must be healthy.
  const auto after =
      damaged_row_norms<T, ExecSpace, MemSpace>("kshard::repair::candidate_norms", held, ids.size(),
                                                cols, first_copy_of_elements, comm, value);
  std::vector<index_t> still;
  for (std::size_t k = 0; k < ids.size(); ++k)
    if (is_damaged(after[k], min_norm)) still.push_back(ids[k]);
  if (!still.empty())
    throw error(fmt::format(
        "kshard::repair_embedding_rows: rows [{}] of '{}' would still be damaged after the "
        "repair (not representable in the element type); nothing was changed",
        fmt::join(still, ", "), names.input));

  const auto local = input.local();
  const auto position = held.position;
  const auto local_row = held.local_row;
  Kokkos::parallel_for(
      "kshard::repair::write",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<index_t>>(
          {0, 0}, {held.count, cols}),
      KOKKOS_LAMBDA(const index_t h, const index_t j) {
        local(local_row(h), j) = static_cast<T>(value(position(h), local_row(h), j));
      });
  ExecSpace().fence();
  report.target_norm = target;
  if (mesh.my_rank() == 0) log_line(fmt::format("{}", report));
  return report;
}

}  // namespace detail

/// Repairs the damaged rows of `input` (norm non-finite or <= min_norm) with the direction of
/// the same rows of `output` (the LM head), scaled to the RMS norm of the healthy input rows;
/// or, with `RepairStrategy::mean_direction`, with the mean direction of the healthy input
/// rows. Rows kept with `RepairConfig::keep_rows` (the padding id) are left alone. Collective
/// over the mesh: every rank must call it, with the same config (a disabled one too: it returns
/// no report after the agreement). Refusals (a config, kept ids, element type, shape or layout
/// that differs between ranks, too many damaged rows, kept ids out of range, shapes, layouts or
/// meshes of input and output that differ, tied storage, damaged output rows, no valid target
/// norm) throw the same `kshard::error` on every rank and change nothing.
template <ValuedMatrix In, ValuedMatrix Out>
std::optional<RepairReport> repair_embedding_rows(const In& input, const Out& output,
                                                  const RepairConfig& config = {},
                                                  const RepairNames& names = {}) {
  return detail::repair_rows(input, &output, config, names);
}

/// Repairs `input` without an output embedding (tied or missing LM head): `config` must use
/// `RepairStrategy::mean_direction`.
template <ValuedMatrix In>
std::optional<RepairReport> repair_embedding_rows(const In& input, const RepairConfig& config,
                                                  const RepairNames& names = {}) {
  return detail::repair_rows(input, static_cast<const In*>(nullptr), config, names);
}

}  // namespace kshard
