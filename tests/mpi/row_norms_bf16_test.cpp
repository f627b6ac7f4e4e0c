// The bf16 row-norm kernel (kernels/row_norms.hpp) against the scalar formula: every element
// widened to float, then to double, squared and summed in double. Every one of the 65536 bf16
// bit patterns alone in a row gives exactly its square (subnormals, the largest finite values,
// whose squares overflow float, infinities and NaNs included); rows of every length up to a few
// blocks of the kernel's 32 lanes, mixing those values, give the scalar sum to rounding, and
// exactly where it is not finite (inf or NaN, as the scalar sum). Distributed by columns, the
// norms of such rows are the same.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kshard/bfloat16.hpp"
#include "kshard/distribute.hpp"
#include "kshard/kernels/row_norms.hpp"
#include "kshard/rowwise.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::bf16;
using kshard::index_t;
using kshard::test::all_ranks;
using kshard::test::ExecSpace;
using kshard::test::MemSpace;

bf16 from_bits(std::uint16_t bits) {
  bf16 x;
  std::memcpy(static_cast<void*>(&x), &bits, sizeof x);
  return x;
}

// The scalar formula, in the plain left-to-right order.
double scalar_square(bf16 x) {
  const auto v = static_cast<double>(static_cast<float>(x));
  return v * v;
}

// Equal to the last bit, or both NaN.
bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Equal to rounding (the kernel sums in another order), and exactly where either is not
// finite: +inf and NaN must match the scalar sum.
bool close(double got, double want) {
  if (!std::isfinite(want) || !std::isfinite(got)) return same(got, want);
  return std::abs(got - want) <= 1e-12 * want;
}

// Squared norms of the rows of `host`, computed by the kernel on ExecSpace.
Kokkos::View<double*, Kokkos::HostSpace> kernel_norms(
    const Kokkos::View<bf16**, Kokkos::LayoutRight, Kokkos::HostSpace>& host) {
  Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace> local("local", host.extent(0),
                                                            host.extent(1));
  Kokkos::deep_copy(local, host);
  Kokkos::View<double*, MemSpace> out("out", host.extent(0));
  kshard::detail::local_row_squared_norms(ExecSpace(), local, out);
  Kokkos::fence();
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
}

TEST(Bf16RowNorms, EveryBitPatternAloneInARow) {
  constexpr index_t patterns = 65536;
  Kokkos::View<bf16**, Kokkos::LayoutRight, Kokkos::HostSpace> host(
      "bits", static_cast<std::size_t>(patterns), 1);
  for (index_t b = 0; b < patterns; ++b)
    host(static_cast<std::size_t>(b), 0) = from_bits(static_cast<std::uint16_t>(b));
  const auto norms = kernel_norms(host);
  index_t wrong = 0;
  for (index_t b = 0; b < patterns; ++b) {
    const auto i = static_cast<std::size_t>(b);
    if (!same(norms(i), scalar_square(host(i, 0)))) ++wrong;
  }
  EXPECT_EQ(wrong, 0);
  // The values the scalar formula must be checked on, spelled out.
  const auto at = [&](std::uint16_t bits) { return norms(static_cast<std::size_t>(bits)); };
  EXPECT_EQ(at(0x0001), std::ldexp(1.0, -266));           // smallest subnormal: 2^-133 squared
  EXPECT_EQ(at(0x8001), std::ldexp(1.0, -266));           // its negative
  EXPECT_EQ(at(0x7f7f), std::ldexp(255.0 * 255.0, 240));  // largest finite, (255 * 2^120)^2
  EXPECT_TRUE(std::isinf(at(0x7f80)) && std::isinf(at(0xff80)));  // +-inf
  EXPECT_TRUE(std::isnan(at(0x7fc0)) && std::isnan(at(0xffc1)));  // NaNs
  EXPECT_EQ(at(0x0000), 0.0);
  EXPECT_EQ(at(0x8000), 0.0);
  EXPECT_TRUE(all_ranks(wrong == 0));
}

TEST(Bf16RowNorms, MixedRowsOfEveryLength) {
  // Ordinary values with subnormals, huge values (up to the largest finite), zeros, and now
  // and then an inf or NaN, in rows of 0 to 100 columns (the kernel's blocks of 32 and every
  // remainder).
  const std::uint16_t specials[] = {0x0001, 0x8005, 0x007f, 0x0080, 0x7f7f, 0xff7f,
                                    0x7f00, 0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0};
  std::mt19937 rng(7);
  for (index_t cols = 0; cols <= 100; ++cols) {
    constexpr index_t rows = 24;
    Kokkos::View<bf16**, Kokkos::LayoutRight, Kokkos::HostSpace> host(
        "mixed", static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c) {
        const auto roll = rng() % 64;
        std::uint16_t bits = static_cast<std::uint16_t>(0x3c00 + rng() % 0x0800);  // ~2^-7..2^8
        if (roll < 4 && r % 4 == 0) bits = specials[rng() % 12];                   // any special
        if (roll < 8 && r % 4 == 1) bits = specials[rng() % 9];                    // finite ones
        if (r % 4 == 2) bits = static_cast<std::uint16_t>(rng() % 0x0080);         // all subnormal
        if (rng() % 2 == 1) bits ^= 0x8000;
        host(static_cast<std::size_t>(r), static_cast<std::size_t>(c)) = from_bits(bits);
      }
    const auto norms = kernel_norms(host);
    bool ok = true;
    for (index_t r = 0; r < rows; ++r) {
      double want = 0;
      for (index_t c = 0; c < cols; ++c)
        want += scalar_square(host(static_cast<std::size_t>(r), static_cast<std::size_t>(c)));
      ok = ok && close(norms(static_cast<std::size_t>(r)), want);
      EXPECT_TRUE(close(norms(static_cast<std::size_t>(r)), want))
          << "row " << r << " of " << cols << " columns: " << norms(static_cast<std::size_t>(r))
          << " against " << want;
    }
    ASSERT_TRUE(all_ranks(ok)) << cols << " columns";
  }
}

// The public entry point on a column-sharded bf16 matrix: the partial norms of each rank's
// columns (some of them specials) summed across ranks, against the scalar sum over the row.
TEST(Bf16RowNorms, ColumnShardedMatrixAgainstScalar) {
  const int size = kshard::test::world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  constexpr index_t rows = 9;
  constexpr index_t cols = 97;
  kshard::HostMatrix<bf16> full("full", static_cast<std::size_t>(rows),
                                static_cast<std::size_t>(cols));
  std::mt19937 rng(11);  // the same on every rank
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) {
      auto bits = static_cast<std::uint16_t>(0x3c00 + rng() % 0x0800);
      if (r == 1 && c % 7 == 0) bits = 0x7f7f;                        // huge: squares past FLT_MAX
      if (r == 2) bits = static_cast<std::uint16_t>(rng() % 0x0080);  // subnormal
      if (r == 3 && c == 50) bits = 0x7f80;                           // inf
      if (r == 4 && c == 3) bits = 0xffc0;                            // NaN
      if (r == 5) bits = 0;                                           // zero row
      full(static_cast<std::size_t>(r), static_cast<std::size_t>(c)) = from_bits(bits);
    }
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, kshard::Layout(kshard::Shard<1>{}), kshard::HostMatrix<const bf16>(full));
  const auto norms =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::row_squared_norms(matrix));
  bool ok = static_cast<index_t>(norms.extent(0)) == rows;
  for (index_t r = 0; ok && r < rows; ++r) {
    double want = 0;
    for (index_t c = 0; c < cols; ++c)
      want += scalar_square(full(static_cast<std::size_t>(r), static_cast<std::size_t>(c)));
    ok = close(norms(static_cast<std::size_t>(r)), want);
  }
  EXPECT_TRUE(std::isinf(norms(3)) && std::isnan(norms(4)) && norms(5) == 0.0);
  EXPECT_TRUE(all_ranks(ok));
}

}  // namespace
