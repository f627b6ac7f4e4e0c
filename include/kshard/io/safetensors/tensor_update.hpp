#pragma once

/// \file
/// What a write puts into a checkpoint: a matrix as the new value of a tensor (`replace`) or of
/// some of its rows (`replace_rows`). The writes themselves: kshard/io/safetensors.hpp.

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kshard/comm/agreement.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/io/engine/collective.hpp"
#include "kshard/io/safetensors/file.hpp"
#include "kshard/matrix_agreement.hpp"

namespace kshard::detail {
struct UpdateAccess;  // the writes' view of an update (io/safetensors/write.hpp)
}  // namespace kshard::detail

namespace kshard::io {

/// A matrix to write over the tensor of the same name (`replace`), or over some of its rows
/// (`replace_rows`): its element type, shape and communicator, and how it packs its part.
/// Holds the matrix (a shared view).
class TensorUpdate {
 public:
  /// The tensor it replaces.
  [[nodiscard]] const std::string& name() const { return name_; }
  /// The rows it replaces (sorted, unique), or nothing for the whole tensor.
  [[nodiscard]] const std::optional<std::vector<index_t>>& rows() const { return row_ids_; }

 private:
  template <class ExecSpace, ValuedMatrix M>
  requires detail::ExecutionSpaceFor<ExecSpace, M>
  friend TensorUpdate replace(const ExecSpace& space, std::string name, const M& matrix);
  template <class ExecSpace, ValuedMatrix M>
  requires detail::ExecutionSpaceFor<ExecSpace, M>
  friend TensorUpdate replace_rows(const ExecSpace& space, std::string name, const M& matrix,
                                   std::vector<index_t> ids);
  friend struct detail::UpdateAccess;

  std::string name_;
  Dtype dtype_ = Dtype::F32;
  index_t rows_ = 0;
  index_t cols_ = 0;
  // Adds the matrix (element type, shape, layout, mesh) to an agreement, named as `role`: a
  // matrix laid out otherwise on one rank would have it write its part by its own layout.
  std::function<void(detail::Agreement&, std::string_view role)> same_matrix_;
  comm::Group group_;
  std::optional<std::vector<index_t>> row_ids_;
  std::function<detail::UpdatePart(const std::optional<std::vector<index_t>>&)> part_;
};

/// `matrix` as the new value of tensor `name`; its dtype and shape must be the tensor's. The
/// write copies the matrix to host memory on `space` (fenced there) when it writes.
template <class ExecSpace, ValuedMatrix M>
requires detail::ExecutionSpaceFor<ExecSpace, M> TensorUpdate replace(const ExecSpace& space,
                                                                      std::string name,
                                                                      const M& matrix) {
  TensorUpdate update;
  update.name_ = std::move(name);
  update.dtype_ = dtype_of<typename M::value_type>();
  update.rows_ = matrix.rows();
  update.cols_ = matrix.cols();
  update.same_matrix_ = [matrix](detail::Agreement& agreement, std::string_view role) {
    detail::same_matrix(agreement, matrix, role);
  };
  update.group_ = matrix.mesh().group();
  update.part_ = [space, matrix](const std::optional<std::vector<index_t>>& rows) {
    return detail::update_part(space, matrix, rows);
  };
  return update;
}

/// `replace(space, name, matrix)` on a default instance of the matrix's execution space.
template <ValuedMatrix M>
TensorUpdate replace(std::string name, const M& matrix) {
  return replace(typename M::execution_space{}, std::move(name), matrix);
}

/// Rows `ids` (global row ids in [0, rows), any order, repeats ignored) of `matrix` as the new
/// value of the same rows of tensor `name`; for `write_rows_in_place`.
template <class ExecSpace, ValuedMatrix M>
requires detail::ExecutionSpaceFor<ExecSpace, M> TensorUpdate
replace_rows(const ExecSpace& space, std::string name, const M& matrix, std::vector<index_t> ids) {
  TensorUpdate update = replace(space, std::move(name), matrix);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  update.row_ids_ = std::move(ids);
  return update;
}

/// `replace_rows(space, name, matrix, ids)` on a default instance of the matrix's execution
/// space.
template <ValuedMatrix M>
TensorUpdate replace_rows(std::string name, const M& matrix, std::vector<index_t> ids) {
  return replace_rows(typename M::execution_space{}, std::move(name), matrix, std::move(ids));
}

}  // namespace kshard::io
