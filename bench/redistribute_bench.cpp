// redistribute against the bare MPI collective that moves the same bytes, measured in the same
// run: Shard<0> -> Replicate (redistribute_into a persistent matrix) against MPI_Allgatherv
// into a preallocated buffer, and redistribute against it into a fresh buffer; Shard<0> ->
// Shard<1> against MPI_Alltoall of the same byte count; and the FSDP unshard (StridedShard<0>,
// Shard<0>) -> (Replicate, Shard<0>) on a (2, n/2) mesh, reported with its bytes. Then each of
// these transitions as a plan made once (`plan_redistribute`) and applied, at a small (64 x 64)
// and a large size, against the physical minimum written here with MPI and plain loops: the
// collective(s) plus the packing the bare version also needs (target: ratio <= 1.05), and, at
// the small size, redistribute_into (which plans on every call) against the plan's apply; and a
// move that communicates nothing, in the default execution space's memory (the device's on a
// GPU build), against a copy of the same bytes there.
// Results are checked against the values every rank can compute, so a broken fast path (or a
// wrong baseline) cannot look good.

#include <kshard/kshard.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"

namespace {

using kshard::index_t;

// Host matrices on every build: the bare baselines hand MPI host pointers, and compare with
// kshard on the same memory (a GPU build's device matrices need a GPU-aware baseline).
template <class L>
using Matrix = kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace>;

float value_at(index_t g, index_t j) { return static_cast<float>((g * 131 + j * 7) % 1021); }

// Fills every local element with value_at(its global row, its global column).
template <class M>
void fill(const M& m) {
  const auto local = m.local();
  const auto map = m.mapping();
  auto host = Kokkos::create_mirror_view(local);
  for (index_t i = 0; i < static_cast<index_t>(local.extent(0)); ++i)
    for (index_t j = 0; j < static_cast<index_t>(local.extent(1)); ++j)
      host(i, j) = value_at(map.rows.to_global(i), map.cols.to_global(j));
  Kokkos::deep_copy(local, host);
}

// Throws unless every local element is value_at(global row, global column): the same check
// passes or fails on every rank only by accident, so agree on it first.
template <class M>
void verify(const M& m, MPI_Comm comm, const char* what) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.local());
  const auto map = m.mapping();
  int bad = 0;
  for (index_t i = 0; i < static_cast<index_t>(host.extent(0)) && bad == 0; ++i)
    for (index_t j = 0; j < static_cast<index_t>(host.extent(1)); ++j)
      if (host(i, j) != value_at(map.rows.to_global(i), map.cols.to_global(j))) {
        bad = 1;
        break;
      }
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (any != 0) throw std::runtime_error(fmt::format("redistribute_bench: {} is wrong", what));
}

std::string fields(index_t rows, index_t cols, const kshard::bench::Paired& t, std::int64_t bytes) {
  return fmt::format(
      R"("type": "float", "rows": {}, "cols": {}, "seconds": {:.6g}, "baseline_seconds": {:.6g}, "ratio": {:.4g}, "bytes_sent": {}, "gbps": {:.4g})",
      rows, cols, t.seconds, t.baseline, t.ratio, bytes,
      static_cast<double>(rows * cols) * sizeof(float) / t.seconds / 1e9);
}

// Bytes this rank sends in one call of `run` (kshard's own counters).
template <class Run>
std::int64_t bytes_of(Run&& run) {
  kshard::reset_comm_stats();
  run();
  return kshard::comm_stats().bytes_sent;
}

void shard_to_replicate(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, index_t rows,
                        index_t cols, int reps) {
  const MPI_Comm comm = mesh.comm();
  using From = kshard::Layout<kshard::Shard<0>>;
  using To = kshard::Layout<kshard::Replicate>;
  Matrix<From> source(mesh, From{}, rows, cols);
  fill(source);
  std::unique_ptr<Matrix<To>> result;
  const auto fresh_call = [&] {
    result.reset();  // as in a training step: the previous replica is gone
    result = std::make_unique<Matrix<To>>(kshard::redistribute(source, To{}));
    Kokkos::fence();
  };
  const auto bytes = bytes_of(fresh_call);
  verify(*result, comm, "Shard<0> -> Replicate");
  result.reset();
  const Matrix<To> persistent(mesh, To{}, rows, cols);
  const auto into_call = [&] {
    kshard::redistribute_into(source, persistent);
    Kokkos::fence();
  };
  if (bytes_of(into_call) != bytes)
    throw std::runtime_error("redistribute_bench: redistribute_into sent other bytes");
  verify(persistent, comm, "Shard<0> -> Replicate into a persistent matrix");

  // The bare collective: the same bytes, gathered into a buffer allocated once, against
  // redistribute_into a matrix allocated once.
  const int size = mesh.size();
  std::vector<int> counts(static_cast<std::size_t>(size));
  std::vector<int> displs(static_cast<std::size_t>(size));
  const int mine = static_cast<int>(source.local().size());
  MPI_Allgather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, comm);
  for (std::size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  std::vector<float> full(static_cast<std::size_t>(rows * cols));
  const auto t = kshard::bench::time_paired(comm, reps, into_call, [&] {
    MPI_Allgatherv(source.local().data(), mine, MPI_FLOAT, full.data(), counts.data(),
                   displs.data(), MPI_FLOAT, comm);
  });
  // redistribute returning a new replica against the collective into a fresh, untouched
  // buffer per call: both pay the page faults of new memory.
  const auto t_fresh = kshard::bench::time_paired(comm, reps, fresh_call, [&] {
    const std::unique_ptr<float[]> fresh(new float[static_cast<std::size_t>(rows * cols)]);
    MPI_Allgatherv(source.local().data(), mine, MPI_FLOAT, fresh.get(), counts.data(),
                   displs.data(), MPI_FLOAT, comm);
  });
  report.add(
      "shard0_to_replicate",
      fields(rows, cols, t, bytes) +
          fmt::format(
              R"(, "fresh_seconds": {:.6g}, "fresh_baseline_seconds": {:.6g}, "ratio_fresh": {:.4g})",
              t_fresh.seconds, t_fresh.baseline, t_fresh.ratio));  // target: ratio <= 1.10

  // The same redistribute_into with the collective watchdog on against it off.
  const auto t_watchdog = kshard::bench::time_watchdog(comm, reps, into_call);
  kshard::bench::watched(into_call)();
  verify(persistent, comm, "Shard<0> -> Replicate into a persistent matrix under the watchdog");
  report.add("watchdog", fields(rows, cols, t_watchdog, bytes));  // target: ratio <= 1.03
}

void shard0_to_shard1(kshard::bench::Report& report, const kshard::Mesh<1>& mesh, index_t rows,
                      index_t cols, int reps) {
  const MPI_Comm comm = mesh.comm();
  using From = kshard::Layout<kshard::Shard<0>>;
  using To = kshard::Layout<kshard::Shard<1>>;
  Matrix<From> source(mesh, From{}, rows, cols);
  fill(source);
  std::unique_ptr<Matrix<To>> result;
  const auto call = [&] {
    result = std::make_unique<Matrix<To>>(kshard::redistribute(source, To{}));
    Kokkos::fence();
  };
  const auto bytes = bytes_of(call);
  verify(*result, comm, "Shard<0> -> Shard<1>");
  result.reset();

  // The bare collective: an all-to-all of the same local shard, already packed (kshard also
  // packs the column blocks and unpacks them, which this baseline does not).
  const int size = mesh.size();
  const auto block = static_cast<int>(source.local().size() / static_cast<std::size_t>(size));
  std::vector<float> send(source.local().data(), source.local().data() + source.local().size());
  std::vector<float> recv(send.size());
  const auto t = kshard::bench::time_paired(
      comm, reps,
      [&] {
        result.reset();
        call();
      },
      [&] { MPI_Alltoall(send.data(), block, MPI_FLOAT, recv.data(), block, MPI_FLOAT, comm); });
  report.add("shard0_to_shard1", fields(rows, cols, t, bytes));
}

// FSDP2 + TP: the weight is (StridedShard<0>, Shard<0>) on a (dp, tp) mesh; the unshard before
// the forward gathers over dp only.
void fsdp_unshard(kshard::bench::Report& report, MPI_Comm world, index_t rows, index_t cols,
                  int reps) {
  int size = 0;
  MPI_Comm_size(world, &size);
  const int dp = size % 2 == 0 ? 2 : 1;
  const int tp = size / dp;
  const kshard::Mesh<2> mesh(world, {dp, tp}, {"dp", "tp"});
  using From = kshard::Layout<kshard::StridedShard<0>, kshard::Shard<0>>;
  using To = kshard::Layout<kshard::Replicate, kshard::Shard<0>>;
  const From from(kshard::StridedShard<0>{tp}, kshard::Shard<0>{});
  Matrix<From> source(mesh, from, rows, cols);
  fill(source);
  std::unique_ptr<Matrix<To>> result;
  const auto call = [&] {
    result = std::make_unique<Matrix<To>>(kshard::redistribute(source, To{}));
    Kokkos::fence();
  };
  const auto bytes = bytes_of(call);
  verify(*result, world, "the FSDP unshard");

  // Baseline: an all-gather over dp of the same bytes into a buffer allocated once.
  const MPI_Comm dp_comm = mesh.dim_comm(0);
  const int mine = static_cast<int>(source.local().size());
  std::vector<int> counts(static_cast<std::size_t>(dp));
  std::vector<int> displs(static_cast<std::size_t>(dp));
  MPI_Allgather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, dp_comm);
  for (std::size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  std::vector<float> gathered(result->local().size());
  result.reset();
  const auto t = kshard::bench::time_paired(
      world, reps,
      [&] {
        result.reset();
        call();
      },
      [&] {
        MPI_Allgatherv(source.local().data(), mine, MPI_FLOAT, gathered.data(), counts.data(),
                       displs.data(), MPI_FLOAT, dp_comm);
      });
  report.add(fmt::format("fsdp_unshard_{}x{}", dp, tp), fields(rows, cols, t, bytes));
}

// The physical minimum of a move: what a hand-written MPI code does, with its buffers and
// counts set up once. `run(in, out)` moves this rank's shard `in` into its new shard `out`.
struct Bare {
  std::function<void(const float*, float*)> run;
};

// Shard<0> -> Replicate on a 1-D mesh: one MPI_Allgatherv straight into the result.
Bare bare_allgather(MPI_Comm comm, index_t rows, index_t cols) {
  int size = 0;
  int rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  auto counts = std::make_shared<std::vector<int>>(static_cast<std::size_t>(size));
  auto displs = std::make_shared<std::vector<int>>(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    (*counts)[static_cast<std::size_t>(r)] =
        static_cast<int>(kshard::chunk_extent(rows, size, r) * cols);
    (*displs)[static_cast<std::size_t>(r)] =
        static_cast<int>(kshard::chunk_begin(rows, size, r) * cols);
  }
  const int mine = (*counts)[static_cast<std::size_t>(rank)];
  return {[=](const float* in, float* out) {
    MPI_Allgatherv(in, mine, MPI_FLOAT, out, counts->data(), displs->data(), MPI_FLOAT, comm);
  }};
}

// Shard<0> -> Shard<1> on a 1-D mesh: pack each peer's columns of this rank's rows (a plain
// loop), one MPI_Alltoallv whose blocks land straight in the result (each peer's rows are
// consecutive there), and a plain copy of the block this rank keeps.
Bare bare_alltoall(MPI_Comm comm, index_t rows, index_t cols) {
  int size = 0;
  int rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const auto n = static_cast<std::size_t>(size);
  const index_t my_rows = kshard::chunk_extent(rows, size, rank);
  const index_t my_cols = kshard::chunk_extent(cols, size, rank);
  const index_t my_col0 = kshard::chunk_begin(cols, size, rank);
  const index_t my_row0 = kshard::chunk_begin(rows, size, rank);
  auto sc = std::make_shared<std::vector<int>>(n, 0);
  auto sd = std::make_shared<std::vector<int>>(n, 0);
  auto rc = std::make_shared<std::vector<int>>(n, 0);
  auto rd = std::make_shared<std::vector<int>>(n, 0);
  int sent = 0;
  for (int p = 0; p < size; ++p) {
    const auto q = static_cast<std::size_t>(p);
    (*sd)[q] = sent;
    (*rd)[q] = static_cast<int>(kshard::chunk_begin(rows, size, p) * my_cols);
    if (p == rank) continue;
    (*sc)[q] = static_cast<int>(my_rows * kshard::chunk_extent(cols, size, p));
    (*rc)[q] = static_cast<int>(kshard::chunk_extent(rows, size, p) * my_cols);
    sent += (*sc)[q];
  }
  auto send = std::make_shared<std::vector<float>>(static_cast<std::size_t>(sent));
  return {[=](const float* in, float* out) {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const index_t c0 = kshard::chunk_begin(cols, size, p);
      const index_t w = kshard::chunk_extent(cols, size, p);
      float* s = send->data() + (*sd)[static_cast<std::size_t>(p)];
      for (index_t i = 0; i < my_rows; ++i)
        for (index_t j = 0; j < w; ++j) s[i * w + j] = in[i * cols + c0 + j];
    }
    MPI_Alltoallv(send->data(), sc->data(), sd->data(), MPI_FLOAT, out, rc->data(), rd->data(),
                  MPI_FLOAT, comm);
    for (index_t i = 0; i < my_rows; ++i)
      for (index_t j = 0; j < my_cols; ++j)
        out[(my_row0 + i) * my_cols + j] = in[i * cols + my_col0 + j];
  }};
}

// The FSDP unshard on a (dp, tp) mesh: each dp group's pieces are consecutive rows of its TP
// chunk, so one MPI_Allgatherv over dp lands straight in the result.
Bare bare_fsdp(const kshard::Mesh<2>& mesh, index_t rows, index_t cols) {
  const MPI_Comm dp_comm = mesh.dim_comm(0);
  const int dp = mesh.extent(0);
  const int tp = mesh.extent(1);
  const index_t chunk = kshard::chunk_extent(rows, tp, mesh.coords()[1]);
  auto counts = std::make_shared<std::vector<int>>(static_cast<std::size_t>(dp));
  auto displs = std::make_shared<std::vector<int>>(static_cast<std::size_t>(dp));
  for (int r = 0; r < dp; ++r) {
    (*counts)[static_cast<std::size_t>(r)] =
        static_cast<int>(kshard::chunk_extent(chunk, dp, r) * cols);
    (*displs)[static_cast<std::size_t>(r)] =
        static_cast<int>(kshard::chunk_begin(chunk, dp, r) * cols);
  }
  const int mine = (*counts)[static_cast<std::size_t>(mesh.coords()[0])];
  return {[=](const float* in, float* out) {
    MPI_Allgatherv(in, mine, MPI_FLOAT, out, counts->data(), displs->data(), MPI_FLOAT, dp_comm);
  }};
}

// A plan made once and applied, against the bare minimum; at small sizes also
// redistribute_into (planning on every call) against the plan's apply.
template <class From, class To, std::size_t N>
void plan_case(kshard::bench::Report& report, const std::string& name, const kshard::Mesh<N>& mesh,
               const From& from, const To& to, index_t rows, index_t cols, int reps,
               const Bare& bare) {
  const MPI_Comm comm = mesh.comm();
  Matrix<From> source(mesh, from, rows, cols);
  fill(source);
  auto plan = kshard::plan_redistribute(source, to);
  const auto target = plan.make_target();
  // As a training loop runs them: on one instance, fenced before the result is read.
  const Kokkos::DefaultHostExecutionSpace space;
  const auto apply_call = [&] {
    plan.apply(space, source, target);
    space.fence();
  };
  const auto bytes = bytes_of(apply_call);
  verify(target, comm, (name + " (plan.apply)").c_str());
  const auto into_call = [&] {
    kshard::redistribute_into(space, source, target);
    space.fence();
  };
  if (bytes_of(into_call) != bytes)
    throw std::runtime_error("redistribute_bench: redistribute_into sent other bytes");
  // The baseline writes a shard of the target's shape, checked like kshard's.
  const typename Matrix<To>::view_type out("bare", target.local().extent(0),
                                           target.local().extent(1));
  const float* in = source.local().data();
  const auto bare_call = [&] { bare.run(in, out.data()); };
  bare_call();
  verify(Matrix<To>(mesh, to, rows, cols, out), comm, (name + " (bare MPI)").c_str());
  // At the small size a move takes microseconds, not much more than the two barriers around a
  // timed sample and the clock reads: each sample times `batch` moves back to back (as a
  // training loop runs them), kshard's and the bare ones alike, and reports one move.
  const bool small = rows * cols <= 64 * 64;
  const int batch = small ? 64 : 1;
  const int repetitions = small ? 25 * reps : reps;  // microseconds: more samples
  const auto per_move = [&](const auto& run_case, const auto& run_baseline) {
    auto t = kshard::bench::time_paired(comm, repetitions, kshard::bench::batched(batch, run_case),
                                        kshard::bench::batched(batch, run_baseline));
    t.seconds /= batch;
    t.baseline /= batch;
    return t;
  };
  const auto t = per_move(apply_call, bare_call);
  std::string extra = fmt::format(R"(, "moves_per_sample": {})", batch);
  if (small) {
    const auto t_into = per_move(into_call, apply_call);
    extra += fmt::format(R"(, "into_seconds": {:.6g}, "ratio_into_vs_apply": {:.4g})",
                         t_into.seconds, t_into.ratio);  // what planning once saves
  }
  report.add(fmt::format("plan_{}_{}x{}", name, rows, cols),
             fields(rows, cols, t, bytes) + extra);  // target: ratio <= 1.05
}

// A move that communicates nothing (Replicate -> Shard<0>: each rank keeps its own rows) in the
// default execution space's memory (the device's on a GPU build), planned once and applied,
// against a deep_copy of the same rows in that memory: what plan.apply adds to the one copy it
// has to make. Target: ratio <= 1.1.
void local_move_case(kshard::bench::Report& report, MPI_Comm world, index_t rows, index_t cols,
                     int reps) {
  int size = 0;
  int rank = 0;
  MPI_Comm_size(world, &size);
  MPI_Comm_rank(world, &rank);
  const kshard::Mesh<1> line(world, {size});
  using From = kshard::Layout<kshard::Replicate>;
  using To = kshard::Layout<kshard::Shard<0>>;
  const kshard::DistMatrix<float, From> source(line, From{}, rows, cols);
  fill(source);
  auto plan = kshard::plan_redistribute(source, To{});
  const auto target = plan.make_target();
  const Kokkos::DefaultExecutionSpace space;
  const auto apply_call = [&] {
    plan.apply(space, source, target);
    space.fence();
  };
  if (bytes_of(apply_call) != 0)
    throw std::runtime_error("redistribute_bench: a local move sent bytes");
  verify(target, world, "Replicate -> Shard<0> (plan.apply)");
  const index_t first = kshard::chunk_begin(rows, size, rank);
  const index_t count = kshard::chunk_extent(rows, size, rank);
  const auto mine = Kokkos::subview(source.local(),
                                    std::pair<index_t, index_t>(first, first + count), Kokkos::ALL);
  const typename kshard::DistMatrix<float, To>::view_type copy("copy", count, cols);
  const auto copy_call = [&] {
    Kokkos::deep_copy(space, copy, mine);
    space.fence();
  };
  const auto t = kshard::bench::time_paired(world, reps, apply_call, copy_call);
  report.add("local_move_replicate_to_shard0", fields(rows, cols, t, 0));
}

void plan_cases(kshard::bench::Report& report, MPI_Comm world, index_t rows, index_t cols,
                int reps) {
  int size = 0;
  MPI_Comm_size(world, &size);
  const kshard::Mesh<1> line(world, {size});
  using S0 = kshard::Layout<kshard::Shard<0>>;
  plan_case(report, "shard0_to_replicate", line, S0{}, kshard::Layout<kshard::Replicate>{}, rows,
            cols, reps, bare_allgather(world, rows, cols));
  plan_case(report, "shard0_to_shard1", line, S0{}, kshard::Layout<kshard::Shard<1>>{}, rows, cols,
            reps, bare_alltoall(world, rows, cols));
  const int dp = size % 2 == 0 ? 2 : 1;
  const int tp = size / dp;
  const kshard::Mesh<2> mesh(world, {dp, tp}, {"dp", "tp"});
  using From = kshard::Layout<kshard::StridedShard<0>, kshard::Shard<0>>;
  plan_case(report, fmt::format("fsdp_unshard_{}x{}", dp, tp), mesh,
            From(kshard::StridedShard<0>{tp}, kshard::Shard<0>{}),
            kshard::Layout<kshard::Replicate, kshard::Shard<0>>{}, rows, cols, reps,
            bare_fsdp(mesh, rows, cols));
}

}  // namespace

int main(int argc, char** argv) {
  return kshard::bench::run_main(
      argc, argv, "redistribute",
      [](kshard::bench::Report& report, const kshard::bench::Options& options) {
        int size = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
        // 256 MiB of fp32: the replicated result and the baseline's buffer fit on every rank.
        const index_t rows = options.quick ? 8192 : 65536;
        const index_t cols = options.quick ? 256 : 1024;
        // KSHARD_BENCH_PLAN_ONLY=1: only the plan cases (a shorter run on a shared machine).
        const char* plan_only = std::getenv("KSHARD_BENCH_PLAN_ONLY");
        plan_cases(report, MPI_COMM_WORLD, 64, 64, options.repetitions);
        plan_cases(report, MPI_COMM_WORLD, rows, cols, options.repetitions);
        local_move_case(report, MPI_COMM_WORLD, rows, cols, options.repetitions);
        if (plan_only != nullptr && std::string(plan_only) == "1") return;
        shard_to_replicate(report, mesh, rows, cols, options.repetitions);
        shard0_to_shard1(report, mesh, rows, cols, options.repetitions);
        fsdp_unshard(report, MPI_COMM_WORLD, rows, cols, options.repetitions);
        const double max_rss = kshard::bench::largest_peak_rss_mib(MPI_COMM_WORLD);
        report.add("peak_rss",
                   fmt::format(R"("mib_per_rank": {:.1f}, "table_mib_per_rank": {:.1f})", max_rss,
                               static_cast<double>(rows * cols * 4) / size / 1048576.0));
      });
}
