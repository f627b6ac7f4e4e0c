#pragma once

// The local row-norm kernel shared by the rowwise algorithms, detection and repair: squared
// full-row L2 norms of the rows of a local shard, widened to fp64.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kshard/bfloat16.hpp"
#include "kshard/detail/int_limit.hpp"
#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/float16.hpp"
#include "kshard/index.hpp"

// The bf16, f16 and fp32 host kernels have x86 forms for AVX2 and AVX-512 (with F16C, which every
// x86 CPU with AVX2 has, for f16), compiled into every x86 host build with GCC or Clang (function
// target attributes: no -m flag needed) and chosen at run time by what the CPU has; never in a
// CUDA/HIP/SYCL compilation, which uses the portable loops below.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDACC__) && !defined(__HIPCC__) && !defined(__SYCL_DEVICE_ONLY__)
#include <cpuid.h>
#include <immintrin.h>
#define KSHARD_ROW_NORMS_X86 1
#define KSHARD_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KSHARD_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#else
#define KSHARD_ROW_NORMS_X86 0
#endif

namespace kshard::detail {

// An element as the algorithms compute with it: in compute_type_t<T>, held in a double.
template <class T>
KOKKOS_INLINE_FUNCTION double widen(T x) {
  return static_cast<double>(static_cast<compute_type_t<T>>(x));
}

// Squared in fp64: a finite fp32 entry above 2^64 (about 1.8e19) would square to infinity in
// fp32 and make a healthy row look non-finite.
template <class T>
KOKKOS_INLINE_FUNCTION double squared(T x) {
  const double v = widen(x);
  return v * v;
}

// Host execution spaces (detail::is_host_space_v) get a loop with independent accumulators per
// row (the latency of one fp64 add chain caps a single-accumulator loop at a quarter of memory
// bandwidth); device spaces get a team per row.

// bf16, f16 and fp32 rows on the host: one fp64 add chain per accumulator caps a core below the
// memory's speed unless a row is spread over many, so the sum runs over 32 fp64 accumulators
// (`row_lane` says which one takes each element of a block of 32), summed at
// the end in one fixed order. Every path below (AVX-512, AVX2, portable) computes the same
// additions in the same order, so they give bit-identical norms whichever the CPU runs (replicas
// of a row on different CPUs agree). Eight accumulators were conversion-bound for bf16 at 0.38x
// of the fp32 kernel's bytes per second (a bf16 element is half the bytes, so twice the elements
// per second must be widened, squared and added) and add-bound for fp32 at 0.82x of the memory's
// speed on a Zen 5 core.
//
// A bf16 element is read as the two bytes it is stored in, widened exactly to float by moving
// them into the top half of 32 bits; an f16 one is widened exactly by F16C's vcvtph2ps (as
// kshard::f16's own conversion does, NaNs quieted alike); the floats are converted exactly to
// double and
// squared in double, as `squared` does (the square of a 24-bit significand is exact in double,
// and lies within its range; in float it would overflow above 2^64 and lose bits below 2^-63,
// which is why the square is not taken in float).
inline constexpr int row_lanes = 32;

// The x86 kernels request into the caches, a line at a time, the memory this many bytes past a
// block of row_lanes elements: what the kernel reads about 8 KiB later (the next rows' near a row's
// end). With the hardware prefetcher alone, a Zen 5 core read a large table at 20-25 GB/s and
// these kernels ran at 23-26; asking for memory 8 KiB ahead, a plain read reached 27-30 and the
// kernels 30 (bf16) and 31 (fp32). A prefetch never faults, past the table's end either.
inline constexpr std::size_t prefetch_distance = 8192;

// The accumulator of bf16 element k of a block of 32: within each half of 16, the even elements
// go to its first eight accumulators and the odd ones to the next eight. That is the order in
// which the x86 forms widen them: the even elements of a 32-bit word by a shift, the odd ones
// by clearing its low half, with no shuffle (the shuffles capped the kernel at 0.75 of the
// memory's speed on one core).
KOKKOS_INLINE_FUNCTION constexpr int bf16_lane(int k) {
  return (k & 16) | ((k & 1) << 3) | ((k >> 1) & 7);
}

// The accumulator of element k of a block of 32 of a bf16 row (bf16_lane) or an fp32 or f16 row
// (its own: the x86 forms widen consecutive fp32 and f16 elements).
KOKKOS_INLINE_FUNCTION constexpr int row_lane(const bf16*, int k) { return bf16_lane(k); }
KOKKOS_INLINE_FUNCTION constexpr int row_lane(const float*, int k) { return k; }
KOKKOS_INLINE_FUNCTION constexpr int row_lane(const f16*, int k) { return k; }

// The fixed final order: halves, then quarters, ..., then the remainder-free total.
KOKKOS_INLINE_FUNCTION double sum_lanes(double (&a)[row_lanes]) {
  for (int w = row_lanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) a[k] += a[k + w];
  return a[0];
}

// The elements after the last whole block (fewer than row_lanes), into their lanes.
template <class T>
KOKKOS_INLINE_FUNCTION void add_rest(double (&a)[row_lanes], const T* rest, int count) {
  for (int k = 0; k < count; ++k) a[row_lane(rest, k)] += squared(rest[k]);
}

// The portable form of the bf16 row kernel (non-x86 hosts, x86 without AVX2, device passes).
KOKKOS_INLINE_FUNCTION double row_squared_norm_portable(const bf16* row, index_t cols) {
  double a[row_lanes] = {};
  index_t j = 0;
  // The lanes of bf16_lane spelled out, so that the compiler vectorises the even and the odd
  // elements (a loop through bf16_lane itself ran 4x slower).
  for (; j + row_lanes <= cols; j += row_lanes)
    for (int half = 0; half < row_lanes; half += 16)
      for (int k = 0; k < 8; ++k) {
        a[half + k] += squared(row[j + half + 2 * k]);
        a[half + 8 + k] += squared(row[j + half + 2 * k + 1]);
      }
  add_rest(a, row + j, static_cast<int>(cols - j));
  return sum_lanes(a);
}

// The portable form of the fp32 and f16 row kernels: element k of a block in lane k.
template <class T>
KOKKOS_INLINE_FUNCTION double consecutive_lanes_portable(const T* row, index_t cols) {
  double a[row_lanes] = {};
  index_t j = 0;
  for (; j + row_lanes <= cols; j += row_lanes)
    for (int k = 0; k < row_lanes; ++k) a[k] += squared(row[j + k]);
  add_rest(a, row + j, static_cast<int>(cols - j));
  return sum_lanes(a);
}
KOKKOS_INLINE_FUNCTION double row_squared_norm_portable(const float* row, index_t cols) {
  return consecutive_lanes_portable(row, cols);
}
KOKKOS_INLINE_FUNCTION double row_squared_norm_portable(const f16* row, index_t cols) {
  return consecutive_lanes_portable(row, cols);
}

// The forms of the bf16, f16 and fp32 row kernels: the portable loop, and on x86 hosts the AVX2 and
// AVX-512 ones, all giving the same bits.
enum class RowKernel { portable, avx2, avx512 };

#if KSHARD_ROW_NORMS_X86
// Sixteen bf16 elements at `p` (unaligned) as floats, exactly: the even elements (the low
// halves of the 32-bit words, shifted up) and the odd ones (the high halves, the low halves
// cleared), eight each.
struct Bf16x16 {
  __m256 even, odd;
};
KSHARD_TARGET_AVX2 inline Bf16x16 bf16x16_to_float(const void* p) {
  const __m256i raw = _mm256_loadu_si256(static_cast<const __m256i*>(p));
  const __m256i high_halves = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(raw, 16)),
          _mm256_castsi256_ps(_mm256_and_si256(raw, high_halves))};
}

// Every line of the block prefetch_distance bytes past `block` of row_lanes elements, into L1.
// (The address is computed as an integer: it may lie past the end of the table, where pointer
// arithmetic would be undefined.)
template <class T>
KSHARD_TARGET_AVX2 inline void prefetch_ahead(const T* block) {
  const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(block) + prefetch_distance;
  for (std::size_t line = 0; line < row_lanes * sizeof(T); line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T0);
}

// acc + v * v: the product of two bf16- or fp32-valued doubles is exact, so the fused
// multiply-add rounds once, as the portable form's add of the exact square does (the same bits).
KSHARD_TARGET_AVX2 inline __m256d add_square(__m256d acc, __m256d v) {
  return _mm256_fmadd_pd(v, v, acc);
}
KSHARD_TARGET_AVX512 inline __m512d add_square(__m512d acc, __m512d v) {
  return _mm512_fmadd_pd(v, v, acc);
}
// float -> double, all eight lanes (the masked form: GCC 12's unmasked intrinsic warns about
// its own undefined pass-through operand under -Werror=maybe-uninitialized).
KSHARD_TARGET_AVX512 inline __m512d to_double(__m256 f) { return _mm512_maskz_cvtps_pd(0xff, f); }

// The 32 lanes in zmm (AVX-512) or ymm (AVX2) accumulators, stored to the same 32 lanes before
// the same final sum as the portable form. The kernels keep them in named variables, not an
// array or a struct: GCC at -O2 keeps an array of vectors in memory, and the store-to-load
// latency of each chain then halves the speed.
struct Zmm4 {
  __m512d c0, c1, c2, c3;
};
struct Ymm4 {
  __m256d c0, c1, c2, c3;
};

// The last steps of sum_lanes' order on the four lanes left: halves of 2, then the last pair.
KSHARD_TARGET_AVX2 inline double sum_four_lanes(__m256d four) {
  const __m128d two = _mm_add_pd(_mm256_castpd256_pd128(four), _mm256_extractf128_pd(four, 1));
  return _mm_cvtsd_f64(_mm_add_sd(two, _mm_unpackhi_pd(two, two)));
}

// The lanes' sum in sum_lanes' order, by vector adds of the same pairs: halves of 16 lanes
// (zmm 0 + 2, 1 + 3), of 8, of 4, then sum_four_lanes.
KSHARD_TARGET_AVX512 inline double sum_lanes_avx512(const Zmm4& c) {
  const __m512d eight = _mm512_add_pd(_mm512_add_pd(c.c0, c.c2), _mm512_add_pd(c.c1, c.c3));
  // Masked extracts (the cast too is one in GCC 12): its unmasked one warns about its own
  // pass-through, as in to_double.
  return sum_four_lanes(_mm256_add_pd(_mm512_maskz_extractf64x4_pd(0xf, eight, 0),
                                      _mm512_maskz_extractf64x4_pd(0xf, eight, 1)));
}

// The row's sum: the lanes, plus the `count` elements after the last whole block at `rest`.
template <class T>
KSHARD_TARGET_AVX512 double finish_avx512(const Zmm4& c, const T* rest, int count) {
  if (count == 0) return sum_lanes_avx512(c);  // a row of whole blocks: no store and reload
  alignas(64) double a[row_lanes];
  _mm512_store_pd(a, c.c0);
  _mm512_store_pd(a + 8, c.c1);
  _mm512_store_pd(a + 16, c.c2);
  _mm512_store_pd(a + 24, c.c3);
  add_rest(a, rest, count);
  return sum_lanes(a);
}

// bf16: four zmm accumulators of eight.
KSHARD_TARGET_AVX512 inline double row_squared_norm_avx512(const bf16* row, index_t cols) {
  index_t j = 0;
  __m512d c0 = _mm512_setzero_pd(), c1 = c0, c2 = c0, c3 = c0;
  for (; j + row_lanes <= cols; j += row_lanes) {
    prefetch_ahead(row + j);
    const Bf16x16 low = bf16x16_to_float(row + j);
    const Bf16x16 high = bf16x16_to_float(row + j + 16);
    c0 = add_square(c0, to_double(low.even));
    c1 = add_square(c1, to_double(low.odd));
    c2 = add_square(c2, to_double(high.even));
    c3 = add_square(c3, to_double(high.odd));
  }
  return finish_avx512({c0, c1, c2, c3}, row + j, static_cast<int>(cols - j));
}

// Eight consecutive fp32 or f16 elements at `p` (unaligned) as floats, exactly (f16: F16C).
KSHARD_TARGET_AVX2 inline __m256 eight_floats(const float* p) { return _mm256_loadu_ps(p); }
KSHARD_TARGET_AVX2 inline __m256 eight_floats(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// fp32 and f16: four zmm accumulators of eight consecutive elements.
template <class T>
KSHARD_TARGET_AVX512 double consecutive_lanes_avx512(const T* row, index_t cols) {
  index_t j = 0;
  __m512d c0 = _mm512_setzero_pd(), c1 = c0, c2 = c0, c3 = c0;
  for (; j + row_lanes <= cols; j += row_lanes) {
    prefetch_ahead(row + j);
    c0 = add_square(c0, to_double(eight_floats(row + j)));
    c1 = add_square(c1, to_double(eight_floats(row + j + 8)));
    c2 = add_square(c2, to_double(eight_floats(row + j + 16)));
    c3 = add_square(c3, to_double(eight_floats(row + j + 24)));
  }
  return finish_avx512({c0, c1, c2, c3}, row + j, static_cast<int>(cols - j));
}
KSHARD_TARGET_AVX512 inline double row_squared_norm_avx512(const float* row, index_t cols) {
  return consecutive_lanes_avx512(row, cols);
}
KSHARD_TARGET_AVX512 inline double row_squared_norm_avx512(const f16* row, index_t cols) {
  return consecutive_lanes_avx512(row, cols);
}

// sum_lanes' order by vector adds of the same pairs, as sum_lanes_avx512, on ymm halves.
KSHARD_TARGET_AVX2 inline double sum_lanes_avx2(const Ymm4& low, const Ymm4& high) {
  return sum_four_lanes(
      _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(low.c0, high.c0), _mm256_add_pd(low.c2, high.c2)),
                    _mm256_add_pd(_mm256_add_pd(low.c1, high.c1), _mm256_add_pd(low.c3, high.c3))));
}

template <class T>
KSHARD_TARGET_AVX2 double finish_avx2(const Ymm4& low, const Ymm4& high, const T* rest, int count) {
  if (count == 0) return sum_lanes_avx2(low, high);
  alignas(32) double a[row_lanes];
  _mm256_store_pd(a, low.c0);
  _mm256_store_pd(a + 4, low.c1);
  _mm256_store_pd(a + 8, low.c2);
  _mm256_store_pd(a + 12, low.c3);
  _mm256_store_pd(a + 16, high.c0);
  _mm256_store_pd(a + 20, high.c1);
  _mm256_store_pd(a + 24, high.c2);
  _mm256_store_pd(a + 28, high.c3);
  add_rest(a, rest, count);
  return sum_lanes(a);
}

// The low and high four floats of eight, as doubles.
KSHARD_TARGET_AVX2 inline __m256d low_to_double(__m256 f) {
  return _mm256_cvtps_pd(_mm256_castps256_ps128(f));
}
KSHARD_TARGET_AVX2 inline __m256d high_to_double(__m256 f) {
  return _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
}

// AVX2 converts four floats to double per instruction: the same lanes in eight ymm accumulators
// of four. The conversions cap a core at about 0.7 of memory bandwidth for bf16.
KSHARD_TARGET_AVX2 inline double row_squared_norm_avx2(const bf16* row, index_t cols) {
  index_t j = 0;
  __m256d c0 = _mm256_setzero_pd(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
  for (; j + row_lanes <= cols; j += row_lanes) {
    prefetch_ahead(row + j);
    const Bf16x16 first = bf16x16_to_float(row + j);
    const Bf16x16 second = bf16x16_to_float(row + j + 16);
    c0 = add_square(c0, low_to_double(first.even));
    c1 = add_square(c1, high_to_double(first.even));
    c2 = add_square(c2, low_to_double(first.odd));
    c3 = add_square(c3, high_to_double(first.odd));
    c4 = add_square(c4, low_to_double(second.even));
    c5 = add_square(c5, high_to_double(second.even));
    c6 = add_square(c6, low_to_double(second.odd));
    c7 = add_square(c7, high_to_double(second.odd));
  }
  return finish_avx2({c0, c1, c2, c3}, {c4, c5, c6, c7}, row + j, static_cast<int>(cols - j));
}

// fp32 and f16: eight ymm accumulators of four consecutive elements.
template <class T>
KSHARD_TARGET_AVX2 double consecutive_lanes_avx2(const T* row, index_t cols) {
  index_t j = 0;
  __m256d c0 = _mm256_setzero_pd(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
  for (; j + row_lanes <= cols; j += row_lanes) {
    prefetch_ahead(row + j);
    const __m256 first = eight_floats(row + j);
    const __m256 second = eight_floats(row + j + 8);
    const __m256 third = eight_floats(row + j + 16);
    const __m256 fourth = eight_floats(row + j + 24);
    c0 = add_square(c0, low_to_double(first));
    c1 = add_square(c1, high_to_double(first));
    c2 = add_square(c2, low_to_double(second));
    c3 = add_square(c3, high_to_double(second));
    c4 = add_square(c4, low_to_double(third));
    c5 = add_square(c5, high_to_double(third));
    c6 = add_square(c6, low_to_double(fourth));
    c7 = add_square(c7, high_to_double(fourth));
  }
  return finish_avx2({c0, c1, c2, c3}, {c4, c5, c6, c7}, row + j, static_cast<int>(cols - j));
}
KSHARD_TARGET_AVX2 inline double row_squared_norm_avx2(const float* row, index_t cols) {
  return consecutive_lanes_avx2(row, cols);
}
KSHARD_TARGET_AVX2 inline double row_squared_norm_avx2(const f16* row, index_t cols) {
  return consecutive_lanes_avx2(row, cols);
}

// F16C: CPUID leaf 1, ECX bit 29 (Clang 14's __builtin_cpu_supports does not name it); it uses
// the ymm registers, whose saving AVX2's check covers.
inline bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

// Whether this build has `kernel` and this CPU runs it (and its operating system saves the
// registers it uses, which __builtin_cpu_supports checks too).
inline bool row_kernel_runs(RowKernel kernel) {
#if KSHARD_ROW_NORMS_X86
  switch (kernel) {
    case RowKernel::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma") && cpu_has_f16c();
    case RowKernel::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case RowKernel::portable:
      return true;
  }
#endif
  return kernel == RowKernel::portable;
}

// The fastest form this CPU runs, found once.
inline RowKernel fastest_row_kernel() {
  static const RowKernel fastest = row_kernel_runs(RowKernel::avx512) ? RowKernel::avx512
                                   : row_kernel_runs(RowKernel::avx2) ? RowKernel::avx2
                                                                      : RowKernel::portable;
  return fastest;
}

// One bf16, f16 or fp32 row on a host execution space with the given form (one this CPU runs); the
// portable form in any device pass of a kernel, which never runs it.
template <class T>
KOKKOS_INLINE_FUNCTION double row_squared_norm(RowKernel kernel, const T* row, index_t cols) {
#if KSHARD_ROW_NORMS_X86 && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  if (kernel == RowKernel::avx512) return row_squared_norm_avx512(row, cols);
  if (kernel == RowKernel::avx2) return row_squared_norm_avx2(row, cols);
#else
  (void)kernel;
#endif
  return row_squared_norm_portable(row, cols);
}

// row_sums on a host space: one work item per row adds its columns in order, into `Lanes`
// interleaved accumulators.
template <int Lanes, class Element, class Store>
struct RowSumsPerItem {
  Element element;
  Store store;
  index_t cols;
  KOKKOS_INLINE_FUNCTION void operator()(index_t i) const {
    if constexpr (Lanes == 8) {
      double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
      index_t j = 0;
      for (; j + 8 <= cols; j += 8) {
        a0 += element(i, j);
        a1 += element(i, j + 1);
        a2 += element(i, j + 2);
        a3 += element(i, j + 3);
        a4 += element(i, j + 4);
        a5 += element(i, j + 5);
        a6 += element(i, j + 6);
        a7 += element(i, j + 7);
      }
      for (; j < cols; ++j) a0 += element(i, j);
      store(i, ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)));
    } else {
      double sum = 0;
      for (index_t j = 0; j < cols; ++j) sum += element(i, j);
      store(i, sum);
    }
  }
};

// row_sums on a device space: a team per row reduces its columns.
template <class Element, class Store>
struct RowSumsPerTeam {
  Element element;
  Store store;
  index_t cols;
  template <class Team>
  KOKKOS_INLINE_FUNCTION void operator()(const Team& team) const {
    const index_t i = team.league_rank();
    double sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, cols),
        [&](const index_t j, double& acc) { acc += element(i, j); }, sum);
    Kokkos::single(Kokkos::PerTeam(team), [&] { store(i, sum); });
  }
};

// For every row i in [0, rows): store(i, s) with s the fp64 sum over j in [0, cols) of
// element(i, j). The host/device fork, written once: on host execution spaces one work item per
// row adds the columns in order (with `Lanes` = 8, into eight interleaved accumulators combined
// as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), which lets the compiler vectorise and hides the
// latency of the add chain); on device spaces a team per row reduces the columns. The result is
// deterministic for a given build and backend.
template <int Lanes = 1, class ExecSpace, class Element, class Store>
void row_sums(const ExecSpace& space, const char* label, index_t rows, index_t cols,
              const Element& element, const Store& store) {
  static_assert(Lanes == 1 || Lanes == 8, "kshard::detail::row_sums: 1 or 8 lanes");
  if (rows == 0) return;
  if constexpr (is_host_space_v<ExecSpace>)
    Kokkos::parallel_for(label,
                         Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(space, 0, rows),
                         RowSumsPerItem<Lanes, Element, Store>{element, store, cols});
  else
    Kokkos::parallel_for(
        label,
        Kokkos::TeamPolicy<ExecSpace>(
            space, checked_int(rows, "row sums", "the number of rows (one team each)"),
            Kokkos::AUTO),
        RowSumsPerTeam<Element, Store>{element, store, cols});
}

// The squared elements of a strided row-major block, for row_sums.
template <class T>
struct SquaredElement {
  const T* data;
  index_t stride;
  KOKKOS_INLINE_FUNCTION double operator()(index_t i, index_t j) const {
    return squared(data[i * stride + j]);
  }
};

// out(i) = sum, for row_sums.
template <class Out>
struct StoreSum {
  Out out;
  KOKKOS_INLINE_FUNCTION void operator()(index_t i, double sum) const { out(i) = sum; }
};

// out(i) = the squared norm of row i of a strided row-major block, by the given host form.
template <class T, class Out>
struct HostRowSquaredNorms {
  RowKernel kernel;
  const T* data;
  index_t stride;
  index_t cols;
  Out out;
  KOKKOS_INLINE_FUNCTION void operator()(index_t i) const {
    out(i) = row_squared_norm(kernel, data + i * stride, cols);
  }
};

// Squared norms of the local parts of the local rows (no communication). On the host, bf16, f16
// and fp32 rows take the fastest row_squared_norm this CPU runs; fp64 ones eight fp64 accumulators
// (an fp64 element is as many bytes as the adds it costs keep up with).
template <class ExecSpace, class View, class Out>
void local_row_squared_norms(const ExecSpace& space, const View& local, const Out& out) {
  const auto rows = static_cast<index_t>(local.extent(0));
  const auto cols = static_cast<index_t>(local.extent(1));
  const auto* data = local.data();  // a plain pointer lets the compiler vectorise the rows
  const auto stride = static_cast<index_t>(local.stride(0));
  using T = typename View::non_const_value_type;
  if constexpr (is_host_space_v<ExecSpace> &&
                (std::is_same_v<T, bf16> || std::is_same_v<T, f16> || std::is_same_v<T, float>))
    Kokkos::parallel_for(
        "kshard::row_norms",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(space, 0, rows),
        HostRowSquaredNorms<T, Out>{fastest_row_kernel(), data, stride, cols, out});
  else
    row_sums<8>(space, "kshard::row_norms", rows, cols, SquaredElement<T>{data, stride},
                StoreSum<Out>{out});
}

}  // namespace kshard::detail
