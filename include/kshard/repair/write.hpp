#pragma once

// Computing and writing the replacement rows, after the detection: the output rows' norms or
// the mean healthy direction, the scales to the target norm, a check of the rows as they will
// be stored, then one kernel writing them into the rows this rank holds.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include "kshard/comm/group.hpp"
#include "kshard/comm/mpi.hpp"
#include "kshard/error.hpp"
#include "kshard/index.hpp"
#include "kshard/kernels/column_sums.hpp"
#include "kshard/kernels/copies.hpp"
#include "kshard/kernels/row_norms.hpp"
#include "kshard/placement.hpp"
#include "kshard/repair/config.hpp"
#include "kshard/repair/detect.hpp"
#include "kshard/repair/report.hpp"

namespace kshard::detail {

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

}  // namespace kshard::detail
