#pragma once

// The column-sum kernel, run on an execution-space instance: the sums over a matrix's kept rows
// (the replacement values of a repair, the bias gradient of a linear layer).

#include <Kokkos_Core.hpp>

#include "kshard/index.hpp"
#include "kshard/kernels/row_norms.hpp"  // compute_type_t

namespace kshard::detail {

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
