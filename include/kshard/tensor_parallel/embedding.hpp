#pragma once

/// \file
/// The vocabulary-parallel embedding lookup (Megatron's `VocabParallelEmbedding`) and its
/// backward, over one mesh dimension, the "tp" dimension. Part of kshard/tensor_parallel.hpp,
/// whose conventions apply.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/bfloat16.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/float16.hpp"
#include "kshard/format.hpp"
#include "kshard/kernels/copies.hpp"
#include "kshard/tensor_parallel/checks.hpp"
#include "kshard/tensor_parallel/region.hpp"
#include "kshard/tensor_parallel/tp_dim.hpp"

namespace kshard {

/// Element type of `vocab_parallel_lookup`'s output for a table of `T`: the table's own type for
/// float and double, float for bf16 and f16 (the lookup's sum and scale are done in float, and
/// 16-bit activations are rarely what the next layer wants).
template <class T>
using lookup_value_t = compute_type_t<T>;

/// The view the returning lookup forms give: `N x H`, row-major, of `lookup_value_t` in the
/// memory space of table type `M`.
template <class M>
using lookup_view_t = Kokkos::View<lookup_value_t<typename M::value_type>**, Kokkos::LayoutRight,
                                   typename M::memory_space>;

namespace detail {

// The type rules of the lookup and its backward on ExecSpace: the table's layout and element
// type, and rank-1 int32 or int64 ids that ExecSpace can read.
template <class ExecSpace, class M, class IdView>
constexpr void check_lookup_types() {
  using T = typename M::value_type;
  static_assert(tp_layout_v<typename M::layout_type, 0>,
                "kshard::vocab_parallel_lookup(_backward): the table's rows must be split over "
                "exactly one mesh dimension (the tp dimension), its columns not at all, and every "
                "other mesh dimension must Replicate it");
  static_assert(tp_float_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>,
                "kshard::vocab_parallel_lookup(_backward): the table must hold float, double, "
                "bf16 or f16");
  static_assert(is_view_of_rank<IdView>(1),
                "kshard::vocab_parallel_lookup(_backward): ids must be a rank-1 Kokkos::View");
  if constexpr (is_view_of_rank<IdView>(1)) {
    using Id = typename IdView::non_const_value_type;
    static_assert(std::is_same_v<Id, std::int32_t> || std::is_same_v<Id, std::int64_t>,
                  "kshard::vocab_parallel_lookup(_backward): ids must be int32 or int64");
    static_assert(
        Kokkos::SpaceAccessibility<ExecSpace, typename IdView::memory_space>::accessible,
        "kshard::vocab_parallel_lookup(_backward): ids must be readable from the execution "
        "space it runs on");
  }
}

// The ids of a lookup in two numbers for the range check and one for the agreement.
struct IdSummary {
  index_t min = 0;
  index_t max = -1;
  std::int64_t digest = 0;  // equal lists give equal digests; different ones almost never do
};

template <class IdView>
struct IdRange {
  IdView ids;
  KOKKOS_INLINE_FUNCTION void operator()(index_t i, Kokkos::MinMaxScalar<index_t>& r) const {
    const auto id = static_cast<index_t>(ids(i));
    if (id < r.min_val) r.min_val = id;
    if (id > r.max_val) r.max_val = id;
  }
};

template <class IdView>
struct IdDigest {
  IdView ids;
  KOKKOS_INLINE_FUNCTION void operator()(index_t i, std::uint64_t& sum) const {
    sum += mix_id(static_cast<std::uint64_t>(ids(i)), static_cast<std::uint64_t>(i));
  }
};

// The lookup's kernel, one team per id (a league of N): out(i, :) = scale * the local row of
// ids(i), or zeros where this rank does not hold it.
template <class Rows, class Local, class IdView, class OutView>
struct LookupRows {
  using Out = typename OutView::non_const_value_type;
  Rows rows;
  Local local;
  IdView ids;
  OutView out;
  Out scale;
  index_t cols;
  template <class Team>
  KOKKOS_INLINE_FUNCTION void operator()(const Team& team) const {
    const index_t i = team.league_rank();
    const index_t l = rows.to_local(static_cast<index_t>(ids(i)));
    if (l == invalid_index)
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols),
                           [&](const index_t j) { out(i, j) = Out(0); });
    else
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](const index_t j) {
        out(i, j) = static_cast<Out>(local(l, j)) * scale;
      });
  }
};

// Range and digest of `ids`: two reductions over the N ids on `space` (each waits for its
// result).
template <class ExecSpace, class IdView>
IdSummary summarize_ids(const ExecSpace& space, const IdView& ids) {
  const auto n = static_cast<index_t>(ids.extent(0));
  IdSummary summary;
  if (n == 0) return summary;
  const Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>> all(space, 0, n);
  Kokkos::MinMaxScalar<index_t> range{};
  Kokkos::parallel_reduce("kshard::id_range", all, IdRange<IdView>{ids},
                          Kokkos::MinMax<index_t>(range));
  std::uint64_t digest = 0;
  Kokkos::parallel_reduce("kshard::id_digest", all, IdDigest<IdView>{ids}, digest);
  return {range.min_val, range.max_val, std::bit_cast<std::int64_t>(digest)};
}

// An id outside [0, vocab), named: the smallest when it is negative, else the largest.
inline std::optional<std::string> ids_problem(const IdSummary& ids, index_t vocab,
                                              const char* who) {
  if (ids.max < ids.min) return std::nullopt;  // no ids
  auto problem = id_range_problem(ids.min < 0 ? ids.min : ids.max, vocab, who);
  if (problem) *problem += "; nothing was written";
  return problem;
}

// The backward's positions grouped by the local row of their id: `row_of(u)` is the u-th
// touched local row (in increasing order) and positions(begin_of(u) .. begin_of(u + 1)) its
// positions, in increasing order.
template <class MemSpace>
struct TouchedRows {
  Kokkos::View<index_t*, MemSpace> row_of;
  Kokkos::View<index_t*, MemSpace> begin_of;
  Kokkos::View<index_t*, MemSpace> position;
  index_t count = 0;
};

// The backward's kernel over (touched row u, column j): adds scale * the sum, in position order,
// of grad_output(p, j) over u's positions p to local(row_of(u), j).
template <class Local, class GradView, class MemSpace>
struct AddTouchedRows {
  using T = typename Local::value_type;
  using Out = typename GradView::non_const_value_type;
  TouchedRows<MemSpace> touched;
  Local local;
  GradView grad_output;
  Out scale;
  KOKKOS_INLINE_FUNCTION void operator()(index_t u, index_t j) const {
    Out sum = Out(0);
    for (index_t q = touched.begin_of(u); q < touched.begin_of(u + 1); ++q)
      sum += scale * grad_output(touched.position(q), j);
    const index_t l = touched.row_of(u);
    local(l, j) = static_cast<T>(static_cast<Out>(local(l, j)) + sum);
  }
};

// Builds TouchedRows on the host from the ids (copied there on `space`), then copies it to
// `MemSpace` (in one upload, none when no row is touched or `upload` is false); throws on an id
// outside [0, vocab). Positions whose id is `padding_id` are left out.
template <class MemSpace, class ExecSpace, class Rows, class IdView>
TouchedRows<MemSpace> touched_rows(const ExecSpace& space, const Rows& rows, const IdView& ids,
                                   index_t vocab, std::optional<index_t> padding_id, bool upload,
                                   const char* who) {
  const auto n = static_cast<index_t>(ids.extent(0));
  const auto host_ids =
      to_host(space, ids, "kshard::vocab_parallel_lookup_backward: the ids, for the host");
  std::vector<std::pair<index_t, index_t>> hits;  // (local row, position)
  for (index_t i = 0; i < n; ++i) {
    const auto id = static_cast<index_t>(host_ids(static_cast<std::size_t>(i)));
    if (auto problem = id_range_problem(id, vocab, who))
      throw error(*problem + "; nothing was written");
    if (padding_id && id == *padding_id) continue;
    if (const index_t l = rows.to_local(id); l != invalid_index) hits.emplace_back(l, i);
  }
  std::stable_sort(hits.begin(), hits.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<index_t> touched;
  std::vector<index_t> offsets;
  std::vector<index_t> positions;
  positions.reserve(hits.size());
  for (const auto& [l, i] : hits) {
    if (touched.empty() || touched.back() != l) {
      touched.push_back(l);
      offsets.push_back(static_cast<index_t>(positions.size()));
    }
    positions.push_back(i);
  }
  offsets.push_back(static_cast<index_t>(positions.size()));
  const auto count = static_cast<index_t>(touched.size());
  if (count == 0 || !upload) return {{}, {}, {}, count};
  const auto [rows_on_space, offsets_on_space, positions_on_space] = vectors_to_space<MemSpace>(
      space, "kshard::lookup_backward_rows", touched, offsets, positions);
  return {rows_on_space, offsets_on_space, positions_on_space, count};
}

}  // namespace detail

/// Looks up replicated token `ids` in a vocabulary-sharded `table` and writes the replicated
/// `[N, H]` rows, times `scale` (Gemma scales embeddings by sqrt(H)), into `out` on every rank.
/// Runs on `space`: its kernels, and the fence before MPI reads `out`.
///
/// `table` is `V x H`, its rows split by mesh dimension `tp_dim` only (`Shard<0>` or
/// `StridedShard<0>` there, `Replicate` everywhere else: a compile error otherwise, or a
/// `kshard::error` when `tp_dim` names another dimension). Without `tp_dim`, the mesh dimension
/// that splits the table's rows; a scale may then follow `out` directly (the forms below). `ids`
/// is a rank-1 view of int32 or int64 ids, any length N >= 0, readable from `space`, with the same
/// values on every rank of the tp group. `out` is a rank-2 `N x H` view of `lookup_value_t<T>` (T
/// for float and double, float for bf16), writable from `space`; its old values are overwritten.
/// Each rank writes the rows of the ids it holds (found with the table's own mapping, so uneven
/// vocabularies are right) scaled by `scale` in the output type, zeros elsewhere; one SUM
/// all-reduce of the N x H output over `mesh.dim_comm(tp_dim)` (none when that dimension has extent
/// 1) completes every row. Every element has exactly one non-zero addend, so scaling before the
/// reduction is bit-for-bit scaling after it.
///
/// Ids outside [0, V) and a wrongly shaped `out` are checked with two reductions over `ids`
/// (range and a digest). First the table (its layout and mesh choose the tp group), `tp_dim`
/// and every rank's findings are agreed over the whole mesh, then the number of ids, their
/// digest and `scale` within the tp group (ranks of different dp groups may look up different
/// ids): every rank throws the same `kshard::error` naming the value, before anything is
/// communicated or written. Communication: one fixed-size agreement where the tp group is the
/// whole mesh or a single rank, else three (the mesh's, the group's, the mesh's on its
/// outcome), plus the all-reduce. Use this form in a training loop to reuse one output buffer.
template <class ExecSpace, ValuedMatrix M, class IdView, detail::KokkosView OutView>
requires detail::ExecutionSpaceFor<ExecSpace, M>
void vocab_parallel_lookup(const ExecSpace& space, const M& table, const IdView& ids,
                           const OutView& out,
                           TpDim tp_dim = detail::inferred_tp_dim<typename M::layout_type, 0>(),
                           double scale = 1.0) {
  using T = typename M::value_type;
  using Out = lookup_value_t<T>;
  detail::check_lookup_types<ExecSpace, M, IdView>();
  static_assert(
      detail::is_view_of_rank<OutView>(2) && std::is_same_v<typename OutView::value_type, Out>,
      "kshard::vocab_parallel_lookup: out must be a rank-2 view of non-const "
      "lookup_value_t<T>");
  static_assert(
      Kokkos::SpaceAccessibility<ExecSpace, typename OutView::memory_space>::accessible,
      "kshard::vocab_parallel_lookup: out must be writable from the execution space it runs on");

  const char* who = "vocab_parallel_lookup";
  const detail::Operation operation(who);
  const auto n = static_cast<index_t>(ids.extent(0));
  const index_t h = table.cols();
  const auto summary = detail::summarize_ids(space, ids);
  std::optional<std::string> problem;
  if (static_cast<index_t>(out.extent(0)) != n || static_cast<index_t>(out.extent(1)) != h)
    problem = fmt::format(
        "kshard::{}: out is {} but must be {} x {} (one row per id, one column per table "
        "column); nothing was written",
        who, detail::shape_of(out), n, h);
  else  // a team policy's league size is an int
    problem = detail::int_limit_problem(n, who, "the number of ids in one call");
  if (!problem) problem = detail::ids_problem(summary, table.rows(), who);
  if (!problem) problem = detail::tp_dim_problem(table, tp_dim, 0, who, "table");
  detail::agree_tp_call(
      table, "the table", tp_dim, problem, [](detail::Agreement&) {},
      [&](detail::Agreement& a) {
        a.same("the number of token ids", n)
            .same("the list of token ids", summary.digest,
                  [](auto) {
                    return std::string();  // a digest: no value worth showing
                  })
            .same("the scale", std::bit_cast<std::int64_t>(scale),
                  [](std::int64_t bits) { return fmt::format("{}", std::bit_cast<double>(bits)); });
      });

  // One team per id: the id is mapped once, then its row is copied by the team's threads along
  // the contiguous columns (a plain vectorisable row copy on the host, coalesced on a GPU).
  using Rows = std::remove_cvref_t<decltype(table.mapping().rows)>;
  Kokkos::parallel_for(
      "kshard::vocab_parallel_lookup",
      Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(n), Kokkos::AUTO),
      detail::LookupRows<Rows, typename M::view_type, IdView, OutView>{
          table.mapping().rows, table.local(), ids, out, static_cast<Out>(scale), h});
  detail::sum_over_tp(space, table.mesh(), tp_dim, out);
}

/// `vocab_parallel_lookup(space, table, ids, out, tp_dim, scale)` on a default instance of the
/// table's execution space.
template <ValuedMatrix M, class IdView, detail::KokkosView OutView>
void vocab_parallel_lookup(const M& table, const IdView& ids, const OutView& out,
                           TpDim tp_dim = detail::inferred_tp_dim<typename M::layout_type, 0>(),
                           double scale = 1.0) {
  vocab_parallel_lookup(typename M::execution_space{}, table, ids, out, tp_dim, scale);
}

/// The same lookup into a new `N x H` LayoutRight view in the table's memory space, returned.
template <class ExecSpace, ValuedMatrix M, class IdView>
requires detail::ExecutionSpaceFor<ExecSpace, M> lookup_view_t<M> vocab_parallel_lookup(
    const ExecSpace& space, const M& table, const IdView& ids,
    TpDim tp_dim = detail::inferred_tp_dim<typename M::layout_type, 0>(), double scale = 1.0) {
  lookup_view_t<M> out(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::vocab_parallel_lookup"),
      ids.extent(0), static_cast<std::size_t>(table.cols()));
  vocab_parallel_lookup(space, table, ids, out, tp_dim, scale);
  return out;
}

/// `vocab_parallel_lookup(space, table, ids, tp_dim, scale)` on a default instance of the
/// table's execution space.
template <ValuedMatrix M, class IdView>
lookup_view_t<M> vocab_parallel_lookup(
    const M& table, const IdView& ids,
    TpDim tp_dim = detail::inferred_tp_dim<typename M::layout_type, 0>(), double scale = 1.0) {
  return vocab_parallel_lookup(typename M::execution_space{}, table, ids, tp_dim, scale);
}

/// Backward of `vocab_parallel_lookup`: for every position n whose id this rank holds, adds
/// `scale * grad_output(n, :)` to that id's local row of `grad_table` (laid out like the table:
/// same rules as the forward). Duplicate ids accumulate, deterministically: each row's
/// contributions are summed in position order (in `lookup_value_t<T>`), then added to the row
/// once. Positions whose id equals `padding_id` add nothing. No communication: `grad_output`
/// is the replicated `[N, H]` output gradient, of the forward's output type. Runs on `space`
/// (the ids are read on the host once `space` is done with them); the update it submits there
/// is not waited for.
///
/// Errors (`kshard::error`, thrown before anything is written, on every rank when the
/// replicated arguments are wrong everywhere): `grad_output` not N x H, an id outside [0, V),
/// a padding id outside [0, V), `tp_dim` not the table's row-splitting dimension (without
/// `tp_dim`, that dimension; a scale may then follow `grad_output` directly).
template <class ExecSpace, ValuedMatrix M, class IdView, class GradView>
requires detail::ExecutionSpaceFor<ExecSpace, M>
void vocab_parallel_lookup_backward(
    const ExecSpace& space, const M& grad_table, const IdView& ids, const GradView& grad_output,
    TpDim tp_dim = detail::inferred_tp_dim<typename M::layout_type, 0>(), double scale = 1.0,
    std::optional<index_t> padding_id = std::nullopt) {
  using T = typename M::value_type;
  using Out = lookup_value_t<T>;
  const char* who = "vocab_parallel_lookup_backward";
  detail::check_lookup_types<ExecSpace, M, IdView>();
  static_assert(detail::is_view_of_rank<GradView>(2),
                "kshard::vocab_parallel_lookup_backward: grad_output must be a rank-2 "
                "Kokkos::View");
  static_assert(std::is_same_v<typename GradView::non_const_value_type, Out>,
                "kshard::vocab_parallel_lookup_backward: grad_output must have the forward's "
                "output element type, lookup_value_t<T>");
  static_assert(
      Kokkos::SpaceAccessibility<ExecSpace, typename GradView::memory_space>::accessible,
      "kshard::vocab_parallel_lookup_backward: grad_output must be readable from the execution "
      "space it runs on");

  detail::throw_if(detail::tp_dim_problem(grad_table, tp_dim, 0, who, "gradient table"));
  const auto n = static_cast<index_t>(ids.extent(0));
  const index_t vocab = grad_table.rows();
  const index_t h = grad_table.cols();
  if (static_cast<index_t>(grad_output.extent(0)) != n ||
      static_cast<index_t>(grad_output.extent(1)) != h)
    throw error(fmt::format(
        "kshard::{}: grad_output is {} but there are {} ids and the table is {} x {}: it must be "
        "{} x {}",
        who, detail::shape_of(grad_output), n, vocab, h, n, h));
  if (padding_id) detail::throw_if(detail::id_range_problem(*padding_id, vocab, who, "padding id"));

  const auto touched = detail::touched_rows<typename M::memory_space>(
      space, grad_table.mapping().rows, ids, vocab, padding_id, h > 0, who);
  if (touched.count == 0 || h == 0) return;
  Kokkos::parallel_for(
      "kshard::vocab_parallel_lookup_backward",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<index_t>>(
          space, {0, 0}, {touched.count, h}),
      detail::AddTouchedRows<typename M::view_type, GradView, typename M::memory_space>{
          touched, grad_table.local(), grad_output, static_cast<Out>(scale)});
}

/// `vocab_parallel_lookup_backward(space, grad_table, ids, grad_output, tp_dim, scale,
/// padding_id)` on a default instance of the table's execution space.
template <ValuedMatrix M, class IdView, class GradView>
void vocab_parallel_lookup_backward(
    const M& grad_table, const IdView& ids, const GradView& grad_output,
    TpDim tp_dim = detail::inferred_tp_dim<typename M::layout_type, 0>(), double scale = 1.0,
    std::optional<index_t> padding_id = std::nullopt) {
  vocab_parallel_lookup_backward(typename M::execution_space{}, grad_table, ids, grad_output,
                                 tp_dim, scale, padding_id);
}

// ---------------------------------------------------------------------------------------------
// The same lookup and backward with a scale right after `out` (`grad_output`, or the ids where
// the lookup returns its output): `tp_dim` inferred. Only a floating-point number is a scale;
// a `TpDim` says which mesh dimension.

/// `vocab_parallel_lookup(space, table, ids, out, tp_dim, scale)` with `tp_dim` the mesh
/// dimension that splits the table's rows.
template <class ExecSpace, ValuedMatrix M, class IdView, detail::KokkosView OutView,
          std::floating_point Scale>
requires detail::ExecutionSpaceFor<ExecSpace, M>
void vocab_parallel_lookup(const ExecSpace& space, const M& table, const IdView& ids,
                           const OutView& out, Scale scale) {
  vocab_parallel_lookup(space, table, ids, out,
                        detail::inferred_tp_dim<typename M::layout_type, 0>(),
                        static_cast<double>(scale));
}

/// `vocab_parallel_lookup(space, table, ids, out, scale)` on a default instance of the table's
/// execution space.
template <ValuedMatrix M, class IdView, detail::KokkosView OutView, std::floating_point Scale>
void vocab_parallel_lookup(const M& table, const IdView& ids, const OutView& out, Scale scale) {
  vocab_parallel_lookup(typename M::execution_space{}, table, ids, out, scale);
}

/// `vocab_parallel_lookup(space, table, ids, tp_dim, scale)` with `tp_dim` the mesh dimension
/// that splits the table's rows: the lookup into a new view.
template <class ExecSpace, ValuedMatrix M, class IdView, std::floating_point Scale>
requires detail::ExecutionSpaceFor<ExecSpace, M> lookup_view_t<M> vocab_parallel_lookup(
    const ExecSpace& space, const M& table, const IdView& ids, Scale scale) {
  return vocab_parallel_lookup(space, table, ids,
                               detail::inferred_tp_dim<typename M::layout_type, 0>(),
                               static_cast<double>(scale));
}

/// `vocab_parallel_lookup(space, table, ids, scale)` on a default instance of the table's
/// execution space.
template <ValuedMatrix M, class IdView, std::floating_point Scale>
lookup_view_t<M> vocab_parallel_lookup(const M& table, const IdView& ids, Scale scale) {
  return vocab_parallel_lookup(typename M::execution_space{}, table, ids, scale);
}

/// `vocab_parallel_lookup_backward(space, grad_table, ids, grad_output, tp_dim, scale,
/// padding_id)` with `tp_dim` the mesh dimension that splits the table's rows.
template <class ExecSpace, ValuedMatrix M, class IdView, class GradView, std::floating_point Scale>
requires detail::ExecutionSpaceFor<ExecSpace, M>
void vocab_parallel_lookup_backward(const ExecSpace& space, const M& grad_table, const IdView& ids,
                                    const GradView& grad_output, Scale scale,
                                    std::optional<index_t> padding_id = std::nullopt) {
  vocab_parallel_lookup_backward(space, grad_table, ids, grad_output,
                                 detail::inferred_tp_dim<typename M::layout_type, 0>(),
                                 static_cast<double>(scale), padding_id);
}

/// `vocab_parallel_lookup_backward(space, grad_table, ids, grad_output, scale, padding_id)` on
/// a default instance of the table's execution space.
template <ValuedMatrix M, class IdView, class GradView, std::floating_point Scale>
void vocab_parallel_lookup_backward(const M& grad_table, const IdView& ids,
                                    const GradView& grad_output, Scale scale,
                                    std::optional<index_t> padding_id = std::nullopt) {
  vocab_parallel_lookup_backward(typename M::execution_space{}, grad_table, ids, grad_output, scale,
                                 padding_id);
}

}  // namespace kshard
