#pragma once

// The run-time checks of a redistribution's arguments, settled in one agreement so that every
// rank refuses alike: the matrix, the target mesh and layout the same on every rank, the
// target's split factors, and, for a move into an existing matrix, its shape, contiguous shards
// that share no memory, and one communicator.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/detail/operation.hpp"
#include "kshard/dist_matrix.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/mesh.hpp"

namespace kshard::detail {

// The agreement every redistribution starts with: the matrix, the target mesh (rank, shape and
// names) and the target layout must be the same on every rank; the target's split factors >= 1.
template <class M, class LT, std::size_t NT>
Agreement redistribute_agreement(const M& matrix, const Mesh<NT>& target_mesh,
                                 const LT& target_layout) {
  Agreement agreement(matrix.mesh().group());
  same_matrix(agreement, matrix, "the matrix");
  same_mesh(agreement, "the target mesh", target_mesh);
  same_layout(agreement, target_layout, "the target");
  const auto actions = target_layout.actions();
  for (std::size_t m = 0; m < NT; ++m)
    if (actions[m].split_factor < 1)
      agreement.problem(
          fmt::format("kshard::{}: target StridedShard on mesh dimension {} ('{}') has split "
                      "factor {}; it must be >= 1",
                      operation_name(), m, target_mesh.names()[m], actions[m].split_factor));
  return agreement;
}

// Why `target`'s shard may not be written from `matrix`'s on this rank: they share memory.
template <class A, class B>
std::optional<std::string> shared_storage_problem(const A& matrix, const B& target,
                                                  std::string_view who) {
  const auto* in = matrix.local().data();
  const auto* out = target.local().data();
  const auto in_size = matrix.local().size();
  const auto out_size = target.local().size();
  if (in_size == 0 || out_size == 0 || !(in < out + out_size && out < in + in_size))
    return std::nullopt;
  return fmt::format(
      "{}: on rank {} the target's shard shares memory with the matrix's; redistribute into "
      "separate storage",
      who, matrix.mesh().my_rank());
}

template <std::size_t N, std::size_t NT>
std::optional<std::string> check_same_communicator(const Mesh<N>& mesh, const Mesh<NT>& target,
                                                   const char* what) {
  if (mesh.group().same_ranks_as(target.group())) return std::nullopt;
  return fmt::format(
      "kshard::{}: the target {} ({} ranks) is over a different communicator than the "
      "matrix's mesh ({} ranks); both must hold the same processes in the same order",
      operation_name(), what, target.size(), mesh.size());
}

// The checks of redistribute_into and of plan_redistribute(matrix, target), settled in one
// agreement; `who` names the entry point in messages.
template <class T, class L, class LT, class E, class S>
void agree_into(const DistMatrix<T, L, E, S>& matrix, const DistMatrix<T, LT, E, S>& target,
                const char* who) {
  const auto& mesh = matrix.mesh();
  std::optional<std::string> problem;
  const std::string name = fmt::format("kshard::{}", who);
  if (target.rows() != matrix.rows() || target.cols() != matrix.cols())
    problem = fmt::format("{}: the target is {} x {} but the matrix is {} x {}", name,
                          target.rows(), target.cols(), matrix.rows(), matrix.cols());
  else if (!matrix.local().span_is_contiguous() || !target.local().span_is_contiguous())
    problem = fmt::format("{}: on rank {} a shard is not contiguous", name, mesh.my_rank());
  else if (auto shared = shared_storage_problem(matrix, target, name))
    problem = std::move(shared);
  else
    problem = check_same_communicator(mesh, target.mesh(), "matrix's mesh");
  // The target's shape is checked against the agreed matrix's on each rank, its layout and
  // mesh are agreed on: together, the whole target.
  redistribute_agreement(matrix, target.mesh(), target.layout()).problem(problem).settle();
}

}  // namespace kshard::detail
