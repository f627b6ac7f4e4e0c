// detail::values_digest, with which distribute(mesh, layout, full) finds ranks whose `full`
// differs: every one-bit change anywhere, every swap of two different rows or of two different
// elements of a row, and the same bytes read as another shape change it; the same values in
// other memory do not. Unmanaged views over vectors (no Kokkos allocation).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kshard/distribute.hpp"

namespace {

template <class T>
std::vector<T> values(std::size_t count, std::uint64_t seed) {
  std::vector<T> v(count);
  std::uint64_t x = seed;
  for (T& e : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    std::memcpy(&e, &x, sizeof(T));  // any bit pattern: the digest reads bytes
  }
  return v;
}

template <class T>
std::int64_t digest_of(std::vector<T>& v, std::size_t rows, std::size_t cols) {
  return kshard::detail::values_digest(kshard::HostMatrix<const T>(v.data(), rows, cols));
}

template <class T>
void expect_every_change_seen(std::size_t rows, std::size_t cols) {
  SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + ", " +
               std::to_string(sizeof(T)) + "-byte elements");
  auto v = values<T>(rows * cols, rows * 131 + cols);
  const std::int64_t original = digest_of(v, rows, cols);
  auto copy = v;  // other memory, same values
  EXPECT_EQ(digest_of(copy, rows, cols), original);
  int unseen = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(v.data());
  for (std::size_t b = 0; b < v.size() * sizeof(T); ++b)
    for (int bit = 0; bit < 8; ++bit) {
      bytes[b] ^= static_cast<unsigned char>(1u << bit);
      unseen += digest_of(v, rows, cols) == original;
      bytes[b] ^= static_cast<unsigned char>(1u << bit);
    }
  EXPECT_EQ(unseen, 0) << "one-bit changes with the original's digest";
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t s = r + 1; s < rows; ++s) {
      std::swap_ranges(v.begin() + r * cols, v.begin() + (r + 1) * cols, v.begin() + s * cols);
      unseen += digest_of(v, rows, cols) == original;
      std::swap_ranges(v.begin() + r * cols, v.begin() + (r + 1) * cols, v.begin() + s * cols);
    }
  EXPECT_EQ(unseen, 0) << "row swaps with the original's digest";
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < cols; ++i)
      for (std::size_t j = i + 1; j < cols; ++j) {
        std::swap(v[r * cols + i], v[r * cols + j]);
        unseen += digest_of(v, rows, cols) == original;
        std::swap(v[r * cols + i], v[r * cols + j]);
      }
  EXPECT_EQ(unseen, 0) << "element swaps within a row with the original's digest";
  if (rows > 1 && cols > 1 && rows != cols) {
    EXPECT_NE(digest_of(v, cols, rows), original) << "the same bytes as " << cols << " x " << rows;
  }
}

TEST(ValuesDigest, SeesEveryOneBitChangeAndEverySwap) {
  for (const auto& [rows, cols] : std::vector<std::pair<std::size_t, std::size_t>>{
           {1, 1}, {3, 5}, {4, 16}, {2, 17}, {5, 33}, {3, 64}})
    expect_every_change_seen<float>(rows, cols);
  expect_every_change_seen<double>(3, 9);
  expect_every_change_seen<std::uint16_t>(4, 37);  // bf16 and f16 are 2-byte patterns too
}

TEST(ValuesDigest, EmptyMatricesOfEveryShapeAgree) {
  std::vector<float> none;
  EXPECT_EQ(digest_of(none, 0, 5), digest_of(none, 3, 0));
}

}  // namespace
