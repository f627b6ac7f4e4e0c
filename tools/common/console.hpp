#pragma once

// What kshard's commands tell on rank 0's terminal: lines, throughput, and the progress of a
// long job (one line rewritten in place on a terminal, a line every few seconds otherwise).

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace kshard_tools {

// This process's rank in MPI_COMM_WORLD.
inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Rank 0 prints (progress and the summary); the other ranks stay quiet.
template <class... Args>
void say(fmt::format_string<Args...> format, Args&&... args) {
  if (world_rank() == 0) {
    fmt::print(format, std::forward<Args>(args)...);
    std::fflush(stdout);
  }
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// "12.3 MB in 0.456 s (27 MB/s)".
inline std::string throughput(std::int64_t bytes, double seconds) {
  return fmt::format("{:.1f} MB in {:.3f} s ({:.0f} MB/s)", static_cast<double>(bytes) / 1e6,
                     seconds, static_cast<double>(bytes) / 1e6 / std::max(seconds, 1e-9));
}

// Rank 0's progress of a job of `total` bytes on stderr: bytes done, rate and time left, on one
// line rewritten in place on a terminal, else a line every `interval` seconds.
class Progress {
 public:
  explicit Progress(double interval = 5.0)
      : terminal_(::isatty(STDERR_FILENO) != 0), interval_(terminal_ ? 0.25 : interval) {}

  void update(std::uint64_t done, std::uint64_t total) {
    const double now = seconds_since(start_);
    if (world_rank() != 0 || (now - shown_ < interval_ && done < total)) return;
    shown_ = now;
    const double rate = static_cast<double>(done) / std::max(now, 1e-9);
    const double left = rate > 0 ? static_cast<double>(total - std::min(done, total)) / rate : 0;
    fmt::print(stderr, "{}{:.2f} of {:.2f} GB, {:.2f} GB/s, {:.0f} s left{}", terminal_ ? "\r" : "",
               static_cast<double>(done) / 1e9, static_cast<double>(total) / 1e9, rate / 1e9, left,
               terminal_ ? "   " : "\n");
    if (terminal_ && done >= total) fmt::print(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool terminal_;
  double interval_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double shown_ = -1e9;
};

}  // namespace kshard_tools
