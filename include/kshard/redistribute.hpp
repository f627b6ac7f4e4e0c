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
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/stats.hpp"
#include "kshard/comm/agreement.hpp"
#include "kshard/comm/mpi.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/redistribute/moves.hpp"
#include "kshard/redistribute/plan.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/format.hpp"
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

// The agreement every redistribution starts with: the matrix, the target mesh (rank, shape and
// names) and the target layout must be the same on every rank; the target's split factors >= 1.
template <class M, class LT, std::size_t NT>
Agreement redistribute_agreement(const M& matrix, const Mesh<NT>& target_mesh,
                                 const LT& target_layout) {
  Agreement agreement(matrix.mesh().group());
  same_matrix(agreement, matrix, "the matrix");
  same_mesh(agreement, "the target mesh", target_mesh);
  same_layout(agreement, target_layout, "the target");
  const auto actions = target_layout.actions();
  for (std::size_t m = 0; m < NT; ++m)
    if (actions[m].split_factor < 1)
      agreement.problem(
          fmt::format("kshard::{}: target StridedShard on mesh dimension {} ('{}') has split "
                      "factor {}; it must be >= 1",
                      operation_name(), m, target_mesh.names()[m], actions[m].split_factor));
  return agreement;
}

// One step of a compiled plan, with everything it needs built once: counts and displacements,
// the pack and unpack moves (in device memory) and the message buffers.
template <class T, class S>
struct Stage {
  enum class Kind { copy, allreduce, reduce_scatter, allgather, local, exchange };
  Kind kind = Kind::local;
  comm::Group group;  // the ranks of the collective
  ReduceOp op = ReduceOp::sum;
  int divide = 0;              // > 1: the output is divided by it afterwards (Partial<avg>)
  int in = -1;                 // input: -1 the source shard, else that intermediate shard
  int out = -1;                // output: -1 the result, else that intermediate shard
  bool in_place = false;       // allgather, exchange: MPI receives straight into the output
  bool send_in_place = false;  // exchange: MPI sends straight from the input
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  // exchange: this rank's totals do not fit MPI's int displacements (agreed on by the plan)
  std::optional<std::string> count_problem;
  DeviceMoves<S> pack;    // input -> send buffer
  DeviceMoves<S> unpack;  // receive buffer (source 0) and input (source 1) -> output
  Kokkos::View<T*, S> send, recv;
};

template <class T, class S>
Kokkos::View<T*, S> message_buffer(index_t elements, const char* label) {
  return Kokkos::View<T*, S>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                             static_cast<std::size_t>(mpi_count(elements)));
}

// The exact exchange: every rank t receives each element of its new shard (dst) once, from the
// rank that holds it in src and agrees with t on every src dimension that does not split
// (Replicate or Partial: the same replica, the same addend); t itself where it already holds
// it. `peers` ranks of `comm`; peer p has coordinates src_coords(p) and dst_coords(p).
// Receivers for which `wants` is false need nothing. One all-to-all(v) over `comm`; the pack
// is one kernel, the unpack (with the elements this rank keeps) another.
template <class T, class S, class Space, std::size_t NS, std::size_t NT, class SrcCoords,
          class DstCoords, class Wants>
Stage<T, S> compile_exchange(const Space& space, const Geometry<NS>& src, const Geometry<NT>& dst,
                             int peers, int self, const SrcCoords& src_coords,
                             const DstCoords& dst_coords, const Wants& wants,
                             const comm::Group& group) {
  const std::array<int, NS> my_src = src_coords(self);
  const std::array<int, NT> my_dst = dst_coords(self);
  const LayoutMapping<NS> mine = src.at(my_src);
  const LayoutMapping<NT> need = dst.at(my_dst);
  const bool i_want = wants(my_dst);
  const MoveEnd from_shard = shard_end(true, mine.cols.local_extent());
  const MoveEnd to_shard = shard_end(false, need.cols.local_extent());
  auto agrees = [&](const std::array<int, NS>& other) {
    for (std::size_t m = 0; m < NS; ++m)
      if (!src.splits(m) && other[m] != my_src[m]) return false;
    return true;
  };
  Stage<T, S> stage;
  stage.kind = Stage<T, S>::Kind::exchange;
  stage.group = group;
  const auto n = static_cast<std::size_t>(peers);
  stage.send_counts.assign(n, 0);
  stage.send_displs.assign(n, 0);
  stage.recv_counts.assign(n, 0);
  stage.recv_displs.assign(n, 0);
  // One list per peer and side, to see whether each peer's block is one contiguous run of
  // the shard (then MPI reads or writes the shard itself, with no pack or unpack).
  std::vector<MoveList> packs(n);
  std::vector<MoveList> unpacks(n);
  // Each count is at most a shard (the planner checked every shard against INT_MAX on every
  // rank); the totals, and with them the displacements, are this rank's alone: checked below.
  index_t sent = 0;
  index_t received = 0;
  for (int t = 0; t < peers; ++t) {
    const auto p = static_cast<std::size_t>(t);
    if (t == self) continue;
    const std::array<int, NS> t_src = src_coords(t);
    if (!agrees(t_src)) continue;
    const std::array<int, NT> t_dst = dst_coords(t);
    if (wants(t_dst)) {
      const LayoutMapping<NT> theirs = dst.at(t_dst);
      const index_t k =
          packs[p].add_block(overlaps(mine.rows, theirs.rows), overlaps(mine.cols, theirs.cols), 0,
                             from_shard, buffer_end(sent));
      stage.send_counts[p] = mpi_count(k);
      sent += k;
    }
    if (i_want) {
      const LayoutMapping<NS> from = src.at(t_src);
      const index_t k =
          unpacks[p].add_block(overlaps(from.rows, need.rows), overlaps(from.cols, need.cols), 0,
                               buffer_end(received), to_shard);
      stage.recv_counts[p] = mpi_count(k);
      received += k;
    }
  }
  stage.count_problem = int_limit_problem(std::max(sent, received), operation_name(),
                                          "the number of elements this rank sends or receives in "
                                          "one all-to-all");
  if (stage.count_problem) return stage;
  // The blocks lie in peer order, as `sent` and `received` counted them.
  std::exclusive_scan(stage.send_counts.begin(), stage.send_counts.end(), stage.send_displs.begin(),
                      0);
  std::exclusive_scan(stage.recv_counts.begin(), stage.recv_counts.end(), stage.recv_displs.begin(),
                      0);
  const auto contiguous = [](const std::vector<MoveList>& lists) {
    for (const MoveList& list : lists)
      if (list.moves().size() > 1) return false;
    return true;
  };
  stage.send_in_place = contiguous(packs);
  stage.in_place = contiguous(unpacks);
  MoveList pack;
  MoveList unpack;
  for (std::size_t p = 0; p < n; ++p) {
    if (stage.send_in_place) {
      if (!packs[p].empty()) stage.send_displs[p] = mpi_count(packs[p].moves()[0].from);
    } else {
      pack.append(packs[p]);
    }
    if (stage.in_place) {
      if (!unpacks[p].empty()) stage.recv_displs[p] = mpi_count(unpacks[p].moves()[0].to);
    } else {
      unpack.append(unpacks[p]);
    }
  }
  if (i_want)  // what this rank already holds: a local copy in the unpack kernel
    unpack.add_block(overlaps(mine.rows, need.rows), overlaps(mine.cols, need.cols), 1, from_shard,
                     to_shard);
  stage.pack = DeviceMoves<S>(space, pack);
  stage.unpack = DeviceMoves<S>(space, unpack);
  if (!stage.send_in_place) stage.send = message_buffer<T, S>(sent, "kshard::redistribute::send");
  if (!stage.in_place) stage.recv = message_buffer<T, S>(received, "kshard::redistribute::recv");
  return stage;
}

// Compiles one single-mesh-dimension step (or the whole-mesh exchange) from this rank's shard in
// step.before to its shard in step.after.
template <class T, class S, class Space, std::size_t N>
Stage<T, S> compile_step(const Space& space, const Mesh<N>& mesh, const Step<N>& step,
                         const std::array<bool, N>& zero_dims) {
  using Kind = typename Stage<T, S>::Kind;
  const std::size_t m = step.dim;
  const int extent = mesh.extent(m);
  auto member = [&](int k) {
    std::array<int, N> c = mesh.coords();
    c[m] = k;
    return c;
  };
  const LayoutMapping<N> mine = step.before.at(mesh.coords());
  const LayoutMapping<N> need = step.after.at(mesh.coords());
  const MoveEnd from_shard = shard_end(true, mine.cols.local_extent());
  const MoveEnd to_shard = shard_end(false, need.cols.local_extent());
  const auto k_count = static_cast<std::size_t>(extent);
  Stage<T, S> stage;
  stage.group = mesh.dim_group(m);
  stage.op = step.op;
  switch (step.kind) {
    case StepKind::allreduce:
      stage.kind = Kind::allreduce;
      stage.divide = step.op == ReduceOp::avg ? extent : 0;
      return stage;
    case StepKind::reduce_scatter: {
      stage.kind = Kind::reduce_scatter;
      stage.divide = step.op == ReduceOp::avg ? extent : 0;
      stage.recv_counts.assign(k_count, 0);
      MoveList pack;
      index_t total = 0;
      for (int k = 0; k < extent; ++k) {
        const LayoutMapping<N> theirs = step.after.at(member(k));
        const index_t n =
            pack.add_block(overlaps(mine.rows, theirs.rows), overlaps(mine.cols, theirs.cols), 0,
                           from_shard, buffer_end(total));
        stage.recv_counts[static_cast<std::size_t>(k)] = mpi_count(n);
        total += n;
      }
      stage.pack = DeviceMoves<S>(space, pack);
      stage.send = message_buffer<T, S>(total, "kshard::redistribute::send");
      return stage;
    }
    case StepKind::allgather: {
      stage.kind = Kind::allgather;
      stage.recv_counts.assign(k_count, 0);
      stage.recv_displs.assign(k_count, 0);
      MoveList unpack;
      index_t total = 0;
      for (int k = 0; k < extent; ++k) {
        const LayoutMapping<N> theirs = step.before.at(member(k));
        const auto p = static_cast<std::size_t>(k);
        stage.recv_displs[p] = mpi_count(total);
        stage.recv_counts[p] = mpi_count(theirs.local_size());
        // Every element the member holds is needed here, in its local (= global) order.
        unpack.add_block(overlaps(theirs.rows, need.rows), overlaps(theirs.cols, need.cols), 0,
                         buffer_end(total), to_shard);
        total += theirs.local_size();
      }
      // Plain row shards of full width (Shard<0> -> Replicate): each member's block is already
      // where it belongs in the output, so MPI receives straight into it.
      stage.in_place = total == need.local_size() && unpack.is_identity(total);
      if (!stage.in_place) {
        stage.unpack = DeviceMoves<S>(space, unpack);
        stage.recv = message_buffer<T, S>(total, "kshard::redistribute::recv");
      }
      return stage;
    }
    case StepKind::slice: {
      stage.kind = Kind::local;
      MoveList copy;
      copy.add_block(overlaps(mine.rows, need.rows), overlaps(mine.cols, need.cols), 1, from_shard,
                     to_shard);
      stage.unpack = DeviceMoves<S>(space, copy);
      return stage;
    }
    case StepKind::exchange_dim: {
      auto all = [](const std::array<int, N>&) { return true; };
      return compile_exchange<T, S>(space, step.before, step.after, extent, mesh.coords()[m],
                                    member, member, all, mesh.dim_group(m));
    }
    case StepKind::exchange_all: {
      auto coords = [&](int r) { return mesh.coords_of(r); };
      auto wants = [&](const std::array<int, N>& c) {
        for (std::size_t j = 0; j < N; ++j)
          if (zero_dims[j] && c[j] != 0) return false;
        return true;
      };
      return compile_exchange<T, S>(space, step.before, step.after, mesh.size(), mesh.my_rank(),
                                    coords, coords, wants, mesh.group());
    }
  }
  return stage;
}

// Runs one compiled stage on `space`, from `in` to `out`: kernels on the instance, MPI only on
// buffers that instance finished writing (with_mpi_access orders MPI after it).
template <class Space, class T, class S>
void run_stage(const Space& space, const Stage<T, S>& stage, const ShardView<T, S>& in,
               const ShardView<T, S>& out) {
  using Kind = typename Stage<T, S>::Kind;
  switch (stage.kind) {
    case Kind::copy:
      copy_shard(space, out, in);
      return;
    case Kind::local:
      run_moves(space, stage.unpack, out.data(), static_cast<const T*>(nullptr), in.data());
      return;
    case Kind::allreduce:
      if constexpr (reducible_v<T>) stage.group.allreduce(space, in, out, stage.op);
      break;
    case Kind::reduce_scatter:
      if constexpr (reducible_v<T>) {
        run_moves(space, stage.pack, stage.send.data(), in.data(), static_cast<const T*>(nullptr));
        stage.group.reduce_scatter(space, stage.send, out, stage.recv_counts.data(), stage.op);
      }
      break;
    case Kind::allgather:
      if (stage.in_place) {
        stage.group.allgatherv(space, in, out, stage.recv_counts.data(), stage.recv_displs.data());
        return;
      }
      stage.group.allgatherv(space, in, stage.recv, stage.recv_counts.data(),
                             stage.recv_displs.data());
      run_moves(space, stage.unpack, out.data(), static_cast<const T*>(stage.recv.data()),
                static_cast<const T*>(nullptr));
      return;
    case Kind::exchange: {
      // Every element of the output is received or kept, so the kept ones are copied after
      // MPI wrote the output (a staged receive writes the whole view back).
      const auto exchange = [&](const auto& send, const auto& recv) {
        stage.group.alltoallv(space, send, stage.send_counts.data(), stage.send_displs.data(), recv,
                              stage.recv_counts.data(), stage.recv_displs.data());
      };
      const auto exchange_into = [&](const auto& send) {
        if (stage.in_place)
          exchange(send, out);
        else
          exchange(send, stage.recv);
      };
      if (stage.send_in_place) {
        exchange_into(in);
      } else {
        run_moves(space, stage.pack, stage.send.data(), in.data(), static_cast<const T*>(nullptr));
        exchange_into(stage.send);
      }
      run_moves(space, stage.unpack, out.data(), static_cast<const T*>(stage.recv.data()),
                in.data());
      return;
    }
  }
  if constexpr (reducible_v<T>)
    if (stage.divide > 1)
      divide_all(space, out.data(), static_cast<index_t>(out.size()), stage.divide);
}

template <std::size_t N>
bool holds_zeros(const std::array<bool, N>& zero_dims, const std::array<int, N>& coords) {
  for (std::size_t m = 0; m < N; ++m)
    if (zero_dims[m] && coords[m] != 0) return true;
  return false;
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

// Only the plan functions construct plans.
struct PlanKey {
  explicit PlanKey() = default;
};

// Why `target`'s shard may not be written from `matrix`'s on this rank: they share memory.
template <class A, class B>
std::optional<std::string> shared_storage_problem(const A& matrix, const B& target,
                                                  std::string_view who) {
  const auto* in = matrix.local().data();
  const auto* out = target.local().data();
  const auto in_size = matrix.local().size();
  const auto out_size = target.local().size();
  if (in_size == 0 || out_size == 0 || !(in < out + out_size && out < in + in_size))
    return std::nullopt;
  return fmt::format(
      "{}: on rank {} the target's shard shares memory with the matrix's; redistribute into "
      "separate storage",
      who, matrix.mesh().my_rank());
}

template <std::size_t N, std::size_t NT>
std::optional<std::string> check_same_communicator(const Mesh<N>& mesh, const Mesh<NT>& target,
                                                   const char* what) {
  if (mesh.group().same_ranks_as(target.group())) return std::nullopt;
  return fmt::format(
      "kshard::{}: the target {} ({} ranks) is over a different communicator than the "
      "matrix's mesh ({} ranks); both must hold the same processes in the same order",
      operation_name(), what, target.size(), mesh.size());
}

// The stages of one move and the intermediate shards between them, built from the layouts'
// values (actions and reduction ops), not their types: compiled once per element type, memory
// space and pair of mesh ranks, however many layout types a program moves between.
template <class T, class S>
class CompiledMove {
 public:
  template <class Space, std::size_t N, std::size_t NT>
  CompiledMove(const Space& space, const Mesh<N>& mesh, const Mesh<NT>& target_mesh,
               const std::array<MeshDimAction, N>& source_actions,
               const std::array<ReduceOp, N>& source_ops,
               const std::array<MeshDimAction, NT>& target_actions,
               const std::array<ReduceOp, NT>& target_ops, index_t rows, index_t cols,
               bool same_mesh) {
    const Geometry<N> source{source_actions, mesh.shape(), rows, cols};
    if constexpr (N == NT) {
      if (same_mesh) {
        const Plan<N> plan = plan_same_mesh(source, source_ops, target_actions, target_ops);
        for (const Step<N>& step : plan.steps)
          add_stage(compile_step<T, S>(space, mesh, step, plan.zero_dims),
                    step.after.at(mesh.coords()));
        if (plan.steps.empty()) {
          Stage<T, S> copy;
          copy.kind = Stage<T, S>::Kind::copy;
          add_stage(std::move(copy), source.at(mesh.coords()));
        }
        zero_result_ = holds_zeros(plan.zero_dims, mesh.coords());
        finish(mesh.group());
        return;
      }
    }
    // Another mesh: pending reductions resolved on the source mesh, then one exact
    // all-to-all(v) over the communicator.
    Geometry<N> flat = source;
    Geometry<NT> goal{target_actions, target_mesh.shape(), rows, cols};
    std::array<bool, NT> zero_dims{};
    const Plan<N> resolve = plan_resolve_partials(source, source_ops);
    for (std::size_t m = 0; m < N; ++m)
      if (flat.actions[m].kind == PlacementKind::partial) flat.actions[m] = replicate_action();
    for (std::size_t m = 0; m < NT; ++m) {
      if (goal.actions[m].kind != PlacementKind::partial) continue;
      zero_dims[m] = target_ops[m] == ReduceOp::sum && goal.shape[m] > 1;
      goal.actions[m] = replicate_action();
    }
    check_message_size(std::max(flat.max_local_size(), goal.max_local_size()), "redistribute");
    for (const Step<N>& step : resolve.steps)
      add_stage(compile_step<T, S>(space, mesh, step, resolve.zero_dims), flat.at(mesh.coords()));
    auto src_coords = [&](int r) { return mesh.coords_of(r); };
    auto dst_coords = [&](int r) { return target_mesh.coords_of(r); };
    auto wants = [&](const std::array<int, NT>& c) { return !holds_zeros(zero_dims, c); };
    add_stage(compile_exchange<T, S>(space, flat, goal, mesh.size(), mesh.my_rank(), src_coords,
                                     dst_coords, wants, mesh.group()),
              goal.at(target_mesh.coords()));
    zero_result_ = holds_zeros(zero_dims, target_mesh.coords());
    finish(mesh.group());
  }

  // Runs every stage on `space`, from `in` to `out`.
  template <class Space>
  void run(const Space& space, const ShardView<T, S>& in, const ShardView<T, S>& out) const {
    // References, not copies: copying a view counts its reference up and down, atomically, on
    // every apply.
    const auto shard = [&](int index) -> const ShardView<T, S>& {
      return index < 0 ? out : intermediates_[static_cast<std::size_t>(index)];
    };
    for (const auto& stage : stages_)
      run_stage(space, stage, stage.in < 0 ? in : shard(stage.in), shard(stage.out));
    if (zero_result_) Kokkos::deep_copy(space, out, T{});
  }

  [[nodiscard]] std::size_t steps() const { return stages_.size(); }

 private:
  // Appends a stage writing a new intermediate shard of `after`'s extents.
  template <std::size_t M>
  void add_stage(Stage<T, S> stage, const LayoutMapping<M>& after) {
    stage.in = stages_.empty() ? -1 : stages_.back().out;
    stage.out = static_cast<int>(intermediates_.size());
    intermediates_.emplace_back(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::redistribute::step"),
        static_cast<std::size_t>(after.rows.local_extent()),
        static_cast<std::size_t>(after.cols.local_extent()));
    stages_.push_back(std::move(stage));
  }

  // The last stage writes the target itself: its intermediate is not needed. An all-to-all's
  // totals are known to each rank only for itself (one rank may send its shard to many peers):
  // one agreement, where the plan has an exchange, so every rank refuses alike.
  void finish(const comm::Group& group) {
    stages_.back().out = -1;
    intermediates_.pop_back();
    using Kind = typename Stage<T, S>::Kind;
    Agreement agreement(group);
    bool exchanges = false;
    for (const auto& stage : stages_) {
      exchanges = exchanges || stage.kind == Kind::exchange;
      agreement.problem(stage.count_problem);
    }
    if (exchanges) agreement.settle();
  }

  std::vector<Stage<T, S>> stages_;
  std::vector<ShardView<T, S>> intermediates_;
  bool zero_result_ = false;
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
    return detail::uninitialized_matrix<T, ExecSpace, MemSpace>(target_mesh_, target_layout_, rows_,
                                                                cols_);
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

namespace detail {

// The checks of redistribute_into and of plan_redistribute(matrix, target), settled in one
// agreement; `who` names the entry point in messages.
template <class T, class L, class LT, class E, class S>
void agree_into(const DistMatrix<T, L, E, S>& matrix, const DistMatrix<T, LT, E, S>& target,
                const char* who) {
  const auto& mesh = matrix.mesh();
  std::optional<std::string> problem;
  const std::string name = fmt::format("kshard::{}", who);
  if (target.rows() != matrix.rows() || target.cols() != matrix.cols())
    problem = fmt::format("{}: the target is {} x {} but the matrix is {} x {}", name,
                          target.rows(), target.cols(), matrix.rows(), matrix.cols());
  else if (!matrix.local().span_is_contiguous() || !target.local().span_is_contiguous())
    problem = fmt::format("{}: on rank {} a shard is not contiguous", name, mesh.my_rank());
  else if (auto shared = shared_storage_problem(matrix, target, name))
    problem = std::move(shared);
  else
    problem = check_same_communicator(mesh, target.mesh(), "matrix's mesh");
  // The target's shape is checked against the agreed matrix's on each rank, its layout and
  // mesh are agreed on: together, the whole target.
  redistribute_agreement(matrix, target.mesh(), target.layout()).problem(problem).settle();
}

}  // namespace detail

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
