#pragma once

/// \file
/// `kshard::TpDim`, the tensor-parallel mesh dimension as the tensor-parallel functions take it
/// (kshard/tensor_parallel.hpp). Part of kshard/tensor_parallel.hpp.

#include <compare>
#include <concepts>
#include <cstddef>

namespace kshard {

/// The index of the tensor-parallel mesh dimension of a call (`kshard::TpDim{1}`,
/// `kshard::TpDim{mesh.dim("tp")}`): a type of its own, so that a tensor-parallel call never
/// takes a dimension for a scale, nor a scale for a dimension.
class TpDim {
 public:
  /// The mesh dimension `m` (an index into the mesh's shape; a negative one names no dimension).
  template <std::integral Index>
  constexpr explicit TpDim(Index m) noexcept : index_(static_cast<std::size_t>(m)) {}

  /// The index of the mesh dimension.
  [[nodiscard]] constexpr std::size_t index() const noexcept { return index_; }

  /// Ordered as their indices.
  friend constexpr auto operator<=>(const TpDim&, const TpDim&) = default;

 private:
  std::size_t index_;
};

}  // namespace kshard
