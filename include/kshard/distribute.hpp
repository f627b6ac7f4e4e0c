#pragma once

/// \file
/// Moving whole matrices between one host copy per rank and a `DistMatrix`: for tests,
/// examples, debugging and checkpoint I/O, not for hot loops.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/kernels/copies.hpp"
#include "kshard/kernels/host_copy.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/matrix_agreement.hpp"

namespace kshard {

/// A whole matrix in host memory, row-major.
template <class T>
using HostMatrix = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace>;

/// The one rank that holds the whole matrix in `distribute(..., Root)` and `gather(..., Root)`
/// (DTensor's `src_data_rank`): `kshard::Root{0}`. Every rank must pass the same one.
struct Root {
  int rank = 0;  ///< a rank of the mesh's communicator (`Mesh::my_rank()` numbering)
};

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

// False on the addends that must be zero for a Partial sum (coordinate != 0 along a sum).
template <class L>
bool holds_value(const std::array<int, L::rank>& coords) {
  for (std::size_t m = 0; m < L::rank; ++m)
    if (L::kinds[m] == PlacementKind::partial && L::partial_op(m) == ReduceOp::sum &&
        coords[m] != 0)
      return false;
  return true;
}

// One MPI message holding the whole shards of some ranks, in rank order: rank r's block has
// `counts[r]` elements (row-major, like its local view) at offset `displs[r]`.
struct Packing {
  std::vector<int> counts;
  std::vector<int> displs;
  int total = 0;
};

// The packing of the shards of the ranks whose coordinates `takes`. Every rank computes all of
// it from agreed values, so a message past INT_MAX elements is the same error on every rank.
template <class Matrix, class Takes>
Packing pack_shards(const Matrix& matrix, Takes&& takes) {
  const auto& mesh = matrix.mesh();
  Packing packing{std::vector<int>(mesh.size()), std::vector<int>(mesh.size()), 0};
  index_t total = 0;
  for (int r = 0; r < mesh.size(); ++r) {
    const auto coords = mesh.coords_of(r);
    const index_t n = takes(coords) ? matrix.mapping_of(coords).local_size() : 0;
    packing.displs[r] = mpi_count(total);
    packing.counts[r] = mpi_count(n);
    total += n;
  }
  packing.total = mpi_count(total);
  return packing;
}

// The first copy of each block, so that a gather moves every element once.
template <class Matrix>
Packing first_copies(const Matrix& matrix) {
  using L = typename Matrix::layout_type;
  const auto first = [](const auto& coords) { return L::is_first_copy(coords, {0, 1}); };
  return pack_shards(matrix, first);
}

// Calls `copy(global_row, global_col, offset, length)` for every stretch of the packed blocks
// that is contiguous in the global matrix (`offset`: into the message).
template <class Matrix, class Copy>
void for_each_packed_segment(const Matrix& matrix, const Packing& packing, Copy&& copy) {
  const auto& mesh = matrix.mesh();
  for (int r = 0; r < mesh.size(); ++r) {
    if (packing.counts[r] == 0) continue;
    const auto mapping = matrix.mapping_of(mesh.coords_of(r));
    const index_t width = mapping.cols.local_extent();
    for_each_shard_segment(mapping, [&](index_t lr, index_t gr, index_t lc, index_t gc, index_t n) {
      copy(gr, gc, packing.displs[r] + lr * width + lc, n);
    });
  }
}

// The whole matrix from the packed blocks of a gather.
template <class Matrix, class T>
HostMatrix<T> unpack(const Matrix& matrix, const Packing& packing, const T* received) {
  HostMatrix<T> full("kshard::gather", static_cast<std::size_t>(matrix.rows()),
                     static_cast<std::size_t>(matrix.cols()));
  for_each_packed_segment(matrix, packing, [&](index_t gr, index_t gc, index_t offset, index_t n) {
    std::memcpy(&full(gr, gc), received + offset, static_cast<std::size_t>(n) * sizeof(T));
  });
  return full;
}

// The digest of the values of `full`, row by row (a padded view's padding is not read).
template <class T>
std::int64_t values_digest(const HostMatrix<T>& full) {
  ValuesDigest digest;
  const std::size_t row_bytes = full.extent(1) * sizeof(T);
  for (std::size_t r = 0; r < full.extent(0) && row_bytes > 0; ++r)
    digest.add_row(reinterpret_cast<const unsigned char*>(&full(r, 0)), row_bytes);
  return digest.value();
}

// Whether `full` holds other values on some rank of `mesh` (one agreement).
template <std::size_t M, class T>
bool values_differ(const Mesh<M>& mesh, const HostMatrix<T>& full) {
  if (mesh.size() == 1) return false;  // no other copy: nothing to read or compare
  Agreement agreement(mesh.group());
  agreement.same("the values of the whole matrix", values_digest(full),
                 [](std::int64_t) { return std::string(); });
  return agreement.outcome().has_value();
}

// Fills `matrix` from `full` on this rank alone: each rank copies out its own shard.
template <class ExecSpace, class Matrix, class FT>
void copy_own_shard(const ExecSpace& space, const Matrix& matrix, const HostMatrix<FT>& full) {
  using T = typename Matrix::value_type;
  using L = typename Matrix::layout_type;
  const bool holds = holds_value<L>(matrix.mesh().coords());
  const auto host = host_mirror(matrix.local());
  for_each_shard_segment(matrix.mapping(),
                         [&](index_t lr, index_t gr, index_t lc, index_t gc, index_t n) {
                           for (index_t j = 0; j < n; ++j)
                             host(lr, lc + j) = holds ? full(gr, gc + j) : T{};
                         });
  Kokkos::deep_copy(space, matrix.local(), host);
  fence(space, "kshard::distribute: the shard is copied (its host source is freed)");
}

// Fills `matrix` from `full` as rank `root` holds it: one scatterv in which the root sends each
// rank its own shard (packed in one host buffer first); the other ranks' `full` is not read.
template <class ExecSpace, class Matrix, class FT>
void scatter_from(const ExecSpace& space, const Matrix& matrix, const HostMatrix<FT>& full,
                  Root root) {
  using T = typename Matrix::value_type;
  using L = typename Matrix::layout_type;
  const auto& mesh = matrix.mesh();
  const Packing packing =
      pack_shards(matrix, [](const auto& coords) { return holds_value<L>(coords); });
  const bool is_root = mesh.my_rank() == root.rank;
  std::vector<T> packed(is_root ? static_cast<std::size_t>(packing.total) : 0);
  if (is_root)
    for_each_packed_segment(matrix, packing,
                            [&](index_t gr, index_t gc, index_t offset, index_t n) {
                              std::memcpy(packed.data() + offset, &full(gr, gc),
                                          static_cast<std::size_t>(n) * sizeof(T));
                            });
  // Received in host memory (the shard itself when it is there), then copied to the shard.
  const auto host = host_mirror(matrix.local());
  const int count = packing.counts[mesh.my_rank()];
  mesh.group().scatterv(packed.data(), packing.counts.data(), packing.displs.data(), host.data(),
                        count, root.rank);
  if (count > 0) {  // a zero addend keeps its zeros
    Kokkos::deep_copy(space, matrix.local(), host);
    fence(space, "kshard::distribute: the shard is copied (its host source is freed)");
  }
}

// Every rank passes the same root, and it is a rank of the mesh: checked before any collective
// uses it, since MPI would hang or fail on one rank only.
inline void same_root(Agreement& agreement, Root root, int size) {
  agreement.same("the root rank", root.rank);
  if (root.rank < 0 || root.rank >= size)
    agreement.problem(fmt::format(
        "kshard::{}: the root rank {} is not a rank of the mesh, whose ranks are 0 to {}",
        operation_name(), root.rank, size - 1));
}

// What a gather checks: the same matrix on every rank, and a whole matrix whose bytes `where`
// (the ranks that receive it) can count.
template <class Matrix>
void gather_checks(Agreement& agreement, const Matrix& matrix, std::string_view where) {
  same_matrix(agreement, matrix, "the matrix");
  if (!fits_in_bytes<typename Matrix::value_type>(matrix.rows(), matrix.cols()))
    agreement.problem(fmt::format(
        "kshard::gather: the whole {} x {} matrix of {}-byte elements needs more than the limit "
        "of {} bytes on {}",
        matrix.rows(), matrix.cols(), sizeof(typename Matrix::value_type),
        std::numeric_limits<index_t>::max(), where));
}

}  // namespace detail

/// Builds a `DistMatrix` from `full`, the whole matrix (a `HostMatrix<T>` or
/// `HostMatrix<const T>`), present on every rank with the same shape (else the same
/// `kshard::error` on every rank). Where every rank holds the same values, each rank copies out
/// its own shard; where they differ (a rank-dependent seed, say), the matrix is rank 0's, as
/// DTensor's `distribute_tensor` (whose `src_data_rank` is 0) makes it: rank 0 scatters the
/// shards, as `distribute(..., Root{0})` does, instead of replicas that silently disagree.
/// For a `Partial` mesh dimension the value becomes a valid addend set: with `sum`, coordinate
/// 0 holds the value and the others zeros; with `max`, `min` and `avg` every rank holds it.
/// Cost: the constructor's agreement, a digest of `full` on every rank (one read of it, at 0.8x
/// the speed of a plain read) compared in one more agreement (neither on a mesh of one rank),
/// then the copy to the shard on `space` (fenced before returning); the scatter only where the
/// values differ.
template <class ExecSpace, class MemSpace = typename ExecSpace::memory_space, class FT,
          std::size_t M, class L>
requires Kokkos::is_execution_space<ExecSpace>::value
    DistMatrix<std::remove_const_t<FT>, L, ExecSpace, MemSpace>
    distribute(const ExecSpace& space, const Mesh<M>& mesh, const L& layout,
               const HostMatrix<FT>& full, const std::string& label = "kshard::distribute") {
  static_assert(detail::layout_fits_mesh<L, M>());
  using T = std::remove_const_t<FT>;
  const detail::Operation operation("distribute");
  DistMatrix<T, L, ExecSpace, MemSpace> matrix(mesh, layout, static_cast<index_t>(full.extent(0)),
                                               static_cast<index_t>(full.extent(1)), label);
  if (detail::values_differ(mesh, full))
    detail::scatter_from(space, matrix, full, Root{0});
  else
    detail::copy_own_shard(space, matrix, full);
  return matrix;
}

/// `distribute(space, mesh, layout, full)` on a default instance of `ExecSpace`.
template <class ExecSpace = Kokkos::DefaultExecutionSpace,
          class MemSpace = typename ExecSpace::memory_space, class FT, std::size_t M, class L>
DistMatrix<std::remove_const_t<FT>, L, ExecSpace, MemSpace> distribute(
    const Mesh<M>& mesh, const L& layout, const HostMatrix<FT>& full,
    const std::string& label = "kshard::distribute") {
  return distribute<ExecSpace, MemSpace>(ExecSpace{}, mesh, layout, full, label);
}

/// Builds a `DistMatrix` from `full`, the whole matrix, held by rank `root` only (a scatter,
/// like DTensor's `distribute_tensor(..., src_data_rank=root)`); the other ranks' `full` is
/// ignored: pass an empty `HostMatrix<T>()`. Same result as `distribute` above, Partial
/// layouts included. Cost: a broadcast of the shape (16 bytes from the root), then one
/// scatterv in which the root sends each rank its own shard (replicas receive their copy, the
/// zero addends of a Partial sum nothing): the sum of those shards' bytes, packed in one host
/// buffer on the root first. Collective: a root outside the mesh or different between ranks,
/// ranks that disagree on the element type or layout, and a message longer than INT_MAX
/// elements are the same `kshard::error` on every rank; the root's shape reaches every rank
/// before any rank checks it.
template <class ExecSpace, class MemSpace = typename ExecSpace::memory_space, class FT,
          std::size_t M, class L>
requires Kokkos::is_execution_space<ExecSpace>::value
    DistMatrix<std::remove_const_t<FT>, L, ExecSpace, MemSpace>
    distribute(const ExecSpace& space, const Mesh<M>& mesh, const L& layout,
               const HostMatrix<FT>& full, Root root,
               const std::string& label = "kshard::distribute") {
  static_assert(detail::layout_fits_mesh<L, M>());
  using T = std::remove_const_t<FT>;
  const detail::Operation operation("distribute");
  detail::Agreement agreement(mesh.group());
  detail::same_root(agreement, root, mesh.size());
  agreement.settle();
  std::array<index_t, 2> shape{static_cast<index_t>(full.extent(0)),
                               static_cast<index_t>(full.extent(1))};
  mesh.group().bcast(shape.data(), 2, root.rank);
  DistMatrix<T, L, ExecSpace, MemSpace> matrix(mesh, layout, shape[0], shape[1], label);
  detail::scatter_from(space, matrix, full, root);
  return matrix;
}

/// `distribute(space, mesh, layout, full, root)` on a default instance of `ExecSpace`.
template <class ExecSpace = Kokkos::DefaultExecutionSpace,
          class MemSpace = typename ExecSpace::memory_space, class FT, std::size_t M, class L>
DistMatrix<std::remove_const_t<FT>, L, ExecSpace, MemSpace> distribute(
    const Mesh<M>& mesh, const L& layout, const HostMatrix<FT>& full, Root root,
    const std::string& label = "kshard::distribute") {
  return distribute<ExecSpace, MemSpace>(ExecSpace{}, mesh, layout, full, root, label);
}

/// Every rank receives the whole matrix (one all-gather over the mesh). Only one replica of
/// each block is sent. Rejects Partial layouts at compile time: their values are pending a
/// reduction. Collective: the ranks first agree that they pass the same matrix (element type,
/// shape, layout); that, and a whole matrix whose byte count passes INT64_MAX or a message
/// longer than INT_MAX elements, is the same `kshard::error` on every rank.
template <class ExecSpace, class T, class L, class E, class S>
requires Kokkos::is_execution_space<ExecSpace>::value HostMatrix<T> gather(
    const ExecSpace& space, const DistMatrix<T, L, E, S>& matrix) {
  static_assert(!L::has_partial,
                "kshard::gather: a Partial matrix has no values until it is reduced; "
                "redistribute it to Replicate or Shard first");
  const detail::Operation operation("gather");
  const auto& mesh = matrix.mesh();
  detail::Agreement agreement(mesh.group());
  detail::gather_checks(agreement, matrix, "every rank");
  agreement.settle();
  const detail::Packing packing = detail::first_copies(matrix);

  const auto local = detail::to_host(space, matrix.local(), "kshard::gather: the shard, for MPI");
  std::vector<T> received(static_cast<std::size_t>(packing.total));
  mesh.group().allgatherv(local.data(), packing.counts[mesh.my_rank()], received.data(),
                          packing.counts.data(), packing.displs.data());
  return detail::unpack(matrix, packing, received.data());
}

/// `gather(space, matrix)` on a default instance of the matrix's execution space.
template <class T, class L, class E, class S>
HostMatrix<T> gather(const DistMatrix<T, L, E, S>& matrix) {
  return gather(E{}, matrix);
}

/// Rank `root` receives the whole matrix (a gather, the inverse of `distribute(..., Root)`);
/// the other ranks get an empty (0 x 0) `HostMatrix`. Cost: one gatherv in which the first
/// copy of each block goes to the root once: the whole matrix's bytes in all, less the root's
/// own block. Rejects Partial layouts at compile time. Collective: a root outside the mesh or
/// different between ranks, ranks that pass different matrices (element type, shape, layout),
/// a whole matrix whose byte count passes INT64_MAX and a message longer than INT_MAX elements
/// are the same `kshard::error` on every rank.
template <class ExecSpace, class T, class L, class E, class S>
requires Kokkos::is_execution_space<ExecSpace>::value HostMatrix<T> gather(
    const ExecSpace& space, const DistMatrix<T, L, E, S>& matrix, Root root) {
  static_assert(!L::has_partial,
                "kshard::gather: a Partial matrix has no values until it is reduced; "
                "redistribute it to Replicate or Shard first");
  const detail::Operation operation("gather");
  const auto& mesh = matrix.mesh();
  detail::Agreement agreement(mesh.group());
  detail::same_root(agreement, root, mesh.size());
  detail::gather_checks(agreement, matrix, fmt::format("the root rank {}", root.rank));
  agreement.settle();
  const detail::Packing packing = detail::first_copies(matrix);

  const bool is_root = mesh.my_rank() == root.rank;
  const auto local = detail::to_host(space, matrix.local(), "kshard::gather: the shard, for MPI");
  std::vector<T> received(is_root ? static_cast<std::size_t>(packing.total) : 0);
  mesh.group().gatherv(local.data(), packing.counts[mesh.my_rank()], received.data(),
                       packing.counts.data(), packing.displs.data(), root.rank);
  if (!is_root) return HostMatrix<T>();
  return detail::unpack(matrix, packing, received.data());
}

/// `gather(space, matrix, root)` on a default instance of the matrix's execution space.
template <class T, class L, class E, class S>
HostMatrix<T> gather(const DistMatrix<T, L, E, S>& matrix, Root root) {
  return gather(E{}, matrix, root);
}

}  // namespace kshard
