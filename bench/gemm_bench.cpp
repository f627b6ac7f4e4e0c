// The local GEMM behind the tensor-parallel linear layers (kshard::detail::gemm_nn / gemm_tn /
// gemm_nt) in GFLOP/s, against a naive triple loop and, when found at configure time, OpenBLAS
// cblas_sgemm on one thread, on the same operands in the same run. Both implementations are
// measured: kshard's own kernel (records gemm_<shape>, "path": "kshard") and, when kshard was
// built with kokkos-kernels, KokkosBlas::gemm as the layers call it (gemm_kokkos_kernels_<shape>,
// "path": "kokkos_kernels"), each timed in alternation with OpenBLAS. Every rank runs the same
// products at once (so more ranks than cores shows the sharing), and the linear-layer shapes
// also run through column_parallel_linear with the weight split over the ranks (on the path in
// use). Each result is compared with the naive loop's, so a broken fast path cannot look good.

#include <kshard/kshard.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.hpp"

#if defined(KSHARD_BENCH_OPENBLAS)
#include <cblas.h>
#endif

namespace {

using kshard::index_t;
using Mat = Kokkos::View<float**, Kokkos::LayoutRight>;
using Exec = Kokkos::DefaultExecutionSpace;

Mat make(const char* label, index_t rows, index_t cols, int seed) {
  Mat m(std::string(label), static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
  Kokkos::parallel_for(
      "bench::fill", rows, KOKKOS_LAMBDA(const index_t i) {
        for (index_t j = 0; j < cols; ++j)
          m(i, j) = 0.01f * static_cast<float>((i * 37 + j * 11 + seed) % 199) - 1.0f;
      });
  Kokkos::fence();
  return m;
}

// op(A)(i, p) for the three forms, A as stored.
enum class Form { nn, tn, nt };

const char* name_of(Form f) { return f == Form::nn ? "nn" : f == Form::tn ? "tn" : "nt"; }

// The textbook i-j-k loop over the first `m_rows` rows of C: one dot product per element.
void naive(Form form, const Mat& a, const Mat& b, const Mat& c, index_t m_rows) {
  const auto n = static_cast<index_t>(c.extent(1));
  const auto k = static_cast<index_t>(form == Form::tn ? a.extent(0) : a.extent(1));
  Kokkos::parallel_for(
      "bench::naive_gemm", m_rows, KOKKOS_LAMBDA(const index_t i) {
        for (index_t j = 0; j < n; ++j) {
          float sum = 0;
          for (index_t p = 0; p < k; ++p) {
            const float x = form == Form::tn ? a(p, i) : a(i, p);
            const float y = form == Form::nt ? b(j, p) : b(p, j);
            sum += x * y;
          }
          c(i, j) = sum;
        }
      });
  Kokkos::fence();
}

// kshard's own kernel, whatever the path in use.
void kshard_gemm(Form form, const Mat& a, const Mat& b, const Mat& c) {
  namespace detail = kshard::detail;
  using Tile = detail::GemmTile;
  const Exec space;
  const auto k = static_cast<index_t>(form == Form::tn ? a.extent(0) : a.extent(1));
  if (form == Form::nn) detail::own_gemm<false, false, Tile>(space, a, b, c, k, false);
  if (form == Form::tn) detail::own_gemm<true, false, Tile>(space, a, b, c, k, false);
  if (form == Form::nt) detail::own_gemm<false, true, Tile>(space, a, b, c, k, false);
  space.fence();
}

// The path in use, as the linear layers call it: kokkos-kernels' vendor BLAS when built with it.
void layers_gemm(Form form, const Mat& a, const Mat& b, const Mat& c) {
  const Exec space;
  if (form == Form::nn) kshard::detail::gemm_nn(space, a, b, c, false);
  if (form == Form::tn) kshard::detail::gemm_tn(space, a, b, c, false);
  if (form == Form::nt) kshard::detail::gemm_nt(space, a, b, c, false);
  space.fence();
}

const char* path_in_use() {
  const Mat m("bench::path", 1, 1);
  return kshard::detail::gemm_path<Exec>(m, m, m) == kshard::detail::GemmPath::kokkos_kernels
             ? "kokkos_kernels"
             : "kshard";
}

#if defined(KSHARD_BENCH_OPENBLAS)
void openblas_gemm(Form form, const Mat& a, const Mat& b, const Mat& c) {
  const auto m = static_cast<int>(c.extent(0));
  const auto n = static_cast<int>(c.extent(1));
  const auto k = static_cast<int>(form == Form::tn ? a.extent(0) : a.extent(1));
  cblas_sgemm(CblasRowMajor, form == Form::tn ? CblasTrans : CblasNoTrans,
              form == Form::nt ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a.data(),
              static_cast<int>(a.extent(1)), b.data(), static_cast<int>(b.extent(1)), 0.0f,
              c.data(), n);
}
#endif

// Largest relative difference over the first `rows` rows of two results.
double max_rel_diff(const Mat& x, const Mat& y, index_t rows) {
  const auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  const auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  double worst = 0;
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < static_cast<index_t>(hx.extent(1)); ++j) {
      const double a = hx(i, j);
      const double b = hy(i, j);
      worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(b)));
    }
  return worst;
}

// One implementation of one product (`run`), alternated with OpenBLAS when found, checked
// against the naive loop's first `naive_rows` rows of `reference`, as one record.
template <class Run>
void record(kshard::bench::Report& report, MPI_Comm comm, const std::string& name, const char* path,
            Form form, const std::string& label, const Mat& a, const Mat& b, const Mat& reference,
            index_t naive_rows, double naive_gflops, int reps, Run&& run) {
  const auto m = static_cast<index_t>(reference.extent(0));
  const auto n = static_cast<index_t>(reference.extent(1));
  const auto k = static_cast<index_t>(form == Form::tn ? a.extent(0) : a.extent(1));
  const Mat c("bench::c", static_cast<std::size_t>(m), static_cast<std::size_t>(n));
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
#if defined(KSHARD_BENCH_OPENBLAS)
  // Alternated with OpenBLAS, so that both see the same share of a loaded machine.
  const Mat blas_c("bench::blas_c", static_cast<std::size_t>(m), static_cast<std::size_t>(n));
  const auto paired = kshard::bench::time_paired(
      comm, reps, [&] { run(form, a, b, c); }, [&] { openblas_gemm(form, a, b, blas_c); });
  const double t_case = paired.seconds;
#else
  const double t_case = kshard::bench::time_collective(comm, reps, [&] { run(form, a, b, c); });
#endif
  // fp32 sums of up to 4096 terms in another order: relative differences of ~1e-5 are rounding.
  const double diff = max_rel_diff(c, reference, naive_rows);
  if (diff > 1e-3)
    throw std::runtime_error(fmt::format("gemm_bench: {} {} ({}) differs from the naive loop by {}",
                                         label, name_of(form), path, diff));
  const double gflops = flops / t_case / 1e9;
  std::string blas = R"("openblas_gflops": null, "ratio": null)";
#if defined(KSHARD_BENCH_OPENBLAS)
  const double blas_diff = max_rel_diff(blas_c, reference, naive_rows);
  if (blas_diff > 1e-3)
    throw std::runtime_error(
        fmt::format("gemm_bench: OpenBLAS {} {} differs from the naive loop by {}", label,
                    name_of(form), blas_diff));
  blas = fmt::format(R"("openblas_gflops": {:.4g}, "ratio": {:.4g})", flops / paired.baseline / 1e9,
                     1 / paired.ratio);  // target >= 0.5
#endif
  report.add(
      name,
      fmt::format(
          R"("form": "{}", "path": "{}", "m": {}, "n": {}, "k": {}, "seconds": {:.6g}, "gflops": {:.4g}, "naive_gflops": {:.4g}, "speedup_vs_naive": {:.4g}, {}, "max_rel_diff": {:.3g})",
          name_of(form), path, m, n, k, t_case, gflops, naive_gflops, gflops / naive_gflops, blas,
          diff));
}

void product(kshard::bench::Report& report, MPI_Comm comm, Form form, const std::string& label,
             index_t m, index_t n, index_t k, const kshard::bench::Options& options) {
  const Mat a = form == Form::tn ? make("bench::a", k, m, 1) : make("bench::a", m, k, 1);
  const Mat b = form == Form::nt ? make("bench::b", n, k, 2) : make("bench::b", k, n, 2);
  const Mat reference("bench::reference", static_cast<std::size_t>(m), static_cast<std::size_t>(n));
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const int reps = options.repetitions;

  // The naive loop runs about 1 GFLOP/s: past 2 * 512^3 flops, time it over the first rows
  // only (its rate does not depend on how many rows).
  const double budget = 2.0 * 512 * 512 * 512;
  const index_t naive_rows = std::max<index_t>(
      1, std::min<index_t>(m, static_cast<index_t>(budget / (flops / static_cast<double>(m)))));
  const double naive_flops = flops * static_cast<double>(naive_rows) / static_cast<double>(m);
  const double t_naive = kshard::bench::time_collective(
      comm, std::min(reps, 3), [&] { naive(form, a, b, reference, naive_rows); });
  const double naive_gflops = naive_flops / t_naive / 1e9;
  record(report, comm, "gemm_" + label, "kshard", form, label, a, b, reference, naive_rows,
         naive_gflops, reps, kshard_gemm);
  if (std::string(path_in_use()) == "kokkos_kernels")
    record(report, comm, "gemm_kokkos_kernels_" + label, "kokkos_kernels", form, label, a, b,
           reference, naive_rows, naive_gflops, reps, layers_gemm);
}

// The whole column-parallel forward (the weight's rows split over the ranks): GFLOP/s summed
// over the ranks, which should grow with the rank count up to the cores.
void column_parallel(kshard::bench::Report& report, MPI_Comm comm, index_t tokens, index_t in,
                     index_t out, const kshard::bench::Options& options) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  const kshard::Mesh<1> mesh(comm, {size}, {"tp"});
  using Layout = kshard::Layout<kshard::Shard<0>>;
  kshard::DistMatrix<float, Layout> weight(mesh, Layout{}, out, in);
  Kokkos::deep_copy(weight.local(), 0.5f);
  const Mat x = make("bench::x", tokens, in, 3);
  Mat y;
  const double t = kshard::bench::time_collective(comm, options.repetitions, [&] {
    y = kshard::column_parallel_linear(weight, x, kshard::no_bias, kshard::TpDim{0});
    Kokkos::fence();
  });
  const double flops =
      2.0 * static_cast<double>(tokens) * static_cast<double>(in) * static_cast<double>(out);
  report.add(
      "column_parallel_linear",
      fmt::format(R"("path": "{}", "m": {}, "n": {}, "k": {}, "seconds": {:.6g}, "gflops": {:.4g})",
                  path_in_use(), tokens, out, in, t, flops / t / 1e9));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = std::string(kshard::bench::isa) == "native" ? "gemm" : "gemm_generic";
  return kshard::bench::run_main(
      argc, argv, name, [](kshard::bench::Report& report, const kshard::bench::Options& options) {
#if defined(KSHARD_BENCH_OPENBLAS)
        openblas_set_num_threads(1);  // the target is per core, as kshard's Serial kernel
#endif
        const std::vector<index_t> sizes =
            options.quick ? std::vector<index_t>{128, 256} : std::vector<index_t>{256, 512, 1024};
        for (index_t s : sizes)
          product(report, MPI_COMM_WORLD, Form::nn, fmt::format("square_{}", s), s, s, s, options);
        // The linear layers' products for N tokens, in = out = H: forward x W^T (nt), input
        // gradient grad_y W (nn), weight gradient grad_y^T x (tn).
        const index_t tokens = options.quick ? 512 : 4096;
        const index_t h = options.quick ? 256 : 1024;
        product(report, MPI_COMM_WORLD, Form::nt, "linear_forward", tokens, h, h, options);
        product(report, MPI_COMM_WORLD, Form::nn, "linear_grad_input", tokens, h, h, options);
        product(report, MPI_COMM_WORLD, Form::tn, "linear_grad_weight", h, h, tokens, options);
        column_parallel(report, MPI_COMM_WORLD, tokens, h, h, options);
      });
}
