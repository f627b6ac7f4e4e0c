#pragma once

// What a communication backend provides, as a concept checked where the backend is chosen
// (comm/group.hpp), as `Placement` is checked for placements: a `Handle` it keeps per group,
// made from the group's MPI communicator, and the data collectives of comm::Group on Kokkos
// views written by an execution-space instance. The MPI backend (comm/mpi_backend.hpp) is one;
// tests/comm/counting_backend.hpp is a test-only second. docs/design.md, section 11, says what
// a stream-ordered backend such as NCCL changes.

#include <Kokkos_Core.hpp>

#include <concepts>

#include "kshard/comm/mpi.hpp"
#include "kshard/comm/reduce_op.hpp"

namespace kshard::comm {

template <class B>
concept CommBackend = requires(typename B::Handle handle, MPI_Comm comm,
                               const Kokkos::DefaultHostExecutionSpace& space,
                               const Kokkos::View<double*, Kokkos::HostSpace>& view,
                               const int* counts, ReduceOp op, int root) {
  { B::make_handle(comm) } -> std::same_as<typename B::Handle>;
  B::allreduce(handle, space, view, op);        // in place
  B::allreduce(handle, space, view, view, op);  // send, receive
  B::bcast(handle, space, view, root);
  B::allgatherv(handle, space, view, view, counts, counts);
  B::alltoallv(handle, space, view, counts, counts, view, counts, counts);
  B::reduce_scatter(handle, space, view, view, counts, op);
};

}  // namespace kshard::comm
