#pragma once

/// \file
/// Detect and repair damaged input-embedding rows (zero, tiny or non-finite, and optionally far
/// below the median norm) before training starts, on any layout, or only find them
/// (`find_damaged_rows`). One full pass over the input shard, work proportional to the local
/// rows or the damaged rows for everything else, and a constant number of collectives whatever
/// the vocabulary size. What a repair is asked (`RepairConfig`, `RepairStrategy`,
/// `RepairNames`) is in `repair/config.hpp`, what it answers (`RepairReport`) in
/// `repair/report.hpp`; this header includes both.

#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/log.hpp"
#include "kshard/repair/checks.hpp"
#include "kshard/repair/config.hpp"
#include "kshard/repair/detect.hpp"
#include "kshard/repair/report.hpp"
#include "kshard/repair/write.hpp"

namespace kshard {

namespace detail {

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
