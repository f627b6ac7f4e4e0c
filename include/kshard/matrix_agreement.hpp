#pragma once

/// \file
/// What the ranks of a call on matrices must pass alike, described for an agreement
/// (comm/agreement.hpp): a layout's placements, a matrix's element type, shape and mesh, and the
/// agreement of a call that communicates within the tensor-parallel groups of a mesh. Internal
/// (namespace kshard::detail); here, above comm/, because comm knows no matrices.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/index.hpp"
#include "kshard/layout_dispatch.hpp"
#include "kshard/placement.hpp"

namespace kshard::detail {

// One placement as a number: kind, tensor dimension, and the reduction of a Partial or the
// name of a custom placement (the split factor is agreed on as a value of its own).
inline std::int64_t placement_code(const MeshDimAction& action, ReduceOp op) {
  std::int64_t extra = 0;
  if (action.kind == PlacementKind::partial) extra = static_cast<int>(op);
  if (action.kind == PlacementKind::custom) extra = fnv1a32(action.name);
  return static_cast<std::int64_t>(action.kind) + 8 * (action.tensor_dim + 1) + 8192 * extra;
}

inline std::string render_placement(std::int64_t code) {
  const auto kind = static_cast<PlacementKind>(code % 8);
  const std::int64_t dim = (code % 8192) / 8 - 1;
  const std::string text = placement_text(
      kind, static_cast<int>(dim), std::nullopt,
      kind == PlacementKind::partial ? static_cast<ReduceOp>(code / 8192) : ReduceOp::sum);
  if (kind != PlacementKind::custom) return text;
  return fmt::format("{} (name code {:#x})", text, code / 8192);
}

// The placements of layout `L` (kind, dimension, reduction and split factor per mesh dimension).
template <class L>
void same_layout(Agreement& agreement, const L& layout, std::string_view role) {
  const auto actions = layout.actions();
  for (std::size_t m = 0; m < L::rank; ++m) {
    agreement.same(fmt::format("the placement of {} on mesh dimension {}", role, m),
                   placement_code(actions[m], L::partial_op(m)), render_placement);
    agreement.same(fmt::format("the split factor of {} on mesh dimension {}", role, m),
                   actions[m].split_factor);
  }
}

// Everything about a matrix of `T` that its ranks must share: element type, global shape,
// layout.
template <class T, class L>
void same_shape_and_layout(Agreement& agreement, index_t rows, index_t cols, const L& layout,
                           std::string_view role) {
  agreement.same(fmt::format("the element type of {}", role), type_code<T>(), render_type);
  agreement.same(fmt::format("the number of rows of {}", role), rows);
  agreement.same(fmt::format("the number of columns of {}", role), cols);
  same_layout(agreement, layout, role);
}

// A mesh as kshard writes it everywhere (its {fmt} formatter too): its names and extents in
// dimension order, "Mesh(dp=2, tp=2)".
template <class Mesh>
std::string mesh_text(const Mesh& mesh) {
  std::string text = "Mesh(";
  for (std::size_t m = 0; m < mesh.shape().size(); ++m)
    text += fmt::format("{}{}={}", m > 0 ? ", " : "", mesh.names()[m], mesh.shape()[m]);
  return text + ")";
}

// A mesh by its shape and names in dimension order: meshes of other shapes over one
// communicator share its duplicate, and the same layout on a `{4, 1}` and a `{2, 2}` mesh gives
// the ranks other coordinates, so other rows.
template <class Mesh>
void same_mesh(Agreement& agreement, std::string what, const Mesh& mesh) {
  same_text(agreement, std::move(what), mesh_text(mesh));
}

// Everything about a matrix that its ranks must share: element type, global shape, layout, mesh.
template <class M>
void same_matrix(Agreement& agreement, const M& matrix, std::string_view role) {
  same_shape_and_layout<typename M::value_type>(agreement, matrix.rows(), matrix.cols(),
                                                matrix.layout(), role);
  same_mesh(agreement, fmt::format("the mesh of {}", role), matrix.mesh());
}

// The agreement of a call that communicates within the groups along mesh dimension `split` of
// `mesh` (the tp groups). What decides the group (`mesh_wide` adds it: the mesh and `tp_dim`, or
// a matrix whose layout names `split`) is agreed over the whole mesh first, with every
// rank's own `problem`: a rank that chose another group would otherwise wait in one the others
// never join. Then the values only the ranks of one group must share (`in_group` adds them;
// other groups may differ): in that same agreement where the group is the whole mesh, else
// within the group, whose outcome one more agreement over the mesh gives every rank, so every
// rank throws the same error. Agreements: 1, or 3 where the groups are proper subgroups of more
// than one rank.
template <class Mesh, class MeshWide, class InGroup>
void agree_in_groups(const Mesh& mesh, std::size_t split, const std::optional<std::string>& problem,
                     MeshWide&& mesh_wide, InGroup&& in_group) {
  const int group_size = split < mesh.shape().size() ? mesh.extent(split) : 1;
  const bool whole = group_size == mesh.size();
  Agreement agreement(mesh.group());
  mesh_wide(agreement);
  agreement.problem(problem);
  // Ranks that disagree on `whole` disagree on what `mesh_wide` adds (which decides `split`):
  // those slots come first and name the difference.
  if (whole) in_group(agreement.within("the ranks of a tp group"));
  agreement.settle();
  if (whole || group_size == 1) return;
  Agreement group(mesh.dim_group(split), "the ranks of a tp group");
  in_group(group);
  agree(mesh.group(), group.outcome());
}

}  // namespace kshard::detail
