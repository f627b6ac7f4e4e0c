#pragma once

// Compiling a plan: each step of a redistribution plan becomes a stage with everything it needs
// built once, when the plan is made (the group of its collective, counts and displacements, the
// pack and unpack moves in device memory, the message buffers), so that running it only packs,
// communicates and unpacks.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "kshard/comm/group.hpp"
#include "kshard/comm/mpi.hpp"
#include "kshard/detail/int_limit.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/index.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"
#include "kshard/redistribute/moves.hpp"
#include "kshard/redistribute/plan.hpp"

namespace kshard::detail {

enum class StageKind { copy, allreduce, reduce_scatter, allgather, local, exchange };

// One step of a compiled plan, with everything it needs built once: counts and displacements,
// the pack and unpack moves (in device memory) and the message buffers.
template <class T, class S>
struct Stage {
  StageKind kind = StageKind::local;
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

// ---- The exact exchange ----

// This rank in an exchange: its shard before (`mine`, at source coordinates `coords`) and after
// (`need`, which it may not want: zeros need no data), and the shard ends of its moves.
template <std::size_t NS, std::size_t NT>
struct ExchangeSelf {
  std::array<int, NS> coords;
  LayoutMapping<NS> mine;
  LayoutMapping<NT> need;
  bool wants;
  MoveEnd from_shard;
  MoveEnd to_shard;

  ExchangeSelf(const Geometry<NS>& src, const Geometry<NT>& dst, const std::array<int, NS>& src_at,
               const std::array<int, NT>& dst_at, bool wants_data)
      : coords(src_at),
        mine(src.at(src_at)),
        need(dst.at(dst_at)),
        wants(wants_data),
        from_shard(shard_end(true, mine.cols.local_extent())),
        to_shard(shard_end(false, need.cols.local_extent())) {}
};

// Whether source coordinates `a` and `b` agree on every dimension of `src` that does not split
// (Replicate or Partial: the same replica, the same addend).
template <std::size_t NS>
bool same_replica(const Geometry<NS>& src, const std::array<int, NS>& a,
                  const std::array<int, NS>& b) {
  for (std::size_t m = 0; m < NS; ++m)
    if (!src.splits(m) && a[m] != b[m]) return false;
  return true;
}

// What this rank sends to and receives from each peer: one move list per peer and side (to see
// whether each peer's block is one contiguous run of the shard), the counts, and this rank's
// totals. Each count is at most a shard (the planner checked every shard against INT_MAX on
// every rank); the totals, and with them the displacements, are this rank's alone.
struct PeerBlocks {
  std::vector<MoveList> packs, unpacks;
  std::vector<int> send_counts, recv_counts;
  index_t sent = 0;
  index_t received = 0;

  explicit PeerBlocks(int peers)
      : packs(static_cast<std::size_t>(peers)),
        unpacks(static_cast<std::size_t>(peers)),
        send_counts(static_cast<std::size_t>(peers), 0),
        recv_counts(static_cast<std::size_t>(peers), 0) {}

  // The block of `self`'s shard that peer p holds after the move (`theirs`), sent to it.
  template <std::size_t NS, std::size_t NT>
  void add_send(std::size_t p, const ExchangeSelf<NS, NT>& self, const LayoutMapping<NT>& theirs) {
    const index_t k = packs[p].add_block(self.mine, theirs, 0, self.from_shard, buffer_end(sent));
    send_counts[p] = mpi_count(k);
    sent += k;
  }

  // The block of peer p's shard before the move (`from`) that `self` needs, received from it.
  template <std::size_t NS, std::size_t NT>
  void add_receive(std::size_t p, const ExchangeSelf<NS, NT>& self, const LayoutMapping<NS>& from) {
    const index_t k = unpacks[p].add_block(from, self.need, 0, buffer_end(received), self.to_shard);
    recv_counts[p] = mpi_count(k);
    received += k;
  }
};

// Whether every peer's block is at most one run of the shard: then MPI reads or writes the shard
// itself, with no pack or unpack.
inline bool one_run_each(const std::vector<MoveList>& lists) {
  for (const MoveList& list : lists)
    if (list.moves().size() > 1) return false;
  return true;
}

// One side's blocks as one list for its kernel, in peer order (as the displacements count them);
// `in_place`, none: each peer's displacement is where its run lies in the shard (`from`, when
// sending).
inline MoveList peer_moves(const std::vector<MoveList>& lists, bool in_place, bool sending,
                           std::vector<int>& displs) {
  MoveList merged;
  for (std::size_t p = 0; p < lists.size(); ++p) {
    if (!in_place)
      merged.append(lists[p]);
    else if (!lists[p].empty())
      displs[p] = mpi_count(sending ? lists[p].moves()[0].from : lists[p].moves()[0].to);
  }
  return merged;
}

// The messages of an exchange from its peer blocks: displacements in peer order (as `sent` and
// `received` counted them), MPI on the shards themselves where each peer's block is one run,
// otherwise a pack and an unpack kernel over message buffers; the unpack also copies what this
// rank keeps.
template <class T, class S, class Space, std::size_t NS, std::size_t NT>
void lay_out_messages(const Space& space, const PeerBlocks& blocks,
                      const ExchangeSelf<NS, NT>& self, Stage<T, S>& stage) {
  stage.send_displs.assign(blocks.send_counts.size(), 0);
  stage.recv_displs.assign(blocks.recv_counts.size(), 0);
  std::exclusive_scan(stage.send_counts.begin(), stage.send_counts.end(), stage.send_displs.begin(),
                      0);
  std::exclusive_scan(stage.recv_counts.begin(), stage.recv_counts.end(), stage.recv_displs.begin(),
                      0);
  stage.send_in_place = one_run_each(blocks.packs);
  stage.in_place = one_run_each(blocks.unpacks);
  const MoveList pack = peer_moves(blocks.packs, stage.send_in_place, true, stage.send_displs);
  MoveList unpack = peer_moves(blocks.unpacks, stage.in_place, false, stage.recv_displs);
  if (self.wants)  // what this rank already holds: a local copy in the unpack kernel
    unpack.add_block(self.mine, self.need, 1, self.from_shard, self.to_shard);
  stage.pack = DeviceMoves<S>(space, pack);
  stage.unpack = DeviceMoves<S>(space, unpack);
  if (!stage.send_in_place)
    stage.send = message_buffer<T, S>(blocks.sent, "kshard::redistribute::send");
  if (!stage.in_place)
    stage.recv = message_buffer<T, S>(blocks.received, "kshard::redistribute::recv");
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
  const std::array<int, NT> my_dst = dst_coords(self);
  const ExchangeSelf<NS, NT> me(src, dst, src_coords(self), my_dst, wants(my_dst));
  PeerBlocks blocks(peers);
  for (int t = 0; t < peers; ++t) {
    if (t == self) continue;
    const std::array<int, NS> t_src = src_coords(t);
    if (!same_replica(src, me.coords, t_src)) continue;
    const std::array<int, NT> t_dst = dst_coords(t);
    const auto p = static_cast<std::size_t>(t);
    if (wants(t_dst)) blocks.add_send(p, me, dst.at(t_dst));
    if (me.wants) blocks.add_receive(p, me, src.at(t_src));
  }
  Stage<T, S> stage;
  stage.kind = StageKind::exchange;
  stage.group = group;
  stage.send_counts = blocks.send_counts;
  stage.recv_counts = blocks.recv_counts;
  stage.count_problem = int_limit_problem(std::max(blocks.sent, blocks.received), operation_name(),
                                          "the number of elements this rank sends or receives in "
                                          "one all-to-all");
  if (!stage.count_problem) lay_out_messages(space, blocks, me, stage);
  return stage;
}

// ---- One step on one mesh dimension ----

// The coordinates of member k of this rank's group along mesh dimension m.
template <std::size_t N>
std::array<int, N> group_member(const Mesh<N>& mesh, std::size_t m, int k) {
  std::array<int, N> c = mesh.coords();
  c[m] = k;
  return c;
}

// A stage of `kind` over the group of the step's mesh dimension, with the step's reduction.
template <class T, class S, std::size_t N>
Stage<T, S> dim_stage(const Mesh<N>& mesh, const Step<N>& step, StageKind kind) {
  Stage<T, S> stage;
  stage.kind = kind;
  stage.group = mesh.dim_group(step.dim);
  stage.op = step.op;
  return stage;
}

// The divisor of a reduction's result: the group's size for Partial<avg>, else none.
template <std::size_t N>
int average_divisor(const Mesh<N>& mesh, const Step<N>& step) {
  return step.op == ReduceOp::avg ? mesh.extent(step.dim) : 0;
}

// Partial -> Shard: this rank packs, in member order, the block of its shard each member of its
// group holds afterwards; MPI reduces and scatters them.
template <class T, class S, class Space, std::size_t N>
Stage<T, S> compile_reduce_scatter(const Space& space, const Mesh<N>& mesh, const Step<N>& step) {
  Stage<T, S> stage = dim_stage<T, S>(mesh, step, StageKind::reduce_scatter);
  stage.divide = average_divisor(mesh, step);
  const int extent = mesh.extent(step.dim);
  stage.recv_counts.assign(static_cast<std::size_t>(extent), 0);
  const LayoutMapping<N> mine = step.before.at(mesh.coords());
  const MoveEnd from_shard = shard_end(true, mine.cols.local_extent());
  MoveList pack;
  index_t total = 0;
  for (int k = 0; k < extent; ++k) {
    const LayoutMapping<N> theirs = step.after.at(group_member(mesh, step.dim, k));
    const index_t n = pack.add_block(mine, theirs, 0, from_shard, buffer_end(total));
    stage.recv_counts[static_cast<std::size_t>(k)] = mpi_count(n);
    total += n;
  }
  stage.pack = DeviceMoves<S>(space, pack);
  stage.send = message_buffer<T, S>(total, "kshard::redistribute::send");
  return stage;
}

// Shard -> Replicate: every member's shard is gathered, then unpacked into this rank's.
template <class T, class S, class Space, std::size_t N>
Stage<T, S> compile_allgather(const Space& space, const Mesh<N>& mesh, const Step<N>& step) {
  Stage<T, S> stage = dim_stage<T, S>(mesh, step, StageKind::allgather);
  const int extent = mesh.extent(step.dim);
  stage.recv_counts.assign(static_cast<std::size_t>(extent), 0);
  stage.recv_displs.assign(static_cast<std::size_t>(extent), 0);
  const LayoutMapping<N> need = step.after.at(mesh.coords());
  const MoveEnd to_shard = shard_end(false, need.cols.local_extent());
  MoveList unpack;
  index_t total = 0;
  for (int k = 0; k < extent; ++k) {
    const LayoutMapping<N> theirs = step.before.at(group_member(mesh, step.dim, k));
    const auto p = static_cast<std::size_t>(k);
    stage.recv_displs[p] = mpi_count(total);
    stage.recv_counts[p] = mpi_count(theirs.local_size());
    // Every element the member holds is needed here, in its local (= global) order.
    unpack.add_block(theirs, need, 0, buffer_end(total), to_shard);
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

// Replicate -> Shard: a local copy of the part this rank keeps, no communication.
template <class T, class S, class Space, std::size_t N>
Stage<T, S> compile_slice(const Space& space, const Mesh<N>& mesh, const Step<N>& step) {
  Stage<T, S> stage = dim_stage<T, S>(mesh, step, StageKind::local);
  const LayoutMapping<N> mine = step.before.at(mesh.coords());
  const LayoutMapping<N> need = step.after.at(mesh.coords());
  MoveList copy;
  copy.add_block(mine, need, 1, shard_end(true, mine.cols.local_extent()),
                 shard_end(false, need.cols.local_extent()));
  stage.unpack = DeviceMoves<S>(space, copy);
  return stage;
}

// Compiles one single-mesh-dimension step (or the whole-mesh exchange) from this rank's shard in
// step.before to its shard in step.after.
template <class T, class S, class Space, std::size_t N>
Stage<T, S> compile_step(const Space& space, const Mesh<N>& mesh, const Step<N>& step,
                         const std::array<bool, N>& zero_dims) {
  switch (step.kind) {
    case StepKind::allreduce: {
      Stage<T, S> stage = dim_stage<T, S>(mesh, step, StageKind::allreduce);
      stage.divide = average_divisor(mesh, step);
      return stage;
    }
    case StepKind::reduce_scatter:
      return compile_reduce_scatter<T, S>(space, mesh, step);
    case StepKind::allgather:
      return compile_allgather<T, S>(space, mesh, step);
    case StepKind::slice:
      return compile_slice<T, S>(space, mesh, step);
    case StepKind::exchange_dim: {
      const std::size_t m = step.dim;
      auto member = [&](int k) { return group_member(mesh, m, k); };
      auto all = [](const std::array<int, N>&) { return true; };
      return compile_exchange<T, S>(space, step.before, step.after, mesh.extent(m),
                                    mesh.coords()[m], member, member, all, mesh.dim_group(m));
    }
    case StepKind::exchange_all: {
      auto coords = [&](int r) { return mesh.coords_of(r); };
      auto wants = [&](const std::array<int, N>& c) { return !holds_zeros(zero_dims, c); };
      return compile_exchange<T, S>(space, step.before, step.after, mesh.size(), mesh.my_rank(),
                                    coords, coords, wants, mesh.group());
    }
  }
  return dim_stage<T, S>(mesh, step, StageKind::local);
}

}  // namespace kshard::detail
