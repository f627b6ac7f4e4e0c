#pragma once

// The argument rules shared by the tensor-parallel headers (embedding.hpp, region.hpp,
// linear.hpp): what a layout, a view or a `TpDim` must be, the messages that name what is
// wrong, and the agreements of the functions that communicate.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/mpi.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/format.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/mesh.hpp"
#include "kshard/tensor_parallel/tp_dim.hpp"

namespace kshard::detail {

// Why `id` is not a row of a vocabulary of `vocab` rows (ids do not wrap here).
inline std::optional<std::string> id_range_problem(index_t id, index_t vocab, const char* who,
                                                   std::string_view what = "token id") {
  if (id >= 0 && id < vocab) return std::nullopt;
  return fmt::format(
      "kshard::{}: {} {} is out of range for a vocabulary of {} rows (valid: 0 <= id < {})", who,
      what, id, vocab, vocab);
}

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

// A Kokkos view: tells an output-view argument from a `TpDim` or a scale in overloads.
template <class V>
concept KokkosView = Kokkos::is_view<V>::value;

template <class V>
constexpr bool is_view_of_rank(int rank) {
  if constexpr (Kokkos::is_view<V>::value)
    return static_cast<int>(V::rank) == rank;
  else
    return false;
}

// The one mesh dimension that splits a tensor-parallel layout (tp_layout_v): the tp groups are
// the ranks along it.
template <class L>
constexpr std::size_t splitting_dim() {
  for (std::size_t m = 0; m < L::rank; ++m)
    if (L::tensor_dims[m] >= 0) return m;
  return 0;
}

// Number of mesh dimensions of layout L that split tensor dimension D.
template <class L, int D>
constexpr int mesh_dims_splitting() {
  int count = 0;
  for (int d : L::tensor_dims) count += d == D ? 1 : 0;
  return count;
}

// The tp_dim that layout L fixes for a call that splits tensor dimension D (the table's or the
// column-parallel weight's rows: 0, the row-parallel weight's columns: 1): the one mesh
// dimension that splits it. The default of every `TpDim` argument that follows a matrix.
template <class L, int D>
constexpr TpDim inferred_tp_dim() {
  static_assert(mesh_dims_splitting<L, D>() > 0,
                "kshard: tp_dim cannot be inferred: no mesh dimension of the layout shards the "
                "tensor-parallel dimension (the table's rows, the column-parallel weight's rows, "
                "the row-parallel weight's columns)");
  static_assert(mesh_dims_splitting<L, D>() < 2,
                "kshard: tp_dim cannot be inferred: more than one mesh dimension of the layout "
                "shards the tensor-parallel dimension (the table's rows, the column-parallel "
                "weight's rows, the row-parallel weight's columns)");
  std::size_t m = 0;
  while (m + 1 < L::rank && L::tensor_dims[m] != D) ++m;
  return TpDim{m};
}

// A new matrix view of the element type and memory space of `M`, as the layers return.
template <class M>
using tp_matrix_view_t =
    Kokkos::View<typename M::value_type**, Kokkos::LayoutRight, typename M::memory_space>;

// `tp_dim` must name a mesh dimension that splits tensor dimension `dim` of `matrix`. Functions
// that communicate fold this into their agreement (a `tp_dim` may differ between ranks); the
// others throw it where it is found.
template <class M>
std::optional<std::string> tp_dim_problem(const M& matrix, TpDim given, int dim, const char* who,
                                          const char* what) {
  using L = typename M::layout_type;
  const auto& mesh = matrix.mesh();
  const std::size_t tp_dim = given.index();
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

// Same shape and the same ranks: a gradient or a bias on the mesh of its weight.
template <std::size_t N>
bool on_same_ranks_alike(const Mesh<N>& a, const Mesh<N>& b) {
  return a.shape() == b.shape() && a.group().same_ranks_as(b.group());
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
  if (!on_same_ranks_alike(param.mesh(), grad.mesh()))
    return fmt::format("kshard::{}: {} is on {} but the weight is on {}, not the same mesh", who,
                       what, grad.mesh(), param.mesh());
  return std::nullopt;
}

// "R x C": the extents of a rank-2 view, for messages.
template <class V>
std::string shape_of(const V& v) {
  return fmt::format("{} x {}", v.extent(0), v.extent(1));
}

// The agreement of a tensor-parallel call on `matrix` that communicates within its tp groups:
// `agree_in_groups` along the mesh dimension that splits it, with the matrix (its layout and
// mesh decide the group), `tp_dim` and the values `mesh_wide` adds agreed over the whole mesh.
template <class M, class MeshWide, class InGroup>
void agree_tp_call(const M& matrix, std::string_view role, TpDim tp_dim,
                   const std::optional<std::string>& problem, MeshWide&& mesh_wide,
                   InGroup&& in_group) {
  agree_in_groups(
      matrix.mesh(), splitting_dim<typename M::layout_type>(), problem,
      [&](Agreement& agreement) {
        same_matrix(agreement, matrix, role);
        agreement.same("tp_dim", static_cast<std::int64_t>(tp_dim.index()));
        mesh_wide(agreement);
      },
      in_group);
}

}  // namespace kshard::detail
