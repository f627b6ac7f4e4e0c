#pragma once

// A small MPI-aware benchmark harness: warm-up, repetitions timed barrier to barrier (all
// ranks together), the median over repetitions. Results are JSON records
// that scripts/bench collects and renders into docs/performance.md.

#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <fmt/format.h>

#include <kshard/watchdog.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// The instruction set the benchmark was compiled for (bench/CMakeLists.txt sets it).
#if !defined(KSHARD_BENCH_ISA)
#define KSHARD_BENCH_ISA "generic"
#endif

namespace kshard::bench {

inline constexpr const char* isa = KSHARD_BENCH_ISA;

struct Options {
  bool quick = false;  // a short run for CI: small sizes, few repetitions
  std::string output;  // JSON file written by rank 0 ("" = stdout only)
  int repetitions = 9;
};

inline Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--quick") options.quick = true;
    if (arg == "--out" && i + 1 < argc) options.output = argv[++i];
  }
  if (options.quick) options.repetitions = 3;
  return options;
}

// The time of one run of `run` on all ranks of `comm` together (seconds): from a barrier that
// no rank passes before all are ready to a barrier that none passes before all have finished,
// the longest such span over the ranks. (Each rank's own time, even the slowest's, is less
// when ranks share cores: a rank that waits for a core before it starts does not count the
// wait, so rates summed over ranks exceed what the machine can do.) Aggregate rates are total
// bytes over this time (total_bytes below), never a sum of per-rank rates.
template <class Run>
double time_once(MPI_Comm comm, Run&& run) {
  MPI_Barrier(comm);
  const auto start = std::chrono::steady_clock::now();
  run();
  MPI_Barrier(comm);
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest;
}

// The sum of `local` over the ranks of `comm` (e.g. the bytes each rank reads; collective).
inline double total_bytes(MPI_Comm comm, double local) {
  double total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, comm);
  return total;
}

inline double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<long>(values.size() / 2),
                   values.end());
  return values[values.size() / 2];
}

// Median over repetitions of the time of `run` on all ranks (time_once, seconds); `setup` runs
// before each repetition, untimed. Both must leave no work pending (fence inside them).
template <class Setup, class Run>
double time_collective(MPI_Comm comm, int repetitions, Setup&& setup, Run&& run) {
  setup();
  run();  // warm-up: first touch, allocations, MPI connection set-up
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    setup();
    times.push_back(time_once(comm, run));
  }
  return median(times);
}

template <class Run>
double time_collective(MPI_Comm comm, int repetitions, Run&& run) {
  return time_collective(
      comm, repetitions, [] {}, run);
}

// A case and its baseline timed in alternation, so that both see the same load on a shared
// machine (timed one after the other, a burst of other work can land on either and swing
// their ratio by 10x). `ratio` is the median of the per-repetition ratios case / baseline.
struct Paired {
  double seconds = 0;
  double baseline = 0;
  double ratio = 0;
};

// `setup` runs before each run of the case, untimed (e.g. damaging rows a repair then fixes).
template <class Setup, class Case, class Baseline>
Paired time_paired(MPI_Comm comm, int repetitions, Setup&& setup, Case&& run_case,
                   Baseline&& run_baseline) {
  setup();
  time_once(comm, run_case);  // warm-up of both
  time_once(comm, run_baseline);
  std::vector<double> a, b, ratios;
  for (int r = 0; r < repetitions; ++r) {
    // Alternate which runs first: the first of a pair is measurably slower (1-2% here, on an
    // operation compared with itself), a bias that would otherwise land on the case.
    setup();
    if (r % 2 == 0) {
      a.push_back(time_once(comm, run_case));
      b.push_back(time_once(comm, run_baseline));
    } else {
      b.push_back(time_once(comm, run_baseline));
      a.push_back(time_once(comm, run_case));
    }
    ratios.push_back(a.back() / b.back());
  }
  return {median(a), median(b), median(ratios)};
}

template <class Case, class Baseline>
Paired time_paired(MPI_Comm comm, int repetitions, Case&& run_case, Baseline&& run_baseline) {
  return time_paired(
      comm, repetitions, [] {}, run_case, run_baseline);
}

// `run` `times` times in a row.
template <class Run>
auto batched(int times, const Run& run) {
  return [times, &run] {
    for (int k = 0; k < times; ++k) run();
  };
}

// `run` with the collective watchdog on (its collectives watched), to time against `run` alone.
template <class Run>
auto watched(Run run) {
  return [run] {
    kshard::set_collective_timeout(600);
    run();
    kshard::set_collective_timeout(0);
  };
}

// One call of `run` with the watchdog on against one with it off. The target (3%) is finer than
// the noise of a plain pairing: on a busy 2-core machine one pair's ratio scatters by 5% (sd),
// and two runs of the same 18 ms copy differed by up to 8% over 9 pairs. So each sample runs
// `run` often enough to last 10 ms, and there are 10 pairs per repetition (90 by default: the
// median's standard error is then about 0.6%). Collective (the batch is the slowest rank's).
template <class Run>
Paired time_watchdog(MPI_Comm comm, int repetitions, const Run& run) {
  run();  // warm-up, so that the call timed below is a steady one
  const double once = time_once(comm, run);
  const int batch = std::clamp(static_cast<int>(std::ceil(0.01 / once)), 1, 1000);
  const auto watched_run = watched(run);
  auto t = time_paired(comm, 10 * repetitions, batched(batch, watched_run), batched(batch, run));
  t.seconds /= batch;
  t.baseline /= batch;
  return t;
}

// Peak resident set size of the largest rank of `comm`, in MiB (Linux; collective).
inline double largest_peak_rss_mib(MPI_Comm comm) {
  std::ifstream status("/proc/self/status");
  std::string line;
  double mine = 0;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) mine = std::stod(line.substr(6)) / 1024.0;
  double largest = 0;
  MPI_Allreduce(&mine, &largest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return largest;
}

// JSON records, one object per measurement: {"bench": ..., "ranks": ..., fields...}, and the
// device with the date when KSHARD_BENCH_DEVICE names them (bench/device_run.sh). Rank 0
// rewrites `path` after each record, so a run stopped at a time limit keeps what it measured.
class Report {
 public:
  Report(std::string bench, MPI_Comm comm, std::string path = "")
      : bench_(std::move(bench)), path_(std::move(path)) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    if (const char* device = std::getenv("KSHARD_BENCH_DEVICE"))
      device_ = fmt::format(R"("device": "{}", )", device);
  }

  // `fields` is a JSON fragment such as R"("seconds": 0.1, "ratio": 1.02)".
  void add(std::string_view case_name, const std::string& fields) {
    records_.push_back(fmt::format(
        R"({{"bench": "{}", "case": "{}", "ranks": {}, "backend": "{}", "isa": "{}", {}{}}})",
        bench_, case_name, size_, Kokkos::DefaultExecutionSpace::name(), isa, device_, fields));
    if (rank_ == 0) std::printf("%-32s %s\n", std::string(case_name).c_str(), fields.c_str());
    write();
  }

  void write() const {
    if (rank_ != 0 || path_.empty()) return;
    std::ofstream out(path_);
    out << "[\n";
    for (std::size_t i = 0; i < records_.size(); ++i)
      out << "  " << records_[i] << (i + 1 < records_.size() ? ",\n" : "\n");
    out << "]\n";
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  std::string bench_;
  std::string path_;
  std::string device_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::string> records_;
};

// A benchmark's whole main: MPI and Kokkos set up, options parsed, kshard's log silenced, then
// `measure(report, options)`; the report is written even when a result check in it throws
// (exit status 1).
template <class Measure>
int run_main(int argc, char** argv, const std::string& name, Measure&& measure) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const Options options = parse(argc, argv);
    Report report(name, MPI_COMM_WORLD, options.output);
    try {
      measure(report, options);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      status = 1;
    }
    report.write();
  }
  MPI_Finalize();
  return status;
}

}  // namespace kshard::bench
