#pragma once

// The writes of kshard::io (io::write_safetensors, io::write_rows_in_place): the checks every
// write agrees on before it touches a file, the bytes a new file copies from its source, the
// updates written and read back through file views of the first copies' shards.

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/mpi_file.hpp"
#include "kshard/io/engine/paths.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/safetensors/file.hpp"
#include "kshard/io/safetensors/tensor_update.hpp"
#include "kshard/matrix_agreement.hpp"

namespace kshard::detail {

struct UpdateAccess {
  static UpdatePart part(const io::TensorUpdate& u) { return u.part_(u.row_ids_); }
  static index_t row_bytes(const io::TensorUpdate& u) {
    return u.cols_ * static_cast<index_t>(io::dtype_size(u.dtype_));
  }
  static io::Dtype dtype(const io::TensorUpdate& u) { return u.dtype_; }
  static index_t cols(const io::TensorUpdate& u) { return u.cols_; }

  // Why `update` cannot replace a tensor of `file` (over `group`), or nothing.
  static std::optional<std::string> problem(const io::TensorUpdate& u,
                                            const io::SafetensorsFile& file,
                                            const comm::Group& group) {
    if (!u.group_.same_ranks_as(group))
      return fmt::format(
          "kshard::io: the matrix for tensor {} lives on another mesh than the "
          "one writing the file",
          in_quotes(u.name_));
    const io::TensorEntry* entry = file.header().find(u.name_);
    if (entry == nullptr)
      return fmt::format("kshard::io: '{}' has no tensor {} to replace", file.path().string(),
                         in_quotes(u.name_));
    if (entry->dtype != u.dtype_ || entry->shape != std::vector<std::int64_t>{u.rows_, u.cols_})
      return fmt::format(
          "kshard::io: tensor {} of '{}' is {} {}, but the matrix replacing it is "
          "{} [{}, {}]",
          in_quotes(u.name_), file.path().string(), io::to_string(entry->dtype),
          io::shape_text(entry->shape), io::to_string(u.dtype_), u.rows_, u.cols_);
    if (u.row_ids_ && !u.row_ids_->empty() &&
        (u.row_ids_->front() < 0 || u.row_ids_->back() >= u.rows_))
      return fmt::format("kshard::io: row id {} of tensor {} is outside [0, {})",
                         u.row_ids_->front() < 0 ? u.row_ids_->front() : u.row_ids_->back(),
                         in_quotes(u.name_), u.rows_);
    return std::nullopt;
  }

  static void agree_on(Agreement& agreement, const io::TensorUpdate& u) {
    same_text(agreement, "the name of a tensor to replace", u.name_);
    u.same_matrix_(agreement, in_quotes(u.name_));
    Digest ids;
    for (const index_t id : u.row_ids_.value_or(std::vector<index_t>{-1})) ids.add(id);
    agreement.same(fmt::format("the rows of {} to replace", in_quotes(u.name_)), ids.value(),
                   [](std::int64_t) { return std::string(); });
  }
};

// The checks every write makes before touching a file: the same updates on every rank, each
// valid for `file`, none twice. Settled by the caller (with its own checks added).
inline void check_updates(Agreement& agreement, const io::SafetensorsFile& file,
                          const std::vector<io::TensorUpdate>& updates, const comm::Group& group) {
  same_text(agreement, "the input file", file.path().string());
  agreement.same("the number of tensors to replace", static_cast<std::int64_t>(updates.size()));
  for (const io::TensorUpdate& u : updates) {
    UpdateAccess::agree_on(agreement, u);
    agreement.problem(UpdateAccess::problem(u, file, group));
    if (std::count_if(updates.begin(), updates.end(),
                      [&](const io::TensorUpdate& v) { return v.name() == u.name(); }) > 1)
      agreement.problem(
          fmt::format("kshard::io: tensor {} is replaced twice", in_quotes(u.name())));
  }
}

// Byte offset of the tensor `update` replaces in `file`.
inline std::uint64_t offset_of(const io::SafetensorsFile& file, const io::TensorUpdate& update) {
  return file.file_offset(*file.header().find(update.name()));
}

// Writes every update's part through `out`, each at its tensor's offset in `file`'s layout.
inline void write_updates(MpiFile& out, const io::SafetensorsFile& file,
                          const std::vector<io::TensorUpdate>& updates) {
  for (const io::TensorUpdate& u : updates) {
    const UpdatePart part = UpdateAccess::part(u);
    out.write_shard(offset_of(file, u), part.types, part.bytes.data());
  }
}

// Reads every update's part back through `in` and names the first that differs from what was
// written.
inline std::optional<std::string> verify_updates(MpiFile& in, const io::SafetensorsFile& file,
                                                 const std::vector<io::TensorUpdate>& updates) {
  std::optional<std::string> problem;
  for (const io::TensorUpdate& u : updates) {
    const UpdatePart part = UpdateAccess::part(u);
    std::vector<std::byte> back(part.bytes.size());
    in.read_shard(offset_of(file, u), part.types, back.data());
    if (!problem && back != part.bytes)
      problem =
          fmt::format("kshard::io: tensor {} of '{}' reads back other bytes than were written",
                      in_quotes(u.name()), file.path().string());
  }
  return problem;
}

// The file's bytes outside the tensors replaced whole, as [begin, end) ranges in file order,
// from byte 8: the length prefix is written last, over the temporary's marker.
inline std::vector<std::pair<std::uint64_t, std::uint64_t>> kept_ranges(
    const io::SafetensorsFile& file, const std::vector<io::TensorUpdate>& updates) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> replaced;
  for (const io::TensorUpdate& u : updates) {
    if (u.rows()) continue;  // a rows update writes over its tensor's kept bytes
    const io::TensorEntry& entry = *file.header().find(u.name());
    replaced.emplace_back(file.file_offset(entry), file.file_offset(entry) + entry.bytes());
  }
  std::sort(replaced.begin(), replaced.end());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> kept;
  std::uint64_t at = temporary_marker.size();
  for (const auto& [begin, end] : replaced) {
    if (begin > at) kept.emplace_back(at, begin);
    at = std::max(at, end);
  }
  if (file.file_size() > at) kept.emplace_back(at, file.file_size());
  return kept;
}

// Copies this rank's equal share of the `kept` bytes from `source` to `target`, at the same
// offsets: POSIX I/O on disjoint ranges, inside the kernel where the file systems can
// (copy_file_range, as cp), else through a bounded buffer; each piece's writeback started at
// once (the MPI-IO sync at the end finds little left).
inline void copy_share(const std::filesystem::path& source, const std::filesystem::path& target,
                       const std::vector<std::pair<std::uint64_t, std::uint64_t>>& kept, int rank,
                       int size) {
  std::uint64_t total = 0;
  for (const auto& [begin, end] : kept) total += end - begin;
  // total * rank / size without forming total * rank, which may pass 64 bits.
  const auto share = [&](int r) {
    const auto ranks = static_cast<std::uint64_t>(size);
    return total / ranks * static_cast<std::uint64_t>(r) +
           total % ranks * static_cast<std::uint64_t>(r) / ranks;
  };
  const std::uint64_t share_begin = share(rank);
  const std::uint64_t share_end = share(rank + 1);
  if (share_begin == share_end) return;
  const ScopedFd in(open_or_throw(source, O_RDONLY | O_CLOEXEC));
  const ScopedFd out(open_or_throw(target, O_WRONLY | O_CLOEXEC));
  constexpr std::uint64_t buffer_bytes = std::uint64_t{64} << 20;
  std::vector<char> buffer;
  std::uint64_t position = 0;  // of the current range's start among the kept bytes
  for (const auto& [begin, end] : kept) {
    const std::uint64_t from = std::max(share_begin, position);
    const std::uint64_t to = std::min(share_end, position + (end - begin));
    for (std::uint64_t at = from; at < to;) {
      const std::uint64_t n = std::min(buffer_bytes, to - at), offset = begin + (at - position);
      if (!copy_in_kernel(in.get(), offset, out.get(), offset, n)) {
        buffer.resize(static_cast<std::size_t>(buffer_bytes));
        throw_if(pread_exactly(in.get(), buffer.data(), n, offset, source.string()));
        pwrite_exactly(out.get(), buffer.data(), n, offset, target);
      }
      start_writeback(out.get(), offset, n);
      at += n;
    }
    position += end - begin;
  }
}

// Rank 0's checks of a new file's paths, before anything is touched: neither the output nor
// its temporary is the source (by identity), the folder exists, the temporary name is free or
// kshard's leftover.
inline std::optional<std::string> new_file_problem(const io::SafetensorsFile& source,
                                                   const std::filesystem::path& target) {
  if (auto unusable = unusable_path_problem({"output", target})) return unusable;
  if (auto clash = first_clash({{"output", target}, {"output's temporary", partial_path(target)}},
                               {{"input", source.path()}}))
    return fmt::format(
        "kshard::io: {}; nothing was written: write to another path or update "
        "the rows in place",
        *clash);
  std::error_code ec;
  const std::filesystem::path folder = std::filesystem::absolute(target).parent_path();
  if (!std::filesystem::is_directory(folder, ec))
    return fmt::format("kshard::io: the output folder '{}' does not exist", folder.string());
  return temporary_problem(partial_path(target));
}

// The 8-byte length prefix of a file with `header`.
inline std::array<std::byte, 8> length_prefix(const io::SafetensorsHeader& header) {
  std::array<std::byte, 8> prefix{};
  for (std::size_t i = 0; i < 8; ++i)
    prefix[i] = static_cast<std::byte>(header.header_length >> (8 * i) & 0xff);
  return prefix;
}

// Writes the new file under `partial`: kept bytes copied, then the updates written over them
// (so that a rows update lands on its tensor's copied bytes), synced and closed.
inline void write_partial(const comm::Group& group, const io::SafetensorsFile& source,
                          const std::filesystem::path& partial,
                          const std::vector<io::TensorUpdate>& updates) {
  std::optional<MpiFile> out;
  agree(group, attempt([&] {
          out.emplace(group, partial.string(), FileAccess::write);  // rank 0 made it
        }));
  const int rank = group.rank();
  agree(group, attempt([&] {
          copy_share(source.path(), partial, kept_ranges(source, updates), rank, group.size());
        }));
  agree(group, attempt([&] {
          write_updates(*out, source, updates);
          out->sync();
          out->close();
        }));
}

// Rank 0's checks before an in-place write touches anything: neither the undo file nor its
// temporary is the checkpoint (by identity), the checkpoint is writable, no undo file is there
// yet, and the temporary name is free or kshard's leftover.
inline std::optional<std::string> in_place_problem(const io::SafetensorsFile& file,
                                                   const std::filesystem::path& undo) {
  if (auto unusable = unusable_path_problem({"undo file", undo})) return unusable;
  if (auto clash = first_clash({{"undo file", undo}, {"undo file's temporary", partial_path(undo)}},
                               {{"checkpoint", file.path()}}))
    return fmt::format("kshard::io: {}; nothing was written: name another undo file", *clash);
  if (auto problem = writable_problem(file.path())) return problem;
  std::error_code ec;  // rank 0 alone looks: it must not throw
  if (std::filesystem::exists(undo, ec) || ec)
    return fmt::format(
        "kshard::io: the undo file '{}' exists already; undo that write or remove the file first",
        undo.string());
  return temporary_problem(partial_path(undo));
}

// Writes the updates' rows into `file` itself, fsyncs, and reads them back.
inline void write_rows_and_verify(const comm::Group& group, const io::SafetensorsFile& file,
                                  const std::vector<io::TensorUpdate>& updates) {
  {
    std::optional<MpiFile> out;
    agree(group, attempt([&] { out.emplace(group, file.path().string(), FileAccess::write); }));
    agree(group, attempt([&] {
            write_updates(*out, file, updates);
            out->sync();
            out->close();
          }));
  }
  std::optional<MpiFile> in;
  agree(group, attempt([&] { in.emplace(group, file.path().string(), FileAccess::read); }));
  agree(group, attempt([&] {
          const auto differs = verify_updates(*in, file, updates);
          in->close();  // collective: before a throw on some ranks only
          if (differs) throw error(*differs);
        }));
}

}  // namespace kshard::detail
