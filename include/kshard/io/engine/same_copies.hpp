#pragma once

// Every rank reads the same checkpoint: where rank 0 alone parses a checkpoint's layout (a DCP
// folder's `.metadata`, ZIP directories, local headers and `data.pkl`s) and broadcasts it, the
// other ranks still read the tensors from their own copies of the files, which on node-local
// storage may be other bytes (a stale copy). Rank 0 logs each file it read (its size and the
// byte ranges, with their hash); every other rank reads the same ranges of its own copy and
// compares, and a copy that differs is refused alike on every rank, naming the file and what
// differs. Data bytes are compared by size only here (their CRCs: io::verify_checksums).

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/posix.hpp"

namespace kshard::detail {

// What rank 0 read of one file: its size, and the ranges [at, at + bytes) in the order read,
// hashed together (FNV-1a 64 over their bytes).
struct FileReads {
  std::filesystem::path path;
  std::uint64_t size = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;  // (at, bytes)
  std::uint64_t hash = 0;
};

// Rank 0's log of every metadata byte it read, file by file.
class ReadLog {
 public:
  // The index of file `path` of `size` bytes in the log (added on first use).
  std::size_t file(const std::filesystem::path& path, std::uint64_t size) {
    const auto [it, added] = index_.emplace(path.string(), files_.size());
    if (added) {
      files_.push_back({path, size, {}, 0});
      hashes_.emplace_back();
    }
    return it->second;
  }
  // Notes that `bytes` were read at byte `at` of file `f`.
  void add(std::size_t f, std::uint64_t at, std::span<const std::byte> bytes) {
    files_[f].ranges.emplace_back(at, bytes.size());
    hashes_[f].add_bytes(bytes.data(), bytes.size());
  }
  // Each file's reads, with their hash.
  [[nodiscard]] std::vector<FileReads> files() const {
    std::vector<FileReads> files = files_;
    for (std::size_t f = 0; f < files.size(); ++f) files[f].hash = hashes_[f].value();
    return files;
  }

 private:
  std::map<std::string, std::size_t> index_;
  std::vector<FileReads> files_;
  std::vector<Fnv1a64> hashes_;  // of each file's ranges so far
};

// `files` as JSON, to broadcast with what they describe.
inline nlohmann::json reads_json(const std::vector<FileReads>& files) {
  nlohmann::json json = nlohmann::json::array();
  for (const FileReads& f : files) json.push_back({f.path.string(), f.size, f.ranges, f.hash});
  return json;
}

// What reads_json wrote (rank 0 of this very program: trusted).
inline std::vector<FileReads> reads_from_json(const nlohmann::json& json) {
  std::vector<FileReads> files;
  for (const auto& f : json) files.push_back({f[0].get<std::string>(), f[1], f[2], f[3]});
  return files;
}

// Why this rank's copy of `reads.path` is not the one rank 0 read, or nothing.
inline std::optional<std::string> copy_difference(const FileReads& reads, int rank) {
  const std::string what =
      fmt::format("kshard::io: rank {}'s copy of '{}' is not rank 0's", rank, reads.path.string());
  const auto problem = attempt([&] {
    const ScopedFd fd(open_or_throw(reads.path, O_RDONLY));
    const std::uint64_t size = open_file_size(fd.get(), reads.path);
    if (size != reads.size)
      throw error(fmt::format("{}: {} bytes there, {} on rank 0 (node-local copies that differ)",
                              what, size, reads.size));
    ReadLog mine;  // the same reads of this rank's copy
    const std::size_t file = mine.file(reads.path, size);
    std::vector<std::byte> bytes;
    for (const auto& [at, count] : reads.ranges) {
      bytes.resize(static_cast<std::size_t>(count));
      throw_if(pread_exactly(fd.get(), bytes.data(), count, at, reads.path.string()));
      mine.add(file, at, bytes);
    }
    if (mine.files().front().hash != reads.hash)
      throw error(fmt::format(
          "{}: the bytes that describe its contents differ (node-local copies that differ)", what));
  });
  return problem;
}

// Collective: every rank but 0 compares its copies of the files rank 0 logged with rank 0's
// reads; every rank throws the same error, naming the lowest rank's first differing file.
// Cost: the logged bytes read once more on every other rank, one agreement.
inline void agree_on_copies(const comm::Group& group, const std::vector<FileReads>& files) {
  std::optional<std::string> problem;
  for (std::size_t f = 0; f < files.size() && group.rank() != 0 && !problem; ++f)
    problem = copy_difference(files[f], group.rank());
  agree(group, std::move(problem));
}

}  // namespace kshard::detail
