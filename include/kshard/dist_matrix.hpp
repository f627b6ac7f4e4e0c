#pragma once

/// \file
/// `DistMatrix`: a matrix distributed over a `Mesh` by a `Layout`, holding this rank's shard
/// as a Kokkos view.

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/mpi.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"

namespace kshard {

/// True when `L` is a `kshard::Layout`.
template <class L>
inline constexpr bool is_layout_v = false;
/// `is_layout_v` for every `Layout<Ps...>`: true.
template <class... Ps>
inline constexpr bool is_layout_v<Layout<Ps...>> = true;

namespace detail {
// True when `rows x cols` elements of `T` take at most INT64_MAX bytes (the count is exact).
template <class T>
bool fits_in_bytes(index_t rows, index_t cols) {
  index_t elements = 0;
  index_t bytes = 0;
  return !__builtin_mul_overflow(rows, cols, &elements) &&
         !__builtin_mul_overflow(elements, static_cast<index_t>(sizeof(T)), &bytes);
}

// True, or the compile error saying that layout L does not fit a mesh of rank M. Asserted first
// where a mesh meets a layout, so that this message, not a failed conversion between mesh types,
// is the first error.
template <class L, std::size_t M>
consteval bool layout_fits_mesh() {
  static_assert(L::rank == M,
                "kshard: the layout needs one placement per mesh dimension, but its length "
                "differs from the mesh rank");
  return true;
}
}  // namespace detail

/// The tag that asks a `DistMatrix` constructor to leave the shard unfilled.
struct Unfilled {
  explicit Unfilled() = default;
};
/// Pass to a `DistMatrix` constructor to leave the shard unfilled (`Kokkos::WithoutInitializing`).
inline constexpr Unfilled unfilled{};

/// A `rows x cols` matrix of `T` distributed over a mesh by layout `L`. The local shard is a
/// row-major `Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>`; kernels over it run on
/// `ExecSpace`. Copies share the local view (like Kokkos views) and the mesh.
template <class T, class L, class ExecSpace = Kokkos::DefaultExecutionSpace,
          class MemSpace = typename ExecSpace::memory_space>
class DistMatrix {
  static_assert(is_layout_v<L>,
                "kshard::DistMatrix<T, L, ...>: L must be a kshard::Layout<placements...>");
  static_assert(L::max_tensor_dim < 2,
                "kshard::DistMatrix: a placement shards a tensor dimension >= 2, but a matrix "
                "only has dimensions 0 (rows) and 1 (cols)");
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kshard::DistMatrix: ExecSpace must be a Kokkos execution space");
  static_assert(Kokkos::is_memory_space<MemSpace>::value,
                "kshard::DistMatrix: MemSpace must be a Kokkos memory space");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, MemSpace>::accessible,
                "kshard::DistMatrix: ExecSpace cannot access MemSpace; pick a memory space "
                "the execution space can read");
  static_assert(std::is_trivially_copyable_v<T> && !std::is_const_v<T>,
                "kshard::DistMatrix: T must be a non-const trivially copyable element type");

 public:
  using value_type = T;                              ///< element type
  using layout_type = L;                             ///< the layout type
  using execution_space = ExecSpace;                 ///< where kernels over the shard run
  using memory_space = MemSpace;                     ///< where the local shard lives
  static constexpr std::size_t mesh_rank = L::rank;  ///< number of mesh dimensions
  using mesh_type = Mesh<mesh_rank>;                 ///< the mesh type
  using mapping_type = LayoutMapping<mesh_rank>;     ///< one rank's index maps
  using view_type = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;  ///< the local shard

  /// Allocates a zero-filled local shard. Collective over the mesh: every rank throws the
  /// same `kshard::error` for negative extents, split factors < 1, a shard whose byte count
  /// passes INT64_MAX, an allocation that fails on any rank, or ranks that disagree on the
  /// element type, the global shape or the layout (placement, tensor dimension, split factor
  /// and reduction of every mesh dimension).
  template <std::size_t M>
  DistMatrix(const Mesh<M>& mesh, const L& layout, index_t rows, index_t cols,
             const std::string& label = "kshard::DistMatrix")
      : DistMatrix(mesh, layout, rows, cols, std::nullopt, label) {}

  /// Allocates the local shard without filling it (`kshard::unfilled`): for a caller that
  /// writes every element before reading any (a read from a checkpoint, a redistribution),
  /// which saves a pass over the shard's memory. Collective, with the errors above.
  template <std::size_t M>
  DistMatrix(const Mesh<M>& mesh, const L& layout, index_t rows, index_t cols, Unfilled,
             const std::string& label = "kshard::DistMatrix")
      : DistMatrix(mesh, layout, rows, cols, std::nullopt, label, false) {}

  /// Wraps an existing local view, whose extents must equal this rank's shard. Collective,
  /// with the errors above plus a wrong local shape (named with the expected one).
  template <std::size_t M>
  DistMatrix(const Mesh<M>& mesh, const L& layout, index_t rows, index_t cols, view_type local)
      : DistMatrix(mesh, layout, rows, cols, std::optional<view_type>(std::move(local)), "") {}

  /// The mesh the matrix is distributed over.
  [[nodiscard]] const mesh_type& mesh() const { return mesh_; }
  /// The layout: one placement per mesh dimension.
  [[nodiscard]] const L& layout() const { return layout_; }
  /// Global number of rows.
  [[nodiscard]] index_t rows() const { return mapping_.rows.global_extent(); }
  /// Global number of columns.
  [[nodiscard]] index_t cols() const { return mapping_.cols.global_extent(); }
  /// Global extent of tensor dimension `d`.
  [[nodiscard]] index_t extent(int d) const { return mapping_.axis(d).global_extent(); }
  /// This rank's mapping (device-callable maps; copy it into kernels by value).
  [[nodiscard]] const mapping_type& mapping() const { return mapping_; }
  /// The mapping of the rank at mesh coordinates `coords` (no communication).
  [[nodiscard]] mapping_type mapping_of(const std::array<int, mesh_rank>& coords) const {
    return map_layout(layout_.actions(), mesh_.shape(), coords, rows(), cols());
  }
  /// This rank's shard (for a Partial layout: this rank's addend).
  [[nodiscard]] const view_type& local() const { return local_; }

 private:
  template <std::size_t M>
  DistMatrix(const Mesh<M>& mesh, const L& layout, index_t rows, index_t cols,
             std::optional<view_type> wrapped, const std::string& label, bool fill = true)
      : mesh_(of_layout_rank(mesh)), layout_(layout) {
    const detail::Operation operation("DistMatrix");
    detail::Agreement agreement(mesh.group());
    detail::same_shape_and_layout<T>(agreement, rows, cols, layout_, "the matrix");
    detail::same_mesh(agreement, "the mesh of the matrix", mesh);
    agreement.problem(validate(rows, cols, wrapped)).settle();
    mapping_ = map_layout(layout_.actions(), mesh_.shape(), mesh_.coords(), rows, cols);
    if (wrapped) {
      local_ = std::move(*wrapped);
      return;
    }
    // An allocation that fails on one rank fails on all, instead of leaving the others to
    // wait for it in their next collective.
    std::optional<std::string> failure;
    try {
      const auto rows_here = static_cast<std::size_t>(mapping_.rows.local_extent());
      const auto cols_here = static_cast<std::size_t>(mapping_.cols.local_extent());
      local_ = fill ? view_type(label, rows_here, cols_here)
                    : view_type(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), rows_here,
                                cols_here);
    } catch (const std::exception& e) {
      failure = fmt::format(
          "kshard::DistMatrix: allocating the {} x {} shard on rank {} failed: {}",
          mapping_.rows.local_extent(), mapping_.cols.local_extent(), mesh_.my_rank(), e.what());
    }
    detail::agree(mesh.group(), failure);
  }

  // `mesh`, which must have one dimension per placement: the assert speaks before any
  // conversion between mesh types fails.
  template <std::size_t M>
  static const mesh_type& of_layout_rank(const Mesh<M>& mesh) {
    static_assert(detail::layout_fits_mesh<L, M>());
    return mesh;
  }

  // This rank's own checks, from its own arguments (the agreement compares them across ranks).
  std::optional<std::string> validate(index_t rows, index_t cols,
                                      const std::optional<view_type>& wrapped) const {
    const auto actions = layout_.actions();
    if (rows < 0 || cols < 0)
      return fmt::format("kshard::{}: DistMatrix extents must be >= 0, got {} x {}",
                         detail::operation_name(), rows, cols);
    for (std::size_t m = 0; m < mesh_rank; ++m)
      if (actions[m].split_factor < 1)
        return fmt::format(
            "kshard::{}: StridedShard on mesh dimension {} ('{}') has split factor {}; it must be "
            ">= 1",
            detail::operation_name(), m, mesh_.names()[m], actions[m].split_factor);
    const mapping_type mine = map_layout(actions, mesh_.shape(), mesh_.coords(), rows, cols);
    const index_t local_rows = mine.rows.local_extent();
    const index_t local_cols = mine.cols.local_extent();
    if (!detail::fits_in_bytes<T>(local_rows, local_cols))
      return fmt::format(
          "kshard::{}: the {} x {} shard of the {} x {} DistMatrix on rank {} needs {} x {} "
          "elements "
          "of {} bytes, more than the limit of {} bytes",
          detail::operation_name(), local_rows, local_cols, rows, cols, mesh_.my_rank(), local_rows,
          local_cols, sizeof(T), std::numeric_limits<index_t>::max());
    if (wrapped) {
      const auto got_rows = static_cast<index_t>(wrapped->extent(0));
      const auto got_cols = static_cast<index_t>(wrapped->extent(1));
      if (got_rows != local_rows || got_cols != local_cols)
        return fmt::format(
            "kshard::{}: wrapped local view on rank {} is {} x {}, but the layout gives this rank "
            "a {} x {} shard of the {} x {} matrix",
            detail::operation_name(), mesh_.my_rank(), got_rows, got_cols, local_rows, local_cols,
            rows, cols);
    }
    return std::nullopt;
  }

  mesh_type mesh_;
  L layout_;
  mapping_type mapping_{};
  view_type local_;
};

/// True when `M` is a `kshard::DistMatrix` (cv-qualifiers and references not removed).
template <class M>
inline constexpr bool is_dist_matrix_v = false;
/// `is_dist_matrix_v` for every `DistMatrix<T, L, E, S>`: true.
template <class T, class L, class E, class S>
inline constexpr bool is_dist_matrix_v<DistMatrix<T, L, E, S>> = true;

/// Any `kshard::DistMatrix`.
template <class M>
concept DistributedMatrix = is_dist_matrix_v<std::remove_cvref_t<M>>;

namespace detail {
// An execution-space instance that may run kernels on matrix `M`'s local view.
template <class ExecSpace, class M>
concept ExecutionSpaceFor = Kokkos::is_execution_space<ExecSpace>::value &&
    bool(Kokkos::SpaceAccessibility<ExecSpace,
                                    typename std::remove_cvref_t<M>::memory_space>::accessible);
}  // namespace detail

/// A `DistMatrix` whose values can be read: no mesh dimension holds a pending reduction.
template <class M>
concept ValuedMatrix = DistributedMatrix<M> && !std::remove_cvref_t<M>::layout_type::has_partial;

}  // namespace kshard
