// kshard::f16 against the compiler's IEEE half (_Float16, GCC >= 12 and Clang >= 15 on x86-64,
// converting in hardware or libgcc): every half to float, and from float every rounding
// boundary of every half (each tie, one float below and above it: normals, subnormals, the
// overflow to infinity, the underflow to zero), both signs, plus NaNs and a million random
// float bit patterns.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "kshard/float16.hpp"

namespace {

#if defined(__FLT16_MANT_DIG__)

std::uint16_t reference_half(float value) { return std::bit_cast<std::uint16_t>(_Float16(value)); }

// kshard's bits for `value` against the reference's, NaN payloads included.
bool same_half(float value) { return kshard::f16(value).bits() == reference_half(value); }

TEST(Float16, EveryHalfWidensExactly) {
  int wrong = 0;
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto half = std::bit_cast<kshard::f16>(static_cast<std::uint16_t>(bits));
    const float want =
        static_cast<float>(std::bit_cast<_Float16>(static_cast<std::uint16_t>(bits)));
    const float got = half;
    const bool ok = std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want);
    if (!ok && ++wrong <= 5) ADD_FAILURE() << std::hex << "half 0x" << bits << ": " << got;
  }
  EXPECT_EQ(wrong, 0);
}

TEST(Float16, EveryRoundingBoundaryOfEveryHalf) {
  int wrong = 0, checked = 0;
  const auto check = [&](float value) {
    ++checked;
    if (!same_half(value) && ++wrong <= 5)
      ADD_FAILURE() << std::hex << "float 0x" << std::bit_cast<std::uint32_t>(value) << ": ours 0x"
                    << kshard::f16(value).bits() << ", reference 0x" << reference_half(value);
  };
  // Between consecutive finite magnitudes a < b: the tie (a + b) / 2 (exact in float: halves
  // have 11 significant bits) and the floats either side of it; b = infinity gives 65520.
  for (std::uint16_t bits = 0; bits < 0x7c00u; ++bits) {
    const float a = std::bit_cast<kshard::f16>(bits);
    const float b =
        bits + 1u < 0x7c00u
            ? static_cast<float>(std::bit_cast<kshard::f16>(static_cast<std::uint16_t>(bits + 1)))
            : 65536.0f;  // where the next exponent would start
    const float tie = (a + b) / 2;
    for (const float sign : {1.0f, -1.0f})
      for (const float value : {a, tie, std::nextafter(tie, 0.0f), std::nextafter(tie, b), b})
        check(sign * value);
  }
  // The smallest subnormal's neighbourhood, far below it, and infinities.
  for (const float value : {0x1p-25f, 0x1.000002p-25f, 0x1.fffffep-26f, 1e-30f, 1e-45f, 0.0f, -0.0f,
                            65504.0f, 65519.996f, 65520.0f, 1e30f, HUGE_VALF, -HUGE_VALF})
    check(value);
  std::mt19937 rng(20261203);
  for (int i = 0; i < 1000000; ++i) check(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  EXPECT_EQ(wrong, 0) << "of " << checked;
}

TEST(Float16, NaNKeepsItsTopPayloadBitsQuietly) {
  for (const std::uint32_t bits :
       {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u, 0xff812345u}) {
    const std::uint16_t got = kshard::f16(std::bit_cast<float>(bits)).bits();
    EXPECT_EQ(got, static_cast<std::uint16_t>(((bits >> 16) & 0x8000u) | 0x7e00u |
                                              ((bits >> 13) & 0x3ffu)))
        << std::hex << bits;
  }
}

#else

TEST(Float16, EveryHalfWidensExactly) { GTEST_SKIP() << "this compiler has no _Float16"; }

#endif

// Conversions a user writes: from double (through float) and back, exactly for halves.
TEST(Float16, DoubleRoundTripsEveryFiniteHalf) {
  for (std::uint32_t bits = 0; bits < 0x7c00u; ++bits) {
    const auto half = std::bit_cast<kshard::f16>(static_cast<std::uint16_t>(bits | 0x8000u));
    ASSERT_EQ(kshard::f16(static_cast<double>(half)).bits(), half.bits()) << std::hex << bits;
  }
}

}  // namespace
