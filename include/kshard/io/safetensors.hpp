#pragma once

/// \file
/// Safetensors checkpoints read into and written from `DistMatrix`es with collective MPI-IO:
/// each rank reads or writes only the bytes of the rows and columns it holds.
///
///     kshard::io::SafetensorsFile file(mesh, "model.safetensors");   // rank 0 reads the header
///     auto embed = kshard::io::read_matrix<float>(file, "embed_tokens.weight", mesh, layout);
///     ...repair...
///     kshard::io::write_safetensors(mesh, file, "repaired.safetensors",
///                                   {kshard::io::replace("embed_tokens.weight", embed)});
///
/// Costs. Opening: every rank reads the 8-byte prefix and the header (pread) and parses them;
/// one agreement compares their size and digest (so every rank throws the same error for a bad
/// file, and a rank that sees another file under the path is refused).
/// Reading a matrix: one `MPI_File_read_at_all` in which only the first copy of each block is
/// read (ranks on a Replicate mesh dimension other than coordinate 0 read nothing), then one
/// broadcast per replica group; a layout that splits columns is read as blocks of whole rows
/// (one contiguous read per rank) and redistributed in memory. Writing a new file: the bytes of
/// every untouched tensor (and the header) are copied in equal contiguous parts by all ranks, each
/// replaced matrix is written by the first copies with one `MPI_File_write_at_all`, then fsync,
/// close and a rename: the file appears complete under its name or not at all.
///
/// The pieces, in io/safetensors/: file.hpp opens a file (`SafetensorsFile`), tensor_update.hpp
/// says what a write puts where (`replace`, `replace_rows`), read.hpp, write.hpp and undo.hpp
/// are the three operations, over io/engine/ (posix.hpp: pread, pwrite, durable files;
/// mpi_file.hpp: MPI-IO).
///
/// Files are untrusted input: the header is validated before any size in it is used (see
/// io/safetensors/header.hpp), and every rank throws the same `kshard::error`, with nothing
/// written, for a file that is missing, truncated or lies about its contents, and for a tensor
/// that is missing or whose dtype or shape does not match the matrix. Elements are read as they
/// are stored: F32 into float, F64 into double, BF16 into kshard::bf16, F16 into kshard::f16;
/// other dtypes are listed in the header but refused as matrices.

#include <Kokkos_Core.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/error.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/engine/io_stats.hpp"
#include "kshard/io/engine/paths.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/model/durability.hpp"
#include "kshard/io/safetensors/file.hpp"
#include "kshard/io/safetensors/header.hpp"
#include "kshard/io/safetensors/read.hpp"
#include "kshard/io/safetensors/tensor_update.hpp"
#include "kshard/io/safetensors/undo.hpp"
#include "kshard/io/safetensors/write.hpp"
#include "kshard/mesh.hpp"

namespace kshard::io {

/// Reads tensor `name` of `file` as a `DistMatrix<T, L, ExecSpace, MemSpace>` over `mesh`:
/// each rank that holds the first copy of a block reads exactly that block's bytes (one
/// `MPI_File_read_at_all` through a datatype built from the mapping's runs), or, for a layout
/// that splits columns over more than one rank, its block of whole rows, which one
/// `redistribute_into` then moves to the layout (memory: that block and the move's buffers);
/// the replicas receive it by broadcast. Collective over the mesh. Every rank throws the same
/// `kshard::error`, with nothing allocated, for a missing tensor, a dtype other than T's, a
/// shape that is not 2-D, layouts, names or element types that differ between ranks, and a
/// file that is shorter than its header says. Copies to device memory run on `space`.
template <class T, class ExecSpace, class MemSpace = typename ExecSpace::memory_space,
          std::size_t N, class L>
requires Kokkos::is_execution_space<ExecSpace>::value DistMatrix<T, L, ExecSpace, MemSpace>
read_matrix(const ExecSpace& space, const SafetensorsFile& file, std::string_view name,
            const Mesh<N>& mesh, const L& layout) {
  static_assert(!L::has_partial,
                "kshard::io::read_matrix: a Partial layout holds addends, not values; read "
                "into Replicate or Shard and redistribute");
  const detail::Operation operation("io::read_matrix");
  detail::agree_on_new_matrix<T>(mesh, layout, name, "the file path", file.path().string(),
                                 detail::matrix_problem<T>(file, name));

  const TensorEntry& entry = *file.header().find(name);
  DistMatrix<T, L, ExecSpace, MemSpace> matrix(mesh, layout, entry.shape[0], entry.shape[1],
                                               unfilled,  // the read fills it
                                               std::string(name));
  detail::advise_filled_whole(matrix.local());
  detail::read_shard(space, file, entry, matrix);
  return matrix;
}

/// `read_matrix(space, file, name, mesh, layout)` on a default instance of `ExecSpace`.
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace,
          class MemSpace = typename ExecSpace::memory_space, std::size_t N, class L>
DistMatrix<T, L, ExecSpace, MemSpace> read_matrix(const SafetensorsFile& file,
                                                  std::string_view name, const Mesh<N>& mesh,
                                                  const L& layout) {
  return read_matrix<T, ExecSpace, MemSpace>(ExecSpace{}, file, name, mesh, layout);
}

/// Reads tensor `name` of `file` into the existing `matrix` (a training loop's buffers,
/// reloaded without allocating), as `read_matrix` reads. Collective over its mesh; every rank
/// throws the same `kshard::error`, with `matrix` unchanged, for the refusals of `read_matrix`
/// and a tensor whose shape is not the matrix's. Copies to device memory run on `space`, which
/// is also fenced before MPI writes into host memory the matrix shares.
template <class ExecSpace, ValuedMatrix M>
requires detail::ExecutionSpaceFor<ExecSpace, M>
void read_into(const ExecSpace& space, const SafetensorsFile& file, std::string_view name,
               const M& matrix) {
  using T = typename M::value_type;
  const detail::Operation operation("io::read_into");
  detail::Agreement agreement(matrix.mesh().group());
  detail::same_read_into(agreement, matrix, name, "the file path", file.path().string());
  agreement.problem(detail::matrix_problem<T>(file, name, matrix.rows(), matrix.cols()));
  agreement.settle();
  detail::read_shard(space, file, *file.header().find(name), matrix);
}

/// `read_into(space, file, name, matrix)` on a default instance of the matrix's execution
/// space.
template <ValuedMatrix M>
void read_into(const SafetensorsFile& file, std::string_view name, const M& matrix) {
  read_into(typename M::execution_space{}, file, name, matrix);
}

/// Writes a new checkpoint at `target`: the file `source` with the tensors (or rows) named by
/// `updates` replaced by their matrices (same dtype and shape, so the header is kept byte for
/// byte). The bytes outside the tensors replaced whole are copied in equal parts by all ranks;
/// each matrix is written by the first copies of its blocks (one `MPI_File_write_at_all`); the
/// file is written as `target` + ".kshard-partial" (starting with kshard's temporary marker
/// until its length prefix is written last), synced, then renamed, so `target` is complete or
/// untouched, and `source` is only read. Collective over `mesh`, which every matrix must live
/// on. Every rank throws the same `kshard::error`, with no file touched, for a missing tensor, a
/// dtype or shape that differs from the tensor's, a tensor given twice, row ids out of range,
/// arguments that differ between ranks, a target or temporary name that names the source file
/// (by device and inode: through links and `..` too), a temporary name that holds a file kshard
/// did not write, a folder that does not exist; and for any failed read or write, with `target`
/// untouched. `durability`: whether the file is fsynced before its rename (see Durability).
template <std::size_t N>
void write_safetensors(const Mesh<N>& mesh, const SafetensorsFile& source,
                       const std::filesystem::path& target,
                       const std::vector<TensorUpdate>& updates,
                       Durability durability = Durability::fsync) {
  const detail::Operation operation("io::write_safetensors");
  const comm::Group& group = mesh.group();
  const std::filesystem::path partial = detail::partial_path(target);
  detail::Agreement agreement(group);
  detail::same_text(agreement, "the output file", target.string());
  detail::same_text(agreement, "the durability", std::string(to_string(durability)));
  detail::check_updates(agreement, source, updates, group);
  if (mesh.my_rank() == 0) agreement.problem(detail::new_file_problem(source, target));
  agreement.settle();
  const detail::DurabilityScope scope(durability);
  bool created = false;  // rank 0 made the temporary: its to remove after a failure
  try {
    detail::agree(group, detail::attempt([&] {
                    if (mesh.my_rank() != 0) return;
                    ::close(detail::create_temporary(partial));
                    created = true;
                  }));
    detail::write_partial(group, source, partial, updates);
    detail::agree(group, detail::attempt([&] {
                    if (mesh.my_rank() != 0) return;
                    const detail::ScopedFd fd(::open(partial.c_str(), O_WRONLY | O_CLOEXEC));
                    detail::seal_temporary(fd.get(), partial,
                                           detail::length_prefix(source.header()));
                    detail::publish(partial, target);
                  }));
  } catch (const error&) {
    if (created) ::unlink(partial.c_str());
    throw;
  }
}

/// Restores the rows that `write_rows_in_place` replaced, from its undo file `undo`, into the
/// checkpoint the undo file names, fsyncs, verifies, and removes `undo`. Collective over
/// `mesh`; rank 0 checks and writes. Every rank throws the same `kshard::error`, with the
/// checkpoint untouched, for an undo file that is missing, not kshard's, of an older format,
/// the checkpoint itself, or made for another file: one whose device and inode, size, tensors,
/// dtypes or widths differ from those recorded, or, after a write that finished, whose rows
/// are not those the write left (hashed; so a second undo from a copy of the file is refused).
template <std::size_t N>
void undo_in_place(const Mesh<N>& mesh, const std::filesystem::path& undo) {
  const detail::Operation operation("io::undo_in_place");
  const SafetensorsFile saved(mesh, undo);
  std::string target_path;
  detail::agree(mesh.group(), detail::attempt([&] {
                  static_cast<void>(detail::undo_field(saved, detail::undo_format));
                  target_path = detail::undo_field(saved, detail::undo_target);
                }));
  const SafetensorsFile target(mesh, target_path);
  std::vector<detail::UndoPart> parts;
  detail::agree(mesh.group(), detail::attempt([&] {
                  if (mesh.my_rank() == 0) parts = detail::check_undo(saved, target);
                }));
  detail::agree(mesh.group(), detail::attempt([&] {
                  if (mesh.my_rank() != 0) return;
                  detail::restore_rows(parts, target);
                  std::filesystem::remove(undo);
                }));
}

/// Writes the rows of `updates` (made with `replace_rows`) into `file` itself, and nothing
/// else: first rank 0 saves the rows' current bytes to the undo file `undo` (written under a
/// marked temporary name, fsynced, renamed) with the file's device, inode and size; then the
/// ranks holding first copies write their parts of the rows (one `MPI_File_write_at_all` per
/// tensor), fsync, and read them back to verify; then rank 0 records the hash of the rows as
/// written in the undo file. A failed write or verification restores the rows from `undo`;
/// after success `undo` stays, for `undo_in_place`. Collective over `mesh`. Every rank throws
/// the same `kshard::error`, nothing written, for the refusals of `write_safetensors`, an
/// update without rows, a file whose mode is read-only, an `undo` (or its temporary name) that
/// is the checkpoint, by identity, an `undo` that already exists (an earlier write not undone
/// or removed), and a file at its temporary name that kshard did not write. Rank 0 holds all
/// replaced rows in memory while it writes the undo file.
template <std::size_t N>
void write_rows_in_place(const Mesh<N>& mesh, const SafetensorsFile& file,
                         const std::vector<TensorUpdate>& updates,
                         const std::filesystem::path& undo) {
  const detail::Operation operation("io::write_rows_in_place");
  const comm::Group& group = mesh.group();
  detail::Agreement agreement(group);
  detail::same_text(agreement, "the undo file", undo.string());
  detail::check_updates(agreement, file, updates, group);
  for (const TensorUpdate& u : updates)
    if (!u.rows())
      agreement.problem(
          fmt::format("kshard::io: the update of tensor {} has no rows; in-place "
                      "writes take replace_rows(name, matrix, ids)",
                      detail::in_quotes(u.name())));
  if (mesh.my_rank() == 0) agreement.problem(detail::in_place_problem(file, undo));
  agreement.settle();
  std::optional<detail::UndoImage> image;  // rank 0's
  detail::agree(group, detail::attempt([&] {
                  if (mesh.my_rank() == 0)
                    image = detail::write_undo(file, detail::row_sets(file, updates), undo);
                }));
  try {
    detail::write_rows_and_verify(group, file, updates);
    detail::agree(group, detail::attempt([&] {
                    if (mesh.my_rank() == 0)
                      detail::mark_undo_written(file, detail::row_sets(file, updates), *image,
                                                undo);
                  }));
  } catch (const error& e) {
    undo_in_place(mesh, undo);
    throw error(fmt::format("{} (the rows were restored from '{}')", e.what(), undo.string()));
  }
}

}  // namespace kshard::io
