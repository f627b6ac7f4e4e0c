#pragma once

/// \file
/// Rowwise algorithms that touch only the local shard: zero one global row, and full-row
/// squared norms of the local rows.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <limits>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "kshard/bfloat16.hpp"
#include "kshard/comm/agreement.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/kernels/row_norms.hpp"
#include "kshard/matrix_agreement.hpp"

namespace kshard {

namespace detail {

// Why global row `row` (negative: counted from the end) is not a row of a matrix of `rows`.
inline std::optional<std::string> row_range_problem(index_t row, index_t rows, const char* who,
                                                    const char* what = "row") {
  const index_t wrapped = row < 0 ? row + rows : row;  // rows >= 0: cannot overflow
  if (rows == 0)
    return fmt::format("kshard::{}: {} {} is out of range: the matrix has no rows", who, what, row);
  if (wrapped < 0 || wrapped >= rows)
    return fmt::format(
        "kshard::{}: {} {} is out of range for a matrix of {} rows (valid: -{} to {})", who, what,
        row, rows, rows, rows - 1);
  return std::nullopt;
}

// Global row `row`, with one wrap for negative values; throws (identically on every rank,
// from global data only) when out of range.
inline index_t wrap_row(index_t row, index_t rows, const char* who) {
  if (auto problem = row_range_problem(row, rows, who)) throw error(*problem);
  return row < 0 ? row + rows : row;
}

// Sums `values` (one entry per local row) over the mesh dimensions that split columns, so
// every column shard of a row ends with the full-row value.
template <class ExecSpace, class M, class View>
void sum_over_column_shards(const ExecSpace& space, const M& matrix, const View& values) {
  using L = typename M::layout_type;
  for (std::size_t m = 0; m < L::rank; ++m)
    if (L::tensor_dims[m] == 1 && matrix.mesh().extent(m) > 1)
      matrix.mesh().dim_group(m).allreduce(space, values, ReduceOp::sum);
}

// Zeroes row `row` of `local`, one element per work item.
template <class View>
struct ZeroRow {
  View local;
  index_t row;
  KOKKOS_INLINE_FUNCTION void operator()(index_t j) const {
    local(row, j) = typename View::value_type(0.0f);
  }
};

}  // namespace detail

/// Sets global row `row` to zero wherever this rank holds part of it; negative rows count
/// from the end. No communication: O(local row) work. Returns true where this rank held part
/// of the row (every replica and every column shard of it), false elsewhere and on empty
/// shards. An out-of-range row throws the same `kshard::error` on every rank. Asynchronous
/// on `space`, like any Kokkos kernel.
template <class ExecSpace, DistributedMatrix M>
requires detail::ExecutionSpaceFor<ExecSpace, M>
bool zero_row(const ExecSpace& space, const M& matrix, index_t row) {
  static_assert(ValuedMatrix<M>,
                "kshard::zero_row: a Partial matrix has no values until it is reduced; "
                "redistribute it to Replicate or Shard first");
  const index_t global = detail::wrap_row(row, matrix.rows(), "zero_row");
  const index_t local_row = matrix.mapping().rows.to_local(global);
  const index_t cols = matrix.mapping().cols.local_extent();
  if (local_row == invalid_index || cols == 0) return false;
  Kokkos::parallel_for("kshard::zero_row",
                       Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(space, 0, cols),
                       detail::ZeroRow<typename M::view_type>{matrix.local(), local_row});
  return true;
}

/// `zero_row(space, matrix, row)` on a default instance of the matrix's execution space.
template <DistributedMatrix M>
bool zero_row(const M& matrix, index_t row) {
  return zero_row(typename M::execution_space{}, matrix, row);
}

namespace detail {
// Why the norms of `matrix` cannot be computed (too many rows for one allocation), if so: from
// global extents, so the same on every rank that passes the same matrix.
template <class M>
std::optional<std::string> norms_size_problem(const M& matrix) {
  if (fits_in_bytes<double>(matrix.rows(), 1)) return std::nullopt;
  return fmt::format(
      "kshard::row_squared_norms: the matrix has {} rows, whose norms would need more than "
      "the limit of {} bytes",
      matrix.rows(), std::numeric_limits<index_t>::max());
}

// `row_squared_norms` once every rank is known to pass the same matrix (the caller agreed on
// it, or no mesh dimension splits columns).
template <class ExecSpace, class M>
Kokkos::View<double*, typename M::memory_space> agreed_row_squared_norms(const ExecSpace& space,
                                                                         const M& matrix) {
  throw_if(norms_size_problem(matrix));
  Kokkos::View<double*, typename M::memory_space> norms(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "kshard::row_squared_norms"),
      matrix.local().extent(0));
  local_row_squared_norms(space, matrix.local(), norms);
  sum_over_column_shards(space, matrix, norms);
  return norms;
}
}  // namespace detail

/// Full-row squared L2 norms of the local rows, in local row order: elements are widened to
/// fp64, squared and summed in fp64 (no finite row of float, bf16 or f16 overflows), then summed
/// over the mesh dimensions that split columns (only those). One pass over the local shard,
/// on `space`. Collective over the mesh (every rank calls it): one fixed-size agreement over
/// the mesh first (the same element type, shape, layout and mesh on every rank, else the same
/// `kshard::error` everywhere; none on a mesh of one rank), then one all-reduce of the local row
/// count in doubles per mesh dimension that splits columns; no more communication on row
/// shards. The agreement runs on every layout because the layout decides whether the norms are
/// summed: a rank passing a row-split matrix while the others pass a column-split one would
/// otherwise leave them waiting in the sum.
template <class ExecSpace, DistributedMatrix M>
requires detail::ExecutionSpaceFor<ExecSpace, M> Kokkos::View<double*, typename M::memory_space>
row_squared_norms(const ExecSpace& space, const M& matrix) {
  static_assert(ValuedMatrix<M>,
                "kshard::row_squared_norms: a Partial matrix has no values until it is reduced; "
                "redistribute it to Replicate or Shard first");
  const detail::Operation operation("row_squared_norms");
  if (matrix.mesh().size() > 1) {
    detail::Agreement agreement(matrix.mesh().group());
    detail::same_matrix(agreement, matrix, "the matrix");
    agreement.problem(detail::norms_size_problem(matrix)).settle();
  }
  return detail::agreed_row_squared_norms(space, matrix);
}

/// `row_squared_norms(space, matrix)` on a default instance of the matrix's execution space.
template <DistributedMatrix M>
Kokkos::View<double*, typename M::memory_space> row_squared_norms(const M& matrix) {
  return row_squared_norms(typename M::execution_space{}, matrix);
}

}  // namespace kshard
