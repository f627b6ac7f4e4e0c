#pragma once

// The collective watchdog behind kshard/watchdog.hpp. With a timeout set, a thread watches
// each of kshard's collectives; a rank that waits in one past the timeout names the stuck
// collective on stderr and ends the job, instead of hanging forever. Off, the only cost is one
// branch on a value cached at start-up.

// Part of comm/mpi.hpp, which includes it after <mpi.h> (without the MPI C++ bindings).
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "kshard/detail/operation.hpp"
#include "kshard/error.hpp"

namespace kshard::detail {

inline constexpr const char* timeout_variable = "KSHARD_COLLECTIVE_TIMEOUT";

struct WatchdogSetting {
  double seconds = 0;       // 0: off; NaN: the environment variable is not a valid timeout
  std::string environment;  // the variable's text while it is the setting in force, else ""
};

// A timeout's text as seconds: a finite number >= 0 ("" is 0), or NaN for anything else.
// (strtod, not from_chars: libc++ parses no floating point with from_chars before LLVM 20.)
inline double parse_timeout(const char* text) {
  if (*text == '\0') return 0;
  char* stop = nullptr;
  const double seconds = std::strtod(text, &stop);
  const bool valid = *stop == '\0' && std::isfinite(seconds) && seconds >= 0;
  return valid ? seconds : std::numeric_limits<double>::quiet_NaN();
}

inline WatchdogSetting setting_from_environment() {
  const char* text = std::getenv(timeout_variable);
  if (text == nullptr) return {};
  return {parse_timeout(text), text};
}

// Read once per process, before main. An invalid value is reported at the first collective,
// where every rank (all see the same environment) throws alike.
inline WatchdogSetting watchdog_setting = setting_from_environment();

// How the timeout in force was set, for messages: "KSHARD_COLLECTIVE_TIMEOUT=5".
inline std::string timeout_origin() {
  const WatchdogSetting& setting = watchdog_setting;
  if (setting.environment.empty())
    return fmt::format("kshard::set_collective_timeout({})", setting.seconds);
  return fmt::format("{}={}", timeout_variable, setting.environment);
}

// The timeout in force, in seconds (0: off); throws for an invalid environment variable.
inline double watchdog_timeout() {
  if (std::isnan(watchdog_setting.seconds))
    throw error(fmt::format(
        "kshard: {} is not a valid timeout; set it to a positive number of seconds, or to 0 or "
        "nothing for no timeout",
        timeout_origin()));
  return watchdog_setting.seconds;
}

// True when collectives are to be watched. Off, one predictable branch on the cached setting.
inline bool watchdog_on() {
  if (watchdog_setting.seconds == 0) [[likely]]
    return false;
  return watchdog_timeout() > 0;
}

// Watches the collective in flight from a thread of its own. The collective itself is the
// same blocking MPI call as without the watchdog (a non-blocking one polled with MPI_Test was
// up to 1.3x slower on a 16 MB all-reduce: MPI's non-blocking algorithms are not its tuned
// blocking ones), so watching costs a clock read and an uncontended lock per collective. The
// thread sleeps until the deadline of the collective it last saw; if that collective is still
// in flight then, it names it on stderr and ends the job with MPI_Abort (from this thread:
// the main thread is inside MPI, which Open MPI and MPICH allow for MPI_Abort).
class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog watchdog;
    return watchdog;
  }

  // A collective starts: `collective` over `comm`, in the running kshard operation.
  void arm(const char* collective, MPI_Comm comm) {
    char name[MPI_MAX_OBJECT_NAME] = {};
    int length = 0;
    MPI_Comm_get_name(comm, name, &length);
    const std::lock_guard lock(mutex_);
    if (rank_ < 0) MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    if (!thread_.joinable()) thread_ = std::thread([this] { watch(); });
    ++generation_;
    armed_ = true;
    start_ = std::chrono::steady_clock::now();
    timeout_ = std::chrono::duration<double>(watchdog_setting.seconds);
    collective_ = collective;
    operation_ = operation_name();
    communicator_ = length > 0 ? std::string(name, static_cast<std::size_t>(length))
                               : std::string("an unnamed communicator");
    if (idle_) wake_.notify_one();
  }

  // The collective armed last has returned.
  void disarm() {
    const std::lock_guard lock(mutex_);
    armed_ = false;
    ++completed_;
  }

  // Collectives this process completed under the watchdog (reset_comm_stats leaves it alone).
  std::int64_t completed() {
    const std::lock_guard lock(mutex_);
    return completed_;
  }

  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  Watchdog() = default;
  ~Watchdog() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  void watch() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      if (!armed_) {
        idle_ = true;
        wake_.wait(lock, [this] { return stopping_ || armed_; });
        idle_ = false;
        continue;
      }
      const std::uint64_t seen = generation_;
      const auto deadline =
          start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout_);
      if (!wake_.wait_until(lock, deadline, [&] { return stopping_ || generation_ != seen; }))
        abort_stuck();
    }
  }

  // One line on stderr naming what this rank waits for, then the end of the whole job.
  [[noreturn]] void abort_stuck() const {
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start_;
    const std::string line = fmt::format(
        "kshard watchdog: rank {}: {}'s {} over {} has not completed after {:.1f} s ({}); {} "
        "kshard collectives completed before it on this rank; aborting the job\n",
        rank_, operation_, collective_, communicator_, waited.count(), timeout_origin(),
        completed_);
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();  // MPI_Abort does not return, but is not declared [[noreturn]]
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  bool stopping_ = false;
  bool idle_ = false;
  bool armed_ = false;
  std::uint64_t generation_ = 0;
  std::int64_t completed_ = 0;  // collectives this process completed under the watchdog
  int rank_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::duration<double> timeout_{0};
  const char* collective_ = "";
  const char* operation_ = "";
  std::string communicator_;
};

// Arms the watchdog for one collective when it is on, and disarms it when the collective
// returns (or throws).
class WatchedCollective {
 public:
  WatchedCollective(const char* collective, MPI_Comm comm) : on_(watchdog_on()) {
    if (on_) Watchdog::instance().arm(collective, comm);
  }
  ~WatchedCollective() {
    if (on_) Watchdog::instance().disarm();
  }
  WatchedCollective(const WatchedCollective&) = delete;
  WatchedCollective& operator=(const WatchedCollective&) = delete;

 private:
  bool on_;
};

}  // namespace kshard::detail
