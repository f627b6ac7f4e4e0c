// The x86 forms of the bf16 row-norm kernel (detail/row_norms.hpp) against its portable form,
// bit for bit, each where this CPU runs it: every bf16 bit pattern in every position of rows
// of every length up to three blocks of 32 lanes, then random rows mixing ordinary values with
// subnormals, the largest finite values, zeros, infinities and NaNs. And the form the row
// norms use is the fastest the CPU runs.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kshard/bfloat16.hpp"
#include "kshard/detail/row_norms.hpp"

namespace {

using kshard::bf16;
using kshard::index_t;

using kshard::detail::Bf16Kernel;

// The x86 forms this build has (none in a CUDA/HIP/SYCL compilation or off x86).
std::vector<Bf16Kernel> x86_kernels() {
  if (!KSHARD_ROW_NORMS_X86) return {};
  return {Bf16Kernel::avx2, Bf16Kernel::avx512};
}

// Bit for bit, NaNs included (any NaN matches any NaN: both forms square the same NaN).
bool same(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

// The rows where `kernel` differs from the portable form.
index_t differing_rows(Bf16Kernel kernel, const std::vector<std::uint16_t>& bits, index_t cols) {
  const auto* data = reinterpret_cast<const bf16*>(bits.data());
  const auto rows = cols == 0 ? 0 : static_cast<index_t>(bits.size()) / cols;
  index_t wrong = 0;
  for (index_t r = 0; r < rows; ++r) {
    const bf16* row = data + r * cols;
    wrong += same(kshard::detail::bf16_row_squared_norm(kernel, row, cols),
                  kshard::detail::bf16_row_squared_norm_portable(row, cols))
                 ? 0
                 : 1;
  }
  return wrong;
}

TEST(Bf16RowNormsIsa, EveryBitPatternInEveryLane) {
  int ran = 0;
  for (const Bf16Kernel kernel : x86_kernels()) {
    if (!kshard::detail::bf16_kernel_runs(kernel)) continue;
    ++ran;
    for (index_t cols = 1; cols <= 3 * kshard::detail::bf16_lanes; ++cols) {
      // Pattern p at position p % cols of its row, in a field of 1.0 (0x3f80).
      std::vector<std::uint16_t> bits(static_cast<std::size_t>(65536 * cols), 0x3f80);
      for (index_t p = 0; p < 65536; ++p)
        bits[static_cast<std::size_t>(p * cols + p % cols)] = static_cast<std::uint16_t>(p);
      EXPECT_EQ(differing_rows(kernel, bits, cols), 0)
          << "form " << static_cast<int>(kernel) << ", " << cols << " columns";
    }
  }
  if (ran == 0) GTEST_SKIP() << "no x86 form of the kernel in this build or on this CPU";
}

TEST(Bf16RowNormsIsa, MixedRows) {
  const std::uint16_t specials[] = {0x0001, 0x8005, 0x007f, 0x0080, 0x7f7f, 0xff7f,
                                    0x7f00, 0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0};
  std::mt19937 rng(13);
  for (const index_t cols : {31, 32, 33, 100, 384, 1024, 1031}) {
    constexpr index_t rows = 64;
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(rows * cols));
    for (std::size_t k = 0; k < bits.size(); ++k) {
      auto b = static_cast<std::uint16_t>(0x3c00 + rng() % 0x0800);  // about 2^-7 to 2^8
      if (rng() % 64 == 0) b = specials[rng() % 12];
      if (rng() % 2 == 1) b ^= 0x8000;
      bits[k] = b;
    }
    for (const Bf16Kernel kernel : x86_kernels()) {
      if (!kshard::detail::bf16_kernel_runs(kernel)) continue;
      EXPECT_EQ(differing_rows(kernel, bits, cols), 0)
          << "form " << static_cast<int>(kernel) << ", " << cols << " columns";
    }
  }
}

// The row norms take the fastest form the CPU runs: AVX-512 over AVX2 over the portable loop,
// as the CPU reports its features (read here directly, not through the library).
TEST(Bf16RowNormsIsa, FastestFormThisCpuRuns) {
  Bf16Kernel want = Bf16Kernel::portable;
#if KSHARD_ROW_NORMS_X86
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) want = Bf16Kernel::avx2;
  if (avx2 && __builtin_cpu_supports("avx512f")) want = Bf16Kernel::avx512;
#endif
  EXPECT_EQ(kshard::detail::fastest_bf16_kernel(), want);
  EXPECT_TRUE(kshard::detail::bf16_kernel_runs(Bf16Kernel::portable));
}

}  // namespace
