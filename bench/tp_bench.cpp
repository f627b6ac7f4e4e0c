// Vocabulary-parallel embedding lookup against what a user would write by hand, measured in the
// same run: a plain copy of the rows this rank owns (zeros elsewhere) plus one bare
// MPI_Allreduce of the N x H output; and against all-gathering the whole table, then looking up
// locally. Both baselines' results are compared with kshard's once, so a broken fast path
// cannot look good.

#include <kshard/kshard.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.hpp"

namespace {

using kshard::index_t;
using Layout = kshard::Layout<kshard::Shard<0>>;
template <class T>
using Matrix = kshard::DistMatrix<T, Layout>;
using Ids = Kokkos::View<std::int32_t*>;
using Out = Kokkos::View<float**, Kokkos::LayoutRight>;

template <class T>
Matrix<T> make_table(const kshard::Mesh<1>& mesh, index_t rows, index_t cols) {
  Matrix<T> m(mesh, Layout{}, rows, cols);
  const auto local = m.local();
  const auto map = m.mapping().rows;
  Kokkos::parallel_for(
      "bench::fill", static_cast<index_t>(local.extent(0)), KOKKOS_LAMBDA(const index_t i) {
        const index_t g = map.to_global(i);
        for (index_t j = 0; j < cols; ++j)
          local(i, j) = static_cast<T>(0.001f * static_cast<float>((g * 31 + j) % 257));
      });
  Kokkos::fence();
  return m;
}

// The same pseudo-random ids on every rank (a fixed LCG), spread over the whole vocabulary.
Ids make_ids(index_t n, index_t vocab) {
  Ids ids("bench::ids", static_cast<std::size_t>(n));
  auto host = Kokkos::create_mirror_view(ids);
  std::uint64_t state = 12345;
  for (index_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    host(static_cast<std::size_t>(i)) =
        static_cast<std::int32_t>((state >> 33) % static_cast<std::uint64_t>(vocab));
  }
  Kokkos::deep_copy(ids, host);
  return ids;
}

// Whether the table and the output live where the host reaches them (not on a GPU build).
constexpr bool on_host =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, Out::memory_space>::accessible;

// The owned ids' rows copied into `out`, zeros for the others: a row per thread (a host's form).
template <class T>
void copy_rows_by_row(const typename Matrix<T>::view_type& local, index_t first, const Ids& ids,
                      const Out& out) {
  const auto owned = static_cast<index_t>(local.extent(0));
  const auto cols = static_cast<index_t>(local.extent(1));
  Kokkos::parallel_for(
      "bench::plain_lookup", static_cast<index_t>(ids.extent(0)), KOKKOS_LAMBDA(const index_t i) {
        const index_t l = static_cast<index_t>(ids(i)) - first;
        if (l >= 0 && l < owned)
          for (index_t j = 0; j < cols; ++j) out(i, j) = static_cast<float>(local(l, j));
        else
          for (index_t j = 0; j < cols; ++j) out(i, j) = 0.0f;
      });
}

// The same copy with an element per thread, neighbouring threads on neighbouring elements (a
// GPU's coalesced form: a device gather of the rows).
template <class T>
void copy_rows_by_element(const typename Matrix<T>::view_type& local, index_t first, const Ids& ids,
                          const Out& out) {
  const auto owned = static_cast<index_t>(local.extent(0));
  const auto cols = static_cast<index_t>(local.extent(1));
  Kokkos::parallel_for(
      "bench::plain_lookup", static_cast<index_t>(ids.extent(0)) * cols,
      KOKKOS_LAMBDA(const index_t k) {
        const index_t i = k / cols, j = k % cols;
        const index_t l = static_cast<index_t>(ids(i)) - first;
        out(i, j) = l >= 0 && l < owned ? static_cast<float>(local(l, j)) : 0.0f;
      });
}

// The hand-written lookup: the rows of the owned ids copied into a preallocated buffer (zeros
// for the others), then one in-place MPI_Allreduce, on `staging` (the buffer itself on a host;
// on a GPU a host copy allocated once, the MPI not being GPU-aware, as kshard's staging
// assumes). Shard<0> owns one contiguous row range.
template <class T>
void plain_lookup(const Matrix<T>& table, const Ids& ids, const Out& out,
                  const Out::HostMirror& staging, MPI_Comm comm) {
  const index_t first = table.mapping().rows.global_offset();
  if constexpr (on_host)
    copy_rows_by_row<T>(table.local(), first, ids, out);
  else
    copy_rows_by_element<T>(table.local(), first, ids, out);
  Kokkos::fence();
  Kokkos::deep_copy(staging, out);  // nothing to copy where staging is `out`
  MPI_Allreduce(MPI_IN_PLACE, staging.data(), static_cast<int>(staging.size()), MPI_FLOAT, MPI_SUM,
                comm);
  Kokkos::deep_copy(out, staging);
}

// The naive alternative: every rank all-gathers the whole V x H table, then copies rows.
template <class T>
void allgather_lookup(const Matrix<T>& table, const Ids& ids, const Out& out,
                      Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace>& full,
                      MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> counts(static_cast<std::size_t>(size));
  std::vector<int> displs(static_cast<std::size_t>(size));
  const int mine = static_cast<int>(table.local().size() * sizeof(T));
  MPI_Allgather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, comm);
  for (std::size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  MPI_Allgatherv(table.local().data(), mine, MPI_BYTE, full.data(), counts.data(), displs.data(),
                 MPI_BYTE, comm);
  const auto cols = static_cast<index_t>(full.extent(1));
  const auto f = full;
  Kokkos::parallel_for(
      "bench::allgather_lookup", static_cast<index_t>(ids.extent(0)),
      KOKKOS_LAMBDA(const index_t i) {
        for (index_t j = 0; j < cols; ++j) out(i, j) = static_cast<float>(f(ids(i), j));
      });
  Kokkos::fence();
}

bool same(const Out& a, const Out& b) {
  const auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  const auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  for (std::size_t k = 0; k < ha.span(); ++k)
    if (ha.data()[k] != hb.data()[k]) return false;
  return true;
}

// The naive alternative, timed against kshard's lookup (`t_kshard` seconds).
template <class T>
void allgather_case(kshard::bench::Report& report, const Matrix<T>& table, const Ids& ids,
                    const Out& result, index_t n, double t_kshard,
                    const kshard::bench::Options& options, const std::string& type) {
  const MPI_Comm comm = table.mesh().comm();
  const index_t vocab = table.rows(), hidden = table.cols();
  Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace> full(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::full"),
      static_cast<std::size_t>(vocab), static_cast<std::size_t>(hidden));
  Out gathered("bench::gathered", static_cast<std::size_t>(n), static_cast<std::size_t>(hidden));
  const double t_gather = kshard::bench::time_collective(
      comm, options.quick ? 1 : 3, [&] { allgather_lookup(table, ids, gathered, full, comm); });
  if (!same(result, gathered))
    throw std::runtime_error("tp_bench: lookup differs from the all-gather baseline");
  report.add(
      "allgather_table_lookup",
      fmt::format(
          R"("type": "{}", "rows": {}, "cols": {}, "ids": {}, "seconds": {:.6g}, "ratio": {:.4g}, "bytes_sent": {})",
          type, vocab, hidden, n, t_gather, t_gather / t_kshard, table.local().span() * sizeof(T)));
}

template <class T>
void run(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, index_t vocab, index_t hidden,
         index_t n, const kshard::bench::Options& options, const std::string& type) {
  const MPI_Comm comm = mesh.comm();
  const auto table = make_table<T>(mesh, vocab, hidden);
  const auto ids = make_ids(n, vocab);
  const int reps = options.repetitions;

  kshard::reset_comm_stats();
  Out result = kshard::vocab_parallel_lookup(table, ids, kshard::TpDim{0});
  Kokkos::fence();
  const auto bytes = kshard::comm_stats().bytes_sent;

  // The headline ratio: kshard into a reused buffer, as the hand-written baseline does.
  Out plain("bench::plain", static_cast<std::size_t>(n), static_cast<std::size_t>(hidden));
  Out reused("bench::reused", static_cast<std::size_t>(n), static_cast<std::size_t>(hidden));
  const auto staging = Kokkos::create_mirror_view(plain);
  const auto lookup = [&] {
    kshard::vocab_parallel_lookup(table, ids, reused, kshard::TpDim{0});
    Kokkos::fence();
  };
  const auto t = kshard::bench::time_paired(
      comm, reps, lookup, [&] { plain_lookup(table, ids, plain, staging, comm); });
  if (!same(reused, plain)) throw std::runtime_error("tp_bench: lookup differs from the baseline");
  // The same lookup with the collective watchdog on against it off.
  const auto t_watchdog = kshard::bench::time_watchdog(comm, reps, lookup);
  kshard::bench::watched(lookup)();
  if (!same(reused, plain))
    throw std::runtime_error("tp_bench: lookup under the watchdog differs from the baseline");
  // The form that returns a new view also pays for fresh pages of the output on every call.
  const auto t_fresh = kshard::bench::time_paired(
      comm, reps,
      [&] {
        result = kshard::vocab_parallel_lookup(table, ids, kshard::TpDim{0});
        Kokkos::fence();
      },
      [&] { plain_lookup(table, ids, plain, staging, comm); });
  if (!same(result, plain)) throw std::runtime_error("tp_bench: lookup differs from the baseline");

  const double out_bytes = static_cast<double>(n * hidden) * sizeof(float);
  const double t_kshard = t.seconds;
  report.add(
      "vocab_parallel_lookup",
      fmt::format(
          R"("type": "{}", "rows": {}, "cols": {}, "ids": {}, "seconds": {:.6g}, "baseline_seconds": {:.6g}, "ratio": {:.4g}, "ratio_fresh": {:.4g}, "bytes_sent": {}, "gbps": {:.4g})",
          type, vocab, hidden, n, t.seconds, t.baseline, t.ratio, t_fresh.ratio, bytes,
          out_bytes / t.seconds / 1e9));

  report.add(
      "watchdog",
      fmt::format(R"("type": "{}", "seconds": {:.6g}, "baseline_seconds": {:.6g}, "ratio": {:.4g})",
                  type, t_watchdog.seconds, t_watchdog.baseline,
                  t_watchdog.ratio));  // target: ratio <= 1.03

  const double max_rss = kshard::bench::largest_peak_rss_mib(comm);
  report.add(
      "lookup_peak_rss",
      fmt::format(R"("type": "{}", "mib_per_rank": {:.1f}, "table_mib_per_rank": {:.1f})", type,
                  max_rss, static_cast<double>(table.local().span() * sizeof(T)) / 1048576.0));

  // Last: the baseline holds the whole table on every rank (on a host: it hands MPI the table).
  if constexpr (on_host) allgather_case(report, table, ids, result, n, t_kshard, options, type);
}

}  // namespace

int main(int argc, char** argv) {
  return kshard::bench::run_main(
      argc, argv, "tp", [](kshard::bench::Report& report, const kshard::bench::Options& options) {
        int size = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size}, {"tp"});
        const index_t vocab = options.quick ? 16384 : 262144;
        const index_t hidden = options.quick ? 256 : 1024;
        const index_t n = options.quick ? 1024 : 4096;
        run<float>(report, mesh, vocab, hidden, n, options, "float");
        run<kshard::bf16>(report, mesh, vocab, hidden, n, options, "bf16");
      });
}
