#pragma once

// Hands Kokkos views to MPI: directly after fencing the execution space that wrote them, or
// through a host copy ("staging") when MPI cannot read the view's memory. The staging copies run
// on that instance, after its work, so staging needs no fence before them.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "kshard/comm/mpi.hpp"
#include "kshard/comm/stats.hpp"
#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/kernels/host_copy.hpp"

#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

#ifndef KSHARD_GPU_AWARE_MPI_DEFAULT
/// Whether MPI may be handed device memory when KSHARD_GPU_AWARE_MPI is not set (0 or 1); CMake
/// sets it from the option of the same name (AUTO: what the MPI says at configure time).
#define KSHARD_GPU_AWARE_MPI_DEFAULT 0
#endif

namespace kshard::detail {

// Whether MPI reads and writes device memory directly, decided once per process: the
// environment variable KSHARD_GPU_AWARE_MPI (0 or 1) when set, else the configured default,
// which an Open MPI built with CUDA support also confirms at run time (its CUDA transport may
// not be loaded on this machine).
inline bool gpu_aware_mpi() {
  static const bool aware = [] {
    const char* env = std::getenv("KSHARD_GPU_AWARE_MPI");
    if (env != nullptr && *env != '\0') return std::string_view(env) != "0";
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT && defined(KOKKOS_ENABLE_CUDA)
    return KSHARD_GPU_AWARE_MPI_DEFAULT != 0 && MPIX_Query_cuda_support() == 1;
#else
    return KSHARD_GPU_AWARE_MPI_DEFAULT != 0;
#endif
  }();
  return aware;
}

// Test hook: stage host memory too, so that a host-only build runs the staging path.
inline bool& force_host_staging() {
  static bool force = false;
  return force;
}

// Whether MPI is handed the memory of a `View` itself (host memory, or device memory with a
// GPU-aware MPI) rather than a host copy of it.
template <class View>
bool mpi_uses_view_memory() {
  using Memory = typename View::memory_space;
  constexpr bool host_memory = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible;
  return host_memory ? !force_host_staging() : gpu_aware_mpi();
}

// Calls `use(pointer)` with memory MPI may access holding `view`'s elements (contiguous views
// only); `space` wrote `view` and, where MPI uses the view's own memory, has been fenced.
// `read`: the contents must be there before; `write`: what `use` writes must end in `view`.
// Staged bytes (both directions) are counted in comm_stats().bytes_staged.
template <class ExecSpace, class View, class Use>
void hand_to_mpi(const ExecSpace& space, const View& view, bool read, bool write, Use&& use) {
  if (mpi_uses_view_memory<View>()) {
    use(view.data());
    return;
  }
  // A separate host buffer even for host memory, left uninitialised (it is copied into or
  // written by MPI before anything reads it).
  const HostCopy<View> host(view);
  const auto bytes = static_cast<std::int64_t>(view.span() * sizeof(typename View::value_type));
  if (read) {
    Kokkos::deep_copy(space, host, view);
    fence(space, "kshard: staged a view for MPI");
    comm_stats().bytes_staged += bytes;
  }
  use(host.data());
  if (write) {
    Kokkos::deep_copy(space, view, host);
    fence(space, "kshard: unstaged a view MPI wrote");  // `host` is freed on return
    comm_stats().bytes_staged += bytes;
  }
}

inline constexpr const char* before_mpi_fence = "kshard: before MPI reads or writes a view";

// `hand_to_mpi` for a view that `space` wrote.
template <class ExecSpace, class View, class Use>
void with_mpi_access(const ExecSpace& space, const View& view, bool read, bool write, Use&& use) {
  if (mpi_uses_view_memory<View>()) fence(space, before_mpi_fence);
  hand_to_mpi(space, view, read, write, std::forward<Use>(use));
}

// Calls `use(send_pointer, recv_pointer)` for a collective that reads `send` and writes `recv`,
// both written by `space`, which is fenced at most once.
template <class ExecSpace, class Send, class Recv, class Use>
void with_mpi_access(const ExecSpace& space, const Send& send, const Recv& recv, Use&& use) {
  if (mpi_uses_view_memory<Send>() || mpi_uses_view_memory<Recv>()) fence(space, before_mpi_fence);
  hand_to_mpi(space, send, true, false, [&](const auto* s) {
    hand_to_mpi(space, recv, false, true, [&](auto* r) { use(s, r); });
  });
}

}  // namespace kshard::detail
