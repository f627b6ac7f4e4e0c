#pragma once

/// \file
/// Rows of a matrix to write over the same rows of a tensor while a checkpoint is converted
/// (`io::convert_checkpoint`): a repair's few hundred rows, gathered so that every rank holds
/// their bytes and places them wherever its share of the output meets them, whatever the form
/// (per-rank shards, consolidated) the output takes.
///
///     auto patch = kshard::io::patch_rows("model.embed_tokens.weight", embed,
///     report.repaired_row_ids); kshard::io::convert_checkpoint(mesh, model, "repaired", options,
///     {patch});
///
/// Cost: one agreement, then one all-reduce of the rows' bytes (each row's first copies give
/// their columns); memory on every rank: the rows (ids x columns x element size).

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/model/row_patch.hpp"
#include "kshard/io/safetensors/file.hpp"
#include "kshard/kernels/copies.hpp"
#include "kshard/matrix_agreement.hpp"

namespace kshard::io {

/// Collective over the matrix's mesh: rows `ids` (any order, repeats ignored) of `matrix` as the
/// new value of the same rows of tensor `name`, on every rank. Every rank throws the same
/// `kshard::error` for names, ids or matrices that differ between ranks and for an id outside
/// [0, rows). Copies the matrix to host memory on `space` (fenced there).
template <class ExecSpace, ValuedMatrix M>
requires detail::ExecutionSpaceFor<ExecSpace, M> RowPatch patch_rows(const ExecSpace& space,
                                                                     std::string name,
                                                                     const M& matrix,
                                                                     std::vector<index_t> ids) {
  using T = typename M::value_type;
  const detail::Operation operation("io::patch_rows");
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  detail::Agreement agreement(matrix.mesh().group());
  detail::same_text(agreement, "the tensor name", name);
  detail::same_matrix(agreement, matrix, "the matrix");
  detail::same_row_ids(agreement, "to patch", name, ids, matrix.rows());
  agreement.settle();
  RowPatch patch{std::move(name), dtype_of<T>(), matrix.rows(), matrix.cols(), std::move(ids), {}};
  const std::size_t row_bytes = static_cast<std::size_t>(patch.cols) * sizeof(T);
  // int64 lanes: each byte has one contributor (a first copy), so the sum is that byte.
  std::vector<std::int64_t> lanes((patch.ids.size() * row_bytes + 7) / 8, 0);
  if (detail::transfers(matrix)) {
    const auto host = detail::to_host(space, matrix.local(), "kshard::io: the rows of a patch");
    const auto& map = matrix.mapping();
    auto* out = reinterpret_cast<std::byte*>(lanes.data());
    for (std::size_t k = 0; k < patch.ids.size(); ++k)
      if (const index_t local = map.rows.to_local(patch.ids[k]); local != invalid_index)
        for (const IndexRun& run : map.cols.runs())
          std::memcpy(out + k * row_bytes + static_cast<std::size_t>(run.global_begin) * sizeof(T),
                      &host(local, run.local_begin),
                      static_cast<std::size_t>(run.size) * sizeof(T));
  }
  matrix.mesh().group().allreduce(lanes.data(), static_cast<std::int64_t>(lanes.size()),
                                  ReduceOp::sum);
  patch.bytes.resize(patch.ids.size() * row_bytes);
  if (!patch.bytes.empty()) std::memcpy(patch.bytes.data(), lanes.data(), patch.bytes.size());
  return patch;
}

/// `patch_rows(space, name, matrix, ids)` on a default instance of the matrix's execution space.
template <ValuedMatrix M>
RowPatch patch_rows(std::string name, const M& matrix, std::vector<index_t> ids) {
  return patch_rows(typename M::execution_space{}, std::move(name), matrix, std::move(ids));
}

}  // namespace kshard::io
