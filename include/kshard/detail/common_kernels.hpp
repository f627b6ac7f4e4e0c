#pragma once

// Small helpers that several algorithms need, written once and run on an execution-space
// instance: host -> device copies of index lists and views, the column-sum kernel and the
// id-range check behind the error messages (int limits: int_limit.hpp; the per-row sums:
// row_norms.hpp).
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

#include "kshard/bfloat16.hpp"
#include "kshard/detail/host_copy.hpp"
#include "kshard/detail/int_limit.hpp"
#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/detail/row_norms.hpp"
#include "kshard/index.hpp"

namespace kshard::detail {

// ---------------------------------------------------------------------------------------------
// Checks

// Why `id` is not a row of a vocabulary of `vocab` rows (ids do not wrap here).
inline std::optional<std::string> id_range_problem(index_t id, index_t vocab, const char* who,
                                                   std::string_view what = "token id") {
  if (id >= 0 && id < vocab) return std::nullopt;
  return fmt::format(
      "kshard::{}: {} {} is out of range for a vocabulary of {} rows (valid: 0 <= id < {})", who,
      what, id, vocab, vocab);
}

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

// ---------------------------------------------------------------------------------------------
// Kernels

// sums(j) += the sum over the rows i with keep(i) of values(i, j), for every column j: each
// sum taken in increasing row order in the type of `sums` (a bf16 or float element widened
// through its compute type). One work item per block of `Block` columns sums it down the rows,
// so every row is read contiguously; the result does not depend on `Block`.
template <index_t Block, class View, class Sums, class Keep>
struct AddColumnSums {
  using Sum = typename Sums::non_const_value_type;
  using Compute = compute_type_t<typename View::non_const_value_type>;
  View values;
  Sums sums;
  Keep keep;
  KOKKOS_INLINE_FUNCTION void operator()(index_t b) const {
    const auto rows = static_cast<index_t>(values.extent(0));
    const auto cols = static_cast<index_t>(values.extent(1));
    const index_t begin = b * Block;
    const index_t width = cols - begin < Block ? cols - begin : Block;
    Sum sum[Block] = {};
    for (index_t i = 0; i < rows; ++i)
      if (keep(i))
        for (index_t t = 0; t < width; ++t)
          sum[t] += static_cast<Sum>(static_cast<Compute>(values(i, begin + t)));
    for (index_t t = 0; t < width; ++t) sums(begin + t) += sum[t];
  }
};

template <int Block = 16, class ExecSpace, class View, class Sums, class Keep>
void add_column_sums(const ExecSpace& space, const char* label, const View& values,
                     const Sums& sums, const Keep& keep) {
  const auto cols = static_cast<index_t>(values.extent(1));
  Kokkos::parallel_for(label,
                       Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(
                           space, 0, (cols + Block - 1) / Block),
                       AddColumnSums<Block, View, Sums, Keep>{values, sums, keep});
}

// Every row: for add_column_sums.
struct AllRows {
  KOKKOS_INLINE_FUNCTION bool operator()(index_t) const { return true; }
};

}  // namespace kshard::detail
