#pragma once

// The MPI backend of kshard's communication layer: the data collectives of comm::Group on
// Kokkos views. MPI is ordered with the host, not with a stream, so each collective first
// fences the instance that wrote its buffers (that instance only, once), or goes through host
// copies made on that instance when MPI cannot read the views' memory (comm/staging.hpp). A
// backend is one struct with these static functions and a `Handle` made from the group's MPI
// communicator; CMake's KSHARD_COMM_BACKEND picks the header (docs/design.md, section 11).

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "kshard/comm/mpi.hpp"
#include "kshard/comm/reduce_op.hpp"
#include "kshard/comm/staging.hpp"
#include "kshard/detail/operation.hpp"

namespace kshard::comm {

// The MPI reduction for a kshard reduction. `avg` reduces as a sum: the callers divide by the
// number of addends, which only they know (a Partial may average over several dimensions).
inline MPI_Op native_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    case ReduceOp::sum:
    case ReduceOp::avg:
      break;
  }
  return MPI_SUM;
}

/// The MPI backend: each collective fences (or stages through the host) the instance that
/// wrote its views, then calls MPI on the group's communicator (a CommBackend, comm/backend.hpp).
struct MpiBackend {
  /// What the backend keeps per group: here the group's own communicator.
  using Handle = MPI_Comm;
  /// The handle of a group whose communicator is `comm`.
  static Handle make_handle(MPI_Comm comm) { return comm; }

  /// Reduces `view` over the group in place with `op`.
  template <class ExecSpace, class View>
  static void allreduce(Handle comm, const ExecSpace& space, const View& view, ReduceOp op) {
    const int count = element_count(view);
    detail::with_mpi_access(space, view, true, true, [&](auto* data) {
      detail::allreduce(data, count, native_op(op), comm);
    });
  }

  /// Reduces `send` over the group into `recv` with `op`.
  template <class ExecSpace, class Send, class Recv>
  static void allreduce(Handle comm, const ExecSpace& space, const Send& send, const Recv& recv,
                        ReduceOp op) {
    const int count = element_count(send);
    detail::with_mpi_access(space, send, recv, [&](const auto* s, auto* r) {
      detail::allreduce(s, r, count, native_op(op), comm);
    });
  }

  /// Copies `root`'s `view` into every rank's.
  template <class ExecSpace, class View>
  static void bcast(Handle comm, const ExecSpace& space, const View& view, int root) {
    const int count = element_count(view);
    const bool is_root = detail::comm_rank(comm) == root;
    detail::with_mpi_access(space, view, is_root, !is_root,
                            [&](auto* data) { detail::broadcast(data, count, root, comm); });
  }

  /// Every rank's `send` into every rank's `recv`, at `displs` (`counts` elements each).
  template <class ExecSpace, class Send, class Recv>
  static void allgatherv(Handle comm, const ExecSpace& space, const Send& send, const Recv& recv,
                         const int* counts, const int* displs) {
    const int count = element_count(send);
    detail::with_mpi_access(space, send, recv, [&](const auto* s, auto* r) {
      detail::allgatherv(s, count, r, counts, displs, comm);
    });
  }

  /// Each rank's slices of `send` to each rank's `recv` (counts and displacements per rank).
  template <class ExecSpace, class Send, class Recv>
  static void alltoallv(Handle comm, const ExecSpace& space, const Send& send,
                        const int* send_counts, const int* send_displs, const Recv& recv,
                        const int* recv_counts, const int* recv_displs) {
    detail::with_mpi_access(space, send, recv, [&](const auto* s, auto* r) {
      detail::alltoallv(s, send_counts, send_displs, r, recv_counts, recv_displs, comm);
    });
  }

  /// Reduces `send` over the group with `op`; rank r keeps `recv_counts[r]` elements of it.
  template <class ExecSpace, class Send, class Recv>
  static void reduce_scatter(Handle comm, const ExecSpace& space, const Send& send,
                             const Recv& recv, const int* recv_counts, ReduceOp op) {
    detail::with_mpi_access(space, send, recv, [&](const auto* s, auto* r) {
      detail::reduce_scatter(s, r, recv_counts, native_op(op), comm);
    });
  }

 private:
  template <class View>
  static int element_count(const View& view) {
    return detail::mpi_count(static_cast<std::int64_t>(view.size()));
  }
};

}  // namespace kshard::comm
