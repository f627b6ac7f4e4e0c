#pragma once

/// \file
/// Counters of the collectives kshard issues on this process, for tests and benchmarks that
/// assert how much an operation communicates.

#include <cstdint>

namespace kshard {

/// What this process has sent through kshard's collectives since the last reset.
struct CommStats {
  /// Collectives that move data (all-reduce, all-gather, broadcast, ...), not counting the
  /// argument agreements.
  std::int64_t collectives = 0;
  std::int64_t bytes_sent = 0;  ///< payload bytes this process contributed to them
  /// Argument agreements: one small fixed-size all-reduce each (more only when it fails), in
  /// which the ranks check that they passed the same arguments. Their bytes are not in
  /// `bytes_sent`.
  std::int64_t agreements = 0;
  /// Bytes copied between device memory and host buffers because MPI could not take device
  /// memory directly (both directions; 0 on host memory and with GPU-aware MPI).
  std::int64_t bytes_staged = 0;
};

/// This process's counters (kshard is driven by one thread per process, as MPI usually is).
inline CommStats& comm_stats() {
  static CommStats stats;
  return stats;
}

/// Zeroes the counters.
inline void reset_comm_stats() { comm_stats() = CommStats{}; }

}  // namespace kshard
