#pragma once

// Which paths name one file, and kshard's temporary files, for the writes of kshard::io and
// kshard-repair. A path an operation creates, truncates, renames or removes must never be one
// of its inputs: paths are compared by what they name (device and inode, through links and
// `..`), not by their spelling. A temporary file starts with a marker, so that a file found
// under a temporary name is removed only when kshard wrote it.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/error.hpp"
#include "kshard/io/engine/io_stats.hpp"
#include "kshard/io/engine/sync.hpp"
#include "kshard/io/model/named_path.hpp"

namespace kshard::detail {

// What a path names: an existing file's device and inode; for a path that does not exist, its
// folder's device and inode and its name (the file it would become).
struct PathId {
  dev_t device = 0;
  ino_t inode = 0;
  std::string name;  // empty for an existing file
  auto operator<=>(const PathId&) const = default;
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

// `path` absolute, its existing part resolved as the kernel resolves it (links, `..`), the rest
// as written: a path lies inside a folder when this form of the folder is a prefix of its.
inline std::filesystem::path resolved(const std::filesystem::path& path) {
  std::error_code ignored;  // on failure: the path made absolute, as written
  std::filesystem::path result =
      std::filesystem::weakly_canonical(std::filesystem::absolute(path, ignored), ignored);
  if (result.empty()) result = std::filesystem::absolute(path, ignored).lexically_normal();
  return result.has_filename() ? result : result.parent_path();
}

// True when `inner` is the folder `outer` (resolved) or lies inside it.
inline bool lies_within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  return std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end()).first == outer.end();
}

// The files in the folder `folder` and its subfolders (links followed, as a copy follows them),
// each named as a file of it; at most 100000 (a folder of side files holds a few).
inline void add_files_of(const io::NamedPath& folder, std::vector<io::NamedPath>& files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto options = fs::directory_options::follow_directory_symlink |
                       fs::directory_options::skip_permission_denied;
  std::size_t seen = 0;
  for (fs::recursive_directory_iterator it(folder.path, options, ec), end;
       !ec && it != end && ++seen <= 100000; it.increment(ec))
    if (it->is_regular_file(ec)) files.push_back({"file of the " + folder.role, it->path()});
}

// The first clash of `paths` (see io::RunPaths), as "the ROLE 'PATH' is the ROLE 'PATH' (one
// file)" or "... lies inside the ROLE 'PATH'", or nothing. Each path is looked at once.
inline std::optional<std::string> first_clash(const io::RunPaths& paths) {
  std::map<PathId, const io::NamedPath*> files;  // what each existing or future file is
  for (const io::NamedPath& r : paths.reads)
    if (const auto id = path_id(r.path)) files.emplace(*id, &r);
  std::vector<io::NamedPath> copied;  // each file of a copied folder (a hard link elsewhere)
  for (const io::NamedPath& c : paths.copies) add_files_of(c, copied);
  for (const io::NamedPath& r : copied)
    if (const auto id = path_id(r.path)) files.emplace(*id, &r);
  std::vector<std::pair<std::filesystem::path, const io::NamedPath*>> folders;
  for (const io::NamedPath& c : paths.copies) folders.emplace_back(resolved(c.path), &c);
  for (const io::NamedPath& m : paths.makes)
    if (m.folder) folders.emplace_back(resolved(m.path), &m);
  for (const io::NamedPath& m : paths.makes) {
    if (const auto id = path_id(m.path)) {  // in a folder that does not exist: no file is there
      const auto [it, added] = files.emplace(*id, &m);
      if (!added)
        return fmt::format("the {} '{}' is the {} '{}' (one file)", m.role, m.path.string(),
                           it->second->role, it->second->path.string());
    }
    const std::filesystem::path where = resolved(m.path);
    for (const auto& [folder, named] : folders)
      if (named != &m && lies_within(where, folder))
        return fmt::format("the {} '{}' lies inside the {} '{}'", m.role, m.path.string(),
                           named->role, named->path.string());
  }
  return std::nullopt;
}

// The first clash of `paths` as an io error ending with `consequence`, or nothing.
inline std::optional<std::string> clash_problem(const io::RunPaths& paths,
                                                std::string_view consequence) {
  if (auto clash = first_clash(paths))
    return fmt::format("kshard::io: {}; {}", *clash, consequence);
  return std::nullopt;
}

// The first path of `made` that names a file of `read`, as first_clash(RunPaths) says it.
inline std::optional<std::string> first_clash(const std::vector<io::NamedPath>& made,
                                              const std::vector<io::NamedPath>& read) {
  return first_clash(io::RunPaths{read, {}, made});
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

// Where a new file or folder is written until it is complete: beside it, so the rename is
// atomic.
inline std::filesystem::path partial_path(const std::filesystem::path& target) {
  return target.string() + ".kshard-partial";
}

// `out` without trailing separators ("out/" names the folder "out").
inline std::filesystem::path folder_path(const std::filesystem::path& out) {
  std::string text = out.string();
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  return text;
}

// Why the path `given` a program writes cannot be used, or nothing: an empty path (an unset
// variable), a folder that does not exist for it to be made in, or something already there
// of another kind (a folder where a file is written, a FIFO that would block the write, a
// file where a folder is made). Local.
inline std::optional<std::string> unusable_path_problem(const io::NamedPath& given) {
  if (given.path.empty())
    return fmt::format("kshard::io: the {} is an empty path; name a file or folder", given.role);
  const auto path = folder_path(given.path);
  const auto parent = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec))
    return fmt::format("kshard::io: the folder '{}' of the {} '{}' does not exist", parent.string(),
                       given.role, given.path.string());
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) return std::nullopt;
  if (given.folder && !std::filesystem::is_directory(status))
    return fmt::format("kshard::io: the {} '{}' exists and is not a folder", given.role,
                       given.path.string());
  if (!given.folder && !std::filesystem::is_regular_file(status))
    return fmt::format("kshard::io: the {} '{}' exists and is not a regular file", given.role,
                       given.path.string());
  return std::nullopt;
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
