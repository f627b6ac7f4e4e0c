#pragma once

/// \file
/// `redistribute`: a matrix in another layout on the same mesh (all-gather, all-reduce,
/// reduce-scatter, all-to-all, local slicing, one mesh dimension at a time), or on another
/// mesh over the same communicator (checkpoint resharding). Every element that moves is
/// planned exactly from the index maps of both layouts, so uneven, empty and strided shards
/// send what the receivers need and nothing else.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm_stats.hpp"
#include "kshard/detail/agreement.hpp"
#include "kshard/detail/mpi.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/detail/redistribute_kernels.hpp"
#include "kshard/detail/redistribute_plan.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"

namespace kshard {

namespace detail {

template <class T, class MemSpace>
using ShardView = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;

// Element types MPI can reduce (a Partial source needs one).
template <class T>
inline constexpr bool reducible_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t>;

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    case ReduceOp::sum:
    case ReduceOp::avg:
      break;
  }
  return MPI_SUM;
}

template <class L>
std::array<ReduceOp, L::rank> partial_ops() {
  std::array<ReduceOp, L::rank> ops{};
  for (std::size_t m = 0; m < L::rank; ++m) ops[m] = L::partial_op(m);
  return ops;
}

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
  static_assert(!L::has_partial || detail::reducible_v<T>,
                "kshard::redistribute: resolving a Partial layout needs an element type MPI "
                "can reduce (float, double, int32_t, int64_t)");
}

// The agreement every redistribution starts with: the matrix, the target mesh's rank and shape
// and the target layout must be the same on every rank; the target's split factors >= 1.
template <class M, class LT, std::size_t NT>
Agreement redistribute_agreement(const M& matrix, const Mesh<NT>& target_mesh,
                                 const LT& target_layout) {
  Agreement agreement(matrix.mesh().comm());
  same_matrix(agreement, matrix, "the matrix");
  agreement.same("the target mesh rank", static_cast<std::int64_t>(NT));
  for (std::size_t m = 0; m < NT; ++m)
    agreement.same(fmt::format("the extent of target mesh dimension {}", m),
                   target_mesh.shape()[m]);
  same_layout(agreement, target_layout, "the target");
  const auto actions = target_layout.actions();
  for (std::size_t m = 0; m < NT; ++m)
    if (actions[m].split_factor < 1)
      agreement.problem(fmt::format(
          "kshard::redistribute: target StridedShard on mesh dimension {} ('{}') has split "
          "factor {}; it must be >= 1",
          m, target_mesh.names()[m], actions[m].split_factor));
  return agreement;
}

// out = the elements of `in` (this rank's shard under `mine`) that the shard under `need` also
// holds, copied locally: no message.
template <class ExecSpace, class T, class S, std::size_t NS, std::size_t NT>
void copy_held(const ShardView<T, S>& in, const LayoutMapping<NS>& mine, const ShardView<T, S>& out,
               const LayoutMapping<NT>& need) {
  BlockLists from;
  BlockLists to;
  const auto rows = overlaps(mine.rows, need.rows);
  const auto cols = overlaps(mine.cols, need.cols);
  from.add(rows, cols, true, 0);
  to.add(rows, cols, false, 0);
  copy_blocks<ExecSpace>(in, from, out, to);
}

// The exact exchange: every rank t receives each element of its new shard (dst) once, from the
// rank that holds it in src and agrees with t on every src dimension that does not split
// (Replicate or Partial: the same replica, the same addend); t itself where it already holds
// it. `peers` ranks of `comm`; peer p has coordinates src_coords(p) and dst_coords(p).
// Receivers for which `wants` is false need nothing. One all-to-all(v) over `comm`.
template <class ExecSpace, class T, class S, std::size_t NS, std::size_t NT, class SrcCoords,
          class DstCoords, class Wants>
void exchange(const ShardView<T, S>& in, const Geometry<NS>& src, const ShardView<T, S>& out,
              const Geometry<NT>& dst, int peers, int self, const SrcCoords& src_coords,
              const DstCoords& dst_coords, const Wants& wants, MPI_Comm comm) {
  const std::array<int, NS> my_src = src_coords(self);
  const std::array<int, NT> my_dst = dst_coords(self);
  const LayoutMapping<NS> mine = src.at(my_src);
  const LayoutMapping<NT> need = dst.at(my_dst);
  const bool i_want = wants(my_dst);
  auto agrees = [&](const std::array<int, NS>& other) {
    for (std::size_t m = 0; m < NS; ++m)
      if (!src.splits(m) && other[m] != my_src[m]) return false;
    return true;
  };
  const auto n = static_cast<std::size_t>(peers);
  std::vector<int> send_counts(n, 0), send_displs(n, 0), recv_counts(n, 0), recv_displs(n, 0);
  BlockLists send;
  BlockLists recv;
  index_t sent = 0;
  index_t received = 0;
  for (int t = 0; t < peers; ++t) {
    const auto p = static_cast<std::size_t>(t);
    send_displs[p] = mpi_count(sent, "kshard::redistribute");
    recv_displs[p] = mpi_count(received, "kshard::redistribute");
    if (t == self) continue;
    const std::array<int, NS> t_src = src_coords(t);
    if (!agrees(t_src)) continue;
    const std::array<int, NT> t_dst = dst_coords(t);
    if (wants(t_dst)) {
      const LayoutMapping<NT> theirs = dst.at(t_dst);
      const index_t k =
          send.add(overlaps(mine.rows, theirs.rows), overlaps(mine.cols, theirs.cols), true, sent);
      send_counts[p] = mpi_count(k, "kshard::redistribute");
      sent += k;
    }
    if (i_want) {
      const LayoutMapping<NS> from = src.at(t_src);
      const index_t k =
          recv.add(overlaps(from.rows, need.rows), overlaps(from.cols, need.cols), false, received);
      recv_counts[p] = mpi_count(k, "kshard::redistribute");
      received += k;
    }
  }
  if (i_want) copy_held<ExecSpace>(in, mine, out, need);  // what this rank already holds
  Kokkos::View<T*, S> send_buffer(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::redistribute::send"),
      static_cast<std::size_t>(sent));
  Kokkos::View<T*, S> recv_buffer(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::redistribute::recv"),
      static_cast<std::size_t>(received));
  pack_blocks<ExecSpace>(in, send, send_buffer);
  with_mpi_access(ExecSpace(), send_buffer, true, false, [&](const T* s) {
    with_mpi_access(ExecSpace(), recv_buffer, false, true, [&](T* r) {
      alltoallv(s, send_counts.data(), send_displs.data(), r, recv_counts.data(),
                recv_displs.data(), comm);
    });
  });
  unpack_blocks<ExecSpace>(recv_buffer, recv, out);
}

// Runs one single-mesh-dimension step (or the whole-mesh exchange) from `in` (this rank's
// shard in step.before) to `out` (its shard in step.after).
template <class ExecSpace, class T, class S, std::size_t N>
void run_step(const Mesh<N>& mesh, const Step<N>& step, const std::array<bool, N>& zero_dims,
              const ShardView<T, S>& in, const ShardView<T, S>& out) {
  const std::size_t m = step.dim;
  const int extent = mesh.extent(m);
  const int self = mesh.coords()[m];
  auto member = [&](int k) {
    std::array<int, N> c = mesh.coords();
    c[m] = k;
    return c;
  };
  const LayoutMapping<N> mine = step.before.at(mesh.coords());
  const LayoutMapping<N> need = step.after.at(mesh.coords());
  const auto k_count = static_cast<std::size_t>(extent);
  switch (step.kind) {
    case StepKind::allreduce: {
      Kokkos::deep_copy(out, in);
      const int count = mpi_count(need.local_size(), "kshard::redistribute");
      with_mpi_access(ExecSpace(), out, true, true,
                      [&](T* data) { allreduce(data, count, mpi_op(step.op), mesh.dim_comm(m)); });
      if (step.op == ReduceOp::avg) divide_all<ExecSpace>(out, extent);
      return;
    }
    case StepKind::reduce_scatter: {
      std::vector<int> counts(k_count, 0);
      BlockLists lists;
      index_t total = 0;
      for (int k = 0; k < extent; ++k) {
        const LayoutMapping<N> theirs = step.after.at(member(k));
        const index_t n = lists.add(overlaps(mine.rows, theirs.rows),
                                    overlaps(mine.cols, theirs.cols), true, total);
        counts[static_cast<std::size_t>(k)] = mpi_count(n, "kshard::redistribute");
        total += n;
      }
      Kokkos::View<T*, S> buffer(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::redistribute::send"),
          static_cast<std::size_t>(total));
      pack_blocks<ExecSpace>(in, lists, buffer);
      with_mpi_access(ExecSpace(), buffer, true, false, [&](const T* s) {
        with_mpi_access(ExecSpace(), out, false, true, [&](T* r) {
          reduce_scatter(s, r, counts.data(), mpi_op(step.op), mesh.dim_comm(m));
        });
      });
      if (step.op == ReduceOp::avg) divide_all<ExecSpace>(out, extent);
      return;
    }
    case StepKind::allgather: {
      std::vector<int> counts(k_count, 0);
      std::vector<int> displs(k_count, 0);
      BlockLists lists;
      index_t total = 0;
      for (int k = 0; k < extent; ++k) {
        const LayoutMapping<N> theirs = step.before.at(member(k));
        const auto p = static_cast<std::size_t>(k);
        displs[p] = mpi_count(total, "kshard::redistribute");
        counts[p] = mpi_count(theirs.local_size(), "kshard::redistribute");
        // Every element the member holds is needed here, in its local (= global) order.
        lists.add(overlaps(theirs.rows, need.rows), overlaps(theirs.cols, need.cols), false, total);
        total += theirs.local_size();
      }
      const int mine_count = counts[static_cast<std::size_t>(self)];
      if (total == static_cast<index_t>(out.size()) &&
          lands_in_place(lists, static_cast<index_t>(out.extent(1)))) {
        // Plain row shards of full width (Shard<0> -> Replicate): each member's block is
        // already where it belongs in `out`, so MPI receives straight into it.
        with_mpi_access(ExecSpace(), in, true, false, [&](const T* s) {
          with_mpi_access(ExecSpace(), out, false, true, [&](T* r) {
            allgatherv(s, mine_count, r, counts.data(), displs.data(), mesh.dim_comm(m));
          });
        });
        return;
      }
      Kokkos::View<T*, S> buffer(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::redistribute::recv"),
          static_cast<std::size_t>(mpi_count(total, "kshard::redistribute")));
      with_mpi_access(ExecSpace(), in, true, false, [&](const T* s) {
        with_mpi_access(ExecSpace(), buffer, false, true, [&](T* r) {
          allgatherv(s, mine_count, r, counts.data(), displs.data(), mesh.dim_comm(m));
        });
      });
      unpack_blocks<ExecSpace>(buffer, lists, out);
      return;
    }
    case StepKind::slice:
      copy_held<ExecSpace>(in, mine, out, need);
      return;
    case StepKind::exchange_dim: {
      auto all = [](const std::array<int, N>&) { return true; };
      exchange<ExecSpace>(in, step.before, out, step.after, extent, self, member, member, all,
                          mesh.dim_comm(m));
      return;
    }
    case StepKind::exchange_all: {
      auto coords = [&](int r) { return mesh.coords_of(r); };
      auto wants = [&](const std::array<int, N>& c) {
        for (std::size_t j = 0; j < N; ++j)
          if (zero_dims[j] && c[j] != 0) return false;
        return true;
      };
      exchange<ExecSpace>(in, step.before, out, step.after, mesh.size(), mesh.my_rank(), coords,
                          coords, wants, mesh.comm());
      return;
    }
  }
}

// Runs the plan's steps from `source` into `result` (this rank's shard of the target), then
// zeroes the addends a created Partial<sum> leaves empty.
template <class ExecSpace, class T, class S, std::size_t N>
void run_plan(const Mesh<N>& mesh, const Plan<N>& plan, const ShardView<T, S>& source,
              const ShardView<T, S>& result, bool last_is_result) {
  ShardView<T, S> cur = source;
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    const Step<N>& step = plan.steps[i];
    ShardView<T, S> out;
    if (last_is_result && i + 1 == plan.steps.size()) {
      out = result;
    } else {
      const LayoutMapping<N> next = step.after.at(mesh.coords());
      out = ShardView<T, S>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::redistribute::step"),
          static_cast<std::size_t>(next.rows.local_extent()),
          static_cast<std::size_t>(next.cols.local_extent()));
    }
    run_step<ExecSpace>(mesh, step, plan.zero_dims, cur, out);
    cur = out;
  }
  if (last_is_result && plan.steps.empty()) Kokkos::deep_copy(result, source);
}

// A matrix whose shard is allocated without a fill: redistribute writes every element of it
// (or zeroes it), so initialising would only cost one more pass over memory.
template <class T, class E, class S, class LT, std::size_t N>
DistMatrix<T, LT, E, S> uninitialized_matrix(const Mesh<N>& mesh, const LT& layout, index_t rows,
                                             index_t cols) {
  const LayoutMapping<N> shard =
      map_layout(layout.actions(), mesh.shape(), mesh.coords(), rows, cols);
  ShardView<T, S> local(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::redistribute"),
                        static_cast<std::size_t>(shard.rows.local_extent()),
                        static_cast<std::size_t>(shard.cols.local_extent()));
  return DistMatrix<T, LT, E, S>(mesh, layout, rows, cols, local);
}

template <std::size_t N>
bool holds_zeros(const std::array<bool, N>& zero_dims, const std::array<int, N>& coords) {
  for (std::size_t m = 0; m < N; ++m)
    if (zero_dims[m] && coords[m] != 0) return true;
  return false;
}

// A move on the matrix's own mesh: per-dimension steps (or one whole-mesh exchange). Planning
// throws the same error on every rank (it reads global data only).
template <std::size_t N>
struct SameMeshMove {
  Plan<N> plan;

  template <class T, class L, class E, class S, class LT>
  SameMeshMove(const DistMatrix<T, L, E, S>& matrix, const LT& target_layout) {
    const Geometry<N> source{matrix.layout().actions(), matrix.mesh().shape(), matrix.rows(),
                             matrix.cols()};
    plan = plan_same_mesh(source, partial_ops<L>(), target_layout.actions(), partial_ops<LT>());
  }

  // Writes this rank's shard of the target into `result` (every element).
  template <class E, class T, class S>
  void run(const Mesh<N>& mesh, const ShardView<T, S>& source,
           const ShardView<T, S>& result) const {
    run_plan<E>(mesh, plan, source, result, true);
    if (holds_zeros(plan.zero_dims, mesh.coords())) Kokkos::deep_copy(result, T{});
  }
};

// A move onto another mesh over the same communicator: pending reductions resolved on the
// source mesh, then one exact all-to-all(v) over the communicator.
template <std::size_t N, std::size_t NT>
struct CrossMeshMove {
  Plan<N> resolve;
  Geometry<N> source;
  Geometry<NT> goal;
  std::array<bool, NT> zero_dims{};

  template <class T, class L, class E, class S, class LT>
  CrossMeshMove(const DistMatrix<T, L, E, S>& matrix, const Mesh<NT>& target_mesh,
                const LT& target_layout)
      : source{matrix.layout().actions(), matrix.mesh().shape(), matrix.rows(), matrix.cols()},
        goal{target_layout.actions(), target_mesh.shape(), matrix.rows(), matrix.cols()} {
    resolve = plan_resolve_partials(source, partial_ops<L>());
    for (std::size_t m = 0; m < N; ++m)
      if (source.actions[m].kind == PlacementKind::partial) source.actions[m] = replicate_action();
    for (std::size_t m = 0; m < NT; ++m) {
      if (goal.actions[m].kind != PlacementKind::partial) continue;
      zero_dims[m] = LT::partial_op(m) == ReduceOp::sum && goal.shape[m] > 1;
      goal.actions[m] = replicate_action();
    }
    check_message_size(std::max(source.max_local_size(), goal.max_local_size()), "redistribute");
  }

  template <class E, class T, class S>
  void run(const Mesh<N>& mesh, const Mesh<NT>& target_mesh, const ShardView<T, S>& local,
           const ShardView<T, S>& result) const {
    ShardView<T, S> resolved = local;
    if (!resolve.steps.empty()) {
      const auto shard = source.at(mesh.coords());
      resolved = ShardView<T, S>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::redistribute::resolved"),
          static_cast<std::size_t>(shard.rows.local_extent()),
          static_cast<std::size_t>(shard.cols.local_extent()));
      run_plan<E>(mesh, resolve, local, resolved, true);
    }
    auto src_coords = [&](int r) { return mesh.coords_of(r); };
    auto dst_coords = [&](int r) { return target_mesh.coords_of(r); };
    auto wants = [&](const std::array<int, NT>& c) { return !holds_zeros(zero_dims, c); };
    exchange<E>(resolved, source, result, goal, mesh.size(), mesh.my_rank(), src_coords, dst_coords,
                wants, mesh.comm());
    if (holds_zeros(zero_dims, target_mesh.coords())) Kokkos::deep_copy(result, T{});
  }
};

template <std::size_t N, std::size_t NT>
std::optional<std::string> check_same_communicator(const Mesh<N>& mesh, const Mesh<NT>& target,
                                                   const char* what) {
  if (congruent(mesh.comm(), target.comm())) return std::nullopt;
  return fmt::format(
      "kshard::redistribute: the target {} ({} ranks) is over a different communicator than the "
      "matrix's mesh ({} ranks); both must hold the same processes in the same order",
      what, target.size(), mesh.size());
}

}  // namespace detail

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
/// left out of `bytes_sent`. In a loop, `redistribute_into` reuses the target's storage.
template <class LT, class T, class L, class E, class S>
[[nodiscard]] DistMatrix<T, LT, E, S> redistribute(const DistMatrix<T, L, E, S>& matrix,
                                                   const LT& target_layout) {
  detail::check_redistribute_types<T, L, LT, L::rank>();
  const detail::Operation operation("redistribute");
  const auto& mesh = matrix.mesh();
  detail::redistribute_agreement(matrix, mesh, target_layout).settle();
  const detail::SameMeshMove<L::rank> move(matrix, target_layout);
  auto result =
      detail::uninitialized_matrix<T, E, S>(mesh, target_layout, matrix.rows(), matrix.cols());
  move.template run<E>(mesh, matrix.local(), result.local());
  return result;
}

/// The same matrix on `target_mesh` in `target_layout` (checkpoint resharding: another mesh
/// shape, rank or layout over the same processes). Collective over both meshes, which must be
/// over the same communicator (the same processes in the same order; copies and duplicates
/// qualify). Pending reductions are resolved on the source mesh (all-reduce), then one exact
/// all-to-all(v) over the communicator sends each rank exactly the elements of its new shard
/// that it does not hold yet. Errors as for the same-mesh overload, plus meshes over different
/// communicators, the same `kshard::error` on every rank.
template <class LT, class T, class L, class E, class S, std::size_t NT>
[[nodiscard]] DistMatrix<T, LT, E, S> redistribute(const DistMatrix<T, L, E, S>& matrix,
                                                   const Mesh<NT>& target_mesh,
                                                   const LT& target_layout) {
  detail::check_redistribute_types<T, L, LT, NT>();
  const detail::Operation operation("redistribute");
  const auto& mesh = matrix.mesh();
  detail::redistribute_agreement(matrix, target_mesh, target_layout)
      .problem(detail::check_same_communicator(mesh, target_mesh, "mesh"))
      .settle();
  const detail::CrossMeshMove<L::rank, NT> move(matrix, target_mesh, target_layout);
  auto result = detail::uninitialized_matrix<T, E, S>(target_mesh, target_layout, matrix.rows(),
                                                      matrix.cols());
  move.template run<E>(mesh, target_mesh, matrix.local(), result.local());
  return result;
}

/// Redistributes `matrix` into `target`, an existing matrix of the same global shape whose
/// layout and mesh say where every element goes; every element of `target`'s shard is
/// overwritten. The same moves and messages as `redistribute` (on the same mesh when the two
/// meshes have the same shape, otherwise as a mesh change), without allocating the result:
/// the form for a loop that unshards into one persistent buffer (FSDP), where a new matrix
/// per call would also pay for fresh pages.
///
/// Errors (the same `kshard::error` on every rank, nothing written): different global shapes,
/// meshes over different communicators, shards that share memory on any rank, or a matrix or
/// target that differs between ranks (element type, shape, layout, mesh shape).
template <class T, class L, class LT, class E, class S>
void redistribute_into(const DistMatrix<T, L, E, S>& matrix,
                       const DistMatrix<T, LT, E, S>& target) {
  constexpr std::size_t N = L::rank;
  constexpr std::size_t NT = LT::rank;
  detail::check_redistribute_types<T, L, LT, NT>();
  const detail::Operation operation("redistribute_into");
  const auto& mesh = matrix.mesh();
  const auto& target_mesh = target.mesh();
  bool same_mesh = false;
  if constexpr (N == NT) same_mesh = mesh.shape() == target_mesh.shape();
  std::optional<detail::SameMeshMove<N>> on_mesh;
  std::optional<detail::CrossMeshMove<N, NT>> across;
  {
    std::optional<std::string> problem;
    const T* in = matrix.local().data();
    const T* out = target.local().data();
    if (target.rows() != matrix.rows() || target.cols() != matrix.cols())
      problem =
          fmt::format("kshard::redistribute_into: the target is {} x {} but the matrix is {} x {}",
                      target.rows(), target.cols(), matrix.rows(), matrix.cols());
    else if (matrix.local().size() > 0 && target.local().size() > 0 &&
             in < out + target.local().size() && out < in + matrix.local().size())
      problem = fmt::format(
          "kshard::redistribute_into: on rank {} the target's shard shares memory with the "
          "matrix's; redistribute into separate storage",
          mesh.my_rank());
    else
      problem = detail::check_same_communicator(mesh, target_mesh, "matrix's mesh");
    // The target's shape is checked against the agreed matrix's on each rank, its layout and
    // mesh are agreed on: together, the whole target.
    detail::redistribute_agreement(matrix, target_mesh, target.layout()).problem(problem).settle();
    if constexpr (N == NT) {
      if (same_mesh) on_mesh.emplace(matrix, target.layout());
    }
    if (!same_mesh) across.emplace(matrix, target_mesh, target.layout());
  }
  if constexpr (N == NT) {
    if (same_mesh) {
      on_mesh->template run<E>(mesh, matrix.local(), target.local());
      return;
    }
  }
  across->template run<E>(mesh, target_mesh, matrix.local(), target.local());
}

}  // namespace kshard
