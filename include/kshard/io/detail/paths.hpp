#pragma once

// Which paths name one file, and kshard's temporary files, for the writes of kshard::io and
// kshard-repair. A path an operation creates, truncates, renames or removes must never be one
// of its inputs: paths are compared by what they name (device and inode, through links and
// `..`), not by their spelling. A temporary file starts with a marker, so that a file found
// under a temporary name is removed only when kshard wrote it.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/error.hpp"
#include "kshard/io/detail/durability.hpp"
#include "kshard/io/io_stats.hpp"
#include "kshard/io/named_path.hpp"

namespace kshard::detail {

// What a path names: an existing file's device and inode; for a path that does not exist, its
// folder's device and inode and its name (the file it would become).
struct PathId {
  dev_t device = 0;
  ino_t inode = 0;
  std::string name;  // empty for an existing file
  bool operator==(const PathId&) const = default;
};

// stat() follows links and resolves `..` as the kernel does (after a linked folder, not
// lexically), so each spelling of one file gives one PathId. Nothing when the folder is missing.
inline std::optional<PathId> path_id(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) return PathId{info.st_dev, info.st_ino, {}};
  std::filesystem::path folder = path.parent_path();
  if (folder.empty()) folder = ".";
  if (::stat(folder.c_str(), &info) != 0) return std::nullopt;
  return PathId{info.st_dev, info.st_ino, path.filename().string()};
}

// The first path of `made` (created, truncated, renamed or removed) that names a file of `read`,
// as "the ROLE 'PATH' is the ROLE 'PATH' (one file)", or nothing.
inline std::optional<std::string> first_clash(const std::vector<io::NamedPath>& made,
                                              const std::vector<io::NamedPath>& read) {
  for (const io::NamedPath& m : made) {
    const auto id = path_id(m.path);
    if (!id) continue;  // in a folder that does not exist: no file is there
    for (const io::NamedPath& r : read)
      if (path_id(r.path) == id)
        return fmt::format("the {} '{}' is the {} '{}' (one file)", m.role, m.path.string(), r.role,
                           r.path.string());
  }
  return std::nullopt;
}

// A file descriptor closed when it goes.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const { return fd_; }
  [[nodiscard]] explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Where a new file is written until it is complete: the same folder, so the rename is atomic.
inline std::filesystem::path partial_path(const std::filesystem::path& target) {
  return target.string() + ".kshard-partial";
}

// The first 8 bytes of every temporary file kshard writes, where a safetensors file has its
// header length: read as a length they pass any header's limit, so a temporary never reads as
// a checkpoint, and a file under a temporary name that lacks them is not kshard's. The real
// length replaces them last, just before the rename (seal_temporary).
inline constexpr std::array<char, 8> temporary_marker{'k', 's', 'h', 'a', 'r', 'd', '~', 't'};

// True when `path` is a regular file (not a link) that starts with the marker.
inline bool is_kshard_temporary(const std::filesystem::path& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return false;
  const ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  std::array<char, 8> head{};
  return fd && ::pread(fd.get(), head.data(), head.size(), 0) == 8 && head == temporary_marker;
}

// Rank 0's check of a temporary name before anything is touched: nothing there, or a
// temporary a killed kshard run left (create_temporary replaces it); anything else is refused,
// never removed for its name alone.
inline std::optional<std::string> temporary_problem(const std::filesystem::path& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0 && errno == ENOENT) return std::nullopt;
  if (is_kshard_temporary(path)) return std::nullopt;
  return fmt::format(
      "kshard::io: '{}', the temporary name of this write, holds a file that kshard did not "
      "write (it lacks kshard's temporary marker); nothing was written: move that file away",
      path.string());
}

// Creates the temporary file `path` holding the marker; returns it open for writing. Never
// opens an existing file or follows a link there (O_EXCL); a kshard leftover is removed first.
inline int create_temporary(const std::filesystem::path& path) {
  if (is_kshard_temporary(path)) ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw error(
        fmt::format("kshard::io: cannot create '{}': {}", path.string(), std::strerror(errno)));
  if (::pwrite(fd, temporary_marker.data(), temporary_marker.size(), 0) != 8) {
    const int saved = errno;
    ::close(fd);
    ::unlink(path.c_str());
    throw error(
        fmt::format("kshard::io: writing '{}' failed: {}", path.string(), std::strerror(saved)));
  }
  io::io_stats().bytes_written += 8;
  return fd;
}

// The temporary's first 8 bytes become `prefix` (its header length), then it is synced (under
// Durability::fsync): from here on it is a complete file, ready for its rename.
inline void seal_temporary(int fd, const std::filesystem::path& path,
                           const std::array<std::byte, 8>& prefix) {
  if (fd < 0 || ::pwrite(fd, prefix.data(), prefix.size(), 0) != 8 || sync_if_durable(fd) != 0)
    throw error(
        fmt::format("kshard::io: writing '{}' failed: {}", path.string(), std::strerror(errno)));
  io::io_stats().bytes_written += 8;
}

}  // namespace kshard::detail
