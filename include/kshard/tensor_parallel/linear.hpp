#pragma once

/// \file
/// Row- and column-parallel linear layers (Megatron's `RowParallelLinear` and
/// `ColumnParallelLinear`), forward and backward, over one mesh dimension, the "tp" dimension.
/// Part of kshard/tensor_parallel.hpp, whose conventions apply.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/format.hpp"
#include "kshard/kernels/column_sums.hpp"
#include "kshard/kernels/copies.hpp"
#include "kshard/kernels/gemm.hpp"
#include "kshard/tensor_parallel/bias.hpp"
#include "kshard/tensor_parallel/checks.hpp"
#include "kshard/tensor_parallel/region.hpp"
#include "kshard/tensor_parallel/tp_dim.hpp"

namespace kshard {

/// The type of `no_bias`.
struct no_bias_t {
  explicit constexpr no_bias_t() = default;
};

/// Passed where a linear layer takes a bias (or a bias gradient): there is none. The default of
/// that argument; given, it lets a `kshard::TpDim` follow.
inline constexpr no_bias_t no_bias{};

namespace detail {

template <class B>
inline constexpr bool is_no_bias_v = std::is_same_v<std::remove_cvref_t<B>, no_bias_t>;

// A bias argument: `no_bias`, a rank-1 view (this rank's part), or an `out x 1` DistMatrix
// laid out like the weight's rows (kshard/tensor_parallel/bias.hpp).
template <class B>
concept BiasArgument = is_no_bias_v<B> ||
    is_view_of_rank<std::remove_cvref_t<B>>(1) || ValuedMatrix<B>;

// What the kernels use of a bias argument: a DistMatrix's local column, anything else as given.
template <class B>
auto local_bias(const B& bias) {
  if constexpr (DistributedMatrix<B>)
    return Kokkos::subview(bias.local(), Kokkos::ALL, 0);
  else
    return bias;
}

// The view type a bias argument is checked as: its local view, or (for no_bias) a vector of
// the weight's element type, which every check accepts.
template <class W, class B>
using bias_view_t =
    std::conditional_t<is_no_bias_v<B>,
                       Kokkos::View<typename W::value_type*, typename W::memory_space>,
                       decltype(local_bias(std::declval<const B&>()))>;

// A bias DistMatrix must be `out x 1` on the weight's mesh, laid out as bias_layout(weight's
// layout). Every value compared was agreed over the mesh when the matrices were built, so every
// rank finds the same problem without communicating.
template <class W, class B>
std::optional<std::string> bias_matrix_problem(const W& weight, const B& bias, const char* who,
                                               const char* what) {
  if constexpr (!DistributedMatrix<B>) {
    return std::nullopt;
  } else {
    static_assert(std::is_same_v<typename B::layout_type, bias_layout_t<typename W::layout_type>>,
                  "kshard: a bias DistMatrix must be split like its weight's rows and replicated "
                  "elsewhere: its layout type must be kshard::bias_layout_t<the weight's layout "
                  "type> (kshard::distribute_bias builds one)");
    static_assert(std::is_same_v<typename B::memory_space, typename W::memory_space>,
                  "kshard: a bias DistMatrix must live in its weight's memory space");
    const auto want = bias_layout(weight.layout());
    if (bias.rows() != weight.rows() || bias.cols() != 1)
      return fmt::format("kshard::{}: {} is {} x {} but the weight is {} x {}: it must be {} x 1",
                         who, what, bias.rows(), bias.cols(), weight.rows(), weight.cols(),
                         weight.rows());
    if (!(bias.layout() == want))
      return fmt::format(
          "kshard::{}: {} has layout {} but the weight's layout {} needs {}: the bias must be "
          "split like the weight's rows",
          who, what, bias.layout(), weight.layout(), want);
    if (!on_same_ranks_alike(bias.mesh(), weight.mesh()))
      return fmt::format("kshard::{}: {} is on {} but the weight is on {}, not the same mesh", who,
                         what, bias.mesh(), weight.mesh());
    return std::nullopt;
  }
}

// The number of elements of a bias argument (none for no_bias).
template <class B>
std::optional<index_t> bias_extent(const B& bias) {
  if constexpr (is_no_bias_v<B>)
    return std::nullopt;
  else
    return static_cast<index_t>(bias.extent(0));
}

// The compile-time rules for a linear layer on ExecSpace: its weight's element type, and
// activation, bias and gradient views of that type that ExecSpace can read.
template <class ExecSpace, class W, class... Views>
constexpr void check_linear_types() {
  using T = typename W::value_type;
  static_assert(tp_float_v<T>,
                "kshard: tensor-parallel linear layers take float or double weights");
  static_assert(
      (Kokkos::SpaceAccessibility<ExecSpace, typename Views::memory_space>::accessible && ...),
      "kshard: a view passed to a tensor-parallel linear layer is not readable from the "
      "execution space it runs on");
  static_assert((std::is_same_v<typename Views::non_const_value_type, T> && ...),
                "kshard: activations, biases and gradients must have the weight's element type");
}

template <class View, class Bias>
struct AddBias {
  View values;
  Bias bias;
  KOKKOS_INLINE_FUNCTION void operator()(index_t i, index_t j) const { values(i, j) += bias(j); }
};

// values(i, j) += bias(j), on `space`.
template <class ExecSpace, class View, class Bias>
void add_bias(const ExecSpace& space, const View& values, const Bias& bias) {
  Kokkos::parallel_for(
      "kshard::add_bias",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<index_t>>(
          space, {0, 0},
          {static_cast<index_t>(values.extent(0)), static_cast<index_t>(values.extent(1))}),
      AddBias<View, Bias>{values, bias});
}

// A new N x cols matrix view for a layer's result, overwritten by its product.
template <class W>
tp_matrix_view_t<W> layer_result(const std::string& label, std::size_t n, index_t cols) {
  return tp_matrix_view_t<W>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n,
                             static_cast<std::size_t>(cols));
}

// Row-parallel forward: y = allreduce_tp(x_local W_local^T) (+ bias).
template <class ExecSpace, class W, class X, class B>
tp_matrix_view_t<W> row_forward(const ExecSpace& space, const W& weight, const X& x_local,
                                const B& bias, TpDim tp_dim) {
  static_assert(tp_layout_v<typename W::layout_type, 1>,
                "kshard::row_parallel_linear: the weight's columns (input features) must be split "
                "over exactly one mesh dimension (the tp dimension), its rows not at all, and "
                "every other mesh dimension must Replicate it");
  static_assert(is_view_of_rank<X>(2) && BiasArgument<B>,
                "kshard::row_parallel_linear: x_local must be a rank-2 view and bias a rank-1 "
                "view or kshard::no_bias");
  check_linear_types<ExecSpace, W, X, bias_view_t<W, B>>();
  const char* who = "row_parallel_linear";
  const Operation operation(who);
  const auto in_local = weight.mapping().cols.local_extent();
  const auto bias_size = bias_extent(local_bias(bias));
  auto problem = bias_matrix_problem(weight, bias, who, "the bias");
  if (!problem && static_cast<index_t>(x_local.extent(1)) != in_local)
    problem = fmt::format(
        "kshard::{}: x_local on rank {} is {} but the weight's local shard there is {} (of "
        "{} x {}): x_local needs one column per local input feature ({})",
        who, weight.mesh().my_rank(), shape_of(x_local), shape_of(weight.local()), weight.rows(),
        weight.cols(), in_local);
  if (!problem && bias_size && *bias_size != weight.rows())
    problem = fmt::format(
        "kshard::{}: the bias has {} elements but the weight is {} x {}: it needs one per "
        "output feature ({})",
        who, *bias_size, weight.rows(), weight.cols(), weight.rows());
  if (!problem) problem = tp_dim_problem(weight, tp_dim, 1, who, "weight");
  agree_tp_call(
      weight, "the weight", tp_dim, problem,
      [&](Agreement& a) { a.same("whether a bias is given", !is_no_bias_v<B>); },
      [&](Agreement& a) {
        a.same("the number of rows of x_local (tokens)", static_cast<index_t>(x_local.extent(0)));
      });
  auto y = layer_result<W>("kshard::row_parallel_y", x_local.extent(0), weight.rows());
  gemm_nt(space, x_local, weight.local(), y, false);
  sum_over_tp(space, weight.mesh(), tp_dim, y);
  if constexpr (!is_no_bias_v<B>) add_bias(space, y, local_bias(bias));
  return y;
}

// Row-parallel backward: grad_x_local = grad_y W_local, grad_W_local += grad_y^T x_local,
// grad_bias += column sums of grad_y. No communication.
template <class ExecSpace, class W, class G, class X, class GY, class GB>
tp_matrix_view_t<W> row_backward(const ExecSpace& space, const W& weight, const X& x_local,
                                 const GY& grad_y, const G& grad_weight, const GB& grad_bias,
                                 TpDim tp_dim) {
  static_assert(tp_layout_v<typename W::layout_type, 1>,
                "kshard::row_parallel_linear_backward: the weight's columns must be split over "
                "exactly one mesh dimension (the tp dimension) and nothing else");
  static_assert(is_view_of_rank<X>(2) && is_view_of_rank<GY>(2) && BiasArgument<GB>,
                "kshard::row_parallel_linear_backward: x_local and grad_y must be rank-2 views, "
                "grad_bias a rank-1 view or kshard::no_bias");
  check_linear_types<ExecSpace, W, X, GY, bias_view_t<W, GB>>();
  const char* who = "row_parallel_linear_backward";
  throw_if(tp_dim_problem(weight, tp_dim, 1, who, "weight"));
  throw_if(placement_problem(weight, grad_weight, who, "grad_weight"));
  throw_if(bias_matrix_problem(weight, grad_bias, who, "grad_bias"));
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
  if (const auto size = bias_extent(local_bias(grad_bias)); size && *size != weight.rows())
    throw error(
        fmt::format("kshard::{}: grad_bias has {} elements but the weight is {} x {}: it needs {}",
                    who, *size, weight.rows(), weight.cols(), weight.rows()));
  auto grad_x = layer_result<W>("kshard::row_parallel_grad_x", grad_y.extent(0), in_local);
  gemm_nn(space, grad_y, weight.local(), grad_x, false);
  gemm_tn(space, grad_y, x_local, grad_weight.local(), true);
  if constexpr (!is_no_bias_v<GB>)
    add_column_sums(space, "kshard::column_sums", grad_y, local_bias(grad_bias), AllRows{});
  return grad_x;
}

// Column-parallel forward: y_local = x W_local^T (+ bias_local). No communication.
template <class ExecSpace, class W, class X, class B>
tp_matrix_view_t<W> column_forward(const ExecSpace& space, const W& weight, const X& x,
                                   const B& bias_local, TpDim tp_dim) {
  static_assert(tp_layout_v<typename W::layout_type, 0>,
                "kshard::column_parallel_linear: the weight's rows (output features) must be "
                "split over exactly one mesh dimension (the tp dimension), its columns not at "
                "all, and every other mesh dimension must Replicate it");
  static_assert(is_view_of_rank<X>(2) && BiasArgument<B>,
                "kshard::column_parallel_linear: x must be a rank-2 view and bias_local a rank-1 "
                "view or kshard::no_bias");
  check_linear_types<ExecSpace, W, X, bias_view_t<W, B>>();
  const char* who = "column_parallel_linear";
  throw_if(tp_dim_problem(weight, tp_dim, 0, who, "weight"));
  throw_if(bias_matrix_problem(weight, bias_local, who, "bias_local"));
  const auto out_local = weight.mapping().rows.local_extent();
  if (static_cast<index_t>(x.extent(1)) != weight.cols())
    throw error(fmt::format(
        "kshard::{}: x is {} but the weight is {} x {}: x needs one column per input feature "
        "({})",
        who, shape_of(x), weight.rows(), weight.cols(), weight.cols()));
  if (const auto size = bias_extent(local_bias(bias_local)); size && *size != out_local)
    throw error(fmt::format(
        "kshard::{}: bias_local on rank {} has {} elements but the weight's local shard there is "
        "{}: it needs one per local output feature ({})",
        who, weight.mesh().my_rank(), *size, shape_of(weight.local()), out_local));
  auto y = layer_result<W>("kshard::column_parallel_y", x.extent(0), out_local);
  gemm_nt(space, x, weight.local(), y, false);
  if constexpr (!is_no_bias_v<B>) add_bias(space, y, local_bias(bias_local));
  return y;
}

// Column-parallel backward: grad_x = allreduce_tp(grad_y_local W_local), grad_W_local +=
// grad_y_local^T x, grad_bias_local += column sums of grad_y_local.
template <class ExecSpace, class W, class G, class X, class GY, class GB>
tp_matrix_view_t<W> column_backward(const ExecSpace& space, const W& weight, const X& x,
                                    const GY& grad_y_local, const G& grad_weight,
                                    const GB& grad_bias_local, TpDim tp_dim) {
  static_assert(tp_layout_v<typename W::layout_type, 0>,
                "kshard::column_parallel_linear_backward: the weight's rows must be split over "
                "exactly one mesh dimension (the tp dimension) and nothing else");
  static_assert(is_view_of_rank<X>(2) && is_view_of_rank<GY>(2) && BiasArgument<GB>,
                "kshard::column_parallel_linear_backward: x and grad_y_local must be rank-2 "
                "views, grad_bias_local a rank-1 view or kshard::no_bias");
  check_linear_types<ExecSpace, W, X, GY, bias_view_t<W, GB>>();
  const char* who = "column_parallel_linear_backward";
  const Operation operation(who);
  const auto out_local = weight.mapping().rows.local_extent();
  const auto bias_size = bias_extent(local_bias(grad_bias_local));
  auto problem = bias_matrix_problem(weight, grad_bias_local, who, "grad_bias_local");
  if (!problem && static_cast<index_t>(x.extent(1)) != weight.cols())
    problem = fmt::format(
        "kshard::{}: x is {} but the weight is {} x {}: x needs one column per input feature "
        "({})",
        who, shape_of(x), weight.rows(), weight.cols(), weight.cols());
  if (!problem && (static_cast<index_t>(grad_y_local.extent(1)) != out_local ||
                   grad_y_local.extent(0) != x.extent(0)))
    problem = fmt::format(
        "kshard::{}: grad_y_local on rank {} is {} but x is {} and the weight's local shard is "
        "{}: grad_y_local must be {} x {}",
        who, weight.mesh().my_rank(), shape_of(grad_y_local), shape_of(x), shape_of(weight.local()),
        x.extent(0), out_local);
  if (!problem && bias_size && *bias_size != out_local)
    problem = fmt::format(
        "kshard::{}: grad_bias_local on rank {} has {} elements but the weight's local shard "
        "there is {}: it needs {}",
        who, weight.mesh().my_rank(), *bias_size, shape_of(weight.local()), out_local);
  if (!problem) problem = tp_dim_problem(weight, tp_dim, 0, who, "weight");
  if (!problem) problem = placement_problem(weight, grad_weight, who, "grad_weight");
  // grad_weight is checked against the agreed weight on each rank (placement_problem).
  agree_tp_call(
      weight, "the weight", tp_dim, problem,
      [&](Agreement& a) { a.same("whether grad_bias_local is given", !is_no_bias_v<GB>); },
      [&](Agreement& a) {
        a.same("the number of rows of x (tokens)", static_cast<index_t>(x.extent(0)));
      });
  auto grad_x = layer_result<W>("kshard::column_parallel_grad_x", x.extent(0), weight.cols());
  gemm_nn(space, grad_y_local, weight.local(), grad_x, false);
  gemm_tn(space, grad_y_local, x, grad_weight.local(), true);
  if constexpr (!is_no_bias_v<GB>)
    add_column_sums(space, "kshard::column_sums", grad_y_local, local_bias(grad_bias_local),
                    AllRows{});
  sum_over_tp(space, weight.mesh(), tp_dim, grad_x);
  return grad_x;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Row-parallel linear: weight [out, in] split by input features

/// Row-parallel linear layer forward: `y = allreduce_tp(x_local * W_local^T) + bias`, the
/// replicated `[N, out]` result on every rank, computed on `space` (which is fenced before the
/// all-reduce; the bias is added on `space` after it, not waited for).
///
/// `weight` is `out x in` with its columns (input features) split over mesh dimension `tp_dim`
/// only (`Shard<1>` or `StridedShard<1>`), float or double; without `tp_dim`, the mesh
/// dimension that splits them. `x_local` is `[N, in_local]`: this rank's input features, in the
/// order of `weight.mapping().cols` (the output of a column-parallel layer whose weight rows
/// are split the same way, for example). `bias` is the replicated `[out]` bias (a view, or the
/// `out x 1` DistMatrix of `kshard::distribute_bias`), added once, after the reduction, or
/// `kshard::no_bias` (the default; pass it to give `tp_dim` without a bias). One agreement over
/// the mesh on the weight (its layout and mesh choose the tp group), `tp_dim`, the bias's
/// presence and every rank's shapes, then on N within the tp group (in the same agreement
/// where the tp group is the whole mesh, else in two more: the group's, then the mesh's on its
/// outcome), so a wrong or differing value on any rank is the same `kshard::error` everywhere;
/// then one all-reduce of N x out elements over `mesh.dim_comm(tp_dim)` (none when that
/// dimension has extent 1).
template <class ExecSpace, ValuedMatrix W, class X, detail::BiasArgument B = no_bias_t>
requires detail::ExecutionSpaceFor<ExecSpace, W> detail::tp_matrix_view_t<W> row_parallel_linear(
    const ExecSpace& space, const W& weight, const X& x_local, const B& bias = no_bias,
    TpDim tp_dim = detail::inferred_tp_dim<typename W::layout_type, 1>()) {
  return detail::row_forward(space, weight, x_local, bias, tp_dim);
}

/// `row_parallel_linear(space, weight, x_local, bias, tp_dim)` on a default instance of the
/// weight's execution space.
template <ValuedMatrix W, class X, detail::BiasArgument B = no_bias_t>
detail::tp_matrix_view_t<W> row_parallel_linear(
    const W& weight, const X& x_local, const B& bias = no_bias,
    TpDim tp_dim = detail::inferred_tp_dim<typename W::layout_type, 1>()) {
  return detail::row_forward(typename W::execution_space{}, weight, x_local, bias, tp_dim);
}

/// Row-parallel linear layer backward, from the replicated output gradient `grad_y` `[N, out]`:
/// returns `grad_x_local = grad_y * W_local` `[N, in_local]`, adds `grad_y^T * x_local` to
/// `grad_weight`'s local shard (laid out like `weight`, on the same mesh) and the column sums of
/// `grad_y` to the replicated `grad_bias` `[out]` (a view or a bias DistMatrix; unless it is
/// `kshard::no_bias`, the default). `tp_dim` as for the forward. Runs on `space`, not waited
/// for. No communication; argument errors throw `kshard::error` on the ranks that see them,
/// before anything is written.
template <class ExecSpace, ValuedMatrix W, ValuedMatrix G, class X, class GY,
          detail::BiasArgument GB = no_bias_t>
requires detail::ExecutionSpaceFor<ExecSpace, W> detail::tp_matrix_view_t<W>
row_parallel_linear_backward(const ExecSpace& space, const W& weight, const X& x_local,
                             const GY& grad_y, const G& grad_weight, const GB& grad_bias = no_bias,
                             TpDim tp_dim = detail::inferred_tp_dim<typename W::layout_type, 1>()) {
  return detail::row_backward(space, weight, x_local, grad_y, grad_weight, grad_bias, tp_dim);
}

/// `row_parallel_linear_backward(space, weight, x_local, grad_y, grad_weight, grad_bias,
/// tp_dim)` on a default instance of the weight's execution space.
template <ValuedMatrix W, ValuedMatrix G, class X, class GY, detail::BiasArgument GB = no_bias_t>
detail::tp_matrix_view_t<W> row_parallel_linear_backward(
    const W& weight, const X& x_local, const GY& grad_y, const G& grad_weight,
    const GB& grad_bias = no_bias,
    TpDim tp_dim = detail::inferred_tp_dim<typename W::layout_type, 1>()) {
  return detail::row_backward(typename W::execution_space{}, weight, x_local, grad_y, grad_weight,
                              grad_bias, tp_dim);
}

// ---------------------------------------------------------------------------------------------
// Column-parallel linear: weight [out, in] split by output features

/// Column-parallel linear layer forward: `y_local = x * W_local^T + bias_local`, this rank's
/// `[N, out_local]` slice of the output (its columns are the output features of
/// `weight.mapping().rows`, in that order), computed on `space`, not waited for.
///
/// `weight` is `out x in` with its rows (output features) split over mesh dimension `tp_dim`
/// only (`Shard<0>` or `StridedShard<0>`), float or double; without `tp_dim`, the mesh
/// dimension that splits them. `x` is the replicated `[N, in]` input, `bias_local` this rank's
/// `[out_local]` slice of the bias, the whole bias as the `out x 1` DistMatrix of
/// `kshard::distribute_bias` (split like the weight's rows, checked against its layout: the
/// same `kshard::error` on every rank), or `kshard::no_bias` (the default; pass it to give
/// `tp_dim` without a bias). No communication.
template <class ExecSpace, ValuedMatrix W, class X, detail::BiasArgument B = no_bias_t>
requires detail::ExecutionSpaceFor<ExecSpace, W> detail::tp_matrix_view_t<W> column_parallel_linear(
    const ExecSpace& space, const W& weight, const X& x, const B& bias_local = no_bias,
    TpDim tp_dim = detail::inferred_tp_dim<typename W::layout_type, 0>()) {
  return detail::column_forward(space, weight, x, bias_local, tp_dim);
}

/// `column_parallel_linear(space, weight, x, bias_local, tp_dim)` on a default instance of the
/// weight's execution space.
template <ValuedMatrix W, class X, detail::BiasArgument B = no_bias_t>
detail::tp_matrix_view_t<W> column_parallel_linear(
    const W& weight, const X& x, const B& bias_local = no_bias,
    TpDim tp_dim = detail::inferred_tp_dim<typename W::layout_type, 0>()) {
  return detail::column_forward(typename W::execution_space{}, weight, x, bias_local, tp_dim);
}

/// Column-parallel linear layer backward, from this rank's output gradient slice
/// `grad_y_local` `[N, out_local]`: returns the replicated `grad_x = allreduce_tp(grad_y_local *
/// W_local)` `[N, in]`, adds `grad_y_local^T * x` to `grad_weight`'s local shard (laid out like
/// `weight`, on the same mesh) and the column sums of `grad_y_local` to `grad_bias_local`
/// `[out_local]` (or to the local rows of a bias DistMatrix laid out like `distribute_bias`'s;
/// unless it is `kshard::no_bias`, the default). `tp_dim` as for the forward. Runs on `space`
/// (fenced before the all-reduce). One agreement over the mesh on the weight (its layout and
/// mesh choose the tp group), the gradient matrix, `tp_dim` and every rank's shapes, then on N
/// within the tp group (in the same agreement where the tp group is the whole mesh, else in two
/// more), so every rank throws the same `kshard::error` before anything is written; then one
/// all-reduce of N x in elements over `mesh.dim_comm(tp_dim)` (none when that dimension has
/// extent 1).
template <class ExecSpace, ValuedMatrix W, ValuedMatrix G, class X, class GY,
          detail::BiasArgument GB = no_bias_t>
requires detail::ExecutionSpaceFor<ExecSpace, W> detail::tp_matrix_view_t<W>
column_parallel_linear_backward(
    const ExecSpace& space, const W& weight, const X& x, const GY& grad_y_local,
    const G& grad_weight, const GB& grad_bias_local = no_bias,
    TpDim tp_dim = detail::inferred_tp_dim<typename W::layout_type, 0>()) {
  return detail::column_backward(space, weight, x, grad_y_local, grad_weight, grad_bias_local,
                                 tp_dim);
}

/// `column_parallel_linear_backward(space, weight, x, grad_y_local, grad_weight,
/// grad_bias_local, tp_dim)` on a default instance of the weight's execution space.
template <ValuedMatrix W, ValuedMatrix G, class X, class GY, detail::BiasArgument GB = no_bias_t>
detail::tp_matrix_view_t<W> column_parallel_linear_backward(
    const W& weight, const X& x, const GY& grad_y_local, const G& grad_weight,
    const GB& grad_bias_local = no_bias,
    TpDim tp_dim = detail::inferred_tp_dim<typename W::layout_type, 0>()) {
  return detail::column_backward(typename W::execution_space{}, weight, x, grad_y_local,
                                 grad_weight, grad_bias_local, tp_dim);
}

}  // namespace kshard
