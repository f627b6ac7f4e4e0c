#pragma once

// The local GEMM through kokkos-kernels: KokkosBlas::gemm, which hands the product to the
// vendor BLAS it was built with (its "TPL": a host BLAS, cuBLAS, rocBLAS). Included by
// kernels/gemm.hpp when kshard was configured with kokkos-kernels (KSHARD_HAVE_KOKKOS_KERNELS,
// CMake option KSHARD_KOKKOS_KERNELS); kernels/gemm.hpp keeps its own kernel for everything this
// file does not take (see kokkos_kernels_gemm_v).
//
// Versions: Debian 12's Trilinos 13.2 ships kokkos-kernels 3.4 (no KOKKOSKERNELS_VERSION
// macro; KokkosBlas::gemm takes no execution-space instance; its host BLAS TPL takes float and
// double in LayoutLeft or LayoutRight, HostSpace). The instance overload exists from 3.6 on.

#include <Kokkos_Core.hpp>

#include <KokkosKernels_config.h>
#include <KokkosBlas3_gemm.hpp>

#include <climits>
#include <type_traits>

// kokkos-kernels' version as a number (40100 for 4.1.0), 0 where it defines none (3.5 and
// older, Trilinos builds of them) or defines it empty.
#if defined(KOKKOSKERNELS_VERSION)
#define KSHARD_KOKKOS_KERNELS_VERSION (KOKKOSKERNELS_VERSION + 0)
#else
#define KSHARD_KOKKOS_KERNELS_VERSION 0
#endif

namespace kshard::detail {

// True when kokkos-kernels was built with a vendor BLAS for views in `MemorySpace`: what its
// gemm TPL specialisations (KokkosBlas3_gemm_tpl_spec_avail.hpp) require besides the value
// type and layouts, from the public TPL macros of KokkosKernels_config.h.
template <class MemorySpace>
constexpr bool kokkos_kernels_vendor_blas() {
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS) || defined(KOKKOSKERNELS_ENABLE_TPL_MKL) || \
    defined(KOKKOSKERNELS_ENABLE_TPL_ARMPL)
  if constexpr (std::is_same_v<MemorySpace, Kokkos::HostSpace>) return true;
#endif
#if defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS) && defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<MemorySpace, Kokkos::CudaSpace> ||
                std::is_same_v<MemorySpace, Kokkos::CudaUVMSpace>)
    return true;
#endif
#if defined(KOKKOSKERNELS_ENABLE_TPL_ROCBLAS) && defined(KOKKOS_ENABLE_HIP)
#if KOKKOS_VERSION >= 40000
  if constexpr (std::is_same_v<MemorySpace, Kokkos::HIPSpace>) return true;
#else
  if constexpr (std::is_same_v<MemorySpace, Kokkos::Experimental::HIPSpace>) return true;
#endif
#endif
  return false;
}

// The views KokkosBlas::gemm hands to a vendor BLAS: float or double throughout, one layout
// for all three (LayoutRight, kshard's, or LayoutLeft; a LayoutStride subview is not a BLAS
// matrix), one memory space that `ExecSpace` reaches and that has a vendor BLAS. Other views
// (bf16, mixed or strided layouts, a BLAS-less build) take kshard's own kernel.
template <class ExecSpace, class AView, class BView, class CView>
constexpr bool kokkos_kernels_gemm_views() {
  if constexpr (!Kokkos::is_view<AView>::value || !Kokkos::is_view<BView>::value ||
                !Kokkos::is_view<CView>::value) {
    return false;
  } else {
    using T = typename CView::non_const_value_type;
    using Layout = typename CView::array_layout;
    using Memory = typename CView::memory_space;
    constexpr bool blas_type = std::is_same_v<T, float> || std::is_same_v<T, double>;
    constexpr bool same_type = std::is_same_v<typename CView::value_type, T> &&
                               std::is_same_v<typename AView::non_const_value_type, T> &&
                               std::is_same_v<typename BView::non_const_value_type, T>;
    constexpr bool blas_layout =
        std::is_same_v<Layout, Kokkos::LayoutRight> || std::is_same_v<Layout, Kokkos::LayoutLeft>;
    constexpr bool same_layout = std::is_same_v<typename AView::array_layout, Layout> &&
                                 std::is_same_v<typename BView::array_layout, Layout>;
    constexpr bool same_memory = std::is_same_v<typename AView::memory_space, Memory> &&
                                 std::is_same_v<typename BView::memory_space, Memory>;
    return blas_type && same_type && blas_layout && same_layout && same_memory &&
           Kokkos::SpaceAccessibility<ExecSpace, Memory>::accessible &&
           kokkos_kernels_vendor_blas<Memory>();
  }
}

template <class ExecSpace, class AView, class BView, class CView>
inline constexpr bool kokkos_kernels_gemm_v =
    kokkos_kernels_gemm_views<ExecSpace, AView, BView, CView>();

// The BLAS takes int sizes and leading dimensions: larger operands take kshard's kernel.
template <class View>
bool fits_blas_int(const View& v) {
  constexpr auto most = static_cast<std::size_t>(INT_MAX);
  return v.extent(0) <= most && v.extent(1) <= most && v.stride(0) <= most && v.stride(1) <= most;
}

// The three views as KokkosBlas::gemm's canonical types (unmanaged; the device names `ExecSpace`,
// so the product is its work, whichever execution space the views were declared with), strides
// and all: a LayoutRight view with a padded row keeps its leading dimension.
template <class ExecSpace, class View, bool Const>
using kokkos_kernels_view_t =
    Kokkos::View<std::conditional_t<Const, typename View::const_value_type,
                                    typename View::non_const_value_type>**,
                 typename View::array_layout,
                 Kokkos::Device<ExecSpace, typename View::memory_space>,
                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// C = op(A) op(B), or C += op(A) op(B) with `accumulate` (beta 1, else 0: the BLAS then never
// reads C), on `space`. M, N and K > 0 and the views fit the BLAS's ints (the caller checks).
template <bool TransA, bool TransB, class ExecSpace, class AView, class BView, class CView>
void kokkos_kernels_gemm(const ExecSpace& space, const AView& a, const BView& b, const CView& c,
                         bool accumulate) {
  using T = typename CView::non_const_value_type;
  const kokkos_kernels_view_t<ExecSpace, AView, true> ua = a;
  const kokkos_kernels_view_t<ExecSpace, BView, true> ub = b;
  const kokkos_kernels_view_t<ExecSpace, CView, false> uc = c;
  const T alpha = T(1);
  const T beta = accumulate ? T(1) : T(0);
  const char* trans_a = TransA ? "T" : "N";
  const char* trans_b = TransB ? "T" : "N";
#if KSHARD_KOKKOS_KERNELS_VERSION >= 30600
  // The instance overload: the BLAS call is queued on `space` (cuBLAS/rocBLAS on its stream).
  KokkosBlas::gemm(space, trans_a, trans_b, alpha, ua, ub, beta, uc);
#else
  // No instance overload (Trilinos 13.2): the work already queued on `space` must be done
  // before the BLAS reads A and B; a host BLAS returns with C written, a device BLAS queues on
  // the default instance, which the next fence of the default instance waits for.
  space.fence();
  KokkosBlas::gemm(trans_a, trans_b, alpha, ua, ub, beta, uc);
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
  if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                            typename CView::memory_space>::accessible)
    ExecSpace().fence();  // ordered before later work on `space`, whatever its stream
#endif
#endif
}

}  // namespace kshard::detail
