#pragma once

/// \file
/// Entering and leaving the tensor-parallel region (Megatron's
/// `reduce_from_tensor_model_parallel_region` and `copy_to_tensor_model_parallel_region`), forward
/// and backward, over one mesh dimension, the "tp" dimension. Part of kshard/tensor_parallel.hpp,
/// whose conventions apply.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/format.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/mesh.hpp"
#include "kshard/tensor_parallel/checks.hpp"
#include "kshard/tensor_parallel/tp_dim.hpp"

namespace kshard {

namespace detail {

// In-place SUM over `comm` of a rank-1 or rank-2 view, after `space` finished writing it; a
// non-contiguous view goes through a contiguous copy made on `space`.
template <class ExecSpace, class View>
void allreduce_sum_any(const ExecSpace& space, const View& values, const comm::Group& group) {
  if (values.span_is_contiguous()) {
    group.allreduce(space, values, ReduceOp::sum);
    return;
  }
  using Copy = Kokkos::View<typename View::non_const_data_type, Kokkos::LayoutRight,
                            typename View::memory_space>;
  Copy copy;
  if constexpr (static_cast<int>(View::rank) == 1)
    copy = Copy(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::reduce_copy"),
                values.extent(0));
  else
    copy = Copy(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::reduce_copy"),
                values.extent(0), values.extent(1));
  Kokkos::deep_copy(space, copy, values);
  group.allreduce(space, copy, ReduceOp::sum);  // fences `space` first: the copy is complete
  Kokkos::deep_copy(space, values, copy);
  // `copy` is freed on return, and the caller's next step may be on another instance or MPI.
  fence(space, "kshard::reduce_from_tp: the sum is in the caller's view");
}

// In-place SUM of `values` over mesh dimension `tp_dim`, after `space` wrote them (none when that
// dimension has extent 1): the reduction of the lookup, the linear layers and reduce_from_tp.
template <class ExecSpace, std::size_t N, class View>
void sum_over_tp(const ExecSpace& space, const Mesh<N>& mesh, TpDim tp_dim, const View& values) {
  if (mesh.extent(tp_dim.index()) > 1)
    allreduce_sum_any(space, values, mesh.dim_group(tp_dim.index()));
}

}  // namespace detail

/// Forward of "reduce from the tensor-parallel region" (Megatron's
/// `reduce_from_tensor_model_parallel_region`): replaces `values` (a rank-1 or rank-2 view of
/// float, double, int32 or int64) in place by their SUM over the ranks along mesh dimension
/// `tp_dim` (`kshard::TpDim{m}`; a mesh has no layout to infer it from), once the work `space`
/// submitted is done (it is fenced before the all-reduce, which it waits for). Collective over
/// `mesh`: `tp_dim` and the mesh (its shape and names), which choose the group, are agreed over the
/// whole mesh first; then the element type, rank and extents of `values`, which must be the same
/// within a tp group (ranks of different tp groups may reduce different extents): in the same
/// agreement where the tp group is the whole mesh, else within the group and once more over the
/// mesh (3 fixed-size agreements), then the all-reduce over `mesh.dim_comm(tp_dim)` (none when that
/// dimension has extent 1). A `tp_dim` outside the mesh or values that differ within a tp group
/// throw the same `kshard::error` on every rank, with `values` unchanged, instead of truncating or
/// hanging in the all-reduce. In a pipeline-parallel program, pass the mesh of the calling stage
/// (its dp x tp ranks), as for every other collective: a mesh that holds other stages would make
/// the call wait for them.
template <class ExecSpace, std::size_t N, class View>
requires detail::ExecutionSpaceFor<ExecSpace, View>
void reduce_from_tp(const ExecSpace& space, const Mesh<N>& mesh, TpDim tp_dim, const View& values) {
  static_assert(detail::is_view_of_rank<View>(1) || detail::is_view_of_rank<View>(2),
                "kshard::reduce_from_tp: values must be a rank-1 or rank-2 Kokkos::View");
  using T = typename View::non_const_value_type;
  static_assert(
      detail::tp_float_v<T> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>,
      "kshard::reduce_from_tp: values must be float, double, int32 or int64");
  const detail::Operation operation("reduce_from_tp");
  std::optional<std::string> problem;
  if (tp_dim.index() >= N)
    problem =
        fmt::format("kshard::reduce_from_tp: tp_dim is {}, but the mesh {} has {} dimension(s)",
                    tp_dim.index(), mesh, N);
  detail::agree_in_groups(
      mesh, tp_dim.index(), problem,
      [&](detail::Agreement& agreement) {
        agreement.same("tp_dim", static_cast<std::int64_t>(tp_dim.index()));
        detail::same_mesh(agreement, "the mesh", mesh);
      },
      [&](detail::Agreement& agreement) {
        agreement.same("the element type of values", detail::type_code<T>(), detail::render_type)
            .same("the rank of values", static_cast<std::int64_t>(View::rank));
        for (std::size_t d = 0; d < static_cast<std::size_t>(View::rank); ++d)
          agreement.same(fmt::format("extent {} of values", d),
                         static_cast<index_t>(values.extent(d)));
      });
  detail::sum_over_tp(space, mesh, tp_dim, values);
}

/// `reduce_from_tp(space, mesh, tp_dim, values)` on a default instance of `ExecSpace` (by
/// default the view's execution space).
template <class ExecSpace = void, std::size_t N, class View>
void reduce_from_tp(const Mesh<N>& mesh, TpDim tp_dim, const View& values) {
  using Exec =
      std::conditional_t<std::is_void_v<ExecSpace>, typename View::execution_space, ExecSpace>;
  reduce_from_tp(Exec{}, mesh, tp_dim, values);
}

/// Backward of `reduce_from_tp`: the identity (the replicated gradient goes to every tp rank's
/// local contribution unchanged). No communication, no work.
template <class View>
[[nodiscard]] View reduce_from_tp_backward(const View& grad) {
  return grad;
}

/// `reduce_from_tp_backward(grad)`, in the form of the instance overloads: nothing runs on
/// `space`.
template <class ExecSpace, class View>
requires detail::ExecutionSpaceFor<ExecSpace, View>
[[nodiscard]] View reduce_from_tp_backward(const ExecSpace& /*space*/, const View& grad) {
  return grad;
}

/// Forward of "copy to the tensor-parallel region" (Megatron's
/// `copy_to_tensor_model_parallel_region`), the conjugate of `reduce_from_tp`: the identity.
template <class View>
[[nodiscard]] View copy_to_tp(const View& values) {
  return values;
}

/// `copy_to_tp(values)`, in the form of the instance overloads: nothing runs on `space`.
template <class ExecSpace, class View>
requires detail::ExecutionSpaceFor<ExecSpace, View>
[[nodiscard]] View copy_to_tp(const ExecSpace& /*space*/, const View& values) { return values; }

/// Backward of `copy_to_tp`: SUM of the tp ranks' gradients, in place, as `reduce_from_tp`
/// (on `space`).
template <class ExecSpace, std::size_t N, class View>
requires detail::ExecutionSpaceFor<ExecSpace, View>
void copy_to_tp_backward(const ExecSpace& space, const Mesh<N>& mesh, TpDim tp_dim,
                         const View& grad) {
  reduce_from_tp(space, mesh, tp_dim, grad);
}

/// `copy_to_tp_backward(space, mesh, tp_dim, grad)` on a default instance of `ExecSpace` (by
/// default the view's execution space).
template <class ExecSpace = void, std::size_t N, class View>
void copy_to_tp_backward(const Mesh<N>& mesh, TpDim tp_dim, const View& grad) {
  reduce_from_tp<ExecSpace>(mesh, tp_dim, grad);
}

}  // namespace kshard
