#pragma once

/// \file
/// Moving whole matrices between one host copy per rank and a `DistMatrix`: for tests,
/// examples, debugging and checkpoint I/O, not for hot loops.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kshard/detail/agreement.hpp"
#include "kshard/detail/mpi.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/layout_mapping.hpp"

namespace kshard {

/// A whole matrix in host memory, row-major.
template <class T>
using HostMatrix = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace>;

namespace detail {

// Calls `copy(local_row, global_row, local_col, global_col, length)` for every stretch of a
// shard row that is contiguous in the global matrix too.
template <std::size_t N, class Copy>
void for_each_shard_segment(const LayoutMapping<N>& mapping, Copy&& copy) {
  const std::vector<IndexRun> col_runs = mapping.cols.runs();
  for (const IndexRun& rows : mapping.rows.runs())
    for (index_t r = 0; r < rows.size; ++r)
      for (const IndexRun& cols : col_runs)
        copy(rows.local_begin + r, rows.global_begin + r, cols.local_begin, cols.global_begin,
             cols.size);
}

}  // namespace detail

/// Builds a `DistMatrix` from `full`, the whole matrix, present on every rank: each rank
/// copies out its own shard, with no communication beyond the constructor's checks. For a
/// `Partial` mesh dimension the value becomes a valid addend set: with `sum`, coordinate 0
/// holds the value and the others zeros; with `max`, `min` and `avg` every rank holds it.
template <class ExecSpace = Kokkos::DefaultExecutionSpace,
          class MemSpace = typename ExecSpace::memory_space, class T, std::size_t M, class L>
DistMatrix<T, L, ExecSpace, MemSpace> distribute(const Mesh<M>& mesh, const L& layout,
                                                 const HostMatrix<const T>& full,
                                                 const std::string& label = "kshard::distribute") {
  const detail::Operation operation("distribute");
  DistMatrix<T, L, ExecSpace, MemSpace> matrix(mesh, layout, static_cast<index_t>(full.extent(0)),
                                               static_cast<index_t>(full.extent(1)), label);
  bool holds_value = true;  // false on the addends that must be zero for a Partial sum
  for (std::size_t m = 0; m < M; ++m)
    if (L::kinds[m] == PlacementKind::partial && L::partial_op(m) == ReduceOp::sum &&
        mesh.coords()[m] != 0)
      holds_value = false;
  auto host = Kokkos::create_mirror_view(matrix.local());
  detail::for_each_shard_segment(matrix.mapping(),
                                 [&](index_t lr, index_t gr, index_t lc, index_t gc, index_t n) {
                                   for (index_t j = 0; j < n; ++j)
                                     host(lr, lc + j) = holds_value ? full(gr, gc + j) : T{};
                                 });
  Kokkos::deep_copy(matrix.local(), host);
  return matrix;
}

/// Every rank receives the whole matrix (one all-gather over the mesh). Only one replica of
/// each block is sent. Rejects Partial layouts at compile time: their values are pending a
/// reduction. Collective: the ranks first agree that they pass the same matrix (element type,
/// shape, layout); that, and a whole matrix whose byte count passes INT64_MAX or a message
/// longer than INT_MAX elements, is the same `kshard::error` on every rank.
template <class T, class L, class E, class S>
HostMatrix<T> gather(const DistMatrix<T, L, E, S>& matrix) {
  static_assert(!L::has_partial,
                "kshard::gather: a Partial matrix has no values until it is reduced; "
                "redistribute it to Replicate or Shard first");
  const detail::Operation operation("gather");
  const auto& mesh = matrix.mesh();
  detail::Agreement agreement(mesh.comm());
  detail::same_matrix(agreement, matrix, "the matrix");
  if (!detail::fits_in_bytes<T>(matrix.rows(), matrix.cols()))
    agreement.problem(fmt::format(
        "kshard::gather: the whole {} x {} matrix of {}-byte elements needs more than the limit "
        "of {} bytes on every rank",
        matrix.rows(), matrix.cols(), sizeof(T), std::numeric_limits<index_t>::max()));
  agreement.settle();
  const int size = mesh.size();
  std::vector<int> counts(size);
  std::vector<int> displs(size);
  index_t total = 0;
  for (int r = 0; r < size; ++r) {
    const auto coords = mesh.coords_of(r);
    const bool sends = L::is_first_copy(coords, {0, 1});  // each block once
    const index_t n = sends ? matrix.mapping_of(coords).local_size() : 0;
    displs[r] = detail::mpi_count(total, "kshard::gather");
    counts[r] = detail::mpi_count(n, "kshard::gather");
    total += n;
  }
  (void)detail::mpi_count(total, "kshard::gather");

  // Contiguous host copy of the local shard (fences the device, copies if not host memory).
  auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
  std::vector<T> received(static_cast<std::size_t>(total));
  detail::allgatherv(local.data(), counts[mesh.my_rank()], received.data(), counts.data(),
                     displs.data(), mesh.comm());

  HostMatrix<T> full("kshard::gather", static_cast<std::size_t>(matrix.rows()),
                     static_cast<std::size_t>(matrix.cols()));
  for (int r = 0; r < size; ++r) {
    if (counts[r] == 0) continue;
    const auto mapping = matrix.mapping_of(mesh.coords_of(r));
    const T* block = received.data() + displs[r];
    const index_t width = mapping.cols.local_extent();
    detail::for_each_shard_segment(mapping, [&](index_t lr, index_t gr, index_t lc, index_t gc,
                                                index_t n) {
      std::memcpy(&full(gr, gc), block + lr * width + lc, static_cast<std::size_t>(n) * sizeof(T));
    });
  }
  return full;
}

}  // namespace kshard
