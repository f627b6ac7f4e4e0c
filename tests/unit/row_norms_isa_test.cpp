// The x86 forms of the bf16, f16 and fp32 row-norm kernels (kernels/row_norms.hpp) against their
// portable forms, bit for bit, each where this CPU runs it: for bf16 and f16 every bit pattern in
// every position of rows of every length up to three blocks of 32 lanes, for all three random
// rows mixing ordinary values of widely spread magnitudes (so that the order of the additions
// shows) with subnormals, the largest finite values, zeros, infinities and NaNs. The portable
// fp32 and f16 forms against a serial long-double sum of squares. And the form the row norms use
// is the fastest the CPU runs.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kshard/bfloat16.hpp"
#include "kshard/float16.hpp"
#include "kshard/kernels/row_norms.hpp"

namespace {

using kshard::bf16;
using kshard::f16;
using kshard::index_t;

using kshard::detail::RowKernel;

// The x86 forms this build has (none in a CUDA/HIP/SYCL compilation or off x86).
std::vector<RowKernel> x86_kernels() {
  if (!KSHARD_ROW_NORMS_X86) return {};
  return {RowKernel::avx2, RowKernel::avx512};
}

// Bit for bit, NaNs included (any NaN matches any NaN: both forms square the same NaN).
bool same(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

// The rows of `rows` x `cols` elements at `data` where `kernel` differs from the portable form.
template <class T>
index_t differing_rows(RowKernel kernel, const T* data, index_t rows, index_t cols) {
  index_t wrong = 0;
  for (index_t r = 0; r < rows; ++r) {
    const T* row = data + r * cols;
    wrong += same(kshard::detail::row_squared_norm(kernel, row, cols),
                  kshard::detail::row_squared_norm_portable(row, cols))
                 ? 0
                 : 1;
  }
  return wrong;
}

// The same for rows of the 16-bit type T (bf16 or f16) given as bit patterns.
template <class T>
index_t differing_rows(RowKernel kernel, const std::vector<std::uint16_t>& bits, index_t cols) {
  return differing_rows(kernel, reinterpret_cast<const T*>(bits.data()),
                        static_cast<index_t>(bits.size()) / cols, cols);
}

// Under AddressSanitizer (an unoptimised build, 50 s for all 65536 patterns) every column count
// still runs, on one pattern in 16 (every low nibble among them): there the test is for the
// kernels' memory accesses, and the optimised builds check the arithmetic on every pattern.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang's spelling
#define KSHARD_TEST_ADDRESS_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(KSHARD_TEST_ADDRESS_SANITIZER)
constexpr index_t pattern_stride = 16;
#else
constexpr index_t pattern_stride = 1;
#endif

// Every bit pattern of the 16-bit type T at every position of rows of 1 to 96 columns, in a
// field of `one` (1.0 in T), with every x86 form this CPU runs; returns the forms run.
template <class T>
int check_every_pattern_in_every_lane(std::uint16_t one) {
  int ran = 0;
  for (const RowKernel kernel : x86_kernels()) {
    if (!kshard::detail::row_kernel_runs(kernel)) continue;
    ++ran;
    for (index_t cols = 1; cols <= 3 * kshard::detail::row_lanes; ++cols) {
      // Row r holds its pattern at position r % cols.
      constexpr index_t rows = 65536 / pattern_stride;
      std::vector<std::uint16_t> bits(static_cast<std::size_t>(rows * cols), one);
      for (index_t r = 0; r < rows; ++r)
        bits[static_cast<std::size_t>(r * cols + r % cols)] =
            static_cast<std::uint16_t>(r * pattern_stride + r % pattern_stride);
      EXPECT_EQ(differing_rows<T>(kernel, bits, cols), 0)
          << "form " << static_cast<int>(kernel) << ", " << cols << " columns";
    }
  }
  return ran;
}

TEST(Bf16RowNormsIsa, EveryBitPatternInEveryLane) {
  if (check_every_pattern_in_every_lane<bf16>(0x3f80) == 0)
    GTEST_SKIP() << "no x86 form of the kernel in this build or on this CPU";
}

TEST(F16RowNormsIsa, EveryBitPatternInEveryLane) {
  if (check_every_pattern_in_every_lane<f16>(0x3c00) == 0)
    GTEST_SKIP() << "no x86 form of the kernel in this build or on this CPU";
}

// Random rows of the 16-bit type T: the patterns from `ordinary` to `ordinary` + `spread` (widely
// spread magnitudes) of either sign, one in 64 one of `specials`, against the portable form.
template <class T>
void check_mixed_rows(std::uint16_t ordinary, unsigned spread,
                      const std::vector<std::uint16_t>& specials) {
  std::mt19937 rng(13);
  for (const index_t cols : {31, 32, 33, 100, 384, 1024, 1031}) {
    constexpr index_t rows = 64;
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(rows * cols));
    for (std::size_t k = 0; k < bits.size(); ++k) {
      auto b = static_cast<std::uint16_t>(ordinary + rng() % spread);
      if (rng() % 64 == 0) b = specials[rng() % specials.size()];
      if (rng() % 2 == 1) b ^= 0x8000;
      bits[k] = b;
    }
    for (const RowKernel kernel : x86_kernels()) {
      if (!kshard::detail::row_kernel_runs(kernel)) continue;
      EXPECT_EQ(differing_rows<T>(kernel, bits, cols), 0)
          << "form " << static_cast<int>(kernel) << ", " << cols << " columns";
    }
  }
}

// bf16 magnitudes about 2^-7 to 2^8.
TEST(Bf16RowNormsIsa, MixedRows) {
  check_mixed_rows<bf16>(0x3c00, 0x0800,
                         {0x0001, 0x8005, 0x007f, 0x0080, 0x7f7f, 0xff7f, 0x7f00, 0x0000, 0x8000,
                          0x7f80, 0xff80, 0x7fc0});
}

// f16 magnitudes about 2^-12 to 2^8; specials: subnormals (the smallest, the largest), the smallest
// normal, the largest finite (65504), zeros, infinities, a quiet and a signalling NaN.
TEST(F16RowNormsIsa, MixedRows) {
  check_mixed_rows<f16>(0x0c00, 0x5000,
                        {0x0001, 0x8005, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x0000, 0x8000, 0x7c00,
                         0xfc00, 0x7e00, 0x7c01});
}

// Random fp32 rows of `cols` columns: magnitudes 2^-60 to 2^60 of either sign, one in 64 a
// special value (subnormals, the smallest normal, the largest finite, zeros, infinities, NaN)
// when `specials` is true.
std::vector<float> random_float_rows(index_t rows, index_t cols, bool specials, unsigned seed) {
  using limits = std::numeric_limits<float>;
  const float special[] = {limits::denorm_min(),
                           -limits::denorm_min() * 5,
                           limits::min(),
                           limits::max(),
                           -limits::max(),
                           0.0f,
                           -0.0f,
                           limits::infinity(),
                           -limits::infinity(),
                           limits::quiet_NaN()};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-60, 60);
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  for (float& v : values) {
    v = std::ldexp(mantissa(rng), exponent(rng)) * (rng() % 2 == 1 ? -1.0f : 1.0f);
    if (specials && rng() % 64 == 0) v = special[rng() % 10];
  }
  return values;
}

TEST(FloatRowNormsIsa, MixedRowsBitForBit) {
  int ran = 0;
  for (const RowKernel kernel : x86_kernels()) {
    if (!kshard::detail::row_kernel_runs(kernel)) continue;
    ++ran;
    std::vector<index_t> widths;
    for (index_t cols = 1; cols <= 3 * kshard::detail::row_lanes; ++cols) widths.push_back(cols);
    for (const index_t cols : {100, 384, 1024, 1031}) widths.push_back(cols);
    for (const index_t cols : widths) {
      const auto values = random_float_rows(64, cols, true, static_cast<unsigned>(cols));
      EXPECT_EQ(differing_rows(kernel, values.data(), 64, cols), 0)
          << "form " << static_cast<int>(kernel) << ", " << cols << " columns";
    }
  }
  if (ran == 0) GTEST_SKIP() << "no x86 form of the kernel in this build or on this CPU";
}

// Every square of an fp32 or f16 value is exact in double and the terms are positive, so any
// order of additions is within (cols - 1) double roundings of the exact sum.
TEST(FloatRowNormsIsa, PortableFormIsTheSumOfSquares) {
  for (const index_t cols : {1, 7, 31, 32, 33, 95, 384, 1031}) {
    const auto values = random_float_rows(16, cols, false, 7u + static_cast<unsigned>(cols));
    for (index_t r = 0; r < 16; ++r) {
      const float* row = values.data() + r * cols;
      long double exact = 0;
      for (index_t j = 0; j < cols; ++j) exact += static_cast<long double>(row[j]) * row[j];
      const double got = kshard::detail::row_squared_norm_portable(row, cols);
      EXPECT_NEAR(got, static_cast<double>(exact),
                  static_cast<double>(exact) * static_cast<double>(cols) * 1.2e-16)
          << cols << " columns, row " << r;
    }
  }
}

TEST(F16RowNormsIsa, PortableFormIsTheSumOfSquares) {
  std::mt19937 rng(29);
  for (const index_t cols : {1, 7, 31, 32, 33, 95, 384, 1031}) {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(cols));
    for (auto& b : bits) b = static_cast<std::uint16_t>(rng() % 0x7c00 | (rng() % 2) << 15);
    const auto* row = reinterpret_cast<const f16*>(bits.data());
    long double exact = 0;
    for (const f16 x : std::vector<f16>(row, row + cols))
      exact += static_cast<long double>(static_cast<float>(x)) * static_cast<float>(x);
    EXPECT_NEAR(kshard::detail::row_squared_norm_portable(row, cols), static_cast<double>(exact),
                static_cast<double>(exact) * static_cast<double>(cols) * 1.2e-16)
        << cols << " columns";
  }
}

// The row norms take the fastest form the CPU runs: AVX-512 over AVX2 over the portable loop,
// as the CPU reports its features (read here directly, not through the library).
TEST(RowNormsIsa, FastestFormThisCpuRuns) {
  RowKernel want = RowKernel::portable;
#if KSHARD_ROW_NORMS_X86
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  if (avx2) want = RowKernel::avx2;
  if (avx2 && __builtin_cpu_supports("avx512f")) want = RowKernel::avx512;
#endif
  EXPECT_EQ(kshard::detail::fastest_row_kernel(), want);
  EXPECT_TRUE(kshard::detail::row_kernel_runs(RowKernel::portable));
}

}  // namespace
