#pragma once

/// \file
/// Where each rank's shard lives in the global matrix: extents, offsets, owned runs and
/// local <-> global index maps. Pure arithmetic on global data: any rank can compute any
/// other rank's mapping without communicating, and the maps are usable in device kernels.

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kshard/axis_split.hpp"
#include "kshard/index.hpp"
#include "kshard/placement.hpp"

namespace kshard {

/// The map of one tensor axis for one mesh coordinate: the composition of the splits of
/// every mesh dimension that shards the axis, outermost first. Trivially copyable, no
/// allocation; every query is O(number of splits), and exact for every extent in
/// [0, INT64_MAX], split factor in [1, INT64_MAX] and rank count in [1, INT_MAX]: an index is
/// range-checked before it reaches a split, and each split maps an index in its range to one
/// in the next range (see `AxisSplit`), so no intermediate leaves [0, extent].
template <std::size_t MaxSplits>
class AxisMap {
 public:
  /// An empty axis (extent 0, no splits).
  constexpr AxisMap() = default;
  /// An axis of `global_extent` indices, not split yet: every index is local.
  KSHARD_HOST_DEVICE constexpr explicit AxisMap(index_t global_extent)
      : global_extent_(global_extent), local_extent_(global_extent) {}

  /// Splits the current local extent once more (once per sharding mesh dimension): `split`
  /// must cut exactly `local_extent()` indices.
  KSHARD_FUNCTION void add_split(const AxisSplit& split) {
    splits_[num_splits_] = split;
    local_extent_ = split.local_extent();
    ++num_splits_;
  }
  /// Splits the current local extent once more by the chunk rule (`AxisSplit::chunked`).
  KSHARD_FUNCTION void add_split(index_t pieces, index_t ranks, index_t coord) {
    add_split(AxisSplit::chunked(local_extent_, pieces, ranks, coord));
  }

  /// Extent of the whole axis.
  [[nodiscard]] KSHARD_FUNCTION index_t global_extent() const { return global_extent_; }
  /// Extent held by this coordinate.
  [[nodiscard]] KSHARD_FUNCTION index_t local_extent() const { return local_extent_; }
  /// Number of mesh dimensions that split this axis.
  [[nodiscard]] KSHARD_FUNCTION std::size_t num_splits() const { return num_splits_; }

  /// Global index of local index `local` (any value), or `invalid_index` when out of range.
  [[nodiscard]] KSHARD_FUNCTION index_t to_global(index_t local) const {
    if (local < 0 || local >= local_extent_) return invalid_index;
    for (std::size_t j = num_splits_; j-- > 0;) local = splits_[j].to_parent(local);
    return local;
  }

  /// Local index of global index `global` (negative indices are not wrapped), or
  /// `invalid_index` when this coordinate does not hold it.
  [[nodiscard]] KSHARD_FUNCTION index_t to_local(index_t global) const {
    if (global < 0 || global >= global_extent_) return invalid_index;
    for (std::size_t j = 0; j < num_splits_ && global != invalid_index; ++j)
      global = splits_[j].from_parent(global);
    return global;
  }

  /// True when this coordinate holds global index `global`.
  [[nodiscard]] KSHARD_FUNCTION bool is_local(index_t global) const {
    return to_local(global) != invalid_index;
  }

  /// Number of local indices from `local` on whose global indices are consecutive; 0 when
  /// `local` is out of range (checked first, so `local_extent_ - local` cannot overflow).
  [[nodiscard]] KSHARD_FUNCTION index_t run_length(index_t local) const {
    if (local < 0 || local >= local_extent_) return 0;
    index_t length = local_extent_ - local;
    for (std::size_t j = num_splits_; j-- > 0;) {
      const index_t here = splits_[j].run_remaining(local);
      length = here < length ? here : length;
      local = splits_[j].to_parent(local);
    }
    return length;
  }

  /// True when the local indices are one run of consecutive global indices (or none).
  [[nodiscard]] KSHARD_FUNCTION bool is_contiguous() const {
    return local_extent_ == 0 || run_length(0) == local_extent_;
  }

  /// Global index of the first local index; the global extent for an empty shard, so that
  /// `[global_offset(), global_offset() + local_extent())` is always a valid empty range.
  [[nodiscard]] KSHARD_FUNCTION index_t global_offset() const {
    return local_extent_ == 0 ? global_extent_ : to_global(0);
  }

  /// The owned global indices as maximal runs, in increasing (= local) order. Host only.
  [[nodiscard]] std::vector<IndexRun> runs() const {
    std::vector<IndexRun> result;
    for (index_t local = 0; local < local_extent_;) {
      const index_t length = run_length(local);
      result.push_back({to_global(local), local, length});
      local += length;
    }
    return result;
  }

 private:
  index_t global_extent_ = 0;
  index_t local_extent_ = 0;
  std::size_t num_splits_ = 0;
  AxisSplit splits_[MaxSplits > 0 ? MaxSplits : 1] = {};
};

namespace detail {

// A product of extents, saturated at INT64_MAX: extents up to INT64_MAX can have a product no
// index_t holds, and no shard that large can exist (or fit one MPI message).
KSHARD_FUNCTION index_t saturating_product(index_t a, index_t b) {
  return a != 0 && b > INT64_MAX / a ? INT64_MAX : a * b;  // b <= max / a: a * b <= max
}

}  // namespace detail

/// One rank's view of a layout of a tensor of rank `Rank` on an N-D mesh: one `AxisMap` per
/// tensor dimension. Rank 2 (kshard's matrices) names its axes `rows` and `cols`.
template <std::size_t N, std::size_t Rank = 2>
struct LayoutMapping {
  static_assert(Rank >= 1, "kshard::LayoutMapping: a tensor has at least one dimension");
  static constexpr std::size_t rank = Rank;  ///< number of tensor dimensions
  AxisMap<N> axes[Rank];                     ///< map of each tensor dimension

  /// The map of tensor dimension `d`.
  [[nodiscard]] KSHARD_FUNCTION const AxisMap<N>& axis(int d) const { return axes[d]; }
  /// The map of tensor dimension `d`, to split.
  [[nodiscard]] KSHARD_FUNCTION AxisMap<N>& axis(int d) { return axes[d]; }
  /// Number of local elements, saturated at INT64_MAX.
  [[nodiscard]] KSHARD_FUNCTION index_t local_size() const {
    index_t size = 1;
    for (std::size_t d = 0; d < Rank; ++d)
      size = detail::saturating_product(size, axes[d].local_extent());
    return size;
  }
};

/// One rank's view of a 2-D layout on an N-D mesh: an `AxisMap` for rows and one for columns.
template <std::size_t N>
struct LayoutMapping<N, 2> {
  static constexpr std::size_t rank = 2;  ///< number of tensor dimensions
  AxisMap<N> rows;                        ///< map of tensor dimension 0
  AxisMap<N> cols;                        ///< map of tensor dimension 1

  /// The map of tensor dimension `d` (0 = rows, 1 = columns).
  [[nodiscard]] KSHARD_FUNCTION const AxisMap<N>& axis(int d) const { return d == 0 ? rows : cols; }
  /// The map of tensor dimension `d` (0 = rows, 1 = columns), to split.
  [[nodiscard]] KSHARD_FUNCTION AxisMap<N>& axis(int d) { return d == 0 ? rows : cols; }
  /// Number of local elements, saturated at INT64_MAX: two extents up to INT64_MAX can have
  /// a product no index_t holds, and no shard that large can exist (or fit one MPI message).
  [[nodiscard]] KSHARD_FUNCTION index_t local_size() const {
    return detail::saturating_product(rows.local_extent(), cols.local_extent());
  }
};

/// The coordinates of linear rank `rank` on a mesh of `shape`: row-major, the last mesh
/// dimension fastest, as `Mesh` numbers its ranks.
template <std::size_t N>
constexpr std::array<int, N> mesh_coords(const std::array<int, N>& shape, int rank) {
  std::array<int, N> coords{};
  for (std::size_t m = N; m-- > 0;) {
    coords[m] = rank % shape[m];
    rank /= shape[m];
  }
  return coords;
}

/// The mapping of a tensor of `extents` for mesh coordinate `coord` on a mesh of `shape`,
/// where mesh dimension m acts as `actions[m]` (its split rule cuts what the dimensions
/// before it left). Split factors must be > 0 (matrices check); a mesh dimension that splits
/// a tensor dimension >= `Rank` is skipped (matrices reject such layouts at compile time).
/// Host only (split rules are host functions); the mapping it returns is device-callable.
template <std::size_t N, std::size_t Rank>
constexpr LayoutMapping<N, Rank> map_layout(const std::array<MeshDimAction, N>& actions,
                                            const std::array<int, N>& shape,
                                            const std::array<int, N>& coord,
                                            const std::array<index_t, Rank>& extents) {
  LayoutMapping<N, Rank> mapping{};
  for (std::size_t d = 0; d < Rank; ++d) mapping.axis(static_cast<int>(d)) = AxisMap<N>(extents[d]);
  for (std::size_t m = 0; m < N; ++m) {
    const MeshDimAction& a = actions[m];
    if (a.tensor_dim < 0 || static_cast<std::size_t>(a.tensor_dim) >= Rank) continue;
    AxisMap<N>& axis = mapping.axis(a.tensor_dim);
    axis.add_split(a.split_rule(axis.local_extent(), a.split_factor, shape[m], coord[m]));
  }
  return mapping;
}

/// The mapping of a `rows x cols` matrix (the rank-2 form of `map_layout`).
template <std::size_t N>
constexpr LayoutMapping<N> map_layout(const std::array<MeshDimAction, N>& actions,
                                      const std::array<int, N>& shape,
                                      const std::array<int, N>& coord, index_t rows, index_t cols) {
  return map_layout(actions, shape, coord, std::array<index_t, 2>{rows, cols});
}

}  // namespace kshard
