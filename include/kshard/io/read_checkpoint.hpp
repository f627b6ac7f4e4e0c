#pragma once

/// \file
/// A checkpoint's tensors read into `DistMatrix`es, whatever form stores them (one file, an
/// indexed folder, per-rank shards at any world size): any layout on any mesh at any rank count.
///
///     kshard::io::Checkpoint model(mesh, "ckpt/epoch_0_step_1000/model");   // 8 shards
///     auto embed = kshard::io::read_matrix<float>(model, "model.embed_tokens.weight", mesh,
///                                                 kshard::Layout<kshard::Shard<0>>{});  // 3 ranks
///
/// Costs. A tensor stored whole in one file is read as `read_matrix` reads a file (see
/// io/safetensors.hpp). A tensor in pieces: for each file holding one, one collective open and
/// one `MPI_File_read_at_all` in which each rank holding a first copy of its block reads
/// exactly the bytes where the piece meets its block (a file view of those runs, coalesced:
/// a row-wise piece into a row-wise block is one run); then one broadcast per replica group.
/// Memory: the shard, and the run lists (24 bytes per run of contiguous bytes).

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/io/checkpoint.hpp"
#include "kshard/io/checkpoint/read_pieces.hpp"
#include "kshard/io/model/stored_tensor.hpp"
#include "kshard/io/safetensors/read.hpp"
#include "kshard/mesh.hpp"

namespace kshard::detail {

// Why tensor `name` of `model` cannot be a rows x cols matrix of T (rows, cols < 0: any shape).
template <class T>
std::optional<std::string> stored_matrix_problem(const io::Checkpoint& model, std::string_view name,
                                                 index_t rows = -1, index_t cols = -1) {
  const std::string where = fmt::format("'{}'", model.path().string());
  if (!model.contains(name))
    return fmt::format("kshard::io: {} has no tensor {}", where, in_quotes(name));
  const io::StoredTensor& tensor = model.tensor(name);
  return shape_problem<T>(name, where, tensor.dtype, tensor.shape, rows, cols);
}

// Reads `tensor` of `model` into `matrix` (shape and dtype agreed on): a whole tensor as its
// file is read, pieces piece by piece.
template <class ExecSpace, class M>
void read_stored(const ExecSpace& space, const io::Checkpoint& model,
                 const io::StoredTensor& tensor, const M& matrix) {
  if (tensor.pieces.size() == 1 && model.form() != io::CheckpointForm::dcp) {
    const io::SafetensorsFile& file = model.files()[tensor.pieces[0].file];
    read_shard(space, file, *file.header().find(tensor.name), matrix);
  } else {
    read_pieces(space, model, tensor, matrix);
  }
}

}  // namespace kshard::detail

namespace kshard::io {

/// Reads tensor `name` of `model` as a `DistMatrix<T, L, ExecSpace, MemSpace>` over `mesh`, in
/// any layout, whatever form stores it (see the file comment for the costs). Collective over
/// the mesh. Every rank throws the same `kshard::error`, with nothing allocated, for a missing
/// tensor, a dtype other than T's, a shape that is not 2-D, layouts, names, paths or element
/// types that differ between ranks, and a file shorter than its header says. Copies to device
/// memory run on `space`.
template <class T, class ExecSpace, class MemSpace = typename ExecSpace::memory_space,
          std::size_t N, class L>
requires Kokkos::is_execution_space<ExecSpace>::value DistMatrix<T, L, ExecSpace, MemSpace>
read_matrix(const ExecSpace& space, const Checkpoint& model, std::string_view name,
            const Mesh<N>& mesh, const L& layout) {
  static_assert(!L::has_partial,
                "kshard::io::read_matrix: a Partial layout holds addends, not values; read "
                "into Replicate or Shard and redistribute");
  const detail::Operation operation("io::read_matrix");
  detail::agree_on_new_matrix<T>(mesh, layout, name, "the checkpoint path", model.path().string(),
                                 detail::stored_matrix_problem<T>(model, name));

  const StoredTensor& tensor = model.tensor(name);
  DistMatrix<T, L, ExecSpace, MemSpace> matrix(mesh, layout, tensor.shape[0], tensor.shape[1],
                                               unfilled, std::string(name));  // the read fills it
  detail::advise_filled_whole(matrix.local());
  detail::read_stored(space, model, tensor, matrix);
  return matrix;
}

/// `read_matrix(space, model, name, mesh, layout)` on a default instance of `ExecSpace`.
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace,
          class MemSpace = typename ExecSpace::memory_space, std::size_t N, class L>
DistMatrix<T, L, ExecSpace, MemSpace> read_matrix(const Checkpoint& model, std::string_view name,
                                                  const Mesh<N>& mesh, const L& layout) {
  return read_matrix<T, ExecSpace, MemSpace>(ExecSpace{}, model, name, mesh, layout);
}

/// Reads tensor `name` of `model` into the existing `matrix`, as `read_matrix` reads. Collective
/// over its mesh; every rank throws the same `kshard::error`, with `matrix` unchanged, for the
/// refusals of `read_matrix` and a tensor whose shape is not the matrix's.
template <class ExecSpace, ValuedMatrix M>
requires detail::ExecutionSpaceFor<ExecSpace, M>
void read_into(const ExecSpace& space, const Checkpoint& model, std::string_view name,
               const M& matrix) {
  using T = typename M::value_type;
  const detail::Operation operation("io::read_into");
  detail::Agreement agreement(matrix.mesh().group());
  detail::same_read_into(agreement, matrix, name, "the checkpoint path", model.path().string());
  agreement.problem(detail::stored_matrix_problem<T>(model, name, matrix.rows(), matrix.cols()));
  agreement.settle();
  detail::read_stored(space, model, model.tensor(name), matrix);
}

/// `read_into(space, model, name, matrix)` on a default instance of the matrix's execution
/// space.
template <ValuedMatrix M>
void read_into(const Checkpoint& model, std::string_view name, const M& matrix) {
  read_into(typename M::execution_space{}, model, name, matrix);
}

/// Reads rows `ids` (any order, repeats ignored) of tensor `name` of `model` into the same rows
/// of the existing `matrix`, leaving its other rows as they are: what a repair needs of an LM
/// head, whose other rows it never reads (a matrix allocated `kshard::unfilled` and filled only
/// there costs no memory traffic beyond those rows). Collective over its mesh; every rank
/// throws the same `kshard::error`, with `matrix` unchanged, for the refusals of `read_into`,
/// ids that differ between ranks and an id outside [0, rows). Cost: each rank holding one of
/// the rows reads its columns of it (one read per file whose pieces meet them, on its own
/// handle), one agreement; memory: those rows on the host. Copies to device memory run on
/// `space`.
template <class ExecSpace, ValuedMatrix M>
requires detail::ExecutionSpaceFor<ExecSpace, M>
void read_rows_into(const ExecSpace& space, const Checkpoint& model, std::string_view name,
                    const M& matrix, std::vector<index_t> ids) {
  using T = typename M::value_type;
  const detail::Operation operation("io::read_rows_into");
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  detail::Agreement agreement(matrix.mesh().group());
  detail::same_read_into(agreement, matrix, name, "the checkpoint path", model.path().string());
  detail::same_row_ids(agreement, "to read", name, ids, matrix.rows());
  agreement.problem(detail::stored_matrix_problem<T>(model, name, matrix.rows(), matrix.cols()));
  agreement.settle();
  detail::read_rows(space, model, model.tensor(name), matrix, ids);
}

/// `read_rows_into(space, model, name, matrix, ids)` on a default instance of the matrix's
/// execution space.
template <ValuedMatrix M>
void read_rows_into(const Checkpoint& model, std::string_view name, const M& matrix,
                    std::vector<index_t> ids) {
  read_rows_into(typename M::execution_space{}, model, name, matrix, std::move(ids));
}

}  // namespace kshard::io
