#pragma once

// The copies several algorithms need, written once and run on an execution-space instance:
// host -> device copies of index lists, and views made readable on the host.
//
// Every function that runs work takes the instance first, runs its kernels and copies on it,
// and fences only that instance (`fence(space, why)`), only where the host reads what it made
// or frees what it reads.

#include <Kokkos_Core.hpp>

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/detail/int_limit.hpp"
#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/index.hpp"
#include "kshard/kernels/host_copy.hpp"

namespace kshard::detail {

// ---------------------------------------------------------------------------------------------
// Copies

// `values` in a new view of `MemSpace`, copied on `space`. Fences `space` before returning: the
// host vector may be freed as soon as this returns.
template <class MemSpace, class ExecSpace, class T>
Kokkos::View<T*, MemSpace> vector_to_space(const ExecSpace& space, const std::vector<T>& values,
                                           const std::string& label) {
  Kokkos::View<T*, MemSpace> result(Kokkos::view_alloc(Kokkos::WithoutInitializing, label),
                                    values.size());
  if (values.empty()) return result;
  const Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> host(values.data(),
                                                                                values.size());
  Kokkos::deep_copy(space, result, host);
  fence(space, "kshard: an index list is copied before its host vector is freed");
  return result;
}

// Several lists in one new view of `MemSpace`, back to back: one copy and one fence for all
// (the host vectors may be freed as soon as this returns); a view of each, in order.
template <class MemSpace, class ExecSpace, class T, class... More>
std::array<Kokkos::View<T*, MemSpace>, 1 + sizeof...(More)> vectors_to_space(
    const ExecSpace& space, const std::string& label, const std::vector<T>& first,
    const More&... more) {
  std::vector<T> all(first);
  (all.insert(all.end(), more.begin(), more.end()), ...);
  const auto joined = vector_to_space<MemSpace>(space, all, label);
  std::array<Kokkos::View<T*, MemSpace>, 1 + sizeof...(More)> views;
  std::size_t begin = 0;
  std::size_t k = 0;
  for (const std::size_t size : {first.size(), more.size()...}) {
    views[k++] = Kokkos::subview(joined, std::make_pair(begin, begin + size));
    begin += size;
  }
  return views;
}

// The contents of `view` readable on the host once the work `space` submitted (which wrote it)
// is done: `view` itself when the host can read it, else a HostCopy made on `space`. `space`
// is fenced either way (`why` labels the fence), so the host may read the result at once.
// Unlike a mirror-and-deep_copy, takes views of const elements too.
template <class ExecSpace, class View>
auto to_host(const ExecSpace& space, const View& view, const char* why) {
  auto host = host_mirror(view);
  if constexpr (!std::is_same_v<decltype(host), View>) Kokkos::deep_copy(space, host, view);
  fence(space, why);
  return host;
}

}  // namespace kshard::detail
