#pragma once

/// \file
/// Whether a write waits for the storage device before its output takes its name.

#include <cstdint>
#include <string_view>

namespace kshard::io {

/// How durably a write publishes its output. Either way the output is written under a
/// temporary name and renamed, so it appears whole or not at all when a process is killed;
/// the two differ on an operating-system crash or a power loss.
enum class Durability : std::uint8_t {
  /// Every file is fsynced (its bytes on the storage device) before its name appears, and its
  /// folder after: a published output survives a crash. Costs the storage's write time (2.2 GB:
  /// 0.6-0.9 s on the machine of docs/performance.md), which starts while bytes are still
  /// being copied (sync_file_range after each buffer).
  fsync,
  /// Nothing is fsynced, as `cp` and torch's savers do: the output is in the page cache when
  /// the call returns, and the kernel writes it back later; a crash before then may leave a
  /// published file with lost bytes. For outputs that can be made again.
  page_cache
};

/// "fsync" or "page_cache".
constexpr std::string_view to_string(Durability d) {
  return d == Durability::fsync ? "fsync" : "page_cache";
}

}  // namespace kshard::io
