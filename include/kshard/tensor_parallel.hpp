#pragma once

/// \file
/// Tensor-parallel building blocks (Megatron style) over one mesh dimension, the "tp" dimension:
/// the vocabulary-parallel embedding lookup and its backward, reduce-from / copy-to the
/// tensor-parallel region, and row- and column-parallel linear layers, forward and backward.
///
/// Conventions shared by every function here:
/// - `tp_dim` is the index of the tensor-parallel mesh dimension (`mesh.dim("tp")`). Matrices
///   must be split over exactly that mesh dimension and replicated over every other one; what
///   the layout type decides is checked at compile time, the rest (which dimension, shapes,
///   meshes) throws `kshard::error` naming the values.
/// - Replicated inputs (token ids, `x` of a column-parallel layer, output gradients of a
///   row-parallel layer or of a lookup) must hold the same values on every rank of the tp group.
/// - Functions that communicate agree on their argument checks over the whole mesh first, so a
///   problem found on any rank is the same `kshard::error` on every rank, before anything is
///   written. Functions that do not communicate check without communicating: they throw on the
///   ranks whose arguments are wrong (every rank, for wrong replicated arguments).
/// - Forward functions return new views; backward functions return the input gradient as a new
///   view and *add* the parameter gradients into the gradient matrices and views given (as
///   PyTorch accumulates `.grad`). Kernels run on the matrix's execution space; views passed in
///   must be readable from it.
/// - Sums are deterministic: every output element is summed in a fixed order (over k for the
///   products, over token positions for the lookup backward), the same on every backend.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/bfloat16.hpp"
#include "kshard/detail/agreement.hpp"
#include "kshard/detail/gemm.hpp"
#include "kshard/detail/mpi.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/detail/staging.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/format.hpp"
#include "kshard/mesh.hpp"

namespace kshard {

/// Element type of `vocab_parallel_lookup`'s output for a table of `T`: the table's own type for
/// float and double, float for bf16 (the lookup's sum and scale are done in float, and bf16
/// activations are rarely what the next layer wants).
template <class T>
using lookup_value_t = compute_type_t<T>;

namespace detail {

// Number of mesh dimensions of layout L that split some tensor dimension.
template <class L>
constexpr int tp_splitting_dims() {
  int count = 0;
  for (int d : L::tensor_dims) count += d >= 0 ? 1 : 0;
  return count;
}

// True when L splits tensor dimension `D` over exactly one mesh dimension and nothing else.
template <class L, int D>
inline constexpr bool tp_layout_v = tp_splitting_dims<L>() == 1 && L::splits(D);

template <class T>
inline constexpr bool tp_float_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

// Tells an output-view argument from a `tp_dim` in overloads.
template <class V>
concept KokkosView = Kokkos::is_view<V>::value;

template <class V>
constexpr bool is_view_of_rank(int rank) {
  if constexpr (Kokkos::is_view<V>::value)
    return static_cast<int>(V::rank) == rank;
  else
    return false;
}

// `tp_dim` must name a mesh dimension that splits tensor dimension `dim` of `matrix`. Functions
// that communicate fold this into their agreement (a `tp_dim` may differ between ranks); the
// others throw it where it is found.
template <class M>
std::optional<std::string> tp_dim_problem(const M& matrix, std::size_t tp_dim, int dim,
                                          const char* who, const char* what) {
  using L = typename M::layout_type;
  const auto& mesh = matrix.mesh();
  if (tp_dim >= L::rank)
    return fmt::format("kshard::{}: tp_dim is {}, but the mesh {} has {} dimension(s)", who, tp_dim,
                       mesh, L::rank);
  if (L::tensor_dims[tp_dim] == dim) return std::nullopt;
  std::size_t split = 0;
  while (split < L::rank && L::tensor_dims[split] < 0) ++split;
  return fmt::format(
      "kshard::{}: the {} layout {} on {} does not shard tensor dimension {} over mesh "
      "dimension {} ('{}'); it must be Shard({}) or StridedShard({}) there (it shards "
      "dimension {} over mesh dimension {} ('{}'))",
      who, what, matrix.layout(), mesh, dim, tp_dim, mesh.names()[tp_dim], dim, dim,
      L::tensor_dims[split], split, mesh.names()[split]);
}

// A weight gradient must be laid out like its weight: same global shape, layout and mesh.
template <class P, class G>
std::optional<std::string> placement_problem(const P& param, const G& grad, const char* who,
                                             const char* what) {
  static_assert(std::is_same_v<typename P::layout_type, typename G::layout_type>,
                "kshard: a gradient matrix must have the layout type of its parameter");
  static_assert(std::is_same_v<typename P::memory_space, typename G::memory_space>,
                "kshard: a gradient matrix must live in its parameter's memory space");
  if (grad.rows() != param.rows() || grad.cols() != param.cols())
    return fmt::format("kshard::{}: {} is {} x {} but the weight is {} x {}", who, what,
                       grad.rows(), grad.cols(), param.rows(), param.cols());
  if (!(grad.layout() == param.layout()))
    return fmt::format("kshard::{}: {} has layout {} but the weight has {}", who, what,
                       grad.layout(), param.layout());
  if (param.mesh().shape() != grad.mesh().shape() ||
      !congruent(param.mesh().comm(), grad.mesh().comm()))
    return fmt::format("kshard::{}: {} is on {} but the weight is on {}, not the same mesh", who,
                       what, grad.mesh(), param.mesh());
  return std::nullopt;
}

inline void throw_if(const std::optional<std::string>& problem) {
  if (problem) throw error(*problem);
}

// "name is R x C": the extents of a rank-2 view, for messages.
template <class V>
std::string shape_of(const V& v) {
  return fmt::format("{} x {}", v.extent(0), v.extent(1));
}

// The ids of a lookup in two numbers for the range check and one for the agreement.
struct IdSummary {
  index_t min = 0;
  index_t max = -1;
  std::int64_t digest = 0;  // equal lists give equal digests; different ones almost never do
};

// The splitmix64 finaliser of (id, position): summed over the positions, a digest of the whole
// list that does not depend on the order in which the reduction adds it up.
KOKKOS_INLINE_FUNCTION std::uint64_t mix_id(std::uint64_t id, std::uint64_t position) {
  std::uint64_t z = id + 0x9e3779b97f4a7c15ull * (position + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Range and digest of `ids`: two reductions over the N ids on `ExecSpace`.
template <class ExecSpace, class IdView>
IdSummary summarize_ids(const IdView& ids) {
  const auto n = static_cast<index_t>(ids.extent(0));
  IdSummary summary;
  if (n == 0) return summary;
  const Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>> all(0, n);
  Kokkos::MinMaxScalar<index_t> range{};
  Kokkos::parallel_reduce(
      "kshard::id_range", all,
      KOKKOS_LAMBDA(const index_t i, Kokkos::MinMaxScalar<index_t>& r) {
        const auto id = static_cast<index_t>(ids(i));
        if (id < r.min_val) r.min_val = id;
        if (id > r.max_val) r.max_val = id;
      },
      Kokkos::MinMax<index_t>(range));
  std::uint64_t digest = 0;
  Kokkos::parallel_reduce(
      "kshard::id_digest", all,
      KOKKOS_LAMBDA(const index_t i, std::uint64_t& sum) {
        sum += mix_id(static_cast<std::uint64_t>(ids(i)), static_cast<std::uint64_t>(i));
      },
      digest);
  return {range.min_val, range.max_val, std::bit_cast<std::int64_t>(digest)};
}

// An id outside [0, vocab), named.
inline std::optional<std::string> ids_problem(const IdSummary& ids, index_t vocab,
                                              const char* who) {
  if (ids.max < ids.min || (ids.min >= 0 && ids.max < vocab)) return std::nullopt;
  return fmt::format(
      "kshard::{}: token id {} is out of range for a vocabulary of {} rows (valid: 0 <= id < "
      "{}); nothing was written",
      who, ids.min < 0 ? ids.min : ids.max, vocab, vocab);
}

// The one mesh dimension that splits a tensor-parallel layout (tp_layout_v): the tp groups are
// the ranks along it.
template <class L>
constexpr std::size_t splitting_dim() {
  for (std::size_t m = 0; m < L::rank; ++m)
    if (L::tensor_dims[m] >= 0) return m;
  return 0;
}

// What the ranks of one tp group must share (`fill` adds it to an Agreement), compared within
// the group. The outcome is the same on every rank of the group and becomes a problem of the
// mesh-wide agreement that follows, so a difference inside one group stops every rank.
template <std::size_t N, class Fill>
std::optional<std::string> agree_in_tp_group(const Mesh<N>& mesh, std::size_t split, Fill&& fill) {
  if (mesh.extent(split) == 1) return std::nullopt;
  Agreement group(mesh.dim_comm(split), "the ranks of a tp group");
  fill(group);
  return group.outcome();
}

// The mesh-wide agreement of a tensor-parallel call on `matrix` (its element type, shape and
// layout) and `tp_dim`, with this rank's problems.
template <class M>
Agreement tp_agreement(const M& matrix, std::string_view role, std::size_t tp_dim) {
  Agreement agreement(matrix.mesh().comm());
  same_matrix(agreement, matrix, role);
  agreement.same("tp_dim", static_cast<std::int64_t>(tp_dim));
  return agreement;
}

// values(i, j) += bias(j).
template <class ExecSpace, class View, class Bias>
void add_bias(const View& values, const Bias& bias) {
  Kokkos::parallel_for(
      "kshard::add_bias",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<index_t>>(
          {0, 0}, {static_cast<index_t>(values.extent(0)), static_cast<index_t>(values.extent(1))}),
      KOKKOS_LAMBDA(const index_t i, const index_t j) { values(i, j) += bias(j); });
}

// sums(j) += sum over i of values(i, j), summed in row order. Each work item sums a block of
// columns down the rows, so every row is read contiguously.
template <class ExecSpace, class View, class Sums>
void add_column_sums(const View& values, const Sums& sums) {
  using T = typename Sums::non_const_value_type;
  constexpr index_t block = 16;
  const auto rows = static_cast<index_t>(values.extent(0));
  const auto cols = static_cast<index_t>(values.extent(1));
  Kokkos::parallel_for(
      "kshard::column_sums",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(0, (cols + block - 1) / block),
      KOKKOS_LAMBDA(const index_t b) {
        const index_t begin = b * block;
        const index_t width = cols - begin < block ? cols - begin : block;
        T sum[block] = {};
        for (index_t i = 0; i < rows; ++i)
          for (index_t t = 0; t < width; ++t) sum[t] += values(i, begin + t);
        for (index_t t = 0; t < width; ++t) sums(begin + t) += sum[t];
      });
}

// In-place SUM over `comm` of a rank-1 or rank-2 view; a non-contiguous view goes through a
// contiguous copy.
template <class ExecSpace, class View>
void allreduce_sum_any(const View& values, MPI_Comm comm) {
  if (values.span_is_contiguous()) {
    allreduce_view(ExecSpace(), values, MPI_SUM, comm);
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
  ExecSpace().fence();
  Kokkos::deep_copy(copy, values);
  allreduce_view(ExecSpace(), copy, MPI_SUM, comm);
  Kokkos::deep_copy(values, copy);
}

template <class M>
using tp_matrix_view_t =
    Kokkos::View<typename M::value_type**, Kokkos::LayoutRight, typename M::memory_space>;

// The compile-time rules for a linear layer's weight and activation views.
template <class W, class... Views>
constexpr void check_linear_types() {
  using T = typename W::value_type;
  static_assert(tp_float_v<T>,
                "kshard: tensor-parallel linear layers take float or double weights");
  static_assert((Kokkos::SpaceAccessibility<typename W::execution_space,
                                            typename Views::memory_space>::accessible &&
                 ...),
                "kshard: a view passed to a tensor-parallel linear layer is not readable from the "
                "weight's execution space");
  static_assert((std::is_same_v<typename Views::non_const_value_type, T> && ...),
                "kshard: activations, biases and gradients must have the weight's element type");
}

// Row-parallel forward: y = allreduce_tp(x_local W_local^T) (+ bias).
template <class W, class X, class B>
tp_matrix_view_t<W> row_forward(const W& weight, const X& x_local, const B* bias,
                                std::size_t tp_dim) {
  static_assert(tp_layout_v<typename W::layout_type, 1>,
                "kshard::row_parallel_linear: the weight's columns (input features) must be split "
                "over exactly one mesh dimension (the tp dimension), its rows not at all, and "
                "every other mesh dimension must Replicate it");
  static_assert(is_view_of_rank<X>(2) && is_view_of_rank<B>(1),
                "kshard::row_parallel_linear: x_local must be a rank-2 and bias a rank-1 view");
  check_linear_types<W, X, B>();
  using ExecSpace = typename W::execution_space;
  const char* who = "row_parallel_linear";
  const Operation operation(who);
  const auto group =
      agree_in_tp_group(weight.mesh(), splitting_dim<typename W::layout_type>(), [&](Agreement& a) {
        a.same("the number of rows of x_local (tokens)", static_cast<index_t>(x_local.extent(0)));
      });
  const auto in_local = weight.mapping().cols.local_extent();
  std::optional<std::string> problem;
  if (static_cast<index_t>(x_local.extent(1)) != in_local)
    problem = fmt::format(
        "kshard::{}: x_local on rank {} is {} but the weight's local shard there is {} (of "
        "{} x {}): x_local needs one column per local input feature ({})",
        who, weight.mesh().my_rank(), shape_of(x_local), shape_of(weight.local()), weight.rows(),
        weight.cols(), in_local);
  else if (bias != nullptr && static_cast<index_t>(bias->extent(0)) != weight.rows())
    problem = fmt::format(
        "kshard::{}: the bias has {} elements but the weight is {} x {}: it needs one per "
        "output feature ({})",
        who, bias->extent(0), weight.rows(), weight.cols(), weight.rows());
  if (!problem) problem = tp_dim_problem(weight, tp_dim, 1, who, "weight");
  tp_agreement(weight, "the weight", tp_dim)
      .same("whether a bias is given", bias != nullptr)
      .problem(group)
      .problem(problem)
      .settle();
  tp_matrix_view_t<W> y(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::row_parallel_y"),
                        x_local.extent(0), static_cast<std::size_t>(weight.rows()));
  gemm_nt<ExecSpace>(x_local, weight.local(), y, false);
  if (weight.mesh().extent(tp_dim) > 1)
    allreduce_view(ExecSpace(), y, MPI_SUM, weight.mesh().dim_comm(tp_dim));
  if (bias != nullptr) add_bias<ExecSpace>(y, *bias);
  return y;
}

// Row-parallel backward: grad_x_local = grad_y W_local, grad_W_local += grad_y^T x_local,
// grad_bias += column sums of grad_y. No communication.
template <class W, class G, class X, class GY, class GB>
tp_matrix_view_t<W> row_backward(const W& weight, const X& x_local, const GY& grad_y,
                                 const G& grad_weight, const GB* grad_bias, std::size_t tp_dim) {
  static_assert(tp_layout_v<typename W::layout_type, 1>,
                "kshard::row_parallel_linear_backward: the weight's columns must be split over "
                "exactly one mesh dimension (the tp dimension) and nothing else");
  static_assert(is_view_of_rank<X>(2) && is_view_of_rank<GY>(2) && is_view_of_rank<GB>(1),
                "kshard::row_parallel_linear_backward: x_local and grad_y must be rank-2 views, "
                "grad_bias a rank-1 view");
  check_linear_types<W, X, GY, GB>();
  using ExecSpace = typename W::execution_space;
  const char* who = "row_parallel_linear_backward";
  throw_if(tp_dim_problem(weight, tp_dim, 1, who, "weight"));
  throw_if(placement_problem(weight, grad_weight, who, "grad_weight"));
  const auto in_local = weight.mapping().cols.local_extent();
  if (static_cast<index_t>(grad_y.extent(1)) != weight.rows())
    throw error(fmt::format(
        "kshard::{}: grad_y is {} but the weight is {} x {}: grad_y needs one column per output "
        "feature ({})",
        who, shape_of(grad_y), weight.rows(), weight.cols(), weight.rows()));
  if (static_cast<index_t>(x_local.extent(1)) != in_local || x_local.extent(0) != grad_y.extent(0))
    throw error(fmt::format(
        "kshard::{}: x_local on rank {} is {} but grad_y is {} and the weight's local shard is "
        "{}: x_local must be {} x {}",
        who, weight.mesh().my_rank(), shape_of(x_local), shape_of(grad_y), shape_of(weight.local()),
        grad_y.extent(0), in_local));
  if (grad_bias != nullptr && static_cast<index_t>(grad_bias->extent(0)) != weight.rows())
    throw error(
        fmt::format("kshard::{}: grad_bias has {} elements but the weight is {} x {}: it needs {}",
                    who, grad_bias->extent(0), weight.rows(), weight.cols(), weight.rows()));
  tp_matrix_view_t<W> grad_x(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::row_parallel_grad_x"),
      grad_y.extent(0), static_cast<std::size_t>(in_local));
  gemm_nn<ExecSpace>(grad_y, weight.local(), grad_x, false);
  gemm_tn<ExecSpace>(grad_y, x_local, grad_weight.local(), true);
  if (grad_bias != nullptr) add_column_sums<ExecSpace>(grad_y, *grad_bias);
  return grad_x;
}

// Column-parallel forward: y_local = x W_local^T (+ bias_local). No communication.
template <class W, class X, class B>
tp_matrix_view_t<W> column_forward(const W& weight, const X& x, const B* bias_local,
                                   std::size_t tp_dim) {
  static_assert(tp_layout_v<typename W::layout_type, 0>,
                "kshard::column_parallel_linear: the weight's rows (output features) must be "
                "split over exactly one mesh dimension (the tp dimension), its columns not at "
                "all, and every other mesh dimension must Replicate it");
  static_assert(is_view_of_rank<X>(2) && is_view_of_rank<B>(1),
                "kshard::column_parallel_linear: x must be a rank-2 and bias_local a rank-1 view");
  check_linear_types<W, X, B>();
  using ExecSpace = typename W::execution_space;
  const char* who = "column_parallel_linear";
  throw_if(tp_dim_problem(weight, tp_dim, 0, who, "weight"));
  const auto out_local = weight.mapping().rows.local_extent();
  if (static_cast<index_t>(x.extent(1)) != weight.cols())
    throw error(fmt::format(
        "kshard::{}: x is {} but the weight is {} x {}: x needs one column per input feature "
        "({})",
        who, shape_of(x), weight.rows(), weight.cols(), weight.cols()));
  if (bias_local != nullptr && static_cast<index_t>(bias_local->extent(0)) != out_local)
    throw error(fmt::format(
        "kshard::{}: bias_local on rank {} has {} elements but the weight's local shard there is "
        "{}: it needs one per local output feature ({})",
        who, weight.mesh().my_rank(), bias_local->extent(0), shape_of(weight.local()), out_local));
  tp_matrix_view_t<W> y(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::column_parallel_y"), x.extent(0),
      static_cast<std::size_t>(out_local));
  gemm_nt<ExecSpace>(x, weight.local(), y, false);
  if (bias_local != nullptr) add_bias<ExecSpace>(y, *bias_local);
  return y;
}

// Column-parallel backward: grad_x = allreduce_tp(grad_y_local W_local), grad_W_local +=
// grad_y_local^T x, grad_bias_local += column sums of grad_y_local.
template <class W, class G, class X, class GY, class GB>
tp_matrix_view_t<W> column_backward(const W& weight, const X& x, const GY& grad_y_local,
                                    const G& grad_weight, const GB* grad_bias_local,
                                    std::size_t tp_dim) {
  static_assert(tp_layout_v<typename W::layout_type, 0>,
                "kshard::column_parallel_linear_backward: the weight's rows must be split over "
                "exactly one mesh dimension (the tp dimension) and nothing else");
  static_assert(is_view_of_rank<X>(2) && is_view_of_rank<GY>(2) && is_view_of_rank<GB>(1),
                "kshard::column_parallel_linear_backward: x and grad_y_local must be rank-2 "
                "views, grad_bias_local a rank-1 view");
  check_linear_types<W, X, GY, GB>();
  using ExecSpace = typename W::execution_space;
  const char* who = "column_parallel_linear_backward";
  const Operation operation(who);
  const auto group =
      agree_in_tp_group(weight.mesh(), splitting_dim<typename W::layout_type>(), [&](Agreement& a) {
        a.same("the number of rows of x (tokens)", static_cast<index_t>(x.extent(0)));
      });
  const auto out_local = weight.mapping().rows.local_extent();
  std::optional<std::string> problem;
  if (static_cast<index_t>(x.extent(1)) != weight.cols())
    problem = fmt::format(
        "kshard::{}: x is {} but the weight is {} x {}: x needs one column per input feature "
        "({})",
        who, shape_of(x), weight.rows(), weight.cols(), weight.cols());
  else if (static_cast<index_t>(grad_y_local.extent(1)) != out_local ||
           grad_y_local.extent(0) != x.extent(0))
    problem = fmt::format(
        "kshard::{}: grad_y_local on rank {} is {} but x is {} and the weight's local shard is "
        "{}: grad_y_local must be {} x {}",
        who, weight.mesh().my_rank(), shape_of(grad_y_local), shape_of(x), shape_of(weight.local()),
        x.extent(0), out_local);
  else if (grad_bias_local != nullptr &&
           static_cast<index_t>(grad_bias_local->extent(0)) != out_local)
    problem = fmt::format(
        "kshard::{}: grad_bias_local on rank {} has {} elements but the weight's local shard "
        "there is {}: it needs {}",
        who, weight.mesh().my_rank(), grad_bias_local->extent(0), shape_of(weight.local()),
        out_local);
  if (!problem) problem = tp_dim_problem(weight, tp_dim, 0, who, "weight");
  if (!problem) problem = placement_problem(weight, grad_weight, who, "grad_weight");
  // grad_weight is checked against the agreed weight on each rank (placement_problem).
  tp_agreement(weight, "the weight", tp_dim)
      .same("whether grad_bias_local is given", grad_bias_local != nullptr)
      .problem(group)
      .problem(problem)
      .settle();
  tp_matrix_view_t<W> grad_x(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::column_parallel_grad_x"),
      x.extent(0), static_cast<std::size_t>(weight.cols()));
  gemm_nn<ExecSpace>(grad_y_local, weight.local(), grad_x, false);
  gemm_tn<ExecSpace>(grad_y_local, x, grad_weight.local(), true);
  if (grad_bias_local != nullptr) add_column_sums<ExecSpace>(grad_y_local, *grad_bias_local);
  if (weight.mesh().extent(tp_dim) > 1)
    allreduce_view(ExecSpace(), grad_x, MPI_SUM, weight.mesh().dim_comm(tp_dim));
  return grad_x;
}

template <class W>
using tp_no_bias_t = Kokkos::View<typename W::value_type*, typename W::memory_space>;

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel embedding lookup

/// Looks up replicated token `ids` in a vocabulary-sharded `table` and writes the replicated
/// `[N, H]` rows, times `scale` (Gemma scales embeddings by sqrt(H)), into `out` on every rank.
///
/// `table` is `V x H`, its rows split by mesh dimension `tp_dim` only (`Shard<0>` or
/// `StridedShard<0>` there, `Replicate` everywhere else: a compile error otherwise, or a
/// `kshard::error` when `tp_dim` names another dimension). `ids` is a rank-1 view of int32 or
/// int64 ids, any length N >= 0, readable from the table's execution space, with the same values
/// on every rank of the tp group. `out` is a rank-2 `N x H` view of `lookup_value_t<T>` (T for
/// float and double, float for bf16), writable from the table's execution space; its old values
/// are overwritten. Each rank writes the rows of the ids it holds (found with the table's own
/// mapping, so uneven vocabularies are right) scaled by `scale` in the output type, zeros
/// elsewhere; one SUM all-reduce of the N x H output over `mesh.dim_comm(tp_dim)` (none when that
/// dimension has extent 1) completes every row. Every element has exactly one non-zero addend,
/// so scaling before the reduction is bit-for-bit scaling after it.
///
/// Ids outside [0, V) and a wrongly shaped `out` are checked with two reductions over `ids`
/// (range and a digest); the number of ids and their digest are agreed within the tp group
/// (ranks of different dp groups may look up different ids), then the table, `tp_dim` and every
/// rank's findings over the whole mesh: every rank throws the same `kshard::error` naming the
/// value, before anything is communicated or written. Communication: those two fixed-size
/// agreements (one when the tp dimension has extent 1) plus the all-reduce. Use this form in a
/// training loop to reuse one output buffer.
template <ValuedMatrix M, class IdView, detail::KokkosView OutView>
void vocab_parallel_lookup(const M& table, const IdView& ids, const OutView& out,
                           std::size_t tp_dim, double scale = 1.0) {
  using T = typename M::value_type;
  using L = typename M::layout_type;
  using Out = lookup_value_t<T>;
  using ExecSpace = typename M::execution_space;
  static_assert(detail::tp_layout_v<L, 0>,
                "kshard::vocab_parallel_lookup: the table's rows must be split over exactly one "
                "mesh dimension (the tp dimension), its columns not at all, and every other mesh "
                "dimension must Replicate it");
  static_assert(detail::tp_float_v<T> || std::is_same_v<T, bf16>,
                "kshard::vocab_parallel_lookup: the table must hold float, double or bf16");
  static_assert(detail::is_view_of_rank<IdView>(1),
                "kshard::vocab_parallel_lookup: ids must be a rank-1 Kokkos::View");
  using Id = typename IdView::non_const_value_type;
  static_assert(std::is_same_v<Id, std::int32_t> || std::is_same_v<Id, std::int64_t>,
                "kshard::vocab_parallel_lookup: ids must be int32 or int64");
  static_assert(
      Kokkos::SpaceAccessibility<ExecSpace, typename IdView::memory_space>::accessible,
      "kshard::vocab_parallel_lookup: ids must be readable from the table's execution space");
  static_assert(
      detail::is_view_of_rank<OutView>(2) && std::is_same_v<typename OutView::value_type, Out>,
      "kshard::vocab_parallel_lookup: out must be a rank-2 view of non-const "
      "lookup_value_t<T>");
  static_assert(
      Kokkos::SpaceAccessibility<ExecSpace, typename OutView::memory_space>::accessible,
      "kshard::vocab_parallel_lookup: out must be writable from the table's execution space");

  const char* who = "vocab_parallel_lookup";
  const detail::Operation operation(who);
  const auto n = static_cast<index_t>(ids.extent(0));
  const index_t h = table.cols();
  const auto summary = detail::summarize_ids<ExecSpace>(ids);
  const auto group =
      detail::agree_in_tp_group(table.mesh(), detail::splitting_dim<L>(), [&](auto& a) {
        a.same("the number of token ids", n)
            .same("the list of token ids", summary.digest, [](auto) {
              return std::string();  // a digest: no value worth showing
            });
      });
  std::optional<std::string> problem;
  if (static_cast<index_t>(out.extent(0)) != n || static_cast<index_t>(out.extent(1)) != h)
    problem = fmt::format(
        "kshard::{}: out is {} but must be {} x {} (one row per id, one column per table "
        "column); nothing was written",
        who, detail::shape_of(out), n, h);
  else if (n > INT_MAX)  // a team policy's league size is an int
    problem = fmt::format("kshard::{}: {} ids in one call; the limit is {}", who, n, INT_MAX);
  else
    problem = detail::ids_problem(summary, table.rows(), who);
  if (!problem) problem = detail::tp_dim_problem(table, tp_dim, 0, who, "table");
  detail::tp_agreement(table, "the table", tp_dim).problem(group).problem(problem).settle();

  const auto rows = table.mapping().rows;
  const auto local = table.local();
  const auto s = static_cast<Out>(scale);
  // One team per id: the id is mapped once, then its row is copied by the team's threads along
  // the contiguous columns (a plain vectorisable row copy on the host, coalesced on a GPU).
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  Kokkos::parallel_for(
      "kshard::vocab_parallel_lookup", Policy(static_cast<int>(n), Kokkos::AUTO),
      KOKKOS_LAMBDA(const typename Policy::member_type& team) {
        const index_t i = team.league_rank();
        const index_t l = rows.to_local(static_cast<index_t>(ids(i)));
        if (l == invalid_index)
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, h),
                               [&](const index_t j) { out(i, j) = Out(0); });
        else
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, h), [&](const index_t j) {
            out(i, j) = static_cast<Out>(local(l, j)) * s;
          });
      });
  if (table.mesh().extent(tp_dim) > 1)
    detail::allreduce_sum_any<ExecSpace>(out, table.mesh().dim_comm(tp_dim));
}

/// The same lookup into a new `N x H` LayoutRight view in the table's memory space, returned.
template <ValuedMatrix M, class IdView>
Kokkos::View<lookup_value_t<typename M::value_type>**, Kokkos::LayoutRight,
             typename M::memory_space>
vocab_parallel_lookup(const M& table, const IdView& ids, std::size_t tp_dim, double scale = 1.0) {
  Kokkos::View<lookup_value_t<typename M::value_type>**, Kokkos::LayoutRight,
               typename M::memory_space>
      out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::vocab_parallel_lookup"),
          ids.extent(0), static_cast<std::size_t>(table.cols()));
  vocab_parallel_lookup(table, ids, out, tp_dim, scale);
  return out;
}

/// Backward of `vocab_parallel_lookup`: for every position n whose id this rank holds, adds
/// `scale * grad_output(n, :)` to that id's local row of `grad_table` (laid out like the table:
/// same rules as the forward). Duplicate ids accumulate, deterministically: each row's
/// contributions are summed in position order (in `lookup_value_t<T>`), then added to the row
/// once. Positions whose id equals `padding_id` add nothing. No communication: `grad_output`
/// is the replicated `[N, H]` output gradient, of the forward's output type.
///
/// Errors (`kshard::error`, thrown before anything is written, on every rank when the
/// replicated arguments are wrong everywhere): `grad_output` not N x H, an id outside [0, V),
/// a padding id outside [0, V), `tp_dim` not the table's row-splitting dimension.
template <ValuedMatrix M, class IdView, class GradView>
void vocab_parallel_lookup_backward(const M& grad_table, const IdView& ids,
                                    const GradView& grad_output, std::size_t tp_dim,
                                    double scale = 1.0,
                                    std::optional<index_t> padding_id = std::nullopt) {
  using T = typename M::value_type;
  using L = typename M::layout_type;
  using Out = lookup_value_t<T>;
  using ExecSpace = typename M::execution_space;
  using MemSpace = typename M::memory_space;
  const char* who = "vocab_parallel_lookup_backward";
  static_assert(detail::tp_layout_v<L, 0>,
                "kshard::vocab_parallel_lookup_backward: the gradient table's rows must be split "
                "over exactly one mesh dimension (the tp dimension), its columns not at all, and "
                "every other mesh dimension must Replicate it");
  static_assert(detail::tp_float_v<T> || std::is_same_v<T, bf16>,
                "kshard::vocab_parallel_lookup_backward: the table must hold float, double or "
                "bf16");
  static_assert(detail::is_view_of_rank<IdView>(1),
                "kshard::vocab_parallel_lookup_backward: ids must be a rank-1 Kokkos::View");
  using Id = typename IdView::non_const_value_type;
  static_assert(std::is_same_v<Id, std::int32_t> || std::is_same_v<Id, std::int64_t>,
                "kshard::vocab_parallel_lookup_backward: ids must be int32 or int64");
  static_assert(detail::is_view_of_rank<GradView>(2),
                "kshard::vocab_parallel_lookup_backward: grad_output must be a rank-2 "
                "Kokkos::View");
  static_assert(std::is_same_v<typename GradView::non_const_value_type, Out>,
                "kshard::vocab_parallel_lookup_backward: grad_output must have the forward's "
                "output element type, lookup_value_t<T>");
  static_assert(
      Kokkos::SpaceAccessibility<ExecSpace, typename GradView::memory_space>::accessible,
      "kshard::vocab_parallel_lookup_backward: grad_output must be readable from the table's "
      "execution space");

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
  if (padding_id && (*padding_id < 0 || *padding_id >= vocab))
    throw error(fmt::format(
        "kshard::{}: padding id {} is out of range for a vocabulary of {} rows (valid: 0 <= id < "
        "{})",
        who, *padding_id, vocab, vocab));

  // Host CSR: the touched local rows in increasing order, each with its positions in order.
  ExecSpace().fence();
  const auto host_ids = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids);
  const auto& rows = grad_table.mapping().rows;
  std::vector<std::pair<index_t, index_t>> hits;  // (local row, position)
  for (index_t i = 0; i < n; ++i) {
    const auto id = static_cast<index_t>(host_ids(static_cast<std::size_t>(i)));
    if (id < 0 || id >= vocab)
      throw error(fmt::format(
          "kshard::{}: token id {} is out of range for a vocabulary of {} rows (valid: 0 <= id < "
          "{}); nothing was written",
          who, id, vocab, vocab));
    if (padding_id && id == *padding_id) continue;
    if (const index_t l = rows.to_local(id); l != invalid_index) hits.emplace_back(l, i);
  }
  if (hits.empty() || h == 0) return;
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
  using Unmanaged = Kokkos::View<const index_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  auto to_device = [](const std::vector<index_t>& v, const std::string& label) {
    Kokkos::View<index_t*, MemSpace> d(Kokkos::view_alloc(Kokkos::WithoutInitializing, label),
                                       v.size());
    Kokkos::deep_copy(d, Unmanaged(v.data(), v.size()));
    return d;
  };
  const auto row_of = to_device(touched, "kshard::lookup_backward_rows");
  const auto begin_of = to_device(offsets, "kshard::lookup_backward_offsets");
  const auto position = to_device(positions, "kshard::lookup_backward_positions");
  const auto local = grad_table.local();
  const auto s = static_cast<Out>(scale);
  Kokkos::parallel_for(
      "kshard::vocab_parallel_lookup_backward",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<index_t>>(
          {0, 0}, {static_cast<index_t>(touched.size()), h}),
      KOKKOS_LAMBDA(const index_t u, const index_t j) {
        Out sum = Out(0);
        for (index_t q = begin_of(u); q < begin_of(u + 1); ++q)
          sum += s * grad_output(position(q), j);
        const index_t l = row_of(u);
        local(l, j) = static_cast<T>(static_cast<Out>(local(l, j)) + sum);
      });
}

// ---------------------------------------------------------------------------------------------
// Entering and leaving the tensor-parallel region

/// Forward of "reduce from the tensor-parallel region" (Megatron's
/// `reduce_from_tensor_model_parallel_region`): replaces `values` (a rank-1 or rank-2 view of
/// float, double, int32 or int64) in place by their SUM over the ranks along mesh dimension
/// `tp_dim`. Fences `ExecSpace` first; one all-reduce over `mesh.dim_comm(tp_dim)`, none when that
/// dimension has extent 1. Every rank of the mesh must call it with the same `tp_dim` and the
/// same extents along tp: as MPI's own all-reduce, this hot path does not spend a collective
/// agreeing on its arguments. A `tp_dim` outside the mesh on every rank throws the same
/// `kshard::error` on every rank.
template <class ExecSpace = void, std::size_t N, class View>
void reduce_from_tp(const Mesh<N>& mesh, std::size_t tp_dim, const View& values) {
  static_assert(detail::is_view_of_rank<View>(1) || detail::is_view_of_rank<View>(2),
                "kshard::reduce_from_tp: values must be a rank-1 or rank-2 Kokkos::View");
  using T = typename View::non_const_value_type;
  static_assert(
      detail::tp_float_v<T> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>,
      "kshard::reduce_from_tp: values must be float, double, int32 or int64");
  using Exec =
      std::conditional_t<std::is_void_v<ExecSpace>, typename View::execution_space, ExecSpace>;
  if (tp_dim >= N)
    throw error(
        fmt::format("kshard::reduce_from_tp: tp_dim is {}, but the mesh {} has {} "
                    "dimension(s)",
                    tp_dim, mesh, N));
  if (mesh.extent(tp_dim) > 1) detail::allreduce_sum_any<Exec>(values, mesh.dim_comm(tp_dim));
}

/// Backward of `reduce_from_tp`: the identity (the replicated gradient goes to every tp rank's
/// local contribution unchanged). No communication.
template <class View>
[[nodiscard]] View reduce_from_tp_backward(const View& grad) {
  return grad;
}

/// Forward of "copy to the tensor-parallel region" (Megatron's
/// `copy_to_tensor_model_parallel_region`), the conjugate of `reduce_from_tp`: the identity.
template <class View>
[[nodiscard]] View copy_to_tp(const View& values) {
  return values;
}

/// Backward of `copy_to_tp`: SUM of the tp ranks' gradients, in place, as `reduce_from_tp`.
template <class ExecSpace = void, std::size_t N, class View>
void copy_to_tp_backward(const Mesh<N>& mesh, std::size_t tp_dim, const View& grad) {
  reduce_from_tp<ExecSpace>(mesh, tp_dim, grad);
}

// ---------------------------------------------------------------------------------------------
// Row-parallel linear: weight [out, in] split by input features

/// Row-parallel linear layer forward: `y = allreduce_tp(x_local * W_local^T) + bias`, the
/// replicated `[N, out]` result on every rank.
///
/// `weight` is `out x in` with its columns (input features) split over mesh dimension `tp_dim`
/// only (`Shard<1>` or `StridedShard<1>`), float or double. `x_local` is `[N, in_local]`: this
/// rank's input features, in the order of `weight.mapping().cols` (the output of a
/// column-parallel layer whose weight rows are split the same way, for example). `bias` is the
/// replicated `[out]` bias, added once, after the reduction. An agreement within the tp group on
/// N, then one over the mesh on the weight, `tp_dim`, the bias's presence and the shapes (a wrong
/// or differing value on any rank is the same `kshard::error` everywhere), then one all-reduce
/// of N x out elements over `mesh.dim_comm(tp_dim)` (none when that dimension has extent 1).
template <ValuedMatrix W, class X, class B>
detail::tp_matrix_view_t<W> row_parallel_linear(const W& weight, const X& x_local, const B& bias,
                                                std::size_t tp_dim) {
  return detail::row_forward(weight, x_local, &bias, tp_dim);
}

/// Row-parallel linear layer forward without a bias.
template <ValuedMatrix W, class X>
detail::tp_matrix_view_t<W> row_parallel_linear(const W& weight, const X& x_local,
                                                std::size_t tp_dim) {
  return detail::row_forward(weight, x_local, static_cast<const detail::tp_no_bias_t<W>*>(nullptr),
                             tp_dim);
}

/// Row-parallel linear layer backward, from the replicated output gradient `grad_y` `[N, out]`:
/// returns `grad_x_local = grad_y * W_local` `[N, in_local]`, adds `grad_y^T * x_local` to
/// `grad_weight`'s local shard (laid out like `weight`, on the same mesh) and the column sums of
/// `grad_y` to the replicated `grad_bias` `[out]`. No communication; argument errors throw
/// `kshard::error` on the ranks that see them, before anything is written.
template <ValuedMatrix W, ValuedMatrix G, class X, class GY, class GB>
detail::tp_matrix_view_t<W> row_parallel_linear_backward(const W& weight, const X& x_local,
                                                         const GY& grad_y, const G& grad_weight,
                                                         const GB& grad_bias, std::size_t tp_dim) {
  return detail::row_backward(weight, x_local, grad_y, grad_weight, &grad_bias, tp_dim);
}

/// Row-parallel linear layer backward without a bias.
template <ValuedMatrix W, ValuedMatrix G, class X, class GY>
detail::tp_matrix_view_t<W> row_parallel_linear_backward(const W& weight, const X& x_local,
                                                         const GY& grad_y, const G& grad_weight,
                                                         std::size_t tp_dim) {
  return detail::row_backward(weight, x_local, grad_y, grad_weight,
                              static_cast<const detail::tp_no_bias_t<W>*>(nullptr), tp_dim);
}

// ---------------------------------------------------------------------------------------------
// Column-parallel linear: weight [out, in] split by output features

/// Column-parallel linear layer forward: `y_local = x * W_local^T + bias_local`, this rank's
/// `[N, out_local]` slice of the output (its columns are the output features of
/// `weight.mapping().rows`, in that order).
///
/// `weight` is `out x in` with its rows (output features) split over mesh dimension `tp_dim`
/// only (`Shard<0>` or `StridedShard<0>`), float or double. `x` is the replicated `[N, in]`
/// input, `bias_local` this rank's `[out_local]` slice of the bias. No communication.
template <ValuedMatrix W, class X, class B>
detail::tp_matrix_view_t<W> column_parallel_linear(const W& weight, const X& x, const B& bias_local,
                                                   std::size_t tp_dim) {
  return detail::column_forward(weight, x, &bias_local, tp_dim);
}

/// Column-parallel linear layer forward without a bias.
template <ValuedMatrix W, class X>
detail::tp_matrix_view_t<W> column_parallel_linear(const W& weight, const X& x,
                                                   std::size_t tp_dim) {
  return detail::column_forward(weight, x, static_cast<const detail::tp_no_bias_t<W>*>(nullptr),
                                tp_dim);
}

/// Column-parallel linear layer backward, from this rank's output gradient slice
/// `grad_y_local` `[N, out_local]`: returns the replicated `grad_x = allreduce_tp(grad_y_local *
/// W_local)` `[N, in]`, adds `grad_y_local^T * x` to `grad_weight`'s local shard (laid out like
/// `weight`, on the same mesh) and the column sums of `grad_y_local` to `grad_bias_local`
/// `[out_local]`. An agreement within the tp group on N, then one over the mesh on the weight,
/// the gradient matrix, `tp_dim` and the shapes (the same `kshard::error` on every rank, before
/// anything is written), then one all-reduce of N x in elements over `mesh.dim_comm(tp_dim)`
/// (none when that dimension has extent 1).
template <ValuedMatrix W, ValuedMatrix G, class X, class GY, class GB>
detail::tp_matrix_view_t<W> column_parallel_linear_backward(const W& weight, const X& x,
                                                            const GY& grad_y_local,
                                                            const G& grad_weight,
                                                            const GB& grad_bias_local,
                                                            std::size_t tp_dim) {
  return detail::column_backward(weight, x, grad_y_local, grad_weight, &grad_bias_local, tp_dim);
}

/// Column-parallel linear layer backward without a bias.
template <ValuedMatrix W, ValuedMatrix G, class X, class GY>
detail::tp_matrix_view_t<W> column_parallel_linear_backward(const W& weight, const X& x,
                                                            const GY& grad_y_local,
                                                            const G& grad_weight,
                                                            std::size_t tp_dim) {
  return detail::column_backward(weight, x, grad_y_local, grad_weight,
                                 static_cast<const detail::tp_no_bias_t<W>*>(nullptr), tp_dim);
}

}  // namespace kshard
