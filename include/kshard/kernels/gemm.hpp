#pragma once

// The local matrix products behind the tensor-parallel linear layers. Two paths:
// - kokkos-kernels (when kshard was configured with it: KSHARD_HAVE_KOKKOS_KERNELS, CMake option
//   KSHARD_KOKKOS_KERNELS): KokkosBlas::gemm, which runs the vendor BLAS (a host BLAS, cuBLAS,
//   rocBLAS) for float and double views of one layout (LayoutRight or LayoutLeft) in a memory
//   space it has a BLAS for (kernels/gemm_kokkos_kernels.hpp). GPU builds require it.
// - kshard's own GEMM, below, for everything else (no kokkos-kernels, bf16 and other types, mixed
//   or strided layouts, operands past the BLAS's int range): a portable, cache- and
//   register-blocked Kokkos kernel, written once for every backend.
// gemm_path() says which one a product takes. Both run on the execution-space instance given.
//
// Every product is C[M, N] = op(A) * B, or C += op(A) * B with `accumulate`:
//   gemm_nn: C = A * B      (A is M x K, B is K x N)
//   gemm_tn: C = A^T * B    (A is K x M)
//   gemm_nt: C = A * B^T    (B is N x K)
// The structure is GotoBLAS's. K is cut into panels of KC, N into blocks of NC, M into blocks
// of MC. For each KC x NC block, op(B) is copied into NR-wide micro-panels (KC x NR, contiguous);
// for each MC block under it, op(A) into MR-tall micro-panels (KC x MR). The copies take the
// transposes, so the three products share one micro-kernel: an MR x NR tile of C taken into
// registers, its products with one micro-panel of each added, and stored back. The A block stays
// in L2, and each B micro-panel in L1 while the tiles of its column pass. The work memory is one
// packed block of each operand (at most 128 KB and 4 MB in float), whatever the sizes.
//
// Determinism: an element of C is its initial value (or zero) plus its products added one at a
// time in increasing k, each K panel by the one work item that owns its tile, so it has the same
// bits for any thread count and any block sizes on a given build (another compiler or target may
// round differently, e.g. fuse the multiply-adds or not).
// (kshard's own kernel only: a vendor BLAS makes no such promise, e.g. OpenBLAS with threads.)

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>

#include "kshard/index.hpp"

#if defined(KSHARD_HAVE_KOKKOS_KERNELS)
#include "kshard/kernels/gemm_kokkos_kernels.hpp"
#endif

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

// The register tile: MR rows x NR columns of C in accumulators, sized to the host compiler's
// SIMD registers (NR as bytes of a row of B) so that they fill about half the register file.
// Measured on one Zen 4 core against OpenBLAS at 1024^3 (GCC 12):
//   AVX-512 (32 registers): 8 x 128 bytes, 0.93x in float and 0.94x in double; 8 x 64 bytes
//     0.93x / 0.70x, 6 x 128 0.87x, 12 x 64 0.79x, 4 x 128 0.72x.
//   AVX2 (16 registers, -march=haswell): 6 x 64 bytes, 0.89x; 4 x 64 0.71x, 8 x 32 0.80x.
//   SSE2 (16 registers, no FMA, the x86-64 default): 4 x 32 bytes, 0.36x (its peak is half of
//     AVX2's); 6 x 32 0.25x, 8 x 16 0.30x.
// A GPU build takes one tile for its host and device passes, which see different target macros.
// The tile is a template argument of the kernels, so translation units built for different
// targets never share a kernel instantiation.
struct GemmTileGpu {
  static constexpr index_t mr = 4;
  static constexpr index_t nr_bytes = 64;
};
struct GemmTileAvx512 {
  static constexpr index_t mr = 8;
  static constexpr index_t nr_bytes = 128;
};
struct GemmTileAvx {
  static constexpr index_t mr = 6;
  static constexpr index_t nr_bytes = 64;
};
struct GemmTileSse {
  static constexpr index_t mr = 4;
  static constexpr index_t nr_bytes = 32;
};
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) || \
    defined(KOKKOS_ENABLE_OPENMPTARGET) || defined(KOKKOS_ENABLE_OPENACC)
using GemmTile = GemmTileGpu;
#elif defined(__AVX512F__)
using GemmTile = GemmTileAvx512;
#elif defined(__AVX__)
using GemmTile = GemmTileAvx;
#else
using GemmTile = GemmTileSse;
#endif

// Block sizes around the tile: a KC x NR micro-panel of B is 32 KB (L1), an MC x KC block of A
// 128 KB in float (L2), a KC x NC block of B 4 MB (L3). Measured with the tiles above, KC 256 and
// MC 128 were the best of KC 128-512 x MC 64-512; MC >= 256 lost 25% at 256^3.
template <class T, class Tile>
struct GemmBlocking {
  using value_type = T;
  static constexpr index_t mr = Tile::mr;
  static constexpr index_t nr = Tile::nr_bytes / static_cast<index_t>(sizeof(T));
  static constexpr index_t kc = 256;
  static constexpr index_t mc = 128 / mr * mr;  // a multiple of MR: no edge tiles inside M
  static constexpr index_t nc = 4096;
};

// Copies rows [first, first + extent) and columns [pc, pc + kc) of a matrix X into Width-tall
// micro-panels: panel r / Width holds kc columns of Width values, zeros past row `extent`, so
// the micro-kernel never checks bounds. X(x, p) is v(p, x) when `Transposed`, else v(x, p).
// A's block is op(A) (Transposed = TransA), B's is op(B)^T (Transposed = !TransB).
template <class T, index_t Width, bool Transposed, class View, class Packed>
struct GemmPackPanels {
  View v;
  Packed packed;
  index_t first = 0;
  index_t pc = 0;
  index_t extent = 0;
  index_t kc = 0;

  // item = panel * kc + p
  KOKKOS_INLINE_FUNCTION void operator()(const index_t item) const {
    const index_t x0 = (item / kc) * Width;
    const index_t p = item % kc;
    KSHARD_UNROLL
    for (index_t r = 0; r < Width; ++r) {
      const index_t x = x0 + r;
      T value = T(0);
      if (x < extent) {
        if constexpr (Transposed)
          value = v(pc + p, first + x);
        else
          value = v(first + x, pc + p);
      }
      packed(item * Width + r) = value;
    }
  }
};

// Both copies in one launch (a launch is a barrier for a threaded backend): the first
// `b_items` items copy B, the others A.
template <class PackA, class PackB>
struct GemmPack {
  PackA pack_a;
  PackB pack_b;
  index_t b_items = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const index_t item) const {
    if (item < b_items)
      pack_b(item);
    else
      pack_a(item - b_items);
  }
};

// C(ic + i, jc + j) += sum over p < kc of A(i, p) B(p, j) from the packed blocks (C starts at
// zero when `overwrite`), one MR x NR tile per work item. Tiles run down a column of A
// micro-panels first, so consecutive items share the B micro-panel.
template <class Blocking, class CView, class Packed>
struct GemmMicroKernel {
  using T = typename Blocking::value_type;
  static constexpr index_t mr = Blocking::mr;
  static constexpr index_t nr = Blocking::nr;

  Packed a_packed;
  Packed b_packed;
  CView c;
  index_t ic = 0;
  index_t jc = 0;
  index_t mc = 0;
  index_t nc = 0;
  index_t kc = 0;
  index_t tiles_m = 0;
  bool overwrite = false;  // the first K panel without `accumulate`

  KOKKOS_INLINE_FUNCTION void operator()(const index_t tile) const {
    const index_t i0 = (tile % tiles_m) * mr;
    const index_t j0 = (tile / tiles_m) * nr;
    const bool full = i0 + mr <= mc && j0 + nr <= nc;
    if (full && overwrite)
      full_tile<true>(i0, j0);
    else if (full)
      full_tile<false>(i0, j0);
    else
      edge_tile(i0, j0);
  }

  // The accumulators start from C (or zero) and go back to it, so an element of C takes its
  // products one at a time in increasing k, whatever the block sizes. Every index into them is
  // a constant, so they live in registers. `Overwrite` is a template parameter: as a run-time
  // choice here it defeats GCC 12's vectoriser.
  template <bool Overwrite>
  KSHARD_NO_LOOP_VECTORIZE KOKKOS_INLINE_FUNCTION void full_tile(index_t i0, index_t j0) const {
    T acc[mr][nr];
    KSHARD_UNROLL
    for (index_t r = 0; r < mr; ++r) {
      KSHARD_UNROLL
      for (index_t q = 0; q < nr; ++q) acc[r][q] = Overwrite ? T(0) : c(ic + i0 + r, jc + j0 + q);
    }
    multiply(i0, j0, acc);
    KSHARD_UNROLL
    for (index_t r = 0; r < mr; ++r) {
      KSHARD_UNROLL
      for (index_t q = 0; q < nr; ++q) c(ic + i0 + r, jc + j0 + q) = acc[r][q];
    }
  }

  // A tile on the lower or right edge: the same sums, for the padding rows and columns too
  // (which start from a repeated element of C, so no read leaves C), and stored through a buffer
  // within the bounds. Indexed by the variable bounds, the accumulators would move to memory.
  KSHARD_NO_LOOP_VECTORIZE KOKKOS_INLINE_FUNCTION void edge_tile(index_t i0, index_t j0) const {
    const index_t rows = mc - i0 < mr ? mc - i0 : mr;
    const index_t cols = nc - j0 < nr ? nc - j0 : nr;
    T acc[mr][nr];
    KSHARD_UNROLL
    for (index_t r = 0; r < mr; ++r) {
      KSHARD_UNROLL
      for (index_t q = 0; q < nr; ++q)
        acc[r][q] =
            overwrite ? T(0)
                      : c(ic + i0 + (r < rows ? r : rows - 1), jc + j0 + (q < cols ? q : cols - 1));
    }
    multiply(i0, j0, acc);
    T out[mr][nr];
    KSHARD_UNROLL
    for (index_t r = 0; r < mr; ++r) {
      KSHARD_UNROLL
      for (index_t q = 0; q < nr; ++q) out[r][q] = acc[r][q];
    }
    for (index_t r = 0; r < rows; ++r)
      for (index_t q = 0; q < cols; ++q) c(ic + i0 + r, jc + j0 + q) = out[r][q];
  }

  // acc += the tile's products over the K panel: an MR-wide column of A times an NR-wide row of
  // B per step, both read sequentially from the packed micro-panels. Inlining is forced:
  // otherwise clang 14 keeps the accumulators in memory (7 GFLOP/s at 1024^3 instead of 24).
  KSHARD_NO_LOOP_VECTORIZE KOKKOS_FORCEINLINE_FUNCTION void multiply(index_t i0, index_t j0,
                                                                     T (&acc)[mr][nr]) const {
    const T* a = a_packed.data() + i0 * kc;
    const T* b = b_packed.data() + j0 * kc;
    for (index_t p = 0; p < kc; ++p) {
      KSHARD_UNROLL
      for (index_t r = 0; r < mr; ++r) {
        const T x = a[r];
        KSHARD_UNROLL
        for (index_t q = 0; q < nr; ++q) acc[r][q] += x * b[q];
      }
      a += mr;
      b += nr;
    }
  }
};

// kshard's own GEMM on `space`: C = op(A) op(B), or C += op(A) op(B) with `accumulate`.
template <bool TransA, bool TransB, class Tile, class ExecSpace, class AView, class BView,
          class CView>
void own_gemm(const ExecSpace& space, const AView& a, const BView& b, const CView& c, index_t k,
              bool accumulate) {
  using T = typename CView::non_const_value_type;
  using Blocking = GemmBlocking<T, Tile>;
  using Packed = Kokkos::View<T*, typename CView::memory_space>;
  using Policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>;
  using Pack = GemmPack<GemmPackPanels<T, Blocking::mr, TransA, AView, Packed>,
                        GemmPackPanels<T, Blocking::nr, !TransB, BView, Packed>>;
  using Kernel = GemmMicroKernel<Blocking, CView, Packed>;
  constexpr index_t mr = Blocking::mr;
  constexpr index_t nr = Blocking::nr;
  const auto m = static_cast<index_t>(c.extent(0));
  const auto n = static_cast<index_t>(c.extent(1));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) Kokkos::deep_copy(space, c, T(0));
    return;
  }
  // One block of each operand, smaller for small products.
  const index_t kc_max = std::min(k, Blocking::kc);
  Packed a_packed(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::gemm::a_packed"),
                  static_cast<std::size_t>(ceil_div(std::min(m, Blocking::mc), mr) * mr * kc_max));
  Packed b_packed(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::gemm::b_packed"),
                  static_cast<std::size_t>(ceil_div(std::min(n, Blocking::nc), nr) * nr * kc_max));
  for (index_t jc = 0; jc < n; jc += Blocking::nc) {
    const index_t nc = std::min(Blocking::nc, n - jc);
    const index_t tiles_n = ceil_div(nc, nr);
    for (index_t pc = 0; pc < k; pc += Blocking::kc) {
      const index_t kc = std::min(Blocking::kc, k - pc);
      // B's block in the same launch as A's first block.
      for (index_t ic = 0; ic < m; ic += Blocking::mc) {
        const index_t mc = std::min(Blocking::mc, m - ic);
        const index_t tiles_m = ceil_div(mc, mr);
        const index_t b_items = ic == 0 ? tiles_n * kc : 0;
        Kokkos::parallel_for(
            "kshard::gemm::pack", Policy(space, 0, b_items + tiles_m * kc),
            Pack{{a, a_packed, ic, pc, mc, kc}, {b, b_packed, jc, pc, nc, kc}, b_items});
        Kokkos::parallel_for(
            "kshard::gemm::tiles", Policy(space, 0, tiles_m * tiles_n),
            Kernel{a_packed, b_packed, c, ic, jc, mc, nc, kc, tiles_m, pc == 0 && !accumulate});
      }
    }
  }
}

// Which implementation a product takes.
enum class GemmPath { kshard, kokkos_kernels };

constexpr const char* name_of(GemmPath path) {
  return path == GemmPath::kokkos_kernels ? "kokkos-kernels (vendor BLAS)" : "kshard";
}

// The path gemm_nn / gemm_tn / gemm_nt take for these views on ExecSpace.
template <class ExecSpace, class AView, class BView, class CView>
GemmPath gemm_path([[maybe_unused]] const AView& a, [[maybe_unused]] const BView& b,
                   [[maybe_unused]] const CView& c) {
#if defined(KSHARD_HAVE_KOKKOS_KERNELS)
  if constexpr (kokkos_kernels_gemm_v<ExecSpace, AView, BView, CView>)
    if (fits_blas_int(a) && fits_blas_int(b) && fits_blas_int(c)) return GemmPath::kokkos_kernels;
#endif
  return GemmPath::kshard;
}

template <bool TransA, bool TransB, class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace& space, const AView& a, const BView& b, const CView& c, index_t k,
          bool accumulate) {
#if defined(KSHARD_HAVE_KOKKOS_KERNELS)
  if constexpr (kokkos_kernels_gemm_v<ExecSpace, AView, BView, CView>) {
    if (gemm_path<ExecSpace>(a, b, c) == GemmPath::kokkos_kernels) {
      using T = typename CView::non_const_value_type;
      if (c.extent(0) == 0 || c.extent(1) == 0) return;
      if (k == 0) {  // KokkosBlas::gemm returns without touching C here
        if (!accumulate) Kokkos::deep_copy(space, c, T(0));
        return;
      }
      kokkos_kernels_gemm<TransA, TransB>(space, a, b, c, accumulate);
      return;
    }
  }
#endif
  own_gemm<TransA, TransB, GemmTile>(space, a, b, c, k, accumulate);
}

// C = A * B (A: M x K, B: K x N, C: M x N); with `accumulate`, C += A * B. On `space`.
template <class ExecSpace, class AView, class BView, class CView>
void gemm_nn(const ExecSpace& space, const AView& a, const BView& b, const CView& c,
             bool accumulate) {
  gemm<false, false>(space, a, b, c, static_cast<index_t>(a.extent(1)), accumulate);
}

// C = A^T * B (A: K x M, B: K x N, C: M x N); with `accumulate`, C += A^T * B. On `space`.
template <class ExecSpace, class AView, class BView, class CView>
void gemm_tn(const ExecSpace& space, const AView& a, const BView& b, const CView& c,
             bool accumulate) {
  gemm<true, false>(space, a, b, c, static_cast<index_t>(a.extent(0)), accumulate);
}

// C = A * B^T (A: M x K, B: N x K, C: M x N); with `accumulate`, C += A * B^T. On `space`.
template <class ExecSpace, class AView, class BView, class CView>
void gemm_nt(const ExecSpace& space, const AView& a, const BView& b, const CView& c,
             bool accumulate) {
  gemm<false, true>(space, a, b, c, static_cast<index_t>(a.extent(1)), accumulate);
}

// The same on a default-constructed ExecSpace instance.
template <class ExecSpace, class AView, class BView, class CView>
requires(!Kokkos::is_execution_space<AView>::value) void gemm_nn(const AView& a, const BView& b,
                                                                 const CView& c, bool accumulate) {
  gemm_nn(ExecSpace(), a, b, c, accumulate);
}

template <class ExecSpace, class AView, class BView, class CView>
requires(!Kokkos::is_execution_space<AView>::value) void gemm_tn(const AView& a, const BView& b,
                                                                 const CView& c, bool accumulate) {
  gemm_tn(ExecSpace(), a, b, c, accumulate);
}

template <class ExecSpace, class AView, class BView, class CView>
requires(!Kokkos::is_execution_space<AView>::value) void gemm_nt(const AView& a, const BView& b,
                                                                 const CView& c, bool accumulate) {
  gemm_nt(ExecSpace(), a, b, c, accumulate);
}

}  // namespace kshard::detail
