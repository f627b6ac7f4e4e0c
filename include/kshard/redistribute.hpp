#pragma once

/// \file
/// `redistribute`: a matrix in another layout on the same mesh (all-gather, all-reduce,
/// reduce-scatter, all-to-all, local slicing, one mesh dimension at a time), or on another
/// mesh over the same communicator (checkpoint resharding). Every element that moves is
/// planned exactly from the index maps of both layouts, so uneven, empty and strided shards
/// send what the receivers need and nothing else.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "kshard/detail/element.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/format.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"
#include "kshard/redistribute/checks.hpp"
#include "kshard/redistribute/compiled_move.hpp"

namespace kshard {

namespace detail {

// The compile-time checks both overloads share: a matrix of T in layout L may move to layout
// LT on a mesh of rank NT.
template <class T, class L, class LT, std::size_t NT>
constexpr void check_redistribute_types() {
  static_assert(is_layout_v<LT>, "kshard::redistribute: the target must be a kshard::Layout");
  static_assert(LT::rank == NT,
                "kshard::redistribute: the target layout needs one placement per dimension of "
                "the target mesh, but its length differs from the mesh rank");
  static_assert(LT::max_tensor_dim < 2,
                "kshard::redistribute: the target layout shards a tensor dimension >= 2, but a "
                "matrix only has dimensions 0 (rows) and 1 (cols)");
  static_assert(!L::has_partial || detail::reducible_element<T>(),
                "kshard::redistribute: resolving a Partial layout needs an element type MPI "
                "can reduce (float, double, int32_t, int64_t)");
}

// Only the plan functions construct plans.
struct PlanKey {
  explicit PlanKey() = default;
};

}  // namespace detail

/// A redistribution planned once and applied any number of times (heFFTe's reshape plans,
/// Cabana's Distributor): made by `plan_redistribute` (collective: it agrees on its arguments
/// the way `redistribute` does, and a plan with an all-to-all agrees once more, in one
/// fixed-size all-reduce, that no rank's send or receive totals pass INT_MAX: each rank knows
/// only its own once the plan is built), it holds the steps, the pack and unpack index lists
/// (already in `MemSpace`), the counts of every collective and the message buffers, so that `apply`
/// only packs, communicates and unpacks: one pack and one unpack kernel per step.
///
/// `apply(space, matrix, target)` moves `matrix` (the plan's source mesh, shape and layout) into
/// `target` (the plan's target mesh, shape and layout): exactly what `redistribute_into` would
/// write, with the same messages and `comm_stats()` counts. Collective over the mesh, like the
/// collectives it runs. Every kernel and copy runs on `space`, and MPI sees a buffer only after
/// `space` is fenced; the caller makes sure `matrix` is ready for `space` (written on it, or
/// fenced) and fences `space` before reading `target` elsewhere. A plan's buffers are shared by
/// its applies: do not run two at once, and fence the instance of one apply before the next
/// runs on another instance.
///
/// Checks (local, no communication, a few integer comparisons per call): the matrix and target
/// are on the plan's meshes (the same `Mesh` object, a copy of it or one built alike, not
/// another mesh over the same ranks), of the plan's global shape and layouts (split factors
/// included), contiguous,
/// and do not share memory; otherwise `apply` throws a `kshard::error` naming what differs,
/// with nothing changed. Shapes and layouts of a `DistMatrix` are agreed when it is made, so
/// when every rank passes the same matrices the outcome is the same on every rank; passing
/// different matrices on different ranks is a documented precondition, unchecked (agreeing on
/// it would add an all-reduce to every call, as much as the whole move of a small matrix costs):
/// the ranks that pass the check would wait in the move, which the collective watchdog
/// (`KSHARD_COLLECTIVE_TIMEOUT`) reports.
template <class T, class L, class LT, class ExecSpace, class MemSpace>
class RedistributePlan {
 public:
  static constexpr std::size_t source_rank = L::rank;          ///< rank of the source mesh
  static constexpr std::size_t target_rank = LT::rank;         ///< rank of the target mesh
  using source_type = DistMatrix<T, L, ExecSpace, MemSpace>;   ///< the matrices it moves
  using target_type = DistMatrix<T, LT, ExecSpace, MemSpace>;  ///< the matrices it fills

  /// Use `plan_redistribute`. The index lists are copied to `MemSpace` on `space`.
  template <class Space>
  RedistributePlan(detail::PlanKey, const Space& space, const source_type& matrix,
                   const Mesh<target_rank>& target_mesh, const LT& target_layout, bool same_mesh)
      : mesh_(matrix.mesh()),
        target_mesh_(target_mesh),
        layout_(matrix.layout()),
        target_layout_(target_layout),
        rows_(matrix.rows()),
        cols_(matrix.cols()),
        move_(space, mesh_, target_mesh_, layout_.actions(), detail::partial_ops<L>(),
              target_layout_.actions(), detail::partial_ops<LT>(), rows_, cols_, same_mesh) {}

  /// Moves `matrix` into `target` on `space` (see the class comment). Throws a `kshard::error`,
  /// changing nothing, when either is not what the plan was made for.
  template <class Space>
  requires Kokkos::is_execution_space<Space>::value void apply(const Space& space,
                                                               const source_type& matrix,
                                                               const target_type& target) {
    static_assert(Kokkos::SpaceAccessibility<Space, MemSpace>::accessible,
                  "kshard::RedistributePlan::apply: the execution space cannot access the "
                  "matrices' memory space");
    const detail::Operation operation("RedistributePlan::apply");
    if (auto problem = mismatch(matrix, target)) throw error(*problem);
    using Shard = detail::ShardView<T, MemSpace>;  // run takes references: no view copies
    static_assert(std::is_same_v<typename target_type::view_type, Shard> &&
                  std::is_same_v<typename source_type::view_type, Shard>);
    move_.run(space, matrix.local(), target.local());
  }

  /// `apply` on the matrices' default execution-space instance.
  void apply(const source_type& matrix, const target_type& target) {
    apply(ExecSpace(), matrix, target);
  }

  /// A new target matrix for this plan, allocated without a fill (every element is written by
  /// `apply`). Collective over the target mesh.
  [[nodiscard]] target_type make_target() const {
    return target_type(target_mesh_, target_layout_, rows_, cols_, unfilled,
                       "kshard::redistribute");
  }

  /// The mesh of the matrices the plan moves.
  [[nodiscard]] const Mesh<source_rank>& source_mesh() const { return mesh_; }
  /// The mesh of the matrices it fills.
  [[nodiscard]] const Mesh<target_rank>& target_mesh() const { return target_mesh_; }
  /// The layout of the matrices it moves.
  [[nodiscard]] const L& source_layout() const { return layout_; }
  /// The layout of the matrices it fills.
  [[nodiscard]] const LT& target_layout() const { return target_layout_; }
  /// Global number of rows.
  [[nodiscard]] index_t rows() const { return rows_; }
  /// Global number of columns.
  [[nodiscard]] index_t cols() const { return cols_; }
  /// Number of steps (collectives or local copies) one `apply` runs.
  [[nodiscard]] std::size_t steps() const { return move_.steps(); }

 private:
  std::optional<std::string> mismatch(const source_type& matrix, const target_type& target) const {
    constexpr const char* who = "kshard::RedistributePlan::apply";
    const auto check = [&](const auto& m, const auto& mesh, const auto& layout,
                           const char* role) -> std::optional<std::string> {
      if (!(m.mesh() == mesh))
        return fmt::format(
            "{}: the {} is on another mesh than the plan's (the same Mesh object, a copy of "
            "it or one built alike is needed, not another mesh over the same ranks)",
            who, role);
      if (m.rows() != rows_ || m.cols() != cols_)
        return fmt::format("{}: the {} is {} x {} but the plan was made for {} x {}", who, role,
                           m.rows(), m.cols(), rows_, cols_);
      if (!(m.layout() == layout))
        return fmt::format("{}: the {}'s layout is {} but the plan was made for {}", who, role,
                           m.layout(), layout);
      if (!m.local().span_is_contiguous())
        return fmt::format("{}: on rank {} the {}'s shard is not contiguous", who, mesh_.my_rank(),
                           role);
      return std::nullopt;
    };
    if (auto problem = check(matrix, mesh_, layout_, "matrix")) return problem;
    if (auto problem = check(target, target_mesh_, target_layout_, "target")) return problem;
    return detail::shared_storage_problem(matrix, target, who);
  }

  Mesh<source_rank> mesh_;
  Mesh<target_rank> target_mesh_;
  L layout_;
  LT target_layout_;
  index_t rows_ = 0;
  index_t cols_ = 0;
  detail::CompiledMove<T, MemSpace> move_;
};

/// Plans moving matrices like `matrix` to `target_layout` on the same mesh, for
/// `RedistributePlan::apply`. Collective over the mesh, with the agreement and errors of
/// `redistribute(matrix, target_layout)`; allocates the plan's buffers and copies its index
/// lists to the matrix's memory on `space` (fenced there).
template <class ExecSpace, class LT, class T, class L, class E, class S>
requires Kokkos::is_execution_space<ExecSpace>::value && is_layout_v<LT>
[[nodiscard]] RedistributePlan<T, L, LT, E, S> plan_redistribute(
    const ExecSpace& space, const DistMatrix<T, L, E, S>& matrix, const LT& target_layout) {
  detail::check_redistribute_types<T, L, LT, L::rank>();
  const detail::Operation operation("plan_redistribute");
  detail::redistribute_agreement(matrix, matrix.mesh(), target_layout).settle();
  return RedistributePlan<T, L, LT, E, S>(detail::PlanKey{}, space, matrix, matrix.mesh(),
                                          target_layout, true);
}

/// `plan_redistribute(space, matrix, target_layout)` on a default instance of `E`.
template <class LT, class T, class L, class E, class S>
requires is_layout_v<LT>
[[nodiscard]] RedistributePlan<T, L, LT, E, S> plan_redistribute(
    const DistMatrix<T, L, E, S>& matrix, const LT& target_layout) {
  return plan_redistribute(E(), matrix, target_layout);
}

/// Plans moving matrices like `matrix` to `target_layout` on `target_mesh` (over the same
/// communicator), with the agreement and errors of `redistribute(matrix, target_mesh,
/// target_layout)`. Collective over both meshes.
template <class ExecSpace, class LT, class T, class L, class E, class S, std::size_t NT>
requires Kokkos::is_execution_space<ExecSpace>::value && is_layout_v<LT>
[[nodiscard]] RedistributePlan<T, L, LT, E, S> plan_redistribute(
    const ExecSpace& space, const DistMatrix<T, L, E, S>& matrix, const Mesh<NT>& target_mesh,
    const LT& target_layout) {
  detail::check_redistribute_types<T, L, LT, NT>();
  const detail::Operation operation("plan_redistribute");
  detail::redistribute_agreement(matrix, target_mesh, target_layout)
      .problem(detail::check_same_communicator(matrix.mesh(), target_mesh, "mesh"))
      .settle();
  return RedistributePlan<T, L, LT, E, S>(detail::PlanKey{}, space, matrix, target_mesh,
                                          target_layout, false);
}

/// `plan_redistribute(space, matrix, target_mesh, target_layout)` on a default instance of `E`.
template <class LT, class T, class L, class E, class S, std::size_t NT>
requires is_layout_v<LT>
[[nodiscard]] RedistributePlan<T, L, LT, E, S> plan_redistribute(
    const DistMatrix<T, L, E, S>& matrix, const Mesh<NT>& target_mesh, const LT& target_layout) {
  return plan_redistribute(E(), matrix, target_mesh, target_layout);
}

/// Plans moving matrices like `matrix` into matrices like `target` (its mesh, shape and
/// layout), with the agreement and errors of `redistribute_into(matrix, target)`: on the same
/// mesh when the two meshes have the same shape, otherwise as a mesh change. Collective.
template <class ExecSpace, class T, class L, class LT, class E, class S>
requires Kokkos::is_execution_space<ExecSpace>::value [[nodiscard]] RedistributePlan<T, L, LT, E, S>
plan_redistribute(const ExecSpace& space, const DistMatrix<T, L, E, S>& matrix,
                  const DistMatrix<T, LT, E, S>& target) {
  detail::check_redistribute_types<T, L, LT, LT::rank>();
  const detail::Operation operation("plan_redistribute");
  detail::agree_into(matrix, target, "plan_redistribute");
  bool same_mesh = false;
  if constexpr (L::rank == LT::rank) same_mesh = matrix.mesh().shape() == target.mesh().shape();
  return RedistributePlan<T, L, LT, E, S>(detail::PlanKey{}, space, matrix, target.mesh(),
                                          target.layout(), same_mesh);
}

/// `plan_redistribute(space, matrix, target)` on a default instance of `E`.
template <class T, class L, class LT, class E, class S>
[[nodiscard]] RedistributePlan<T, L, LT, E, S> plan_redistribute(
    const DistMatrix<T, L, E, S>& matrix, const DistMatrix<T, LT, E, S>& target) {
  return plan_redistribute(E(), matrix, target);
}

/// The same matrix in `target_layout` on the same mesh: a new `DistMatrix` (its own storage).
/// Collective over the mesh. Each mesh dimension that changes uses the cheapest collective on
/// its sub-communicator `dim_comm(m)`: Shard -> Replicate all-gather(v), Partial -> Replicate
/// all-reduce, Partial -> Shard reduce-scatter, Shard<0> <-> Shard<1> and strided changes
/// all-to-all(v) with exactly the elements each rank needs, Replicate -> Shard and
/// Replicate -> Partial local (no communication). When no order of per-dimension steps keeps
/// each step inside its sub-communicators (several mesh dims splitting the same tensor dim),
/// one exact all-to-all(v) over the mesh does the move. `Partial<avg>` divides by the mesh
/// dimension's extent; a created `Partial<sum>` keeps the value on coordinate 0 and zeros
/// elsewhere, `max`/`min`/`avg` keep it everywhere.
///
/// Errors (the same `kshard::error` on every rank, before anything is allocated or sent): a
/// target split factor < 1, a matrix or target layout that differs between ranks (type,
/// placements, split factors), a shard too large for one MPI message.
/// `comm_stats()` counts the data this rank sends; the few bytes of the argument checks are
/// left out of `bytes_sent`. In a loop, `redistribute_into` reuses the target's storage, and a
/// plan (`plan_redistribute`, then `RedistributePlan::apply`) also skips the planning.
/// The form with an execution-space instance first runs every kernel and copy on it.
template <class ExecSpace, class LT, class T, class L, class E, class S>
requires Kokkos::is_execution_space<ExecSpace>::value [[nodiscard]] DistMatrix<T, LT, E, S>
redistribute(const ExecSpace& space, const DistMatrix<T, L, E, S>& matrix,
             const LT& target_layout) {
  detail::check_redistribute_types<T, L, LT, L::rank>();
  const detail::Operation operation("redistribute");
  auto plan = plan_redistribute(space, matrix, target_layout);
  auto result = plan.make_target();
  plan.apply(space, matrix, result);
  return result;
}

/// `redistribute(space, matrix, target_layout)` on a default instance of `E`.
template <class LT, class T, class L, class E, class S>
[[nodiscard]] DistMatrix<T, LT, E, S> redistribute(const DistMatrix<T, L, E, S>& matrix,
                                                   const LT& target_layout) {
  detail::check_redistribute_types<T, L, LT, L::rank>();
  return redistribute(E(), matrix, target_layout);
}

/// The same matrix on `target_mesh` in `target_layout` (checkpoint resharding: another mesh
/// shape, rank or layout over the same processes). Collective over both meshes, which must be
/// over the same communicator (the same processes in the same order; copies and duplicates
/// qualify). Pending reductions are resolved on the source mesh (all-reduce), then one exact
/// all-to-all(v) over the communicator sends each rank exactly the elements of its new shard
/// that it does not hold yet. Errors as for the same-mesh overload, plus meshes over different
/// communicators, the same `kshard::error` on every rank.
template <class ExecSpace, class LT, class T, class L, class E, class S, std::size_t NT>
requires Kokkos::is_execution_space<ExecSpace>::value [[nodiscard]] DistMatrix<T, LT, E, S>
redistribute(const ExecSpace& space, const DistMatrix<T, L, E, S>& matrix,
             const Mesh<NT>& target_mesh, const LT& target_layout) {
  detail::check_redistribute_types<T, L, LT, NT>();
  const detail::Operation operation("redistribute");
  auto plan = plan_redistribute(space, matrix, target_mesh, target_layout);
  auto result = plan.make_target();
  plan.apply(space, matrix, result);
  return result;
}

/// `redistribute(space, matrix, target_mesh, target_layout)` on a default instance of `E`.
template <class LT, class T, class L, class E, class S, std::size_t NT>
[[nodiscard]] DistMatrix<T, LT, E, S> redistribute(const DistMatrix<T, L, E, S>& matrix,
                                                   const Mesh<NT>& target_mesh,
                                                   const LT& target_layout) {
  detail::check_redistribute_types<T, L, LT, NT>();
  return redistribute(E(), matrix, target_mesh, target_layout);
}

/// Redistributes `matrix` into `target`, an existing matrix of the same global shape whose
/// layout and mesh say where every element goes; every element of `target`'s shard is
/// overwritten. The same moves and messages as `redistribute` (on the same mesh when the two
/// meshes have the same shape, otherwise as a mesh change), without allocating the result:
/// the form for a loop that unshards into one persistent buffer (FSDP), where a new matrix
/// per call would also pay for fresh pages. It plans on every call; `plan_redistribute` once
/// and `RedistributePlan::apply` per step skip that. The form with an execution-space instance
/// first runs every kernel and copy on it.
///
/// Errors (the same `kshard::error` on every rank, nothing written): different global shapes,
/// meshes over different communicators, shards that share memory on any rank, or a matrix or
/// target that differs between ranks (element type, shape, layout, mesh shape).
template <class ExecSpace, class T, class L, class LT, class E, class S>
requires Kokkos::is_execution_space<ExecSpace>::value void redistribute_into(
    const ExecSpace& space, const DistMatrix<T, L, E, S>& matrix,
    const DistMatrix<T, LT, E, S>& target) {
  detail::check_redistribute_types<T, L, LT, LT::rank>();
  const detail::Operation operation("redistribute_into");
  detail::agree_into(matrix, target, "redistribute_into");
  bool same_mesh = false;
  if constexpr (L::rank == LT::rank) same_mesh = matrix.mesh().shape() == target.mesh().shape();
  RedistributePlan<T, L, LT, E, S> plan(detail::PlanKey{}, space, matrix, target.mesh(),
                                        target.layout(), same_mesh);
  plan.apply(space, matrix, target);
}

/// `redistribute_into(space, matrix, target)` on a default instance of `E`.
template <class T, class L, class LT, class E, class S>
void redistribute_into(const DistMatrix<T, L, E, S>& matrix,
                       const DistMatrix<T, LT, E, S>& target) {
  redistribute_into(E(), matrix, target);
}

}  // namespace kshard
