#pragma once

/// \file
/// `kshard::bf16`: 16-bit brain-float storage, the element type of most training checkpoints.
/// Arithmetic on it is always done in float (or double) by kshard's algorithms.

#include <cstdint>
#include <type_traits>

#include "kshard/detail/element.hpp"
#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/detail/macros.hpp"

namespace kshard {

/// Portable bfloat16 storage: the top 16 bits of an IEEE float, converted with
/// round-to-nearest-even (NaN stays NaN). Used where Kokkos has no 16-bit `bhalf_t`.
class bfloat16 {
 public:
  /// Positive zero.
  bfloat16() = default;
  /// Rounds `value` to the nearest bfloat16, ties to even; NaN stays NaN. Implicit, like float.
  KSHARD_HOST_DEVICE bfloat16(float value) : bits_(round(value)) {}  // NOLINT: implicit like float
  /// Converts `value` to float, then rounds that as above.
  KSHARD_HOST_DEVICE bfloat16(double value) : bfloat16(static_cast<float>(value)) {}  // NOLINT
  /// The exact float value (bfloat16 is a truncated float, so widening is lossless).
  KSHARD_HOST_DEVICE operator float() const {  // NOLINT: implicit like float
    const std::uint32_t wide = static_cast<std::uint32_t>(bits_) << 16;
    float value;
    __builtin_memcpy(&value, &wide, sizeof value);
    return value;
  }
  /// The raw 16 bits.
  [[nodiscard]] KSHARD_HOST_DEVICE std::uint16_t bits() const { return bits_; }

 private:
  static KSHARD_HOST_DEVICE std::uint16_t round(float value) {
    std::uint32_t wide;
    __builtin_memcpy(&wide, &value, sizeof wide);
    if ((wide & 0x7f800000u) == 0x7f800000u && (wide & 0x007fffffu) != 0)
      return static_cast<std::uint16_t>((wide >> 16) | 0x0040u);  // quiet NaN
    const std::uint32_t lsb = (wide >> 16) & 1u;
    return static_cast<std::uint16_t>((wide + 0x7fffu + lsb) >> 16);
  }
  std::uint16_t bits_ = 0;
};

/// The bf16 element type kshard uses: Kokkos' own where it is 16-bit storage, else
/// `kshard::bfloat16`.
#if KSHARD_KOKKOS_HAS_BF16
using bf16 = Kokkos::Experimental::bhalf_t;
#else
using bf16 = bfloat16;
#endif

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>,
              "kshard::bf16 must be 16-bit trivially copyable storage");

/// The type kshard squares and scales elements of `T` in: float for float, bf16 and f16,
/// double for double (the spec's "fp32, or the element type if wider").
template <class T>
using compute_type_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

namespace detail {
template <>
struct ElementOf<bf16> {
  static constexpr ElementCode code = ElementCode::bf16;
};
}  // namespace detail

}  // namespace kshard
