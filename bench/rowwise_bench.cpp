// Rowwise algorithms against the memory (a STREAM-like read of the same bytes) and against the
// naive alternatives, all measured in the same run: full-row norms (also against the per-row
// loop and an fp64 sum-of-squares kernel, neither of which is a bound), detection, repair of 256
// rows (and the three-pass Python algorithm written plainly), each in bf16 and f16 also against
// the fp64 sum-of-squares kernel over an fp32 table in bytes per second, zero_row (and
// gather-zero-scatter), scaling with V. Times are barrier to barrier over all ranks; gbps_all_ranks
// is total bytes over it.

#include <kshard/kshard.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

#include "harness.hpp"

namespace {

using kshard::index_t;
using kshard::detail::squared;
using Layout = kshard::Layout<kshard::Shard<0>>;
template <class T>
using Matrix = kshard::DistMatrix<T, Layout>;

// Sum of squares over the whole local array with eight independent fp64 accumulators, without
// prefetch: a tuned fp64 kernel, not the memory's speed (kshard's row norms ran 1.05-1.4x as
// fast as it on fp32 and 2-3.6x on bf16, whose widening binds it). No target is stated against
// it; the targets are against `stream_read`.
template <class T>
double fp64_sum_of_squares(const typename Matrix<T>::view_type& local) {
  const T* data = local.data();
  const auto n = static_cast<index_t>(local.span());
  constexpr index_t block = 2048;
  double total = 0;
  Kokkos::parallel_reduce(
      "bench::fp64_sum_of_squares", (n + block - 1) / block,
      KOKKOS_LAMBDA(const index_t b, double& sum) {
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
        const index_t end = (b + 1) * block < n ? (b + 1) * block : n;
        index_t k = b * block;
        for (; k + 8 <= end; k += 8) {
          a0 += squared(data[k]);
          a1 += squared(data[k + 1]);
          a2 += squared(data[k + 2]);
          a3 += squared(data[k + 3]);
          a4 += squared(data[k + 4]);
          a5 += squared(data[k + 5]);
          a6 += squared(data[k + 6]);
          a7 += squared(data[k + 7]);
        }
        for (; k < end; ++k) a0 += squared(data[k]);
        sum += ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
      },
      total);
  return total;
}

// A read of `words` 64-bit words on the device, one thread per word, so that neighbouring
// threads read neighbouring words (coalesced): what the device's memory gives.
inline std::uint64_t device_read(const unsigned char* bytes, index_t words) {
  std::uint64_t total = 0;
  Kokkos::parallel_reduce(
      "bench::device_read", words,
      KOKKOS_LAMBDA(const index_t k, std::uint64_t& sum) {
        std::uint64_t word;
        __builtin_memcpy(&word, bytes + 8 * k, sizeof word);
        sum += word;
      },
      total);
  return total;
}

// A STREAM-like read of the same bytes: the local array as 64-bit words, summed as integers
// (no conversion, no floating point), in blocks: what the memory gives this rank. On the host it
// asks for each line 8 KiB ahead, as kshard's row kernels do (kernels/row_norms.hpp), so that
// their prefetch does not count as a gain over the memory: a Zen 5 core read 20-25 GB/s without
// it, 27-30 with it. bf16 row norms are measured against this, not against
// `fp64_sum_of_squares`, whose bf16 form is bound by the same widening the kernel does and would
// hide a kernel slower than memory.
// On a GPU it is device_read.
template <class T>
std::uint64_t stream_read(const typename Matrix<T>::view_type& local) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(local.data());
  if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                            typename Matrix<T>::memory_space>::accessible)
    return device_read(bytes, static_cast<index_t>(local.span() * sizeof(T) / 8));
  std::uint64_t total = 0;
  const auto lines = static_cast<index_t>(local.span() * sizeof(T) / 64);
  constexpr index_t block = 512;  // lines
  Kokkos::parallel_reduce(
      "bench::stream_read", (lines + block - 1) / block,
      KOKKOS_LAMBDA(const index_t b, std::uint64_t& sum) {
        const index_t end = (b + 1) * block < lines ? (b + 1) * block : lines;
        std::uint64_t acc = 0;
        for (index_t line = b * block; line < end; ++line) {
          const unsigned char* at = bytes + 64 * line;
#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
          // As an integer: the address may lie past the table's end.
          __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(at) +
                                                           kshard::detail::prefetch_distance));
#endif
          for (int k = 0; k < 8; ++k) {
            std::uint64_t word;
            __builtin_memcpy(&word, at + 8 * k, sizeof word);
            acc += word;
          }
        }
        sum += acc;
      },
      total);
  return total;
}

// The per-row loop most people write: one fp64 accumulator per row.
template <class T>
void plain_row_norms(const typename Matrix<T>::view_type& local, const Kokkos::View<double*>& out) {
  const auto cols = static_cast<index_t>(local.extent(1));
  Kokkos::parallel_for(
      "bench::plain_row_norms", static_cast<index_t>(local.extent(0)),
      KOKKOS_LAMBDA(const index_t i) {
        double sum = 0;
        for (index_t j = 0; j < cols; ++j) {
          const auto v = static_cast<kshard::compute_type_t<T>>(local(i, j));
          sum += static_cast<double>(v * v);
        }
        out(i) = sum;
      });
  Kokkos::fence();
}

template <class T>
Matrix<T> make_table(const kshard::Mesh<1>& mesh, index_t rows, index_t cols, float phase) {
  Matrix<T> m(mesh, Layout{}, rows, cols);
  const auto local = m.local();
  const auto map = m.mapping().rows;
  Kokkos::parallel_for(
      "bench::fill", static_cast<index_t>(local.extent(0)), KOKKOS_LAMBDA(const index_t i) {
        const index_t g = map.to_global(i);
        for (index_t j = 0; j < cols; ++j)
          local(i, j) = static_cast<T>(phase + 0.001f * static_cast<float>((g * 31 + j) % 257));
      });
  Kokkos::fence();
  return m;
}

// Zeroes `count` global rows spread over the table, wherever they are held.
template <class T>
void damage(const Matrix<T>& m, index_t count) {
  for (index_t k = 0; k < count; ++k) kshard::zero_row(m, (k * 7919) % m.rows());
  Kokkos::fence();
}

// Bytes per second on all ranks together of the fp64 sum-of-squares kernel and of the three
// rowwise operations, per element type; for bf16 and f16, also each operation's bytes per second
// over those of that kernel over an fp32 table, timed in alternation with it (the against-fp32
// records).
struct Rates {
  double sum_of_squares = 0, norms = 0, detection = 0, repair = 0;
  double norms_vs_fp32 = 0, detection_vs_fp32 = 0, repair_vs_fp32 = 0;
};

// `fp32_sum_of_squares` reads an fp32 table of the same shape (bf16 and f16 only).
template <class T>
Rates run(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, index_t rows, index_t cols,
          const kshard::bench::Options& options,
          const std::function<void()>& fp32_sum_of_squares = nullptr) {
  const std::string type(kshard::detail::element_name<T>());
  const auto input = make_table<T>(mesh, rows, cols, 0.5f);
  const auto output = make_table<T>(mesh, rows, cols, 0.25f);
  const MPI_Comm comm = mesh.comm();
  const int reps = options.repetitions;
  const double local_bytes = static_cast<double>(input.local().span() * sizeof(T));
  const double all_bytes = kshard::bench::total_bytes(comm, local_bytes);
  // gbps_per_rank: this rank's bytes over the time of all ranks (barrier to barrier);
  // gbps_all_ranks: every rank's bytes over that time, the machine's aggregate.
  const auto fields = [&](const kshard::bench::Paired& t) {
    return fmt::format(
        R"("type": "{}", "rows": {}, "cols": {}, "seconds": {:.6g}, "baseline_seconds": {:.6g}, "ratio": {:.4g}, "gbps_per_rank": {:.4g}, "gbps_all_ranks": {:.4g})",
        type, rows, cols, t.seconds, t.baseline, t.ratio, local_bytes / t.seconds / 1e9,
        all_bytes / t.seconds / 1e9);
  };

  // Every case is timed in alternation with its baseline (time_paired), so both see the same
  // share of a shared machine.
  double sink = 0;
  const auto sum_of_squares = [&] { sink += fp64_sum_of_squares<T>(input.local()); };
  const auto norms = [&] {
    const auto n = kshard::row_squared_norms(input);
    Kokkos::fence();
  };
  Kokkos::View<double*> plain("plain", input.local().extent(0));
  // For reference, no target: the per-row loop and the norms against the fp64 kernel.
  const auto t_sum = kshard::bench::time_paired(comm, reps, sum_of_squares, sum_of_squares);
  const auto t_plain = kshard::bench::time_paired(
      comm, reps, [&] { plain_row_norms<T>(input.local(), plain); }, sum_of_squares);
  const auto t_norms = kshard::bench::time_paired(comm, reps, norms, sum_of_squares);
  report.add("fp64_sum_of_squares", fields(t_sum));
  report.add("plain_row_loop", fields(t_plain));
  report.add("row_squared_norms", fields(t_norms));
  // Against the memory itself: a STREAM-like read of the same bytes, in alternation.
  // Target: stream / norms >= 0.85 (bytes per second of the kernel over the memory's).
  std::uint64_t words = 0;
  const auto t_memory = kshard::bench::time_paired(comm, reps, norms,
                                                   [&] { words += stream_read<T>(input.local()); });
  report.add("row_squared_norms_vs_memory",
             fields(t_memory) +
                 fmt::format(R"(, "stream_gbps_all_ranks": {:.4g}, "fraction_of_memory": {:.4g})",
                             all_bytes / t_memory.baseline / 1e9, 1 / t_memory.ratio));

  const kshard::RepairConfig config(true, 1e-6, 256);
  const auto repair = [&] { (void)kshard::repair_embedding_rows(input, output, config); };
  const auto t_detect = kshard::bench::time_paired(comm, reps, repair, norms);
  report.add("detect_no_damage", fields(t_detect));  // target <= 1.10
  const index_t damaged = std::min<index_t>(256, rows);
  const auto damage_rows = [&] { damage(input, damaged); };
  const auto t_repair = kshard::bench::time_paired(comm, reps, damage_rows, repair, norms);
  report.add("repair_256_rows", fields(t_repair));  // target <= 1.20
  // The Python algorithm: norms of the input, of the whole output, and of the input again.
  const auto t_python = kshard::bench::time_paired(
      comm, reps, damage_rows,
      [&] {
        const auto a = kshard::row_squared_norms(input);
        const auto b = kshard::row_squared_norms(output);
        (void)kshard::repair_embedding_rows(input, output, config);
        const auto c = kshard::row_squared_norms(input);
        Kokkos::fence();
      },
      norms);
  report.add("python_three_pass_repair", fields(t_python));

  // zero_row: one row, many times per repetition, against a raw fill of the same slice.
  constexpr int calls = 1000;
  const index_t row = rows / 3;
  const index_t local_row = input.mapping().rows.to_local(row);
  const index_t held = local_row == kshard::invalid_index ? 0 : 1;
  const index_t first = held == 1 ? local_row : 0;
  const auto slice =
      Kokkos::subview(input.local(), Kokkos::make_pair(first, first + held), Kokkos::ALL);
  const auto t_zero = kshard::bench::time_paired(
      comm, reps,
      [&] {
        for (int k = 0; k < calls; ++k) kshard::zero_row(input, row);
        Kokkos::fence();
      },
      [&] {
        for (int k = 0; k < calls; ++k) Kokkos::deep_copy(slice, T(0.0f));
        Kokkos::fence();
      });
  kshard::reset_comm_stats();
  kshard::zero_row(input, row);
  const auto zero_bytes = kshard::comm_stats().bytes_sent;
  report.add(
      "zero_row",
      fmt::format(
          R"("type": "{}", "rows": {}, "cols": {}, "seconds": {:.6g}, "ratio": {:.4g}, "bytes_sent": {})",
          type, rows, cols, t_zero.seconds / calls, t_zero.ratio, zero_bytes));
  if (sink == 1.2345 || words == 12345) std::printf(" ");
  const auto gbps = [&](double seconds) { return all_bytes / seconds / 1e9; };
  Rates rates{gbps(t_sum.seconds), gbps(t_norms.seconds), gbps(t_detect.seconds),
              gbps(t_repair.seconds)};
  if (fp32_sum_of_squares) {
    // Same shape, so bytes per second over fp32's are sizeof(T) / 4 over the time ratio.
    constexpr double bytes_vs_fp32 = sizeof(T) / 4.0;
    const auto vs_fp32 = [&](const auto& setup, const auto& operation) {
      return bytes_vs_fp32 /
             kshard::bench::time_paired(comm, reps, setup, operation, fp32_sum_of_squares).ratio;
    };
    const auto nothing = [] {};
    rates.norms_vs_fp32 = vs_fp32(nothing, norms);
    rates.detection_vs_fp32 = vs_fp32(nothing, repair);
    rates.repair_vs_fp32 = vs_fp32(damage_rows, repair);
  }
  return rates;
}

// The naive way to zero a row of a distributed table: gather it all, zero, scatter back.
void zero_row_baseline(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, index_t rows,
                       index_t cols, const kshard::bench::Options& options) {
  const auto input = make_table<float>(mesh, rows, cols, 0.5f);
  const index_t row = rows / 3;
  constexpr int calls = 1000;
  const double t_zero = kshard::bench::time_collective(mesh.comm(), options.repetitions, [&] {
    for (int k = 0; k < calls; ++k) kshard::zero_row(input, row);
    Kokkos::fence();
  });
  const double t_naive = kshard::bench::time_collective(mesh.comm(), options.quick ? 1 : 3, [&] {
    auto full = kshard::gather(input);
    for (index_t j = 0; j < cols; ++j)
      full(static_cast<std::size_t>(row), static_cast<std::size_t>(j)) = 0.0f;
    const auto back = kshard::distribute(mesh, Layout{}, kshard::HostMatrix<const float>(full));
    Kokkos::fence();
  });
  report.add(
      "zero_row_gather_scatter",
      fmt::format(R"("type": "float", "rows": {}, "cols": {}, "seconds": {:.6g}, "ratio": {:.4g})",
                  rows, cols, t_naive, t_naive / (t_zero / calls)));
}

// distribute(mesh, layout, full) checks that every rank passes the same values by a digest of
// the whole host matrix on every rank: against a plain read of the same bytes as 64-bit words
// (target: ratio <= 1.35, i.e. >= 0.75 of the memory's speed).
void distribute_digest(kshard::bench::Report& report, index_t rows, index_t cols,
                       const kshard::bench::Options& options) {
  kshard::HostMatrix<float> full("full", rows, cols);
  for (std::size_t i = 0; i < full.extent(0); ++i)
    for (std::size_t j = 0; j < full.extent(1); ++j)
      full(i, j) = 0.001f * static_cast<float>((i * 31 + j) % 257);
  std::int64_t digests = 0;
  std::uint64_t words = 0;
  const auto t = kshard::bench::time_paired(
      MPI_COMM_WORLD, options.repetitions,
      [&] { digests ^= kshard::detail::values_digest(kshard::HostMatrix<const float>(full)); },
      [&] {
        const auto* at = reinterpret_cast<const std::uint64_t*>(full.data());
        std::uint64_t sum = 0;  // a local: `words` may alias the data, which keeps it in memory
        for (std::size_t k = 0; k < full.span() / 2; ++k) sum += at[k];
        words += sum;
      });
  if (digests == 1 && words == 1) std::printf(" ");
  const double gb = static_cast<double>(full.span() * sizeof(float)) / 1e9;
  report.add(
      "distribute_digest",
      fmt::format(
          R"("type": "float", "rows": {}, "cols": {}, "seconds": {:.6g}, "gbps_per_rank": {:.4g}, "read_gbps_per_rank": {:.4g}, "ratio": {:.4g})",
          rows, cols, t.seconds, gb / t.seconds, gb / t.baseline, t.ratio));
}

}  // namespace

int main(int argc, char** argv) {
  return kshard::bench::run_main(
      argc, argv, "rowwise",
      [](kshard::bench::Report& report, const kshard::bench::Options& options) {
        int size = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
        const index_t rows = options.quick ? 16384 : 262144;
        const index_t cols = options.quick ? 256 : 1024;
        const auto fp32 = run<float>(report, mesh, rows, cols, options);
        const auto fp32_table = make_table<float>(mesh, rows, cols, 0.5f);
        double sink = 0;
        const auto read_fp32 = [&] { sink += fp64_sum_of_squares<float>(fp32_table.local()); };
        const auto bf16 = run<kshard::bf16>(report, mesh, rows, cols, options, read_fp32);
        const auto f16 = run<kshard::f16>(report, mesh, rows, cols, options, read_fp32);
        if (sink == 1.2345) std::printf(" ");
        // bf16 and f16 are half the bytes of fp32 per element: at the memory's speed they read
        // as many bytes per second as fp32 does. For reference, no target (that kernel is not
        // the memory: row_squared_norms_vs_memory is): their bytes per second of each operation
        // over the fp64 sum-of-squares kernel's over an fp32 table, each timed in alternation
        // with it (`ratio`); `ratio_separate_runs` divides rates from separate runs.
        for (const auto& [type, rates] : {std::pair{"bf16", bf16}, std::pair{"f16", f16}}) {
          const std::tuple<const char*, double, double> operations[] = {
              {"row_squared_norms", rates.norms, rates.norms_vs_fp32},
              {"detect_no_damage", rates.detection, rates.detection_vs_fp32},
              {"repair_256_rows", rates.repair, rates.repair_vs_fp32}};
          for (const auto& [operation, gbps, paired] : operations)
            report.add(
                fmt::format("{}_vs_fp32_sum_of_squares", type),
                fmt::format(
                    R"("type": "{}", "operation": "{}", "rows": {}, "cols": {}, "gbps_all_ranks": {:.4g}, "fp32_sum_of_squares_gbps_all_ranks": {:.4g}, "fp32_norms_gbps_all_ranks": {:.4g}, "ratio": {:.4g}, "ratio_separate_runs": {:.4g})",
                    type, operation, rows, cols, gbps, fp32.sum_of_squares, fp32.norms, paired,
                    gbps / fp32.sum_of_squares));
        }
        // How the cost grows with V: norms at four sizes.
        for (index_t v : {rows / 8, rows / 4, rows / 2, rows}) {
          const auto table = make_table<float>(mesh, v, cols, 0.5f);
          const double t = kshard::bench::time_collective(mesh.comm(), options.repetitions, [&] {
            const auto n = kshard::row_squared_norms(table);
            Kokkos::fence();
          });
          report.add(
              "norms_vs_rows",
              fmt::format(
                  R"("type": "float", "rows": {}, "cols": {}, "seconds": {:.6g}, "gbps_per_rank": {:.4g}, "gbps_all_ranks": {:.4g})",
                  v, cols, t, static_cast<double>(table.local().span() * 4) / t / 1e9,
                  static_cast<double>(v * cols * 4) / t / 1e9));
        }
        // Before the gather baseline, which holds the whole table: kshard's own peak.
        const double max_rss = kshard::bench::largest_peak_rss_mib(MPI_COMM_WORLD);
        report.add("peak_rss",
                   fmt::format(R"("mib_per_rank": {:.1f}, "table_mib_per_rank": {:.1f})", max_rss,
                               static_cast<double>(rows * cols * 4) / size / 1048576.0));
        distribute_digest(report, rows / 4, cols, options);
        zero_row_baseline(report, mesh, rows, cols, options);  // allocates the whole table: last
      });
}
