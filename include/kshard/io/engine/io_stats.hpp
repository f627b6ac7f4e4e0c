#pragma once

/// \file
/// Counters of the file bytes kshard::io moves on this process, for tests and benchmarks that
/// assert how much a read or a write touches.

#include <cstdint>

namespace kshard::io {

/// What this process has read from and written to checkpoint files since the last reset.
struct IoStats {
  std::int64_t bytes_read = 0;     ///< file bytes this process read (headers included)
  std::int64_t bytes_written = 0;  ///< file bytes this process wrote (undo files included)
  std::int64_t syncs = 0;  ///< files and folders this process fsynced (MPI_File_sync included)
};

/// This process's counters (kshard is driven by one thread per process, as MPI usually is).
inline IoStats& io_stats() {
  static IoStats stats;
  return stats;
}

/// Zeroes the counters.
inline void reset_io_stats() { io_stats() = IoStats{}; }

}  // namespace kshard::io
