#pragma once

// The POSIX layer of kshard::io: exact reads and writes (pread, pwrite) that name the file
// they fail on, the first bytes of a safetensors file, small files written durably (a marked
// temporary, fsync, rename, the folder synced) and rank 0's checks on a file before it writes
// it. Every byte moved is counted in io_stats().

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kshard/error.hpp"
#include "kshard/index.hpp"
#include "kshard/io/engine/io_stats.hpp"
#include "kshard/io/engine/paths.hpp"
#include "kshard/io/model/messages.hpp"

namespace kshard::detail {

// Reads exactly `size` bytes at `offset` with pread, or says why not.
inline std::optional<std::string> pread_exactly(int fd, void* data, std::uint64_t size,
                                                std::uint64_t offset, const std::string& path) {
  auto* out = static_cast<char*>(data);
  for (std::uint64_t done = 0; done < size;) {
    const ssize_t got = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return fmt::format("kshard::io: reading {} bytes at offset {} of '{}' failed: {}", size,
                         offset, path, got == 0 ? "end of file" : std::strerror(errno));
    done += static_cast<std::uint64_t>(got);
    io::io_stats().bytes_read += got;
  }
  return std::nullopt;
}

// Writes exactly `size` bytes at `offset` with pwrite; throws naming `path` when it cannot.
inline void pwrite_exactly(int fd, const void* data, std::uint64_t size, std::uint64_t offset,
                           const std::filesystem::path& path) {
  const auto* in = static_cast<const char*>(data);
  for (std::uint64_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, in + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw error(fmt::format("kshard::io: writing '{}' failed: {}", path.string(),
                              n == 0 ? "nothing written" : std::strerror(errno)));
    done += static_cast<std::uint64_t>(n);
    io::io_stats().bytes_written += n;
  }
}

// Copies `bytes` bytes at `from` of `in` to `to` of `out` by one pwrite from a read-only
// mapping of the source, its page tables filled first (MADV_POPULATE_READ): the kernel copies
// page cache to page cache once, at memcpy speed whatever the offsets. Only the kernel reads the
// mapping, so a source truncated meanwhile fails the pwrite (EFAULT) instead of raising SIGBUS.
// False when it cannot.
inline bool copy_through_mapping(int in, std::uint64_t from, int out, std::uint64_t to,
                                 std::uint64_t bytes) {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t lead = from % page, length = lead + bytes;
  void* map = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, in, static_cast<off_t>(from - lead));
  if (map == MAP_FAILED) return false;
#ifdef MADV_POPULATE_READ
  ::madvise(map, length, MADV_POPULATE_READ);  // a hint: pwrite faults in what it leaves
#endif
  const char* data = static_cast<const char*>(map) + lead;
  std::uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(out, data + done, bytes - done, static_cast<off_t>(to + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::uint64_t>(n);
  }
  ::munmap(map, length);
  return done == bytes;
}

// Copies `bytes` bytes from `from` of `in` to `to` of `out` inside the kernel, with no pass
// through a buffer: with copy_file_range, as cp copies, where both offsets sit alike in their
// pages; else through a mapping (copy_file_range between offsets that differ within a page,
// as a consolidation's mostly do, ran at 0.6 x the speed on ext4). False when neither works,
// for the caller to copy through a buffer instead (from the start: a partial copy is
// idempotent). Counts the bytes as pread and pwrite would.
inline bool copy_in_kernel(int in, std::uint64_t from, int out, std::uint64_t to,
                           std::uint64_t bytes) {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (from % page != to % page) {
    if (!copy_through_mapping(in, from, out, to, bytes)) return false;
  } else {
    auto in_at = static_cast<off_t>(from), out_at = static_cast<off_t>(to);
    for (std::uint64_t left = bytes; left > 0;) {
      const ssize_t n = ::copy_file_range(in, &in_at, out, &out_at, left, 0);
      if (n <= 0) return false;
      left -= static_cast<std::uint64_t>(n);
    }
  }
  io::io_stats().bytes_read += static_cast<index_t>(bytes);
  io::io_stats().bytes_written += static_cast<index_t>(bytes);
  return true;
}

// Starts writing [at, at + bytes) of `out` back without waiting, so that a later fsync finds
// little left and the disk works while the next buffer is filled (not under
// Durability::page_cache, which leaves writeback to the kernel). A hint: errors are the
// fsync's to report.
inline void start_writeback(int out, std::uint64_t at, std::uint64_t bytes) {
  if (syncing())
    ::sync_file_range(out, static_cast<off_t>(at), static_cast<off_t>(bytes),
                      SYNC_FILE_RANGE_WRITE);
}

// The data written to `fd` so far is on the storage device (under Durability::fsync), or an
// error naming `path`.
inline void fsync_or_throw(int fd, const std::filesystem::path& path) {
  if (sync_if_durable(fd) != 0)
    throw error(
        fmt::format("kshard::io: syncing '{}' failed: {}", path.string(), std::strerror(errno)));
}

// `path` opened with `flags`, or an error naming it. A file (no O_DIRECTORY in `flags`) must be
// a regular file: it is opened non-blocking, so that a FIFO or a device cannot hold the open
// (a FIFO waits for a writer, or for a reader when written), then refused by its kind (a
// folder, a socket, a link to /dev/zero alike). Non-blocking changes nothing for a regular file.
inline int open_or_throw(const std::filesystem::path& path, int flags) {
  const bool folder = (flags & O_DIRECTORY) != 0;
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC | (folder ? 0 : O_NONBLOCK));
  if (fd < 0)
    throw error(
        fmt::format("kshard::io: cannot open '{}': {}", path.string(), std::strerror(errno)));
  struct stat info {};
  if (!folder && (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode))) {
    ::close(fd);
    throw error(fmt::format("kshard::io: '{}' is not a regular file", path.string()));
  }
  return fd;
}

// The size of the open file `fd` (at `path`, for the message).
inline std::uint64_t open_file_size(int fd, const std::filesystem::path& path) {
  const off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < 0) throw_io_error("cannot find the size of '", path.string(), "'");
  return static_cast<std::uint64_t>(end);
}

// Rows `ids`, each `row_bytes` long, of the tensor at byte `offset` of the file open as `fd`,
// packed in that order.
inline std::vector<std::byte> read_rows(int fd, const std::string& path, std::uint64_t offset,
                                        const std::vector<index_t>& ids, std::uint64_t row_bytes) {
  std::vector<std::byte> bytes(ids.size() * row_bytes);
  for (std::size_t r = 0; r < ids.size(); ++r)
    if (auto failed = pread_exactly(fd, bytes.data() + r * row_bytes, row_bytes,
                                    offset + static_cast<std::uint64_t>(ids[r]) * row_bytes, path))
      throw error(*failed);
  return bytes;
}

// Rank 0: the complete file takes its name (under Durability::fsync, the folder is synced too).
inline void publish(const std::filesystem::path& partial, const std::filesystem::path& target) {
  if (std::rename(partial.c_str(), target.c_str()) != 0)
    throw error(fmt::format("kshard::io: renaming '{}' to '{}' failed: {}", partial.string(),
                            target.string(), std::strerror(errno)));
  const std::filesystem::path folder = std::filesystem::absolute(target).parent_path();
  if (!syncing()) return;
  const ScopedFd fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd) sync_if_durable(fd.get());
}

// Writes `bytes` (a safetensors file) to `path` durably and atomically: a marked temporary,
// its length prefix written last, fsync, rename.
inline void write_durably(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  const std::filesystem::path partial = partial_path(path);
  const ScopedFd fd(create_temporary(partial));
  try {
    const std::size_t marker = temporary_marker.size();
    pwrite_exactly(fd.get(), bytes.data() + marker, bytes.size() - marker, marker, partial);
    std::array<std::byte, 8> prefix{};
    std::copy_n(bytes.begin(), prefix.size(), prefix.begin());
    seal_temporary(fd.get(), partial, prefix);
    publish(partial, path);
  } catch (const error&) {
    ::unlink(partial.c_str());
    throw;
  }
}

// Why `path` may not be written in place (rank 0's check): read-only by its mode (respected
// even by root, who may write anyway) or by access().
inline std::optional<std::string> writable_problem(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || (info.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0 ||
      ::access(path.c_str(), W_OK) != 0)
    return fmt::format("kshard::io: '{}' is read-only; nothing was written", path.string());
  return std::nullopt;
}

}  // namespace kshard::detail
