#pragma once

// The undo file of an in-place write (io::write_rows_in_place, io::undo_in_place): written by
// rank 0 before any row changes, marked "written" with a hash of the rows once they are
// verified, and checked against the checkpoint before any row is restored.

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/error.hpp"
#include "kshard/io/engine/paths.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/safetensors/file.hpp"
#include "kshard/io/safetensors/tensor_update.hpp"
#include "kshard/io/safetensors/write.hpp"

namespace kshard::detail {

// An undo file is a safetensors file: tensor "<i>.rows" holds the row ids of update i,
// "<i>.bytes" their bytes before the write, metadata "<i>.name" its tensor. It records what
// the in-place write left behind, so that undo restores into that file only: the file's path,
// device, inode and size, and, once the rows are written and verified (state "written"), a
// hash of each tensor's written rows ("<i>.written_hash").
inline constexpr std::string_view undo_format = "kshard.undo";
inline constexpr std::string_view undo_version = "2";
inline constexpr std::string_view undo_target = "kshard.target";
inline constexpr std::string_view undo_target_size = "kshard.target_size";
inline constexpr std::string_view undo_target_device = "kshard.target_device";
inline constexpr std::string_view undo_target_inode = "kshard.target_inode";
inline constexpr std::string_view undo_state = "kshard.state";
// The states and the hash are of fixed length: the header keeps its length when they change.
inline constexpr std::string_view undo_writing = "writing";
inline constexpr std::string_view undo_written = "written";
inline constexpr std::string_view undo_no_hash = "0000000000000000";

// The key of metadata `field` of update `i`.
inline std::string undo_key(std::size_t i, std::string_view field) {
  return fmt::format("{}.{}", i, field);
}

// The hash undo format 2 records of rows: a Digest of their bytes (FNV-1a 64 of the bytes and
// the end byte 0xff), as 16 hex digits.
inline std::string rows_hash(const std::vector<std::byte>& bytes) {
  const std::int64_t value =
      Digest()
          .add(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()))
          .value();
  return fmt::format("{:016x}", std::bit_cast<std::uint64_t>(value));
}

// Rank 0's undo file while the in-place write runs: its tensors and metadata.
struct UndoImage {
  std::vector<io::TensorSpec> specs;
  std::map<std::string, std::string> metadata;

  [[nodiscard]] std::vector<std::byte> header() const {
    return io::serialize_safetensors_header(io::make_safetensors_header(specs, metadata));
  }
};

// The metadata of a new undo file for `file`, open as `fd`: its path, size, device and inode,
// state "writing".
inline std::map<std::string, std::string> undo_metadata(const io::SafetensorsFile& file, int fd) {
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    throw error(fmt::format("kshard::io: cannot stat '{}': {}", file.path().string(),
                            std::strerror(errno)));
  return {{std::string(undo_format), std::string(undo_version)},
          {std::string(undo_target), std::filesystem::absolute(file.path()).string()},
          {std::string(undo_target_size), std::to_string(file.file_size())},
          {std::string(undo_target_device), std::to_string(info.st_dev)},
          {std::string(undo_target_inode), std::to_string(info.st_ino)},
          {std::string(undo_state), std::string(undo_writing)}};
}

// Rows of one tensor of a file that an in-place write replaces: the tensor's name, dtype and
// width, the row ids, and where the tensor's first byte lies in the file.
struct RowSet {
  std::string name;
  io::Dtype dtype = io::Dtype::F32;
  index_t cols = 0;
  std::vector<index_t> ids;
  std::uint64_t offset = 0;

  [[nodiscard]] std::uint64_t row_bytes() const {
    return static_cast<std::uint64_t>(cols) * io::dtype_size(dtype);
  }
};

// The row sets of `updates` (each made with replace_rows) of `file`.
inline std::vector<RowSet> row_sets(const io::SafetensorsFile& file,
                                    const std::vector<io::TensorUpdate>& updates) {
  std::vector<RowSet> sets;
  for (const io::TensorUpdate& u : updates)
    sets.push_back(
        {u.name(), UpdateAccess::dtype(u), UpdateAccess::cols(u), *u.rows(), offset_of(file, u)});
  return sets;
}

// Rank 0: the undo file of `sets` (the current bytes of every row they replace), recording the
// file's identity and size, in state "writing".
inline UndoImage write_undo(const io::SafetensorsFile& file, const std::vector<RowSet>& sets,
                            const std::filesystem::path& undo) {
  const ScopedFd fd(open_or_throw(file.path(), O_RDONLY));
  UndoImage image;
  image.metadata = undo_metadata(file, fd.get());
  std::vector<std::byte> data;
  for (std::size_t i = 0; i < sets.size(); ++i) {
    const RowSet& set = sets[i];
    const auto count = static_cast<std::int64_t>(set.ids.size());
    image.metadata[undo_key(i, "name")] = set.name;
    image.metadata[undo_key(i, "written_hash")] = undo_no_hash;
    image.specs.push_back({undo_key(i, "rows"), io::Dtype::I64, {count}});
    image.specs.push_back({undo_key(i, "bytes"), set.dtype, {count, set.cols}});
    const auto* id_bytes = reinterpret_cast<const std::byte*>(set.ids.data());
    data.insert(data.end(), id_bytes, id_bytes + set.ids.size() * sizeof(index_t));
    const std::vector<std::byte> rows =
        read_rows(fd.get(), file.path().string(), set.offset, set.ids, set.row_bytes());
    data.insert(data.end(), rows.begin(), rows.end());
  }
  std::vector<std::byte> bytes = image.header();
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_durably(undo, bytes);
  return image;
}

// Rank 0, after the rows were written and verified: the undo file records the hash of each
// tensor's rows as the file now holds them, and state "written". The values keep their length,
// so only the header bytes that differ are rewritten (tens of bytes) and synced; a torn write
// there leaves a hash or state that undo refuses, never one it accepts wrongly.
inline void mark_undo_written(const io::SafetensorsFile& file, const std::vector<RowSet>& sets,
                              UndoImage& image, const std::filesystem::path& undo) {
  const std::vector<std::byte> before = image.header();
  {
    const ScopedFd in(open_or_throw(file.path(), O_RDONLY));
    for (std::size_t i = 0; i < sets.size(); ++i)
      image.metadata[undo_key(i, "written_hash")] = rows_hash(read_rows(
          in.get(), file.path().string(), sets[i].offset, sets[i].ids, sets[i].row_bytes()));
  }
  image.metadata[std::string(undo_state)] = undo_written;
  const std::vector<std::byte> after = image.header();
  if (after.size() != before.size())
    throw error("kshard::io: the undo file's header changed its length (a kshard bug)");
  const auto first = static_cast<std::size_t>(
      std::mismatch(before.begin(), before.end(), after.begin()).first - before.begin());
  const auto end =
      after.size() -
      static_cast<std::size_t>(std::mismatch(before.rbegin(), before.rend(), after.rbegin()).first -
                               before.rbegin());
  const ScopedFd out(open_or_throw(undo, O_WRONLY));
  pwrite_exactly(out.get(), after.data() + first, end - first, first, undo);
  fsync_or_throw(out.get(), undo);
}

// The value of metadata `key` of an undo file, or an error naming the file.
inline const std::string& undo_field(const io::SafetensorsFile& undo, std::string_view key) {
  const auto it = undo.header().metadata.find(std::string(key));
  if (it == undo.header().metadata.end())
    throw error(fmt::format("kshard::io: '{}' is not a kshard undo file (no {} in its metadata)",
                            undo.path().string(), key));
  return it->second;
}

// One tensor of an undo file: the rows it restores and where they go in the checkpoint.
struct UndoPart {
  std::string name;
  std::vector<index_t> ids;
  std::vector<std::byte> saved;  // the rows' bytes before the in-place write
  std::uint64_t offset = 0;      // of the tensor in the checkpoint
  std::uint64_t row_bytes = 0;
  std::string written_hash;
};

// Rank 0: the tensors of `undo`, each checked against the tensor of `target` it restores.
inline std::vector<UndoPart> undo_parts(const io::SafetensorsFile& undo,
                                        const io::SafetensorsFile& target) {
  const ScopedFd fd(open_or_throw(undo.path(), O_RDONLY));
  const std::string from = undo.path().string();
  std::vector<UndoPart> parts;
  for (std::size_t i = 0;; ++i) {
    const auto name = undo.header().metadata.find(undo_key(i, "name"));
    if (name == undo.header().metadata.end()) return parts;
    const io::TensorEntry* rows = undo.header().find(undo_key(i, "rows"));
    const io::TensorEntry* saved = undo.header().find(undo_key(i, "bytes"));
    const io::TensorEntry* entry = target.header().find(name->second);
    if (rows == nullptr || saved == nullptr || rows->dtype != io::Dtype::I64 ||
        rows->shape.size() != 1 || entry == nullptr || saved->dtype != entry->dtype ||
        entry->shape.size() != 2 ||
        saved->shape != std::vector<std::int64_t>{rows->shape[0], entry->shape[1]})
      throw error(fmt::format("kshard::io: the undo file does not match tensor {} of '{}'",
                              in_quotes(name->second), target.path().string()));
    UndoPart part{name->second,
                  std::vector<index_t>(static_cast<std::size_t>(rows->shape[0])),
                  std::vector<std::byte>(saved->bytes()),
                  target.file_offset(*entry),
                  static_cast<std::uint64_t>(entry->shape[1]) * io::dtype_size(entry->dtype),
                  undo_field(undo, undo_key(i, "written_hash"))};
    throw_if(
        pread_exactly(fd.get(), part.ids.data(), rows->bytes(), undo.file_offset(*rows), from));
    throw_if(pread_exactly(fd.get(), part.saved.data(), part.saved.size(), undo.file_offset(*saved),
                           from));
    for (const index_t id : part.ids)
      if (id < 0 || id >= entry->shape[0])
        throw error(fmt::format("kshard::io: the undo file names row {} of tensor {}, which has {}",
                                id, in_quotes(name->second), entry->shape[0]));
    parts.push_back(std::move(part));
  }
}

// Rank 0: `target` is the file `undo` was made for: a format that records it, not the undo
// file itself, the device, inode and size recorded.
inline void check_undo_identity(const io::SafetensorsFile& undo,
                                const io::SafetensorsFile& target) {
  const std::string where = target.path().string();
  if (const std::string& format = undo_field(undo, undo_format); format != undo_version)
    throw error(fmt::format(
        "kshard::io: the undo file '{}' has format {}, which does not record what the in-place "
        "write left in the checkpoint (its identity and a hash of the rows); kshard restores "
        "only from format {}",
        undo.path().string(), in_quotes(format), undo_version));
  if (auto clash = first_clash({{"undo file", undo.path()}}, {{"checkpoint it restores", where}}))
    throw error(fmt::format("kshard::io: {}", *clash));
  struct stat info {};
  if (::stat(where.c_str(), &info) != 0)
    throw error(fmt::format("kshard::io: cannot stat '{}': {}", where, std::strerror(errno)));
  const std::string now = fmt::format("device {} inode {}", info.st_dev, info.st_ino);
  const std::string recorded =
      fmt::format("device {} inode {}", undo_field(undo, undo_target_device),
                  undo_field(undo, undo_target_inode));
  if (now != recorded)
    throw error(fmt::format(
        "kshard::io: '{}' is not the file the undo file '{}' was made for: it is {}, the undo "
        "file records {} (replaced since the in-place write?)",
        where, undo.path().string(), now, recorded));
  if (undo_field(undo, undo_target_size) != std::to_string(target.file_size()))
    throw error(fmt::format("kshard::io: '{}' has {} bytes, but the undo file was made for {}",
                            where, target.file_size(), undo_field(undo, undo_target_size)));
}

// Rank 0: the parts `undo` restores into `target`, after checking that the rows there are
// those the in-place write left (its state "written"; a write that never finished, state
// "writing", left old and new rows that no hash tells apart, and is checked by identity only).
inline std::vector<UndoPart> check_undo(const io::SafetensorsFile& undo,
                                        const io::SafetensorsFile& target) {
  check_undo_identity(undo, target);
  std::vector<UndoPart> parts = undo_parts(undo, target);
  const std::string& state = undo_field(undo, undo_state);
  if (state == undo_writing) return parts;
  if (state != undo_written)
    throw error(fmt::format("kshard::io: the undo file '{}' is in state {}, not one kshard writes",
                            undo.path().string(), in_quotes(state)));
  const ScopedFd fd(open_or_throw(target.path(), O_RDONLY));
  for (const UndoPart& part : parts) {
    const std::string now = rows_hash(
        read_rows(fd.get(), target.path().string(), part.offset, part.ids, part.row_bytes));
    if (now != part.written_hash)
      throw error(fmt::format(
          "kshard::io: the rows of tensor {} in '{}' are not those the in-place write left there "
          "(their hash is {}, the undo file '{}' records {}): the file was written, replaced or "
          "undone since",
          in_quotes(part.name), target.path().string(), now, undo.path().string(),
          part.written_hash));
  }
  return parts;
}

// Rank 0: writes the saved rows back into `target`, fsyncs, and reads them back.
inline void restore_rows(const std::vector<UndoPart>& parts, const io::SafetensorsFile& target) {
  const std::string where = target.path().string();
  const ScopedFd out(open_or_throw(target.path(), O_RDWR));
  for (const UndoPart& part : parts)
    for (std::size_t r = 0; r < part.ids.size(); ++r)
      pwrite_exactly(out.get(), part.saved.data() + r * part.row_bytes, part.row_bytes,
                     part.offset + static_cast<std::uint64_t>(part.ids[r]) * part.row_bytes,
                     target.path());
  fsync_or_throw(out.get(), target.path());
  for (const UndoPart& part : parts)
    if (read_rows(out.get(), where, part.offset, part.ids, part.row_bytes) != part.saved)
      throw error(fmt::format(
          "kshard::io: tensor {} of '{}' reads back other bytes than the undo file holds",
          in_quotes(part.name), where));
}

}  // namespace kshard::detail
