#pragma once

// The collective read of a tensor stored in pieces (per-rank shards, DCP) into a DistMatrix:
// each rank holding a first copy reads, from each file it needs, exactly the bytes where a piece
// of that file meets its shard (one read per file through a file view of those runs, on its own
// MPI-IO handle: a checkpoint of a thousand files costs no rank a thousand collective opens);
// one agreement then gives every rank the same error, and the replicas receive their blocks by
// broadcast. And the read of a few rows (io::read_rows_into): each rank holding one reads its
// columns of it, from the pieces it meets, in whatever form the checkpoint stores it.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/engine/box_runs.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/mpi_file.hpp"
#include "kshard/io/model/stored_tensor.hpp"
#include "kshard/io/safetensors/read.hpp"
#include "kshard/kernels/host_copy.hpp"

namespace kshard::detail {

// The boxes of this rank's shard of `mapping` (one per run of rows times run of columns) in its
// row-major local storage of `element_bytes`-byte elements.
template <std::size_t N>
std::vector<BoxStorage> shard_boxes(const LayoutMapping<N>& mapping, std::uint64_t element_bytes) {
  std::vector<BoxStorage> boxes;
  const index_t width = mapping.cols.local_extent();
  const std::vector<IndexRun> col_runs = mapping.cols.runs();
  for (const IndexRun& rows : mapping.rows.runs())
    for (const IndexRun& cols : col_runs)
      boxes.push_back({{rows.global_begin, cols.global_begin},
                       {rows.size, cols.size},
                       {width, 1},
                       static_cast<std::uint64_t>(rows.local_begin * width + cols.local_begin) *
                           element_bytes});
  return boxes;
}

// The runs that move the pieces of `tensor` in file `file` into `boxes`, sorted by their place
// in the file and cut to MPI's int counts.
inline std::vector<ByteRun> runs_from_file(const io::StoredTensor& tensor, std::size_t file,
                                           const std::vector<BoxStorage>& boxes,
                                           std::uint64_t element_bytes) {
  std::vector<ByteRun> runs;
  for (const io::StoredPiece& piece : tensor.pieces) {
    if (piece.file != file) continue;
    const BoxStorage stored = stored_box(piece);
    for (const BoxStorage& box : boxes) append_shared_runs(stored, box, element_bytes, runs);
  }
  std::sort(runs.begin(), runs.end(),
            [](const ByteRun& a, const ByteRun& b) { return a.from < b.from; });
  return split_runs(runs, std::uint64_t{1} << 30);
}

// This rank's read of its `runs` of `file` into `data`, on a handle of its own:
// a rank opens only the files it reads, and no rank waits on another's files. Throws for a file
// that cannot be read or is shorter than when the checkpoint was opened.
inline void read_runs(const io::DataFile& file, const std::vector<ByteRun>& runs, void* data) {
  const ShardTypes types = byte_run_types(runs);
  MpiFile handle(file.path.string(), FileAccess::read);
  handle.read_shard(0, types, data);
  const std::uint64_t size = handle.size();
  handle.close();
  if (size < file.size)
    throw error(
        fmt::format("kshard::io: '{}' is {} bytes, shorter than the {} it had when the "
                    "checkpoint was opened (it changed since)",
                    file.path.string(), size, file.size));
}

// The collective read of `tensor` (pieces in `model`'s files) into `matrix`, whose shape and
// dtype were agreed on: this rank's read of each file it needs, one agreement, then a broadcast
// per replica group.
template <class ExecSpace, class M>
void read_pieces(const ExecSpace& space, const io::Checkpoint& model,
                 const io::StoredTensor& tensor, const M& matrix) {
  constexpr std::uint64_t element_bytes = sizeof(typename M::value_type);
  const auto& mesh = matrix.mesh();
  const auto host = host_mirror(matrix.local());
  fence(space, "kshard::io: before reading into a shard");
  std::vector<BoxStorage> boxes;
  if (transfers(matrix)) boxes = shard_boxes(matrix.mapping(), element_bytes);
  std::set<std::size_t> files;
  for (const io::StoredPiece& piece : tensor.pieces) files.insert(piece.file);
  agree(mesh.group(), attempt([&] {  // one agreement for all files: the same error everywhere
          for (const std::size_t f : files)
            if (auto runs = runs_from_file(tensor, f, boxes, element_bytes); !runs.empty())
              read_runs(model.data_files()[f], runs, host.data());
        }));
  if (auto group = replica_group<typename M::layout_type>(mesh))
    broadcast_bytes(host.data(), host.size() * element_bytes, *group);
  if (host.data() != matrix.local().data()) {
    Kokkos::deep_copy(space, matrix.local(), host);
    fence(space, "kshard::io: the shard is read (its host copy is freed)");
  }
}

// The boxes of rows `held` (global ids) of this rank's shard of `mapping`, its columns of row
// `held[k]` at row k of a row-major `held.size() x` local-columns buffer.
template <std::size_t N>
std::vector<BoxStorage> row_boxes(const LayoutMapping<N>& mapping, const std::vector<index_t>& held,
                                  std::uint64_t element_bytes) {
  std::vector<BoxStorage> boxes;
  const index_t width = mapping.cols.local_extent();
  const std::vector<IndexRun> col_runs = mapping.cols.runs();
  for (std::size_t k = 0; k < held.size(); ++k)
    for (const IndexRun& cols : col_runs)
      boxes.push_back(
          {{held[k], cols.global_begin},
           {1, cols.size},
           {width, 1},
           (k * static_cast<std::uint64_t>(width) + static_cast<std::uint64_t>(cols.local_begin)) *
               element_bytes});
  return boxes;
}

// Reads rows `ids` (sorted, unique, agreed on) of `tensor` into the same rows of `matrix`, whose
// shape and dtype were agreed on, leaving its other rows untouched: every rank holding a row
// (replicas too: the rows are few) reads its columns of it from each file whose pieces meet it,
// on its own handle; one agreement.
template <class ExecSpace, class M>
void read_rows(const ExecSpace& space, const io::Checkpoint& model, const io::StoredTensor& tensor,
               const M& matrix, const std::vector<index_t>& ids) {
  using T = typename M::value_type;
  const auto& map = matrix.mapping();
  std::vector<index_t> held, local;  // the ids this rank holds, and their local rows
  for (const index_t id : ids)
    if (const index_t row = map.rows.to_local(id); row != invalid_index) {
      held.push_back(id);
      local.push_back(row);
    }
  const std::vector<BoxStorage> boxes = row_boxes(map, held, sizeof(T));
  Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace> rows(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::io::rows"), held.size(),
      static_cast<std::size_t>(map.cols.local_extent()));
  std::set<std::size_t> files;
  for (const io::StoredPiece& piece : tensor.pieces) files.insert(piece.file);
  agree(matrix.mesh().group(), attempt([&] {
          for (const std::size_t f : files)
            if (auto runs = runs_from_file(tensor, f, boxes, sizeof(T)); !runs.empty())
              read_runs(model.data_files()[f], runs, rows.data());
        }));
  for (std::size_t k = 0; k < held.size(); ++k)
    Kokkos::deep_copy(space, Kokkos::subview(matrix.local(), local[k], Kokkos::ALL),
                      Kokkos::subview(rows, k, Kokkos::ALL));
  fence(space, "kshard::io: the rows are read (their host copy is freed)");
}

}  // namespace kshard::detail
