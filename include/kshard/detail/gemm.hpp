#pragma once

// The local matrix products behind the tensor-parallel linear layers: a portable, register-
// blocked Kokkos kernel (no BLAS, no KokkosKernels), written once for every backend.
//
// Every product is C[M, N] = op(A) * B with B a K x N matrix read along its rows:
//   gemm_nn: C = A * B      (A is M x K)
//   gemm_tn: C = A^T * B    (A is K x M)
//   gemm_nt: C = A * B^T    (B given N x K; packed to K x N in column chunks first)
// One work item computes an MR x NR tile of C in registers over the whole K extent, reading a
// row of NR consecutive elements of B and MR scalars of A per step, so the inner loop is a
// fixed-size, vectorisable multiply-add over contiguous memory. Consecutive work items share
// the same NR columns of B (which then stay in cache), and every element of C is one sum over k
// in increasing order: results are deterministic and the same on every backend and thread count.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

#include "kshard/index.hpp"

// Complete unrolling of the constant-bound tile loops, requested before the loop vectoriser
// sees them (at -O3 GCC would otherwise vectorise them as loops and leave the accumulators in
// memory, a 3x slowdown). nvcc's host pass accepts neither spelling without a warning (its
// front end knows no GCC pragma, and GCC behind it no plain unroll), so it gets none.
#if defined(__CUDA_ARCH__) || defined(__HIPCC__) || defined(__clang__) || \
    defined(__INTEL_LLVM_COMPILER)
#define KSHARD_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define KSHARD_UNROLL
#elif defined(__GNUC__)
#define KSHARD_UNROLL _Pragma("GCC unroll 32")
#else
#define KSHARD_UNROLL
#endif

// GCC's -O3 loop vectoriser turns the k loop into an in-order ("fold-left") vector reduction,
// which is slower than the scalar loop it replaces; the tile loops inside it are vectorised by
// the basic-block (SLP) vectoriser either way.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(__HIPCC__) && \
    !defined(__INTEL_LLVM_COMPILER)
#define KSHARD_NO_LOOP_VECTORIZE __attribute__((optimize("no-tree-loop-vectorize")))
#else
#define KSHARD_NO_LOOP_VECTORIZE
#endif

namespace kshard::detail {

// Tile sizes: MR rows x NR columns of C, NR * sizeof(T) = one 64-byte cache line of B.
// Measured on one core (Serial, 512^3, GCC 12, -O2 and -O3 alike): ~27 GFLOP/s in float and
// ~13 in double, against 0.95 / 0.7 for the plain i-j-k triple loop and 6-14 / 3.6 for the
// i-k-j loop the compiler vectorises; 4 x 8, 6 x 16 and 8 x 8 float tiles ran 10-40% slower.
template <class T>
struct GemmTile {
  static constexpr index_t mr = 4;
  static constexpr index_t nr = static_cast<index_t>(64 / sizeof(T));
};

// C(i, col_begin + j) (+)= sum_k opA(i, k) * B(k, j) over the tiles of an m x n block.
template <class T, bool TransA, class AView, class BView, class CView>
struct GemmTiles {
  static constexpr index_t mr = GemmTile<T>::mr;
  static constexpr index_t nr = GemmTile<T>::nr;

  AView a;
  BView b;
  CView c;
  index_t m = 0;
  index_t n = 0;
  index_t k = 0;
  index_t col_begin = 0;
  index_t tiles_m = 0;
  bool accumulate = false;

  KOKKOS_INLINE_FUNCTION T a_at(index_t i, index_t p) const {
    if constexpr (TransA)
      return a(p, i);
    else
      return a(i, p);
  }

  KOKKOS_INLINE_FUNCTION void store(index_t i, index_t j, T value) const {
    if (accumulate)
      c(i, col_begin + j) += value;
    else
      c(i, col_begin + j) = value;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const index_t tile) const {
    const index_t i0 = (tile % tiles_m) * mr;
    const index_t j0 = (tile / tiles_m) * nr;
    if (i0 + mr <= m && j0 + nr <= n)
      full_tile(i0, j0);
    else
      edge_tile(i0, j0);
  }

  // Every loop bound is a constant, so the accumulators live in registers.
  KSHARD_NO_LOOP_VECTORIZE KOKKOS_INLINE_FUNCTION void full_tile(index_t i0, index_t j0) const {
    T acc[mr][nr] = {};
    for (index_t p = 0; p < k; ++p) {
      T av[mr];
      KSHARD_UNROLL
      for (index_t r = 0; r < mr; ++r) av[r] = a_at(i0 + r, p);
      KSHARD_UNROLL
      for (index_t r = 0; r < mr; ++r) {
        KSHARD_UNROLL
        for (index_t q = 0; q < nr; ++q) acc[r][q] += av[r] * b(p, j0 + q);
      }
    }
    KSHARD_UNROLL
    for (index_t r = 0; r < mr; ++r) {
      KSHARD_UNROLL
      for (index_t q = 0; q < nr; ++q) store(i0 + r, j0 + q, acc[r][q]);
    }
  }

  // A tile on the lower or right edge of C: the same sums, with bounds.
  KOKKOS_INLINE_FUNCTION void edge_tile(index_t i0, index_t j0) const {
    const index_t rows = m - i0 < mr ? m - i0 : mr;
    const index_t cols = n - j0 < nr ? n - j0 : nr;
    for (index_t r = 0; r < rows; ++r)
      for (index_t q = 0; q < cols; ++q) {
        T sum = T(0);
        for (index_t p = 0; p < k; ++p) sum += a_at(i0 + r, p) * b(p, j0 + q);
        store(i0 + r, j0 + q, sum);
      }
  }
};

template <class ExecSpace, bool TransA, class AView, class BView, class CView>
void gemm_tiles(const AView& a, const BView& b, const CView& c, index_t m, index_t n, index_t k,
                index_t col_begin, bool accumulate) {
  using T = typename CView::non_const_value_type;
  using Tile = GemmTile<T>;
  if (m == 0 || n == 0) return;
  const index_t tiles_m = (m + Tile::mr - 1) / Tile::mr;
  const index_t tiles_n = (n + Tile::nr - 1) / Tile::nr;
  Kokkos::parallel_for(
      "kshard::gemm",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(0, tiles_m * tiles_n),
      GemmTiles<T, TransA, AView, BView, CView>{a, b, c, m, n, k, col_begin, tiles_m, accumulate});
}

// C = A * B (A: M x K, B: K x N, C: M x N); with `accumulate`, C += A * B.
template <class ExecSpace, class AView, class BView, class CView>
void gemm_nn(const AView& a, const BView& b, const CView& c, bool accumulate) {
  gemm_tiles<ExecSpace, false>(a, b, c, static_cast<index_t>(c.extent(0)),
                               static_cast<index_t>(c.extent(1)), static_cast<index_t>(a.extent(1)),
                               0, accumulate);
}

// C = A^T * B (A: K x M, B: K x N, C: M x N); with `accumulate`, C += A^T * B.
template <class ExecSpace, class AView, class BView, class CView>
void gemm_tn(const AView& a, const BView& b, const CView& c, bool accumulate) {
  gemm_tiles<ExecSpace, true>(a, b, c, static_cast<index_t>(c.extent(0)),
                              static_cast<index_t>(c.extent(1)), static_cast<index_t>(a.extent(0)),
                              0, accumulate);
}

// C = A * B^T (A: M x K, B: N x K, C: M x N); with `accumulate`, C += A * B^T. B is transposed
// into a K x `chunk` buffer one column chunk of C at a time, so the extra memory stays bounded.
template <class ExecSpace, class AView, class BView, class CView>
void gemm_nt(const AView& a, const BView& b, const CView& c, bool accumulate,
             index_t chunk = 1024) {
  using T = typename CView::non_const_value_type;
  using MemSpace = typename CView::memory_space;
  const auto m = static_cast<index_t>(c.extent(0));
  const auto n = static_cast<index_t>(c.extent(1));
  const auto k = static_cast<index_t>(a.extent(1));
  if (m == 0 || n == 0) return;
  const index_t width = n < chunk ? n : chunk;
  Kokkos::View<T**, Kokkos::LayoutRight, MemSpace> packed(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::gemm_nt::packed"),
      static_cast<std::size_t>(k), static_cast<std::size_t>(width));
  for (index_t begin = 0; begin < n; begin += width) {
    const index_t cols = n - begin < width ? n - begin : width;
    if (k > 0)
      Kokkos::parallel_for(
          "kshard::gemm_nt::pack",
          Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<index_t>>({0, 0},
                                                                                        {cols, k}),
          KOKKOS_LAMBDA(const index_t j, const index_t p) { packed(p, j) = b(begin + j, p); });
    gemm_tiles<ExecSpace, false>(a, packed, c, m, cols, k, begin, accumulate);
  }
}

}  // namespace kshard::detail
