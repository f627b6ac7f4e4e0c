#pragma once

/// \file
/// `kshard::f16`: IEEE 754 half-precision storage, the element type of many published
/// checkpoints (`model.half()`). Arithmetic on it is always done in float (or double) by
/// kshard's algorithms.

#include <cstdint>
#include <type_traits>

#include "kshard/detail/element.hpp"
#include "kshard/detail/macros.hpp"

namespace kshard {

/// Portable half-precision storage (1 sign, 5 exponent, 10 significand bits), converted by
/// integer operations (and one exact multiply for subnormals), so that the bits do not depend on
/// the floating-point environment (flush-to-zero, a device's rounding): from float with
/// round-to-nearest-even (subnormals included; 65520 and above become infinity; NaN stays NaN
/// with its top payload bits, quieted), to float exactly (NaN quieted likewise).
class float16 {
 public:
  /// Positive zero.
  float16() = default;
  /// Rounds `value` to the nearest half, ties to even. Implicit, like float.
  KSHARD_HOST_DEVICE float16(float value) : bits_(round(value)) {}  // NOLINT: implicit like float
  /// Converts `value` to float, then rounds that as above.
  KSHARD_HOST_DEVICE float16(double value) : float16(static_cast<float>(value)) {}  // NOLINT
  /// The exact float value (every half is a float).
  KSHARD_HOST_DEVICE operator float() const {  // NOLINT: implicit like float
    const std::uint32_t sign = static_cast<std::uint32_t>(bits_ & 0x8000u) << 16;
    const std::uint32_t exponent = (bits_ >> 10) & 0x1fu;
    const std::uint32_t significand = bits_ & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: significand x 2^-24, exact in float (no rounding,
      // and a normal float result, so flush-to-zero modes do not touch it)
      const float magnitude = static_cast<float>(significand) * 0x1p-24f;
      return sign != 0 ? -magnitude : magnitude;
    }
    const std::uint32_t wide =
        exponent == 0x1fu  // infinity, or NaN: payload kept, quiet (as F16C and CUDA widen)
            ? sign | 0x7f800000u | (significand == 0 ? 0u : 0x400000u | (significand << 13))
            : sign | ((exponent + 112u) << 23) | (significand << 13);  // rebias 15 -> 127
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
    const auto sign = static_cast<std::uint16_t>((wide >> 16) & 0x8000u);
    const std::uint32_t magnitude = wide & 0x7fffffffu;
    if (magnitude > 0x7f800000u)  // NaN: the top payload bits, quiet
      return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u)  // 65520 (halfway past 65504, ties to even: up) and infinity
      return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) {  // 2^-14 and above: a normal half; a carry may raise it
      const std::uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
      return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
    }
    if (magnitude < 0x33000000u) return sign;  // 2^-25 and below (a tie to zero): zero
    // A subnormal half: the float's 24-bit significand shifted to units of 2^-24, rounded.
    const std::uint32_t exponent = magnitude >> 23;  // 102 to 112
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14 to 24
    std::uint32_t units = significand >> shift;
    const std::uint32_t rest = significand & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (units & 1u) != 0)) ++units;
    return static_cast<std::uint16_t>(sign | units);
  }
  std::uint16_t bits_ = 0;
};

/// The half-precision element type kshard uses (safetensors dtype F16).
using f16 = float16;

static_assert(sizeof(f16) == 2 && std::is_trivially_copyable_v<f16>,
              "kshard::f16 must be 16-bit trivially copyable storage");

namespace detail {
template <>
struct ElementOf<f16> {
  static constexpr ElementCode code = ElementCode::f16;
};
}  // namespace detail

}  // namespace kshard
