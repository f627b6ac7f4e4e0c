#pragma once

// A compiled move: the stages of one redistribution (the plan's steps, compiled on the same
// mesh or as a mesh change) and the intermediate shards between them, built once and run on
// every apply.

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/detail/element.hpp"
#include "kshard/index.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"
#include "kshard/redistribute/compile.hpp"
#include "kshard/redistribute/moves.hpp"
#include "kshard/redistribute/plan.hpp"

namespace kshard::detail {

template <class T, class MemSpace>
using ShardView = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;

// The reduction of each mesh dimension of layout L (what a Partial there reduces with).
template <class L>
std::array<ReduceOp, L::rank> partial_ops() {
  std::array<ReduceOp, L::rank> ops{};
  for (std::size_t m = 0; m < L::rank; ++m) ops[m] = L::partial_op(m);
  return ops;
}

// Runs an exchange stage from `in` to `out`: every element of the output is received or kept,
// so the kept ones are copied after MPI wrote the output (a staged receive writes the whole
// view back).
template <class Space, class T, class S>
void run_exchange(const Space& space, const Stage<T, S>& stage, const ShardView<T, S>& in,
                  const ShardView<T, S>& out) {
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
  run_moves(space, stage.unpack, out.data(), static_cast<const T*>(stage.recv.data()), in.data());
}

// Runs one compiled stage on `space`, from `in` to `out`: kernels on the instance, MPI only on
// buffers that instance finished writing (with_mpi_access orders MPI after it).
template <class Space, class T, class S>
void run_stage(const Space& space, const Stage<T, S>& stage, const ShardView<T, S>& in,
               const ShardView<T, S>& out) {
  switch (stage.kind) {
    case StageKind::copy:
      copy_shard(space, out, in);
      return;
    case StageKind::local:
      run_moves(space, stage.unpack, out.data(), static_cast<const T*>(nullptr), in.data());
      return;
    case StageKind::allreduce:
      if constexpr (reducible_element<T>()) stage.group.allreduce(space, in, out, stage.op);
      break;
    case StageKind::reduce_scatter:
      if constexpr (reducible_element<T>()) {
        run_moves(space, stage.pack, stage.send.data(), in.data(), static_cast<const T*>(nullptr));
        stage.group.reduce_scatter(space, stage.send, out, stage.recv_counts.data(), stage.op);
      }
      break;
    case StageKind::allgather:
      if (stage.in_place) {
        stage.group.allgatherv(space, in, out, stage.recv_counts.data(), stage.recv_displs.data());
        return;
      }
      stage.group.allgatherv(space, in, stage.recv, stage.recv_counts.data(),
                             stage.recv_displs.data());
      run_moves(space, stage.unpack, out.data(), static_cast<const T*>(stage.recv.data()),
                static_cast<const T*>(nullptr));
      return;
    case StageKind::exchange:
      run_exchange(space, stage, in, out);
      return;
  }
  if constexpr (reducible_element<T>())
    if (stage.divide > 1)
      divide_all(space, out.data(), static_cast<index_t>(out.size()), stage.divide);
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
        compile_same_mesh(space, mesh, source,
                          plan_same_mesh(source, source_ops, target_actions, target_ops));
        return;
      }
    }
    const Geometry<NT> target{target_actions, target_mesh.shape(), rows, cols};
    compile_mesh_change(space, mesh, target_mesh,
                        plan_mesh_change(source, source_ops, target, target_ops));
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
  // The plan's steps on the matrix's mesh; a plain copy when there are none.
  template <class Space, std::size_t N>
  void compile_same_mesh(const Space& space, const Mesh<N>& mesh, const Geometry<N>& source,
                         const Plan<N>& plan) {
    for (const Step<N>& step : plan.steps)
      add_stage(compile_step<T, S>(space, mesh, step, plan.zero_dims),
                step.after.at(mesh.coords()));
    if (plan.steps.empty()) {
      Stage<T, S> copy;
      copy.kind = StageKind::copy;
      add_stage(std::move(copy), source.at(mesh.coords()));
    }
    zero_result_ = holds_zeros(plan.zero_dims, mesh.coords());
    finish(mesh.group());
  }

  // Another mesh: pending reductions resolved on the source mesh, then one exact
  // all-to-all(v) over the communicator.
  template <class Space, std::size_t N, std::size_t NT>
  void compile_mesh_change(const Space& space, const Mesh<N>& mesh, const Mesh<NT>& target_mesh,
                           const MeshChange<N, NT>& change) {
    for (const Step<N>& step : change.resolve.steps)
      add_stage(compile_step<T, S>(space, mesh, step, change.resolve.zero_dims),
                change.flat.at(mesh.coords()));
    auto src_coords = [&](int r) { return mesh.coords_of(r); };
    auto dst_coords = [&](int r) { return target_mesh.coords_of(r); };
    auto wants = [&](const std::array<int, NT>& c) { return !holds_zeros(change.zero_dims, c); };
    add_stage(compile_exchange<T, S>(space, change.flat, change.goal, mesh.size(), mesh.my_rank(),
                                     src_coords, dst_coords, wants, mesh.group()),
              change.goal.at(target_mesh.coords()));
    zero_result_ = holds_zeros(change.zero_dims, target_mesh.coords());
    finish(mesh.group());
  }

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
    Agreement agreement(group);
    bool exchanges = false;
    for (const auto& stage : stages_) {
      exchanges = exchanges || stage.kind == StageKind::exchange;
      agreement.problem(stage.count_problem);
    }
    if (exchanges) agreement.settle();
  }

  std::vector<Stage<T, S>> stages_;
  std::vector<ShardView<T, S>> intermediates_;
  bool zero_result_ = false;
};

}  // namespace kshard::detail
