#pragma once

// The local row-norm kernel shared by the rowwise algorithms, detection and repair: squared
// full-row L2 norms of the rows of a local shard, widened to fp64.

#include <Kokkos_Core.hpp>

#include "kshard/bfloat16.hpp"
#include "kshard/index.hpp"

namespace kshard::detail {

// An element as the algorithms compute with it: in compute_type_t<T>, held in a double.
template <class T>
KOKKOS_INLINE_FUNCTION double widen(T x) {
  return static_cast<double>(static_cast<compute_type_t<T>>(x));
}

// Squared in fp64: a finite fp32 entry above 2^64 (about 1.8e19) would square to infinity in
// fp32 and make a healthy row look non-finite.
template <class T>
KOKKOS_INLINE_FUNCTION double squared(T x) {
  const double v = widen(x);
  return v * v;
}

// Host execution spaces get a loop with eight independent accumulators per row (the latency
// of one fp64 add chain caps a single-accumulator loop at a quarter of memory bandwidth, and
// eight let the compiler vectorise the bf16 widening too); device spaces get a team per row.
template <class ExecSpace>
inline constexpr bool is_host_space_v =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;

// Squared norms of the local parts of the local rows (no communication).
template <class ExecSpace, class View, class Out>
void local_row_squared_norms(const View& local, const Out& out) {
  const auto rows = static_cast<index_t>(local.extent(0));
  const auto cols = static_cast<index_t>(local.extent(1));
  if constexpr (is_host_space_v<ExecSpace>) {
    const auto* data = local.data();
    const auto stride = static_cast<index_t>(local.stride(0));
    Kokkos::parallel_for(
        "kshard::row_norms", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(0, rows),
        KOKKOS_LAMBDA(const index_t i) {
          const auto* row = data + i * stride;  // plain pointer: lets the compiler vectorise
          double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
          index_t j = 0;
          for (; j + 8 <= cols; j += 8) {
            a0 += squared(row[j]);
            a1 += squared(row[j + 1]);
            a2 += squared(row[j + 2]);
            a3 += squared(row[j + 3]);
            a4 += squared(row[j + 4]);
            a5 += squared(row[j + 5]);
            a6 += squared(row[j + 6]);
            a7 += squared(row[j + 7]);
          }
          for (; j < cols; ++j) a0 += squared(row[j]);
          out(i) = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
        });
  } else {
    using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
    Kokkos::parallel_for(
        "kshard::row_norms", Kokkos::TeamPolicy<ExecSpace>(static_cast<int>(rows), Kokkos::AUTO),
        KOKKOS_LAMBDA(const Team& team) {
          const index_t i = team.league_rank();
          double sum = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, cols),
              [&](const index_t j, double& acc) { acc += squared(local(i, j)); }, sum);
          Kokkos::single(Kokkos::PerTeam(team), [&] { out(i) = sum; });
        });
  }
}

}  // namespace kshard::detail
