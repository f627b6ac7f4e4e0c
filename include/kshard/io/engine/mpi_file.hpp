#pragma once

// MPI-IO for kshard::io: an owning file handle, owning datatypes, and the datatype that selects
// one rank's shard inside a row-major tensor on disk. Every call is checked and its bytes are
// counted in io_stats(). The only place where kshard::io names MPI: the rest of io speaks in
// groups (comm::Group), byte offsets and ShardTypes.

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/group.hpp"
#include "kshard/comm/mpi.hpp"
#include "kshard/error.hpp"
#include "kshard/index.hpp"
#include "kshard/io/engine/box_runs.hpp"
#include "kshard/io/engine/io_stats.hpp"
#include "kshard/io/engine/sync.hpp"
#include "kshard/layout_mapping.hpp"

namespace kshard::detail {

// Owns a committed MPI datatype.
class MpiType {
 public:
  MpiType() = default;
  explicit MpiType(MPI_Datatype type) : type_(type) {
    check_mpi(MPI_Type_commit(&type_), "MPI_Type_commit");
  }
  MpiType(MpiType&& other) noexcept : type_(std::exchange(other.type_, MPI_DATATYPE_NULL)) {}
  MpiType& operator=(MpiType&& other) noexcept {
    std::swap(type_, other.type_);
    return *this;
  }
  MpiType(const MpiType&) = delete;
  MpiType& operator=(const MpiType&) = delete;
  ~MpiType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  [[nodiscard]] MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// `count` consecutive elements of `element_bytes` bytes each.
inline MPI_Datatype contiguous_bytes(index_t count, int element_bytes) {
  MPI_Datatype element = MPI_DATATYPE_NULL;
  check_mpi(MPI_Type_contiguous(element_bytes, MPI_BYTE, &element), "MPI_Type_contiguous");
  MPI_Datatype type = MPI_DATATYPE_NULL;
  const int rc =
      MPI_Type_contiguous(checked_int(count, "io", "a row's element count"), element, &type);
  MPI_Type_free(&element);
  check_mpi(rc, "MPI_Type_contiguous");
  return type;
}

// Blocks of `base` at byte displacements: one per run, `run.size` elements at
// `run.global_begin * stride` bytes. Counts stay ints through `base`, displacements are 64-bit.
inline MPI_Datatype runs_type(const std::vector<IndexRun>& runs, MPI_Aint stride,
                              MPI_Datatype base) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> displacements;
  for (const IndexRun& run : runs) {
    lengths.push_back(checked_int(run.size, "io", "a run of consecutive rows or columns"));
    displacements.push_back(static_cast<MPI_Aint>(run.global_begin) * stride);
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  check_mpi(
      MPI_Type_create_hindexed(checked_int(static_cast<index_t>(runs.size()), "io", "a run count"),
                               lengths.data(), displacements.data(), base, &type),
      "MPI_Type_create_hindexed");
  return type;
}

// The rows `runs` of a row-major tensor, each row selected by `row` (the shard's columns): one
// strided vector per run, its stride given explicitly rather than through a resized extent
// (ROMIO 3.2 mis-tiles resized types: MPICH and Open MPI's romio321 read wrong columns).
inline MPI_Datatype rows_type(const std::vector<IndexRun>& runs, MPI_Aint row_bytes,
                              MPI_Datatype row) {
  std::vector<MPI_Datatype> vectors;
  std::vector<MPI_Aint> displacements;
  for (const IndexRun& run : runs) {
    MPI_Datatype vector = MPI_DATATYPE_NULL;
    check_mpi(MPI_Type_create_hvector(checked_int(run.size, "io", "a run of consecutive rows"), 1,
                                      row_bytes, row, &vector),
              "MPI_Type_create_hvector");
    vectors.push_back(vector);
    displacements.push_back(static_cast<MPI_Aint>(run.global_begin) * row_bytes);
  }
  const std::vector<int> ones(vectors.size(), 1);
  MPI_Datatype type = MPI_DATATYPE_NULL;
  const int rc =
      MPI_Type_create_struct(checked_int(static_cast<index_t>(vectors.size()), "io", "a run count"),
                             ones.data(), displacements.data(), vectors.data(), &type);
  for (MPI_Datatype& vector : vectors) MPI_Type_free(&vector);
  check_mpi(rc, "MPI_Type_create_struct");
  return type;
}

// How one rank's shard of a row-major `rows x cols` tensor of `element_bytes`-byte elements
// lies in the file (relative to the tensor's first byte) and in memory (the row-major shard):
// `count` items of `memory` in memory match the `file` type's bytes on disk. Row and column
// counts stay below 2^31 because a row is one datatype, as Open MPI 4.1 has no large counts.
struct ShardTypes {
  MpiType file;    // the shard's bytes in the tensor, as a file view's filetype
  MpiType memory;  // one shard row in memory
  int count = 0;   // shard rows
  index_t bytes = 0;
};

// The shard types for rows `row_runs` (a subset of the shard's rows, in increasing order; the
// memory side holds them packed in that order) and all the shard's columns.
template <std::size_t N>
ShardTypes shard_types(const LayoutMapping<N>& mapping, const std::vector<IndexRun>& row_runs,
                       int element_bytes) {
  ShardTypes types;
  index_t rows = 0;
  for (const IndexRun& run : row_runs) rows += run.size;
  const index_t cols = mapping.cols.local_extent();
  if (rows == 0 || cols == 0) return types;
  const auto row_bytes = static_cast<MPI_Aint>(mapping.cols.global_extent()) * element_bytes;
  MPI_Datatype element = MPI_DATATYPE_NULL;
  check_mpi(MPI_Type_contiguous(element_bytes, MPI_BYTE, &element), "MPI_Type_contiguous");
  MPI_Datatype row = runs_type(mapping.cols.runs(), element_bytes, element);
  MPI_Type_free(&element);
  MPI_Datatype file = rows_type(row_runs, row_bytes, row);
  MPI_Type_free(&row);
  types.file = MpiType(file);
  types.memory = MpiType(contiguous_bytes(cols, element_bytes));
  types.count = checked_int(rows, "io", "a shard's row count");
  types.bytes = rows * cols * element_bytes;
  return types;
}

// The datatypes that move `runs` (sorted by source byte, as a file view must be; each under
// 2^31 bytes, see split_runs): the file type selects each run's bytes in the file, the memory
// type its destination bytes in memory; count 1, or 0 where there are no runs.
inline ShardTypes byte_run_types(const std::vector<ByteRun>& runs) {
  ShardTypes types;
  if (runs.empty()) return types;
  std::vector<int> lengths;
  std::vector<MPI_Aint> in_file, in_memory;
  for (const ByteRun& run : runs) {
    lengths.push_back(checked_int(static_cast<index_t>(run.bytes), "io", "a run's byte count"));
    in_file.push_back(static_cast<MPI_Aint>(run.from));
    in_memory.push_back(static_cast<MPI_Aint>(run.to));
    types.bytes += static_cast<index_t>(run.bytes);
  }
  const int count = checked_int(static_cast<index_t>(runs.size()), "io", "a run count");
  MPI_Datatype file = MPI_DATATYPE_NULL, memory = MPI_DATATYPE_NULL;
  check_mpi(MPI_Type_create_hindexed(count, lengths.data(), in_file.data(), MPI_BYTE, &file),
            "MPI_Type_create_hindexed");
  types.file = MpiType(file);
  check_mpi(MPI_Type_create_hindexed(count, lengths.data(), in_memory.data(), MPI_BYTE, &memory),
            "MPI_Type_create_hindexed");
  types.memory = MpiType(memory);
  types.count = 1;
  return types;
}

// How a file is opened: read only, or write only (an existing file: kshard::io creates files
// with O_EXCL on rank 0 before it opens them here).
enum class FileAccess { read, write };

// An MPI file opened collectively; closed (collectively) when the handle goes. Errors return
// codes (MPI's default for files), which every call checks. A collective read or write that
// moves fewer bytes than asked is reported by close(), not where it happens: a rank that threw
// there would leave the others waiting in the next collective call (a view reset, the close).
class MpiFile {
 public:
  // Collective over `group`.
  MpiFile(const comm::Group& group, const std::string& path, FileAccess access)
      : MpiFile(group.native(), path, access) {}
  // This rank's own handle (over MPI_COMM_SELF): its calls wait on no other rank.
  MpiFile(const std::string& path, FileAccess access) : MpiFile(MPI_COMM_SELF, path, access) {}

  MpiFile(const MpiFile&) = delete;
  MpiFile& operator=(const MpiFile&) = delete;
  ~MpiFile() {
    if (file_ != MPI_FILE_NULL) MPI_File_close(&file_);
  }

  // Collective: reads this rank's shard (`types`, none where types.count is 0) of the tensor at
  // byte `offset` into `data`, through a file view of the shard.
  void read_shard(std::uint64_t offset, const ShardTypes& types, void* data) {
    set_view(offset, view_of(types));
    MPI_Status status;
    check_mpi(MPI_File_read_at_all(file_, 0, data, types.count, memory_of(types), &status),
              "MPI_File_read_at_all");
    if (!short_transfer_) short_transfer_ = count_problem(status, types.bytes, "read");
    io::io_stats().bytes_read += types.bytes;
    set_view(0, MPI_BYTE);
  }
  // Collective: writes this rank's shard of the tensor at byte `offset` from `data`.
  void write_shard(std::uint64_t offset, const ShardTypes& types, const void* data) {
    set_view(offset, view_of(types));
    MPI_Status status;
    check_mpi(MPI_File_write_at_all(file_, 0, data, types.count, memory_of(types), &status),
              "MPI_File_write_at_all");
    if (!short_transfer_) short_transfer_ = count_problem(status, types.bytes, "wrote");
    io::io_stats().bytes_written += types.bytes;
    set_view(0, MPI_BYTE);
  }
  // Independent: `bytes` bytes at byte `offset`.
  void read_at(std::uint64_t offset, void* data, int bytes) {
    MPI_Status status;
    check_mpi(
        MPI_File_read_at(file_, static_cast<MPI_Offset>(offset), data, bytes, MPI_BYTE, &status),
        "MPI_File_read_at");
    if (auto problem = count_problem(status, bytes, "read")) throw error(*problem);
    io::io_stats().bytes_read += bytes;
  }
  void write_at(std::uint64_t offset, const void* data, int bytes) {
    MPI_Status status;
    check_mpi(
        MPI_File_write_at(file_, static_cast<MPI_Offset>(offset), data, bytes, MPI_BYTE, &status),
        "MPI_File_write_at");
    if (auto problem = count_problem(status, bytes, "wrote")) throw error(*problem);
    io::io_stats().bytes_written += bytes;
  }
  // Collective: the data written so far is on the storage device (fsync; nothing under
  // Durability::page_cache, which every rank runs alike).
  void sync() {
    if (!syncing()) return;
    ++io::io_stats().syncs;
    check_mpi(MPI_File_sync(file_), "MPI_File_sync");
  }
  // The file's size in bytes now (a local call).
  [[nodiscard]] std::uint64_t size() const {
    MPI_Offset bytes = 0;
    check_mpi(MPI_File_get_size(file_, &bytes), "MPI_File_get_size");
    return static_cast<std::uint64_t>(bytes);
  }
  // Collective: closes now, so that a failing close is an error rather than lost; then throws
  // for a short collective transfer, if there was one.
  void close() {
    check_mpi(MPI_File_close(&file_), "MPI_File_close");
    file_ = MPI_FILE_NULL;
    if (short_transfer_) throw error(*short_transfer_);
  }

 private:
  MpiFile(MPI_Comm comm, const std::string& path, FileAccess access) : path_(path) {
    const int mode = access == FileAccess::read ? MPI_MODE_RDONLY : MPI_MODE_WRONLY;
    const int rc = MPI_File_open(comm, path.c_str(), mode, MPI_INFO_NULL, &file_);
    if (rc != MPI_SUCCESS) {
      file_ = MPI_FILE_NULL;
      throw error(fmt::format("kshard::io: cannot open '{}': {}", path, mpi_error_text(rc)));
    }
  }
  // Collective: this rank's view becomes `filetype` at byte `offset`.
  void set_view(std::uint64_t offset, MPI_Datatype filetype) {
    char native[] = "native";
    check_mpi(MPI_File_set_view(file_, static_cast<MPI_Offset>(offset), MPI_BYTE, filetype, native,
                                MPI_INFO_NULL),
              "MPI_File_set_view");
  }
  // A rank that moves nothing still takes part in the collective, with a view of bytes.
  static MPI_Datatype view_of(const ShardTypes& types) {
    return types.count > 0 ? types.file.get() : MPI_BYTE;
  }
  static MPI_Datatype memory_of(const ShardTypes& types) {
    return types.count > 0 ? types.memory.get() : MPI_BYTE;
  }
  static std::string mpi_error_text(int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    return std::string(text, static_cast<std::size_t>(length));
  }
  [[nodiscard]] std::optional<std::string> count_problem(const MPI_Status& status, index_t expected,
                                                         const char* verb) const {
    if (expected == 0) return std::nullopt;  // ROMIO leaves the status of an empty transfer unset
    MPI_Count got = 0;
    check_mpi(MPI_Get_elements_x(&status, MPI_BYTE, &got), "MPI_Get_elements_x");
    if (got == expected) return std::nullopt;
    return fmt::format(
        "kshard::io: {} {} bytes of '{}' where {} were expected (the file is shorter than its "
        "header says, or the device is full)",
        verb, static_cast<index_t>(got), path_, expected);
  }

  std::string path_;
  MPI_File file_ = MPI_FILE_NULL;
  std::optional<std::string> short_transfer_;  // the first short collective transfer
};

}  // namespace kshard::detail
