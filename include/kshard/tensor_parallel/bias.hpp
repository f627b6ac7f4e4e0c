#pragma once

/// \file
/// Distributed biases of the tensor-parallel linear layers (kshard/tensor_parallel/linear.hpp). A
/// bias is an `out x 1` `DistMatrix` whose rows are split exactly as its weight's rows (the output
/// features) and which every other mesh dimension replicates: the column-parallel bias is then
/// sharded like its weight's output dimension and the row-parallel bias replicated, with no
/// slicing by hand.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/distribute.hpp"
#include "kshard/error.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/placement.hpp"

namespace kshard {

namespace detail {

// A bias keeps its weight's placements that split the weight's rows and replicates the rest
// (the weight's columns are its input features, which a bias does not have).
template <class P>
using bias_placement_t = std::conditional_t<P::tensor_dim == 0, P, Replicate>;

template <class P>
constexpr bias_placement_t<P> bias_placement(const P& placement) {
  if constexpr (P::tensor_dim == 0)
    return placement;  // with its split factor
  else
    return Replicate{};
}

template <class L>
struct bias_layout_of;

template <class... Ps>
struct bias_layout_of<Layout<Ps...>> {
  using type = Layout<bias_placement_t<Ps>...>;
};

}  // namespace detail

/// The layout type of the bias of a linear layer whose weight has layout type `L`: `L`'s
/// placements that split tensor dimension 0 (the weight's rows), `Replicate` elsewhere.
template <class L>
using bias_layout_t = typename detail::bias_layout_of<L>::type;

/// The bias matrix type of a linear layer with weight type `W`, on instances of `ExecSpace`.
template <class W, class ExecSpace = typename W::execution_space>
using bias_matrix_t = DistMatrix<typename W::value_type, bias_layout_t<typename W::layout_type>,
                                 ExecSpace, typename W::memory_space>;

/// The layout of the bias of a linear layer whose weight has layout `weight_layout`: its
/// placements that split the weight's rows (split factors included), `Replicate` elsewhere.
/// `Layout(Replicate, Shard<0>)` (column-parallel) stays itself; `Layout(Replicate, Shard<1>)`
/// (row-parallel) becomes `Layout(Replicate, Replicate)`.
template <class... Ps>
constexpr bias_layout_t<Layout<Ps...>> bias_layout(const Layout<Ps...>& weight_layout) {
  return [&]<std::size_t... M>(std::index_sequence<M...>) {
    return bias_layout_t<Layout<Ps...>>(detail::bias_placement(weight_layout.template get<M>())...);
  }
  (std::index_sequence_for<Ps...>{});
}

/// Builds the bias of the linear layer of `weight` from `full`, the whole `[out]` bias (a rank-1
/// host-readable view of the weight's element type) present on every rank: an `out x 1`
/// `DistMatrix` on the weight's mesh with layout `bias_layout(weight.layout())`, each rank
/// holding its own rows. The linear layers take it (or a zero matrix of the same type, shape
/// and layout) as their bias or bias gradient. Collective: one fixed-size agreement on the
/// weight (element type, shape, layout, mesh) and the length of `full`, then `distribute`
/// (which copies on `space` and fences it); another weight or `full` on some ranks, or `full`
/// without one element per weight row, is the same `kshard::error` on every rank, before
/// anything is built.
template <class ExecSpace, ValuedMatrix W, class HostVector>
requires detail::ExecutionSpaceFor<ExecSpace, W> bias_matrix_t<W, ExecSpace> distribute_bias(
    const ExecSpace& space, const W& weight, const HostVector& full,
    const std::string& label = "kshard::bias") {
  using T = typename W::value_type;
  static_assert(Kokkos::is_view<HostVector>::value && HostVector::rank == 1 &&
                    std::is_same_v<typename HostVector::non_const_value_type, T> &&
                    Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                               typename HostVector::memory_space>::accessible,
                "kshard::distribute_bias: full must be a rank-1 host view of the weight's "
                "element type");
  const detail::Operation operation("distribute_bias");
  const auto elements = static_cast<index_t>(full.extent(0));
  detail::Agreement agreement(weight.mesh().group());
  detail::same_matrix(agreement, weight, "the weight");
  agreement.same("the number of elements of the bias", elements);
  if (elements != weight.rows())
    agreement.problem(fmt::format(
        "kshard::distribute_bias: the bias has {} elements but the weight is {} x {}: it needs "
        "one per output feature ({})",
        elements, weight.rows(), weight.cols(), weight.rows()));
  agreement.settle();
  HostMatrix<T> column(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::distribute_bias"),
                       full.extent(0), 1);
  for (std::size_t i = 0; i < full.extent(0); ++i) column(i, 0) = full(i);
  return distribute<ExecSpace, typename W::memory_space>(
      space, weight.mesh(), bias_layout(weight.layout()), column, label);
}

/// `distribute_bias(space, weight, full, label)` on a default instance of the weight's
/// execution space.
template <ValuedMatrix W, class HostVector>
bias_matrix_t<W> distribute_bias(const W& weight, const HostVector& full,
                                 const std::string& label = "kshard::bias") {
  return distribute_bias(typename W::execution_space{}, weight, full, label);
}

}  // namespace kshard
