#pragma once

// kshard's communication layer: a `comm::Group` is the set of ranks a collective runs over (the
// whole mesh, or one mesh dimension), and its member functions are the only collectives the
// algorithms call. Each one
//   - takes the execution-space instance that produced its buffers first, and hands them to the
//     backend only after that instance is fenced (the MPI backend; a stream-ordered backend
//     such as NCCL would enqueue on the instance's stream instead),
//   - refuses counts an MPI int cannot hold, naming the operation,
//   - counts its payload in comm_stats(),
//   - opens a Kokkos Tools region "kshard::<operation>::<collective>".
// The backend (comm/mpi_backend.hpp over comm/mpi.hpp) is the only other place that names
// MPI, besides Mesh construction and the MPI-IO of kshard::io. docs/design.md, section 11,
// says what a second backend (NCCL) changes.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "kshard/comm/backend.hpp"
#include "kshard/comm/mpi.hpp"
#include "kshard/comm/reduce_op.hpp"
#include "kshard/detail/operation.hpp"

// The backend of the data collectives, one header chosen at configure time: it defines
// `kshard::comm::Backend` (docs/design.md, section 11).
#if defined(KSHARD_COMM_BACKEND_HEADER)
#include KSHARD_COMM_BACKEND_HEADER
#else
#include "kshard/comm/mpi_backend.hpp"
namespace kshard::comm {
using Backend = MpiBackend;
}  // namespace kshard::comm
#endif

namespace kshard::comm {

static_assert(CommBackend<Backend>,
              "kshard: the configured communication backend (KSHARD_COMM_BACKEND_HEADER) does "
              "not provide what comm/backend.hpp requires");

/// A Kokkos Tools profiling region around one collective, named after the running kshard
/// operation; free when no tool is loaded.
class Region {
 public:
  /// Opens "kshard::<operation>::<collective>" when a tool is loaded.
  explicit Region(const char* collective) : open_(Kokkos::Profiling::profileLibraryLoaded()) {
    if (open_)
      Kokkos::Profiling::pushRegion(
          fmt::format("kshard::{}::{}", detail::operation_name(), collective));
  }
  ~Region() {
    if (open_) Kokkos::Profiling::popRegion();
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

 private:
  bool open_;
};

/// The ranks a collective runs over: copies share one communicator, freed with the last copy.
class Group {
 public:
  Group() = default;
  /// The group of the ranks of `comm`, which it owns from now on.
  explicit Group(detail::Communicator comm)
      : comm_(std::move(comm)), data_(Backend::make_handle(comm_.get())) {}

  /// This rank's position in the group.
  [[nodiscard]] int rank() const { return detail::comm_rank(comm_.get()); }
  /// Number of ranks in the group.
  [[nodiscard]] int size() const { return detail::comm_size(comm_.get()); }
  /// The group's MPI communicator (argument agreement, host values, MPI-IO, users' own calls).
  [[nodiscard]] MPI_Comm native() const { return comm_.get(); }
  /// True when both groups hold the same ranks in the same order (local, no communication).
  [[nodiscard]] bool same_ranks_as(const Group& other) const {
    return detail::congruent(native(), other.native());
  }

  // ----- Host values: metadata and small results, never device memory -----

  /// In-place reduction of `count` host values.
  template <class T>
  void allreduce(T* values, std::int64_t count, ReduceOp op) const {
    const Region region("allreduce");
    detail::allreduce(values, detail::mpi_count(count), native_op(op), native());
  }
  /// Rank `root`'s `count` host values, everywhere.
  template <class T>
  void bcast(T* values, std::int64_t count, int root) const {
    const Region region("bcast");
    detail::broadcast(values, detail::mpi_count(count), root, native());
  }
  /// Every rank's `count` host values, in rank order.
  template <class T>
  void allgather(const T* send, std::int64_t count, T* recv) const {
    const Region region("allgather");
    detail::allgather(send, detail::mpi_count(count), recv, native());
  }

  /// Rank r's `count` host values land at `displs[r]` of `recv`, `counts[r]` elements.
  template <class T>
  void allgatherv(const T* send, std::int64_t count, T* recv, const int* counts,
                  const int* displs) const {
    const Region region("allgatherv");
    detail::allgatherv(send, detail::mpi_count(count), recv, counts, displs, native());
  }
  /// Rank `root` receives every rank's `count` host values, rank r's `counts[r]` at
  /// `displs[r]` of `recv` (`recv`, `counts` and `displs` are read on the root only).
  template <class T>
  void gatherv(const T* send, std::int64_t count, T* recv, const int* counts, const int* displs,
               int root) const {
    const Region region("gatherv");
    detail::gatherv(send, detail::mpi_count(count), recv, counts, displs, root, native());
  }
  /// Rank `root` sends `counts[r]` host values at `displs[r]` of `send` to each rank r, which
  /// receives its `count` in `recv`.
  template <class T>
  void scatterv(const T* send, const int* counts, const int* displs, T* recv, std::int64_t count,
                int root) const {
    const Region region("scatterv");
    detail::scatterv(send, counts, displs, recv, detail::mpi_count(count), root, native());
  }

  // ----- Views written by `space`: contiguous; the backend orders the collective after the
  // work `space` queued (the MPI backend fences it) -----

  /// In-place reduction of `view` over the group.
  template <class ExecSpace, class View>
  requires Kokkos::is_execution_space<ExecSpace>::value void allreduce(const ExecSpace& space,
                                                                       const View& view,
                                                                       ReduceOp op) const {
    const Region region("allreduce");
    Backend::allreduce(data_, space, view, op);
  }

  /// The reduction of `send` over the group, into `recv` (same size; `send` is left as is).
  template <class ExecSpace, class Send, class Recv>
  requires Kokkos::is_execution_space<ExecSpace>::value void allreduce(const ExecSpace& space,
                                                                       const Send& send,
                                                                       const Recv& recv,
                                                                       ReduceOp op) const {
    const Region region("allreduce");
    Backend::allreduce(data_, space, send, recv, op);
  }

  /// Rank `root`'s `view`, everywhere.
  template <class ExecSpace, class View>
  requires Kokkos::is_execution_space<ExecSpace>::value void bcast(const ExecSpace& space,
                                                                   const View& view,
                                                                   int root) const {
    const Region region("bcast");
    Backend::bcast(data_, space, view, root);
  }

  /// Rank r's `send` lands at `displs[r]` of `recv`, `counts[r]` elements (host arrays).
  template <class ExecSpace, class Send, class Recv>
  requires Kokkos::is_execution_space<ExecSpace>::value void allgatherv(const ExecSpace& space,
                                                                        const Send& send,
                                                                        const Recv& recv,
                                                                        const int* counts,
                                                                        const int* displs) const {
    const Region region("allgatherv");
    Backend::allgatherv(data_, space, send, recv, counts, displs);
  }

  /// Personalised all-to-all: `send_counts[r]` elements at `send_displs[r]` of `send` go to
  /// rank r, which receives them at `recv_displs[me]` of its `recv` (host arrays).
  template <class ExecSpace, class Send, class Recv>
  requires Kokkos::is_execution_space<ExecSpace>::value void alltoallv(
      const ExecSpace& space, const Send& send, const int* send_counts, const int* send_displs,
      const Recv& recv, const int* recv_counts, const int* recv_displs) const {
    const Region region("alltoallv");
    Backend::alltoallv(data_, space, send, send_counts, send_displs, recv, recv_counts,
                       recv_displs);
  }

  /// Reduction of `send` (every rank's block in rank order, `recv_counts[r]` elements for rank
  /// r) whose block for this rank lands in `recv`.
  template <class ExecSpace, class Send, class Recv>
  requires Kokkos::is_execution_space<ExecSpace>::value void reduce_scatter(const ExecSpace& space,
                                                                            const Send& send,
                                                                            const Recv& recv,
                                                                            const int* recv_counts,
                                                                            ReduceOp op) const {
    const Region region("reduce_scatter");
    Backend::reduce_scatter(data_, space, send, recv, recv_counts, op);
  }

 private:
  detail::Communicator comm_;  // host values, agreement, the group's ranks
  Backend::Handle data_{};     // the data collectives
};

}  // namespace kshard::comm
