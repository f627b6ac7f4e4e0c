#pragma once

// Planning a redistribution: which steps (one mesh dimension at a time, or one exact exchange
// over the whole mesh) move a matrix from one layout to another, and which elements each rank
// sends to each other rank. Pure arithmetic on global data (no MPI, no Kokkos): every rank
// computes the same plan, so a plan-time error is the same on every rank.

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "kshard/detail/int_limit.hpp"
#include "kshard/error.hpp"
#include "kshard/index.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/placement.hpp"

namespace kshard::detail {

// A layout with its mesh shape and matrix shape: enough to map any coordinate.
template <std::size_t N>
struct Geometry {
  std::array<MeshDimAction, N> actions{};
  std::array<int, N> shape{};
  index_t rows = 0;
  index_t cols = 0;

  [[nodiscard]] LayoutMapping<N> at(const std::array<int, N>& coords) const {
    return map_layout(actions, shape, coords, rows, cols);
  }
  [[nodiscard]] int size() const {
    int n = 1;
    for (int e : shape) n *= e;
    return n;
  }
  // Coordinates of linear (row-major) rank `r`, as Mesh::coords_of.
  [[nodiscard]] std::array<int, N> coords(int r) const { return mesh_coords(shape, r); }
  // Distance between the linear ranks of neighbours along mesh dimension m.
  [[nodiscard]] int stride(std::size_t m) const {
    int s = 1;
    for (std::size_t j = m + 1; j < N; ++j) s *= shape[j];
    return s;
  }
  // True when mesh dimension m splits a tensor dimension.
  [[nodiscard]] bool splits(std::size_t m) const { return actions[m].tensor_dim >= 0; }
  // Largest local shard over all coordinates.
  [[nodiscard]] index_t max_local_size() const {
    index_t most = 0;
    for (int r = 0; r < size(); ++r) most = std::max(most, at(coords(r)).local_size());
    return most;
  }
};

// Global indices held by both `a` and `b`, as runs, with their local index on each side.
struct Overlap {
  index_t global_begin = 0;
  index_t a_local = 0;
  index_t b_local = 0;
  index_t size = 0;
};

template <std::size_t A, std::size_t B>
std::vector<Overlap> overlaps(const AxisMap<A>& a, const AxisMap<B>& b) {
  const std::vector<IndexRun> ra = a.runs();
  const std::vector<IndexRun> rb = b.runs();
  std::vector<Overlap> result;
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < ra.size() && j < rb.size()) {
    const index_t lo = std::max(ra[i].global_begin, rb[j].global_begin);
    const index_t hi = std::min(ra[i].global_end(), rb[j].global_end());
    if (lo < hi)
      result.push_back({lo, ra[i].local_begin + (lo - ra[i].global_begin),
                        rb[j].local_begin + (lo - rb[j].global_begin), hi - lo});
    if (ra[i].global_end() < rb[j].global_end())
      ++i;
    else
      ++j;
  }
  return result;
}

inline index_t total_size(const std::vector<Overlap>& runs) {
  index_t n = 0;
  for (const Overlap& o : runs) n += o.size;
  return n;
}

// Number of matrix elements held by both mappings.
template <std::size_t A, std::size_t B>
index_t overlap_elements(const LayoutMapping<A>& a, const LayoutMapping<B>& b) {
  if (a.local_size() == 0 || b.local_size() == 0) return 0;
  return total_size(overlaps(a.rows, b.rows)) * total_size(overlaps(a.cols, b.cols));
}

// What one step of a redistribution does to the local shards.
enum class StepKind {
  allreduce,       // Partial -> Replicate on dim_comm(m): all-reduce
  reduce_scatter,  // Partial -> Shard on dim_comm(m): reduce-scatter
  allgather,       // Shard -> Replicate on dim_comm(m): all-gather(v)
  slice,           // Replicate -> Shard: local copy, no communication
  exchange_dim,    // Shard -> another split on dim_comm(m): exact all-to-all(v)
  exchange_all,    // anything else: exact all-to-all(v) over the whole mesh
};

template <std::size_t N>
struct Step {
  StepKind kind = StepKind::slice;
  std::size_t dim = 0;          // mesh dimension (not for exchange_all)
  ReduceOp op = ReduceOp::sum;  // allreduce and reduce_scatter
  Geometry<N> before;
  Geometry<N> after;
};

template <std::size_t N>
struct Plan {
  std::vector<Step<N>> steps;
  // Mesh dimensions where the target creates a Partial<sum>: coordinates != 0 end with zeros
  // and need no data.
  std::array<bool, N> zero_dims{};
};

// True when the two placements hold the same data on a mesh dimension of `extent` ranks:
// splits by the same rule and factor (Shard is StridedShard with one piece), and on one rank
// every placement holds everything.
inline bool same_data(const MeshDimAction& a, ReduceOp a_op, const MeshDimAction& b, ReduceOp b_op,
                      int extent) {
  if (extent == 1) return true;
  if (a.kind == PlacementKind::partial || b.kind == PlacementKind::partial)
    return a.kind == b.kind && a_op == b_op;
  if (a.tensor_dim != b.tensor_dim) return false;
  return a.tensor_dim < 0 || (a.split_rule == b.split_rule && a.split_factor == b.split_factor);
}

inline void check_message_size(index_t elements, const char* who) {
  checked_int(elements, who, "a shard's element count (sent as one MPI message)");
}

struct StepChoice {
  bool valid = false;
  StepKind kind = StepKind::slice;
  std::int64_t cost = 0;  // elements sent, summed over all ranks
};

// Can mesh dimension m go from `before` to `after` (which differ only there) inside each
// dim_comm(m) group, i.e. does every rank's new shard come from its own group? If so, with
// which collective, and at what cost. Exact: uses every coordinate's index maps.
template <std::size_t N>
StepChoice choose_step(const Geometry<N>& before, const Geometry<N>& after, std::size_t m) {
  const int ranks = before.size();
  const int extent = before.shape[m];
  const int stride = before.stride(m);
  std::vector<LayoutMapping<N>> src(static_cast<std::size_t>(ranks));
  std::vector<LayoutMapping<N>> dst(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    src[static_cast<std::size_t>(r)] = before.at(before.coords(r));
    dst[static_cast<std::size_t>(r)] = after.at(after.coords(r));
  }
  const PlacementKind from = before.actions[m].kind;
  const bool from_split = before.splits(m);
  bool everyone_needs_all = true;  // each group member needs every element the group holds
  std::int64_t gather_cost = 0;
  std::int64_t exchange_cost = 0;
  std::int64_t scatter_cost = 0;
  for (int r = 0; r < ranks; ++r) {
    const auto& mine = src[static_cast<std::size_t>(r)];
    const auto& need = dst[static_cast<std::size_t>(r)];
    const index_t needed = need.local_size();
    index_t covered = 0;
    if (!from_split) {
      // Replicate or Partial along m: every member of the group holds the same indices.
      covered = overlap_elements(need, mine);
      scatter_cost += mine.local_size() - needed;
    } else {
      // The split along m partitions what the group holds: count each member's share.
      const int c = before.coords(r)[m];
      index_t held = 0;
      for (int k = 0; k < extent; ++k) {
        const auto q = static_cast<std::size_t>(r + (k - c) * stride);
        covered += overlap_elements(need, src[q]);
        held += src[q].local_size();
        if (static_cast<int>(q) != r) exchange_cost += overlap_elements(mine, dst[q]);
      }
      everyone_needs_all = everyone_needs_all && held == needed;
      gather_cost += mine.local_size();
    }
    if (covered != needed) return {};
  }
  if (from == PlacementKind::replicate) return {true, StepKind::slice, 0};
  if (from == PlacementKind::partial) return {true, StepKind::reduce_scatter, scatter_cost};
  if (after.actions[m].kind == PlacementKind::replicate && everyone_needs_all)
    return {true, StepKind::allgather, gather_cost};
  return {true, StepKind::exchange_dim, exchange_cost};
}

inline MeshDimAction replicate_action() { return MeshDimAction{}; }

// A plan being built: its steps so far and the data layout they reach, with the reduction of
// each mesh dimension.
template <std::size_t N>
struct PlanBuilder {
  Plan<N> plan;
  Geometry<N> cur;
  std::array<ReduceOp, N> cur_ops{};

  // Appends a step from the current layout to `next` on mesh dimension m.
  void push(StepKind kind, std::size_t m, ReduceOp op, const Geometry<N>& next) {
    check_message_size(std::max(cur.max_local_size(), next.max_local_size()), "redistribute");
    plan.steps.push_back(Step<N>{kind, m, op, cur, next});
    cur = next;
  }
};

// The source's Partial dims that the target does not keep, resolved: by a reduce-scatter where
// the target shard lies inside what the group holds, else by an all-reduce.
template <std::size_t N>
void resolve_pending_reductions(PlanBuilder<N>& builder, const std::array<ReduceOp, N>& src_ops,
                                const std::array<MeshDimAction, N>& target,
                                const std::array<ReduceOp, N>& target_ops) {
  Geometry<N>& cur = builder.cur;
  for (std::size_t m = 0; m < N; ++m) {
    if (cur.actions[m].kind != PlacementKind::partial) continue;
    const bool keep = target[m].kind == PlacementKind::partial && target_ops[m] == src_ops[m];
    if (keep) continue;
    if (cur.shape[m] == 1) {  // one addend: it is the value
      cur.actions[m] = target[m];
      builder.cur_ops[m] = target_ops[m];
      continue;
    }
    Geometry<N> next = cur;
    if (target[m].tensor_dim >= 0) {
      next.actions[m] = target[m];
      if (choose_step(cur, next, m).valid) {
        builder.push(StepKind::reduce_scatter, m, src_ops[m], next);
        continue;
      }
    }
    next.actions[m] = replicate_action();
    builder.push(StepKind::allreduce, m, src_ops[m], next);
  }
}

// The data layout to reach: the target, its Partial dims not kept Replicate for now (they come
// last and locally, see zero_dims).
template <std::size_t N>
std::array<MeshDimAction, N> data_goal(PlanBuilder<N>& builder,
                                       const std::array<MeshDimAction, N>& target,
                                       const std::array<ReduceOp, N>& target_ops) {
  std::array<MeshDimAction, N> goal = target;
  for (std::size_t m = 0; m < N; ++m) {
    if (target[m].kind != PlacementKind::partial) continue;
    if (builder.cur.actions[m].kind == PlacementKind::partial) continue;  // kept (or one rank)
    goal[m] = replicate_action();
    builder.plan.zero_dims[m] = target_ops[m] == ReduceOp::sum && builder.cur.shape[m] > 1;
  }
  return goal;
}

// The mesh dimensions whose data must move to reach `goal`; the others hold the same indices
// already and are relabelled.
template <std::size_t N>
std::vector<std::size_t> dims_to_move(PlanBuilder<N>& builder,
                                      const std::array<MeshDimAction, N>& goal,
                                      const std::array<ReduceOp, N>& target_ops) {
  Geometry<N>& cur = builder.cur;
  std::vector<std::size_t> dims;
  for (std::size_t m = 0; m < N; ++m) {
    if (same_data(cur.actions[m], builder.cur_ops[m], goal[m], target_ops[m], cur.shape[m]))
      cur.actions[m] = goal[m];
    else
      dims.push_back(m);
  }
  return dims;
}

// Steps of one mesh dimension each, and what they send in all.
template <std::size_t N>
struct StepSequence {
  std::vector<Step<N>> steps;
  std::int64_t cost = 0;
};

// The steps moving `dims` from `from` to `goal` one at a time, in that order; nullopt when one
// of them cannot stay inside its dimension's groups.
template <std::size_t N>
std::optional<StepSequence<N>> steps_in_order(const Geometry<N>& from,
                                              const std::array<MeshDimAction, N>& goal,
                                              const std::vector<std::size_t>& dims) {
  StepSequence<N> sequence;
  Geometry<N> g = from;
  for (std::size_t m : dims) {
    Geometry<N> next = g;
    next.actions[m] = goal[m];
    const StepChoice choice = choose_step(g, next, m);
    if (!choice.valid) return std::nullopt;
    sequence.steps.push_back(Step<N>{choice.kind, m, ReduceOp::sum, g, next});
    sequence.cost += choice.cost;
    g = next;
  }
  return sequence;
}

// The cheapest order of per-dimension steps over every order of `dims`; no steps when no order
// keeps every step inside its dimension's groups.
template <std::size_t N>
std::vector<Step<N>> cheapest_steps(const Geometry<N>& from,
                                    const std::array<MeshDimAction, N>& goal,
                                    std::vector<std::size_t> dims) {
  std::vector<Step<N>> best;
  std::int64_t best_cost = std::numeric_limits<std::int64_t>::max();
  do {
    std::optional<StepSequence<N>> sequence = steps_in_order(from, goal, dims);
    if (sequence && sequence->cost < best_cost) {
      best = std::move(sequence->steps);
      best_cost = sequence->cost;
    }
  } while (std::next_permutation(dims.begin(), dims.end()));
  return best;
}

// Same mesh: resolve the source's Partial dims that the target does not keep, then move the
// other dims one at a time with per-dim collectives in the cheapest valid order, or, where no
// order keeps every step inside the dims' groups, with one exact all-to-all over the mesh.
// Target Partial dims come last and locally (see zero_dims).
template <std::size_t N>
Plan<N> plan_same_mesh(const Geometry<N>& source, const std::array<ReduceOp, N>& src_ops,
                       const std::array<MeshDimAction, N>& target,
                       const std::array<ReduceOp, N>& target_ops) {
  PlanBuilder<N> builder{{}, source, src_ops};
  resolve_pending_reductions(builder, src_ops, target, target_ops);
  const std::array<MeshDimAction, N> goal = data_goal(builder, target, target_ops);
  const std::vector<std::size_t> dims = dims_to_move(builder, goal, target_ops);
  if (dims.empty()) return builder.plan;
  const std::vector<Step<N>> steps = cheapest_steps(builder.cur, goal, dims);
  for (const Step<N>& s : steps) builder.push(s.kind, s.dim, s.op, s.after);
  if (steps.empty()) {
    Geometry<N> next = builder.cur;
    next.actions = goal;
    builder.push(StepKind::exchange_all, 0, ReduceOp::sum, next);
  }
  return builder.plan;
}

// Another mesh: every pending reduction is resolved on the source mesh (all-reduce), then one
// exact all-to-all over the common communicator moves the data (the caller does that step).
template <std::size_t N>
Plan<N> plan_resolve_partials(Geometry<N> cur, const std::array<ReduceOp, N>& src_ops) {
  Plan<N> plan;
  for (std::size_t m = 0; m < N; ++m) {
    if (cur.actions[m].kind != PlacementKind::partial) continue;
    Geometry<N> next = cur;
    next.actions[m] = replicate_action();
    if (cur.shape[m] > 1) {
      check_message_size(next.max_local_size(), "redistribute");
      plan.steps.push_back(Step<N>{StepKind::allreduce, m, src_ops[m], cur, next});
    }
    cur = next;
  }
  return plan;
}

// Whether coordinates `coords` hold zeros: != 0 on a dimension where the target creates a
// Partial<sum>, which keeps the value on coordinate 0 only.
template <std::size_t N>
bool holds_zeros(const std::array<bool, N>& zero_dims, const std::array<int, N>& coords) {
  for (std::size_t m = 0; m < N; ++m)
    if (zero_dims[m] && coords[m] != 0) return true;
  return false;
}

// A move to another mesh: the source's pending reductions resolved on the source mesh
// (`resolve`, which ends in `flat`), then one exact all-to-all over the common communicator from
// `flat` to `goal`, the target with its Partial dims Replicate; coordinates that hold zeros
// (`zero_dims`) receive nothing.
template <std::size_t N, std::size_t NT>
struct MeshChange {
  Plan<N> resolve;
  Geometry<N> flat;
  Geometry<NT> goal;
  std::array<bool, NT> zero_dims{};
};

template <std::size_t N, std::size_t NT>
MeshChange<N, NT> plan_mesh_change(const Geometry<N>& source,
                                   const std::array<ReduceOp, N>& src_ops,
                                   const Geometry<NT>& target,
                                   const std::array<ReduceOp, NT>& target_ops) {
  MeshChange<N, NT> change{plan_resolve_partials(source, src_ops), source, target, {}};
  for (std::size_t m = 0; m < N; ++m)
    if (change.flat.actions[m].kind == PlacementKind::partial)
      change.flat.actions[m] = replicate_action();
  for (std::size_t m = 0; m < NT; ++m) {
    if (change.goal.actions[m].kind != PlacementKind::partial) continue;
    change.zero_dims[m] = target_ops[m] == ReduceOp::sum && change.goal.shape[m] > 1;
    change.goal.actions[m] = replicate_action();
  }
  check_message_size(std::max(change.flat.max_local_size(), change.goal.max_local_size()),
                     "redistribute");
  return change;
}

}  // namespace kshard::detail
