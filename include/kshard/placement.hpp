#pragma once

/// \file
/// Placements (how one mesh dimension holds a tensor) and layouts (one placement per mesh
/// dimension). Both are small value types; a layout is part of a matrix's type, so misuse is
/// a compile error. A placement type carries everything kshard's arithmetic asks of it: the
/// tensor dimension it splits and its split rule, or the reduction it leaves pending; see
/// docs/design.md, "Add a placement", for one defined outside kshard.

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "kshard/axis_split.hpp"
#include "kshard/comm/reduce_op.hpp"
#include "kshard/index.hpp"

namespace kshard {

/// What a placement does along its mesh dimension. The planner needs only "splits a tensor
/// dimension" (`tensor_dim >= 0`, by the placement's `split_rule`) and "pending reduction"
/// (`partial`); the kind names the built-in placements for messages and parsing, and `custom`
/// stands for any splitting placement defined outside kshard.
enum class PlacementKind { replicate, shard, strided_shard, partial, custom };

/// How a splitting placement cuts an axis of `extent` indices for coordinate `coord` of a mesh
/// dimension of `ranks` ranks, given its runtime `factor` (`split_factor()`). Called on the
/// host when a mapping is built; the `AxisSplit` it returns is what device code evaluates.
using SplitRule = AxisSplit (*)(index_t extent, index_t factor, index_t ranks, index_t coord);

/// Every rank along the mesh dimension holds the whole extent.
struct Replicate {
  static constexpr PlacementKind kind = PlacementKind::replicate;  ///< `replicate`
  static constexpr std::string_view name = "Replicate";            ///< as DTensor spells it
  static constexpr int tensor_dim = -1;                            ///< splits no tensor dimension
  static constexpr std::nullptr_t split_rule = nullptr;            ///< splits nothing
  /// Always 1 (only `StridedShard` has a factor).
  [[nodiscard]] static constexpr index_t split_factor() { return 1; }
  /// All `Replicate` placements are equal.
  friend constexpr bool operator==(Replicate, Replicate) { return true; }
};

/// Tensor dimension `D` is split across the mesh dimension by the torch.chunk rule.
template <int D>
struct Shard {
  static_assert(D >= 0, "kshard::Shard<D>: the tensor dimension D must be >= 0");
  static constexpr PlacementKind kind = PlacementKind::shard;   ///< `shard`
  static constexpr std::string_view name = "Shard";             ///< as DTensor spells it
  static constexpr int tensor_dim = D;                          ///< the tensor dimension split
  static constexpr SplitRule split_rule = &AxisSplit::chunked;  ///< torch.chunk, one piece
  /// Always 1: a plain shard is one piece.
  [[nodiscard]] static constexpr index_t split_factor() { return 1; }
  /// All `Shard<D>` placements are equal.
  friend constexpr bool operator==(Shard, Shard) { return true; }
};

/// FSDP2's right-to-left sharding: the extent is chunked into `split_factor` pieces, each piece
/// into one sub-piece per rank, and a rank holds its sub-piece of every piece. `Shard<D>` is
/// the case `split_factor == 1`. The factor must be > 0; matrices check it collectively.
template <int D>
struct StridedShard {
  static_assert(D >= 0, "kshard::StridedShard<D>: the tensor dimension D must be >= 0");
  static constexpr PlacementKind kind = PlacementKind::strided_shard;  ///< `strided_shard`
  static constexpr std::string_view name = "StridedShard";             ///< as DTensor spells it
  static constexpr int tensor_dim = D;  ///< the tensor dimension split
  /// torch.chunk into `factor` pieces, then each piece across the ranks: Shard's rule.
  static constexpr SplitRule split_rule = &AxisSplit::chunked;
  index_t factor = 1;  ///< number of pieces (runtime)

  /// The number of pieces, `factor`.
  [[nodiscard]] constexpr index_t split_factor() const { return factor; }
  /// Equal when the factors are.
  friend constexpr bool operator==(StridedShard, StridedShard) = default;
};

/// Every rank holds an addend; the value is the reduction `Op` across the mesh dimension.
template <ReduceOp Op = ReduceOp::sum>
struct Partial {
  static constexpr PlacementKind kind = PlacementKind::partial;  ///< `partial`
  static constexpr std::string_view name = "Partial";            ///< as DTensor spells it
  static constexpr int tensor_dim = -1;                          ///< splits no tensor dimension
  static constexpr std::nullptr_t split_rule = nullptr;          ///< splits nothing
  static constexpr ReduceOp op = Op;                             ///< the pending reduction
  /// Always 1 (only `StridedShard` has a factor).
  [[nodiscard]] static constexpr index_t split_factor() { return 1; }
  /// All `Partial<Op>` placements are equal.
  friend constexpr bool operator==(Partial, Partial) { return true; }
};

/// A type that can stand for one mesh dimension in a layout: a trivially copyable value with
/// a kind, a name, the tensor dimension it splits (-1 for none) and a runtime factor; one that
/// splits has a `SplitRule`, one that does not a `std::nullptr_t` rule (a type, not a value, so
/// that the check is a constant expression in every build); a `partial` one names its
/// reduction.
template <class P>
concept Placement = std::is_trivially_copyable_v<P> && requires(const P& p) {
  { P::kind } -> std::convertible_to<PlacementKind>;
  { P::name } -> std::convertible_to<std::string_view>;
  { P::tensor_dim } -> std::convertible_to<int>;
  { P::split_rule } -> std::convertible_to<SplitRule>;
  { p.split_factor() } -> std::convertible_to<index_t>;
} &&(P::tensor_dim >= 0) == !std::is_null_pointer_v<std::remove_cvref_t<decltype(P::split_rule)>> &&
    (P::kind != PlacementKind::partial || (P::tensor_dim < 0 && requires {
       { P::op } -> std::convertible_to<ReduceOp>;
     }));

/// How one mesh dimension acts on the tensor, with the placement type erased (for the
/// arithmetic, which needs values, not types). `Layout::actions()` fills every field from the
/// placement types; an action built by hand for a built-in placement can leave the rule and
/// the name at their defaults.
struct MeshDimAction {
  PlacementKind kind = PlacementKind::replicate;  ///< what the placement does
  int tensor_dim = -1;                            ///< tensor dimension split, or -1
  index_t split_factor = 1;                       ///< the placement's runtime factor
  SplitRule split_rule = &AxisSplit::chunked;     ///< its split rule (read when it splits)
  std::string_view name = {};                     ///< its name (printed for `custom` kinds)
};

/// One placement per mesh dimension, applied left to right.
template <Placement... Ps>
class Layout {
 public:
  /// Number of mesh dimensions the layout is for.
  static constexpr std::size_t rank = sizeof...(Ps);
  /// The placement kinds, known at compile time.
  static constexpr std::array<PlacementKind, rank> kinds{Ps::kind...};
  /// True when some mesh dimension holds a pending reduction.
  static constexpr bool has_partial = ((Ps::kind == PlacementKind::partial) || ...);
  /// Largest tensor dimension any placement splits (-1 when none does).
  static constexpr int max_tensor_dim = std::max({-1, Ps::tensor_dim...});

  /// Default-constructed placements (a `StridedShard` gets factor 1).
  constexpr Layout() = default;
  /// The layout with these placements, mesh dimension 0 first.
  constexpr explicit Layout(Ps... placements) : placements_(placements...) {}

  /// Placement of mesh dimension `M`.
  template <std::size_t M>
  [[nodiscard]] constexpr const auto& get() const {
    return std::get<M>(placements_);
  }

  /// The placements as values, one per mesh dimension.
  [[nodiscard]] constexpr std::array<MeshDimAction, rank> actions() const {
    return std::apply(
        [](const auto&... p) {
          return std::array<MeshDimAction, rank>{
              MeshDimAction{p.kind, p.tensor_dim, p.split_factor(), p.split_rule, p.name}...};
        },
        placements_);
  }

  /// The tensor dimension each mesh dimension splits (-1 for Replicate and Partial).
  static constexpr std::array<int, rank> tensor_dims{Ps::tensor_dim...};

  /// True when mesh coordinates `coords` hold the first copy of the data they hold along the
  /// tensor dimensions in `dims` ({0}: their rows, {0, 1}: their elements): coordinate 0 along
  /// every mesh dimension that splits none of `dims`. Counts replicated data once.
  [[nodiscard]] static constexpr bool is_first_copy(const std::array<int, rank>& coords,
                                                    std::initializer_list<int> dims) {
    for (std::size_t m = 0; m < rank; ++m) {
      bool splits_kept = false;
      for (int d : dims) splits_kept = splits_kept || tensor_dims[m] == d;
      if (!splits_kept && coords[m] != 0) return false;
    }
    return true;
  }

  /// The reduction pending on mesh dimension `m` (meaningful where `kinds[m]` is partial).
  [[nodiscard]] static constexpr ReduceOp partial_op(std::size_t m) {
    constexpr std::array<ReduceOp, rank> ops{reduce_op_of<Ps>()...};
    return ops[m];
  }

  /// True when a mesh dimension splits tensor dimension `d` (Shard or StridedShard).
  [[nodiscard]] static constexpr bool splits(int d) { return ((Ps::tensor_dim == d) || ...); }

  /// Equal when every placement is equal.
  friend constexpr bool operator==(const Layout&, const Layout&) = default;

 private:
  template <class P>
  static constexpr ReduceOp reduce_op_of() {
    if constexpr (P::kind == PlacementKind::partial)
      return P::op;
    else
      return ReduceOp::sum;
  }

  std::tuple<Ps...> placements_;
};

/// Deduces the layout type from its placements: `Layout(Replicate{}, Shard<0>{})`.
template <Placement... Ps>
Layout(Ps...) -> Layout<Ps...>;

}  // namespace kshard
