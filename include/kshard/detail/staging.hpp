#pragma once

// Hands Kokkos views to MPI: fence the execution space first, and go through a host copy
// when MPI cannot read the view's memory directly.

#include <Kokkos_Core.hpp>

#include <cstddef>

#include "kshard/detail/mpi.hpp"

namespace kshard::detail {

// In-place all-reduce of a rank-1 view over `comm`, after `exec` finished writing it.
template <class ExecSpace, class View>
void allreduce_view(const ExecSpace& exec, const View& view, MPI_Op op, MPI_Comm comm) {
  exec.fence();
  const int count = mpi_count(static_cast<std::int64_t>(view.size()), "kshard all-reduce");
  using Memory = typename View::memory_space;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible) {
    allreduce(view.data(), count, op, comm);
  } else {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    allreduce(host.data(), count, op, comm);
    Kokkos::deep_copy(view, host);
  }
}

}  // namespace kshard::detail
