#pragma once

// The byte moves of a conversion (io::convert_checkpoint): every rank writes an equal share of
// the output files' data sections (cut at element boundaries), each stretch in pieces of at most
// one buffer: the runs where the stored pieces meet it are read (pread) into the buffer, which
// is written (pwrite) where it goes; a piece that fills a whole buffer's worth on its own is
// copied inside the kernel (copy_file_range), as cp does. Each buffer's writeback starts at once
// (sync_file_range), so the final fsync does not wait for the whole output. POSIX I/O on disjoint
// byte ranges: no rank assembles anything for another.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/io/engine/box_runs.hpp"
#include "kshard/io/engine/conversion_plan.hpp"
#include "kshard/io/engine/crc32.hpp"
#include "kshard/io/engine/io_stats.hpp"
#include "kshard/io/engine/paths.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/model/row_patch.hpp"

namespace kshard::detail {

// Elements [begin, end) of output tensor `tensor` (row-major in its box) of output file `file`,
// which one rank writes.
struct Stretch {
  std::size_t file = 0;
  const OutputTensor* tensor = nullptr;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// The element of a tensor whose bytes are [first, last) in the concatenated tensor bytes where
// byte position `at` falls (clamped to the tensor): the share boundaries of all ranks cut each
// tensor at the same elements, so the shares partition it.
inline std::int64_t element_at(std::uint64_t at, std::uint64_t first, std::uint64_t last,
                               std::uint64_t element_bytes) {
  return static_cast<std::int64_t>((std::clamp(at, first, last) - first) / element_bytes);
}

// The bytes of all tensors of `files`.
inline std::uint64_t tensor_bytes(const std::vector<OutputFile>& files) {
  std::uint64_t total = 0;
  for (const OutputFile& file : files)
    for (const OutputTensor& tensor : file.tensors) total += tensor.bytes();
  return total;
}

// The stretches of rank `rank` of `ranks`: its equal share of the tensors' bytes, concatenated
// in file order.
inline std::vector<Stretch> stretches_of(const std::vector<OutputFile>& files, int rank,
                                         int ranks) {
  const std::uint64_t total = tensor_bytes(files);
  // floor(total * r / ranks) without overflow: total = q * ranks + m, m * r < ranks^2.
  const auto boundary = [&](std::uint64_t r) {
    const auto n = static_cast<std::uint64_t>(ranks);
    return total / n * r + total % n * r / n;
  };
  const std::uint64_t low = boundary(static_cast<std::uint64_t>(rank));
  const std::uint64_t high = boundary(static_cast<std::uint64_t>(rank) + 1);
  std::vector<Stretch> stretches;
  std::uint64_t first = 0;
  for (std::size_t f = 0; f < files.size(); ++f)
    for (const OutputTensor& tensor : files[f].tensors) {
      const std::uint64_t last = first + tensor.bytes();
      const std::uint64_t size = dtype_info(tensor.tensor->dtype).size;
      const Stretch stretch{f, &tensor, element_at(low, first, last, size),
                            element_at(high, first, last, size)};
      if (stretch.begin < stretch.end) stretches.push_back(stretch);
      first = last;
    }
  return stretches;
}

// The source key of a row patch's runs: after every file, so the patch lands last.
inline constexpr std::size_t patch_source = std::numeric_limits<std::size_t>::max();

// The runs that move the rows of `patch` where they meet `target`, from the patch's bytes.
inline void append_patch_runs(const io::RowPatch& patch, const BoxStorage& target,
                              std::uint64_t element_bytes, std::vector<ByteRun>& runs) {
  const auto row_bytes = static_cast<std::uint64_t>(patch.cols) * element_bytes;
  for (std::size_t k = 0; k < patch.ids.size(); ++k)
    append_shared_runs(row_major_box({patch.ids[k], 0}, {1, patch.cols}, k * row_bytes), target,
                       element_bytes, runs);
}

// The runs that fill elements [a, b) of `out` (element a at byte 0 of a buffer) from the stored
// pieces, by source file, each list sorted by its place in the file; then, under
// `patch_source`, from the rows of `patch` (if any) where they meet it.
inline std::map<std::size_t, std::vector<ByteRun>> fill_runs(const OutputTensor& out,
                                                             std::int64_t a, std::int64_t b,
                                                             const io::RowPatch* patch) {
  const io::StoredTensor& tensor = *out.tensor;
  const std::uint64_t element_bytes = dtype_info(tensor.dtype).size;
  std::map<std::size_t, std::vector<ByteRun>> runs;
  std::uint64_t placed = 0;  // bytes of [a, b) the boxes before this one hold
  boxes_of_range(
      out.shape, a, b, [&](std::vector<std::int64_t> at, std::vector<std::int64_t> extent) {
        std::uint64_t elements = 1;
        for (std::size_t d = 0; d < at.size(); ++d) {
          at[d] += out.offsets[d];
          elements *= static_cast<std::uint64_t>(extent[d]);
        }
        const BoxStorage target = row_major_box(std::move(at), std::move(extent), placed);
        for (const io::StoredPiece& piece : tensor.pieces)
          append_shared_runs(stored_box(piece), target, element_bytes, runs[piece.file]);
        if (patch != nullptr) append_patch_runs(*patch, target, element_bytes, runs[patch_source]);
        placed += elements * element_bytes;
      });
  std::erase_if(runs, [](const auto& entry) { return entry.second.empty(); });  // pieces apart
  for (auto& [file, list] : runs)
    std::sort(list.begin(), list.end(),
              [](const ByteRun& x, const ByteRun& y) { return x.from < y.from; });
  return runs;
}

// Files opened on first use and kept open, at most `max_open` at a time: past it, the open
// ones are closed first, each fsynced first when the files are written (a DCP saved with a
// file per item, or written for a large job, has more files than a process may hold open).
class OpenFiles {
 public:
  OpenFiles(std::vector<std::filesystem::path> paths, int flags)
      : paths_(std::move(paths)), fds_(paths_.size()), flags_(flags) {}

  // The descriptor of file `i`.
  int operator[](std::size_t i) {
    if (!fds_[i]) {
      if (open_.size() == max_open) close_all();
      fds_[i].emplace(open_or_throw(paths_[i], flags_ | O_CLOEXEC));
      open_.push_back(i);
    }
    return fds_[i]->get();
  }
  [[nodiscard]] const std::filesystem::path& path(std::size_t i) const { return paths_[i]; }
  // Every file written through this is on the storage device (written files only).
  void close_all() {
    for (const std::size_t i : open_) {
      if ((flags_ & O_ACCMODE) != O_RDONLY) fsync_or_throw(fds_[i]->get(), paths_[i]);
      fds_[i].reset();
    }
    open_.clear();
  }

 private:
  static constexpr std::size_t max_open = 64;
  std::vector<std::filesystem::path> paths_;
  std::vector<std::optional<ScopedFd>> fds_;
  std::vector<std::size_t> open_;
  int flags_;
};

// One rank's byte mover: the checkpoint's files and the output files it opened, and its buffer.
class ByteMover {
 public:
  // A mover that also takes the CRC-32 of what it writes when `checksums` is set (it then
  // passes every byte through its buffer).
  ByteMover(std::vector<std::filesystem::path> sources, std::vector<std::filesystem::path> outputs,
            std::uint64_t buffer_bytes, bool checksums)
      : in_(std::move(sources), O_RDONLY),
        out_(std::move(outputs), O_WRONLY),
        buffer_bytes_(buffer_bytes),
        checksums_(checksums) {}

  // Writes `stretch`, its rows from `patch` where it has them, calling `done(bytes)` after each
  // buffer's worth; returns the CRC-32 of the bytes written (0 when the mover takes none).
  std::uint32_t write(const Stretch& stretch, const io::RowPatch* patch,
                      const std::function<void(std::uint64_t)>& done) {
    const std::uint64_t element_bytes = dtype_info(stretch.tensor->tensor->dtype).size;
    const auto step =
        static_cast<std::int64_t>(std::max<std::uint64_t>(1, buffer_bytes_ / element_bytes));
    std::uint32_t crc = 0;
    for (std::int64_t a = stretch.begin; a < stretch.end; a += std::min(step, stretch.end - a)) {
      const std::int64_t b = std::min(stretch.end, a + step);
      const std::uint64_t at = stretch.tensor->at + static_cast<std::uint64_t>(a) * element_bytes;
      const std::uint64_t bytes = static_cast<std::uint64_t>(b - a) * element_bytes;
      crc = move(fill_runs(*stretch.tensor, a, b, patch), stretch.file, at, bytes, patch, crc);
      done(bytes);
    }
    return crc;
  }

  // Every output file this rank wrote is on the storage device.
  void sync() { out_.close_all(); }

 private:
  // Fills bytes [at, at + bytes) of output file `file` by `runs` (from the buffer's start);
  // returns `crc` continued over them when the mover takes checksums.
  std::uint32_t move(const std::map<std::size_t, std::vector<ByteRun>>& runs, std::size_t file,
                     std::uint64_t at, std::uint64_t bytes, const io::RowPatch* patch,
                     std::uint32_t crc) {
    const int out = out_[file];
    if (!checksums_ && in_kernel(runs) && copy_in_kernel(runs, out, at)) {
      start_writeback(out, at, bytes);
      return crc;
    }
    if (buffer_.size() < bytes) buffer_.resize(bytes);
    for (const auto& [source, list] : runs)
      for (const ByteRun& run : list)
        if (source == patch_source)
          std::memcpy(buffer_.data() + run.to, patch->bytes.data() + run.from, run.bytes);
        else
          throw_if(pread_exactly(in_[source], buffer_.data() + run.to, run.bytes, run.from,
                                 in_.path(source).string()));
    pwrite_exactly(out, buffer_.data(), bytes, at, out_.path(file).string());
    start_writeback(out, at, bytes);
    return checksums_ ? zip_crc32(std::span(buffer_.data(), bytes), crc) : crc;
  }
  // Whether `runs` go file to file inside the kernel: one run, or runs of at least 1 MiB each
  // (where pieces meet, as Shard(0) pieces do), none from a patch. Shorter runs (a column
  // split's rows) are gathered in the buffer and written with one pwrite.
  static bool in_kernel(const std::map<std::size_t, std::vector<ByteRun>>& runs) {
    if (runs.contains(patch_source)) return false;
    if (runs.size() == 1 && runs.begin()->second.size() == 1) return true;
    return std::all_of(runs.begin(), runs.end(), [](const auto& entry) {
      return std::all_of(entry.second.begin(), entry.second.end(),
                         [](const ByteRun& run) { return run.bytes >= (std::uint64_t{1} << 20); });
    });
  }
  // Copies every run to `at` + its place in `out` inside the kernel; false, nothing counted,
  // when the file systems cannot (the caller then moves them all through the buffer).
  bool copy_in_kernel(const std::map<std::size_t, std::vector<ByteRun>>& runs, int out,
                      std::uint64_t at) {
    const io::IoStats before = io::io_stats();
    for (const auto& [source, list] : runs)
      for (const ByteRun& run : list)
        if (!detail::copy_in_kernel(in_[source], run.from, out, at + run.to, run.bytes)) {
          io::io_stats() = before;
          return false;
        }
    return true;
  }
  OpenFiles in_, out_;
  std::uint64_t buffer_bytes_;
  bool checksums_;
  std::vector<std::byte> buffer_;
};

}  // namespace kshard::detail
