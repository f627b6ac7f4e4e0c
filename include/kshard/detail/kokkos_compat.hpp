#pragma once

// Every difference between the Kokkos versions kshard supports (Debian's 3.4 to 5.x) lives
// here, so the rest of the library is written once.

#include <Kokkos_Core.hpp>

// Kokkos 4 provides Kokkos::Experimental::bhalf_t; it is 16-bit storage only where
// KOKKOS_BHALF_T_IS_FLOAT is false (elsewhere it falls back to float, which is not what a
// bf16 checkpoint holds). Kokkos 3.4 has no bhalf_t at all.
#if defined(KOKKOS_BHALF_T_IS_FLOAT) && !KOKKOS_BHALF_T_IS_FLOAT
#define KSHARD_KOKKOS_HAS_BF16 1
#else
#define KSHARD_KOKKOS_HAS_BF16 0
#endif

namespace kshard::detail {

// Waits for the work submitted to `space` only (never a global fence), labelled for Kokkos
// Tools where the Kokkos in use labels fences (3.6 and later).
template <class ExecSpace>
void fence(const ExecSpace& space, const char* label) {
#if KOKKOS_VERSION >= 30600
  space.fence(label);
#else
  (void)label;
  space.fence();
#endif
}

// Whether `ExecSpace` runs on the host (its memory is host-accessible): the host and device
// forms of a kernel are chosen by it.
template <class ExecSpace>
inline constexpr bool is_host_space_v =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;

}  // namespace kshard::detail
