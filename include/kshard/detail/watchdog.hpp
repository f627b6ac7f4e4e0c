#pragma once

// The collective watchdog behind kshard/watchdog.hpp. With a timeout set, detail/mpi.hpp starts
// each collective non-blocking and waits for it here; a rank that waits past the timeout names
// the stuck collective on stderr and ends the job, instead of hanging forever. Off, the only
// cost is one branch on a value cached at start-up.

// Part of detail/mpi.hpp, which includes it after <mpi.h> (without the MPI C++ bindings).
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

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

// Collectives this process completed under the watchdog (reset_comm_stats leaves it alone).
inline std::int64_t watched_collectives = 0;

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

// The name Mesh gives its communicators ("the whole mesh", "mesh dimension 1 ('tp')").
inline std::string communicator_name(MPI_Comm comm) {
  char name[MPI_MAX_OBJECT_NAME] = {};
  int length = 0;
  MPI_Comm_get_name(comm, name, &length);
  if (length == 0) return "an unnamed communicator";
  return std::string(name, static_cast<std::size_t>(length));
}

// One line on stderr naming what this rank waits for, then the end of the whole job.
[[noreturn]] inline void abort_stuck(const char* collective, MPI_Comm comm, double waited) {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string line = fmt::format(
      "kshard watchdog: rank {}: {}'s {} over {} has not completed after {:.1f} s ({}); {} "
      "kshard collectives completed before it on this rank; aborting the job\n",
      rank, operation_name(), collective, communicator_name(comm), waited, timeout_origin(),
      watched_collectives);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return, but is not declared [[noreturn]]
}

// MPI_Wait for `collective`'s request (returning MPI's error code), with the watchdog's
// deadline. MPI_Test is polled without pause: the rank keeps its core busy while it waits, as
// MPI's own blocking calls do.
[[nodiscard]] inline int complete(MPI_Request& request, const char* collective, MPI_Comm comm) {
  const double timeout = watchdog_setting.seconds;
  const auto start = std::chrono::steady_clock::now();
  for (int done = 0; done == 0;) {
    if (const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) return rc;
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (done == 0 && waited.count() >= timeout) abort_stuck(collective, comm, waited.count());
  }
  ++watched_collectives;
  return MPI_SUCCESS;
}

}  // namespace kshard::detail
