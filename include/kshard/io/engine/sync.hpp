#pragma once

// The durability of the running write: set by its entry point for its lifetime (as Operation
// names it), consulted where a file would be synced, so that a Durability::page_cache write
// skips every fsync, sync_file_range and MPI_File_sync below it. Every rank of a write must
// run it with the same durability (its entry point agrees on it): MPI_File_sync is collective.

#include <unistd.h>

#include "kshard/io/engine/io_stats.hpp"
#include "kshard/io/model/durability.hpp"

namespace kshard::detail {

inline io::Durability& current_durability() {
  static io::Durability durability = io::Durability::fsync;
  return durability;
}

// True when the running write syncs what it writes.
inline bool syncing() { return current_durability() == io::Durability::fsync; }

// Sets the durability for its lifetime, then restores the one before.
class DurabilityScope {
 public:
  explicit DurabilityScope(io::Durability durability) : previous_(current_durability()) {
    current_durability() = durability;
  }
  ~DurabilityScope() { current_durability() = previous_; }
  DurabilityScope(const DurabilityScope&) = delete;
  DurabilityScope& operator=(const DurabilityScope&) = delete;

 private:
  io::Durability previous_;
};

// fsync(fd) when the running write syncs (counted in io_stats), else 0.
inline int sync_if_durable(int fd) {
  if (!syncing()) return 0;
  ++io::io_stats().syncs;
  return ::fsync(fd);
}

}  // namespace kshard::detail
