// The local GEMM behind the tensor-parallel layers (kshard::detail::gemm_nn / gemm_tn / gemm_nt)
// on its own, against a triple loop in double: empty products, K = 0, one element, sizes off
// every tile and block multiple, several K panels and M and N blocks, overwrite and accumulate,
// float and double; and the same bits on Serial as on the default host backend's threads.
// Every case runs through the path in use (kokkos-kernels' vendor BLAS when kshard was built
// with it, KSHARD_HAVE_KOKKOS_KERNELS) and, where that is not kshard's own kernel, through that
// kernel too; Gemm.PathInUse checks (and prints) which path the linear layers' views take.

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "kshard/kernels/gemm.hpp"

namespace {

using kshard::index_t;

// The other unit tests need no backend; these run on Kokkos' default one.
class KokkosEnvironment final : public ::testing::Environment {
 public:
  void SetUp() override { Kokkos::initialize(); }
  void TearDown() override { Kokkos::finalize(); }
};
[[maybe_unused]] ::testing::Environment* const kokkos_environment =
    ::testing::AddGlobalTestEnvironment(new KokkosEnvironment);

template <class T>
using HostMatrix = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace>;

// A stored M x K (K x M for tn), B stored K x N (N x K for nt).
enum class Form { nn, tn, nt };

const char* name_of(Form form) { return form == Form::nn ? "nn" : form == Form::tn ? "tn" : "nt"; }

template <class T>
HostMatrix<T> random_matrix(index_t rows, index_t cols, std::uint32_t seed) {
  HostMatrix<T> m("m", static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
  std::mt19937 generator(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) m(i, j) = static_cast<T>(uniform(generator));
  return m;
}

// The implementation a case runs: what gemm_nn / gemm_tn / gemm_nt choose, or kshard's own.
enum class Path { in_use, own };

// The paths every case runs: kshard's own kernel too where the path in use is another one.
std::vector<Path> paths() {
#if defined(KSHARD_HAVE_KOKKOS_KERNELS)
  return {Path::in_use, Path::own};
#else
  return {Path::in_use};
#endif
}

// C = or += op(A) * B by the kernel on ExecSpace, from C = c0.
template <class ExecSpace, class T>
HostMatrix<T> product(Form form, const HostMatrix<T>& a, const HostMatrix<T>& b,
                      const HostMatrix<T>& c0, bool accumulate, Path path = Path::in_use) {
  using Memory = typename ExecSpace::memory_space;
  namespace detail = kshard::detail;
  const auto da = Kokkos::create_mirror_view_and_copy(Memory(), a);
  const auto db = Kokkos::create_mirror_view_and_copy(Memory(), b);
  Kokkos::View<T**, Kokkos::LayoutRight, Memory> c("c", c0.extent(0), c0.extent(1));
  Kokkos::deep_copy(c, c0);
  const ExecSpace space;
  if (path == Path::own) {
    using Tile = detail::GemmTile;
    const auto k = static_cast<index_t>(form == Form::tn ? a.extent(0) : a.extent(1));
    if (form == Form::nn) detail::own_gemm<false, false, Tile>(space, da, db, c, k, accumulate);
    if (form == Form::tn) detail::own_gemm<true, false, Tile>(space, da, db, c, k, accumulate);
    if (form == Form::nt) detail::own_gemm<false, true, Tile>(space, da, db, c, k, accumulate);
  } else {
    if (form == Form::nn) detail::gemm_nn<ExecSpace>(da, db, c, accumulate);
    if (form == Form::tn) detail::gemm_tn<ExecSpace>(da, db, c, accumulate);
    if (form == Form::nt) detail::gemm_nt<ExecSpace>(da, db, c, accumulate);
  }
  space.fence();
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
}

// Every element within the rounding bound (K + 2) eps (|c0| + sum |a b|) of the double triple
// loop: exact for K = 0. Without `accumulate`, C starts as NaN, which must not be read.
template <class T>
void check(Form form, index_t m, index_t n, index_t k, bool accumulate, std::uint32_t seed,
           Path path) {
  SCOPED_TRACE(::testing::Message()
               << name_of(form) << ", M = " << m << ", N = " << n << ", K = " << k << ", "
               << sizeof(T) << "-byte elements" << (accumulate ? ", accumulate" : "")
               << (path == Path::own ? ", kshard's own kernel" : ", the path in use"));
  const auto a = form == Form::tn ? random_matrix<T>(k, m, seed) : random_matrix<T>(m, k, seed);
  const auto b =
      form == Form::nt ? random_matrix<T>(n, k, seed + 1) : random_matrix<T>(k, n, seed + 1);
  auto c0 = random_matrix<T>(m, n, seed + 2);
  if (!accumulate) Kokkos::deep_copy(c0, std::numeric_limits<T>::quiet_NaN());
  const auto got = product<Kokkos::DefaultExecutionSpace>(form, a, b, c0, accumulate, path);
  ASSERT_EQ(got.extent(0), c0.extent(0));
  ASSERT_EQ(got.extent(1), c0.extent(1));
  const double eps = std::numeric_limits<T>::epsilon();
  index_t wrong = 0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double want = accumulate ? static_cast<double>(c0(i, j)) : 0.0;
      double scale = std::abs(want);
      for (index_t p = 0; p < k; ++p) {
        const double x = form == Form::tn ? a(p, i) : a(i, p);
        const double y = form == Form::nt ? b(j, p) : b(p, j);
        want += x * y;
        scale += std::abs(x * y);
      }
      const double error = std::abs(static_cast<double>(got(i, j)) - want);
      if (!(error <= static_cast<double>(k + 2) * eps * scale) && wrong++ == 0)
        ADD_FAILURE() << "C(" << i << ", " << j << ") = " << got(i, j) << ", want " << want;
    }
  EXPECT_EQ(wrong, 0) << "elements outside the rounding bound";
}

template <class T>
void check_all(index_t m, index_t n, index_t k, std::uint32_t seed) {
  for (const Path path : paths())
    for (const Form form : {Form::nn, Form::tn, Form::nt})
      for (const bool accumulate : {false, true}) check<T>(form, m, n, k, accumulate, seed, path);
}

using FloatBlocks = kshard::detail::GemmBlocking<float, kshard::detail::GemmTile>;
using DoubleBlocks = kshard::detail::GemmBlocking<double, kshard::detail::GemmTile>;

TEST(Gemm, EmptyProducts) {
  check_all<float>(0, 5, 3, 1);
  check_all<double>(4, 0, 3, 2);
  check_all<float>(0, 0, 0, 3);
  check_all<double>(0, 6, 0, 4);
}

TEST(Gemm, KZeroZeroesCOrLeavesIt) {
  check_all<float>(3, 7, 0, 5);
  check_all<double>(DoubleBlocks::mr + 1, DoubleBlocks::nr + 1, 0, 6);
}

TEST(Gemm, SmallAndEdgeTiles) {
  check_all<double>(1, 1, 1, 7);
  check_all<float>(1, 1, 1, 8);
  check_all<float>(1, 33, 2, 9);
  check_all<float>(9, 35, 13, 10);  // full and edge tiles in both directions
  check_all<double>(13, 11, 29, 11);
  check_all<float>(2 * FloatBlocks::mr, 2 * FloatBlocks::nr, 16, 12);  // full tiles only
  check_all<double>(2 * DoubleBlocks::mr, 2 * DoubleBlocks::nr, 16, 13);
  check_all<float>(FloatBlocks::mr - 1, FloatBlocks::nr - 1, 64, 14);  // edge tiles only
}

TEST(Gemm, SeveralKPanelsAndMBlocks) {
  check_all<float>(FloatBlocks::mc + 3, 67, FloatBlocks::kc + 1, 15);
  check_all<double>(2 * DoubleBlocks::mc + 1, 45, 2 * DoubleBlocks::kc + 7, 16);
  check_all<float>(37, 3, 3 * FloatBlocks::kc, 17);  // K panels only, N below one tile
}

TEST(Gemm, SeveralNBlocks) {
  check_all<float>(3, FloatBlocks::nc + FloatBlocks::nr + 5, FloatBlocks::kc + 2, 18);
  check_all<double>(DoubleBlocks::mr + 2, DoubleBlocks::nc + 1, 9, 19);
}

#if defined(KOKKOS_ENABLE_SERIAL)
// One work item per tile, with a fixed order of k: the thread count cannot change a bit
// (trivially true where the default host backend is Serial itself). kshard's own kernel only: a
// vendor BLAS makes no such promise.
TEST(Gemm, SameBitsOnSerialAsOnHostThreads) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  const index_t m = FloatBlocks::mc + 21, n = 3 * FloatBlocks::nr + 7, k = FloatBlocks::kc + 50;
  for (const Form form : {Form::nn, Form::tn, Form::nt}) {
    const auto a =
        form == Form::tn ? random_matrix<float>(k, m, 20) : random_matrix<float>(m, k, 20);
    const auto b =
        form == Form::nt ? random_matrix<float>(n, k, 21) : random_matrix<float>(k, n, 21);
    const auto c0 = random_matrix<float>(m, n, 22);
    const auto serial = product<Kokkos::Serial>(form, a, b, c0, true, Path::own);
    const auto threads = product<Host>(form, a, b, c0, true, Path::own);
    index_t differ = 0;
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) differ += serial(i, j) != threads(i, j) ? 1 : 0;
    EXPECT_EQ(differ, 0) << name_of(form) << " on " << Host::name();
  }
}
#endif

// The path the linear layers' products take (their views: LayoutRight, float or double, in the
// default execution space's memory), printed and checked: kokkos-kernels' vendor BLAS when kshard
// was built with kokkos-kernels and that has a BLAS for the memory space, else kshard's own.
template <class T>
void check_path_in_use() {
  using Exec = Kokkos::DefaultExecutionSpace;
  using Memory = Exec::memory_space;
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Memory>;
  using ConstMatrix = Kokkos::View<const T**, Kokkos::LayoutRight, Memory>;
  namespace detail = kshard::detail;
  const Matrix a("a", 8, 4), c("c", 8, 8);
  const ConstMatrix b = Matrix("b", 4, 8);
  const auto path = detail::gemm_path<Exec>(a, b, c);
  std::cout << "[ path     ] " << sizeof(T) << "-byte elements on " << Exec::name() << ": "
            << detail::name_of(path) << "\n";
#if defined(KSHARD_HAVE_KOKKOS_KERNELS)
  constexpr bool vendor = detail::kokkos_kernels_vendor_blas<Memory>();
  EXPECT_EQ(path, vendor ? detail::GemmPath::kokkos_kernels : detail::GemmPath::kshard);
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS)
  if constexpr (std::is_same_v<Memory, Kokkos::HostSpace>) {
    EXPECT_EQ(path, detail::GemmPath::kokkos_kernels)
        << "kokkos-kernels has a host BLAS, and the linear layers' views must reach it";
  }
#endif
  // kshard's rule agrees with kokkos-kernels' own (its internal TPL trait, whose signature is
  // known for 3.4-4.0 and 4.1 on), on the canonical views it hands over.
  using KA = detail::kokkos_kernels_view_t<Exec, Matrix, true>;
  using KB = detail::kokkos_kernels_view_t<Exec, ConstMatrix, true>;
  using KC = detail::kokkos_kernels_view_t<Exec, Matrix, false>;
#if KSHARD_KOKKOS_KERNELS_VERSION >= 40100
  constexpr bool kk_tpl = KokkosBlas::Impl::gemm_tpl_spec_avail<Exec, KA, KB, KC>::value;
#else
  constexpr bool kk_tpl = KokkosBlas::Impl::gemm_tpl_spec_avail<KA, KB, KC>::value;
#endif
  static_assert(kk_tpl == detail::kokkos_kernels_gemm_v<Exec, Matrix, ConstMatrix, Matrix>,
                "kshard's rule for kokkos-kernels' vendor BLAS disagrees with kokkos-kernels");
#else
  EXPECT_EQ(path, detail::GemmPath::kshard);
#endif
}

TEST(Gemm, PathInUse) {
  check_path_in_use<float>();
  check_path_in_use<double>();
}

// A column range of a LayoutRight matrix (a padded LayoutRight view in Kokkos 3.4, whose row
// stride the BLAS gets as its leading dimension), the same as a LayoutStride view (which no BLAS
// takes: kshard's own kernel), and a contiguous copy, all through an execution-space instance
// (the form the layers may pass): the same products.
TEST(Gemm, SubviewsStridesAndInstances) {
  using Exec = Kokkos::DefaultExecutionSpace;
  using Memory = Exec::memory_space;
  using Matrix = Kokkos::View<double**, Kokkos::LayoutRight, Memory>;
  namespace detail = kshard::detail;
  const index_t m = 19, n = 23, k = 37;
  const auto a_full =
      Kokkos::create_mirror_view_and_copy(Memory(), random_matrix<double>(m, k + 5, 30));
  const auto b = Kokkos::create_mirror_view_and_copy(Memory(), random_matrix<double>(k, n, 31));
  const auto a_sub = Kokkos::subview(a_full, Kokkos::ALL, std::pair<index_t, index_t>(2, 2 + k));
  const Kokkos::View<const double**, Kokkos::LayoutStride, Memory> a_strided = a_sub;
  EXPECT_EQ(detail::gemm_path<Exec>(a_strided, b, b), detail::GemmPath::kshard);
  const Matrix a("a", m, k);
  Kokkos::deep_copy(a, a_sub);
  const Matrix c_sub("c_sub", m, n), c_strided("c_strided", m, n), c("c", m, n);
  const Exec space;
  detail::gemm_nn(space, a_sub, b, c_sub, false);
  detail::gemm_nn(space, a_strided, b, c_strided, false);
  detail::gemm_nn(space, a, b, c, false);
  space.fence();
  const auto want = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
  const double bound = static_cast<double>((k + 2) * k) * std::numeric_limits<double>::epsilon();
  for (const Matrix& result : {c_sub, c_strided}) {
    const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), result);
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j)
        ASSERT_NEAR(got(i, j), want(i, j), bound) << result.label() << "(" << i << ", " << j << ")";
  }
}

}  // namespace
