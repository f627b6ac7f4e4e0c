#pragma once

// Moving blocks of a shard in and out of flat message buffers with Kokkos kernels.

#include <Kokkos_Core.hpp>

#include <vector>

#include "kshard/detail/redistribute_plan.hpp"
#include "kshard/detail/staging.hpp"
#include "kshard/index.hpp"

namespace kshard::detail {

// One block of a message: rows x cols elements, whose local indices are entries
// [row_begin, row_begin + rows) and [col_begin, col_begin + cols) of the index lists, stored
// row-major from `offset` in the message buffer.
struct Block {
  index_t row_begin = 0;
  index_t rows = 0;
  index_t col_begin = 0;
  index_t cols = 0;
  index_t offset = 0;
};

// Host-built index lists for a set of blocks (one side of the transfer).
struct BlockLists {
  std::vector<index_t> rows;
  std::vector<index_t> cols;
  std::vector<Block> blocks;

  // Adds the block of elements in `row_runs` x `col_runs`, using their local indices on side
  // a or b; returns its number of elements.
  index_t add(const std::vector<Overlap>& row_runs, const std::vector<Overlap>& col_runs,
              bool side_a, index_t offset) {
    Block b;
    b.row_begin = static_cast<index_t>(rows.size());
    b.col_begin = static_cast<index_t>(cols.size());
    b.offset = offset;
    for (const Overlap& o : row_runs)
      for (index_t i = 0; i < o.size; ++i) rows.push_back((side_a ? o.a_local : o.b_local) + i);
    for (const Overlap& o : col_runs)
      for (index_t i = 0; i < o.size; ++i) cols.push_back((side_a ? o.a_local : o.b_local) + i);
    b.rows = static_cast<index_t>(rows.size()) - b.row_begin;
    b.cols = static_cast<index_t>(cols.size()) - b.col_begin;
    blocks.push_back(b);
    return b.rows * b.cols;
  }
};

// True when unpacking `lists` into a row-major shard `cols` wide is the identity: every block
// is whole consecutive rows, and its message offset is where those rows start in the shard.
inline bool lands_in_place(const BlockLists& lists, index_t cols) {
  for (const Block& b : lists.blocks) {
    if (b.rows == 0 || b.cols == 0) continue;
    if (b.cols != cols) return false;
    for (index_t j = 0; j < cols; ++j)
      if (lists.cols[static_cast<std::size_t>(b.col_begin + j)] != j) return false;
    const index_t first = lists.rows[static_cast<std::size_t>(b.row_begin)];
    for (index_t i = 0; i < b.rows; ++i)
      if (lists.rows[static_cast<std::size_t>(b.row_begin + i)] != first + i) return false;
    if (b.offset != first * cols) return false;
  }
  return true;
}

template <class MemSpace>
Kokkos::View<const index_t*, MemSpace> to_space(const std::vector<index_t>& values) {
  Kokkos::View<index_t*, MemSpace> result(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kshard::redistribute::indices"),
      values.size());
  Kokkos::View<const index_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(
      values.data(), values.size());
  Kokkos::deep_copy(result, host);
  return result;
}

enum class BlockMove { pack, unpack };

// pack: buffer(offset + row-major position) = shard(rows[row_begin + i], cols[col_begin + j]);
// unpack: the reverse assignment. A named functor: nvcc rejects a device lambda whose captures
// are first used inside `if constexpr`.
template <BlockMove Move, class Shard, class Buffer, class Indices>
struct MoveBlock {
  Shard shard;
  Buffer buffer;
  Indices rows;
  Indices cols;
  index_t row_begin = 0;
  index_t col_begin = 0;
  index_t width = 0;
  index_t offset = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const index_t i, const index_t j) const {
    if constexpr (Move == BlockMove::pack)
      buffer(offset + i * width + j) = shard(rows(row_begin + i), cols(col_begin + j));
    else
      shard(rows(row_begin + i), cols(col_begin + j)) = buffer(offset + i * width + j);
  }
};

template <class ExecSpace, BlockMove Move, class Shard, class Buffer>
void move_blocks(const Shard& shard, const BlockLists& lists, const Buffer& buffer) {
  using MemSpace = typename Shard::memory_space;
  const auto rows = to_space<MemSpace>(lists.rows);
  const auto cols = to_space<MemSpace>(lists.cols);
  for (const Block& b : lists.blocks) {
    if (b.rows == 0 || b.cols == 0) continue;
    Kokkos::parallel_for(
        Move == BlockMove::pack ? "kshard::redistribute::pack" : "kshard::redistribute::unpack",
        Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {b.rows, b.cols}),
        MoveBlock<Move, Shard, Buffer, decltype(rows)>{shard, buffer, rows, cols, b.row_begin,
                                                       b.col_begin, b.cols, b.offset});
  }
}

template <class ExecSpace, class Shard, class Buffer>
void pack_blocks(const Shard& shard, const BlockLists& lists, const Buffer& buffer) {
  move_blocks<ExecSpace, BlockMove::pack>(shard, lists, buffer);
}

template <class ExecSpace, class Buffer, class Shard>
void unpack_blocks(const Buffer& buffer, const BlockLists& lists, const Shard& shard) {
  move_blocks<ExecSpace, BlockMove::unpack>(shard, lists, buffer);
}

// out(out_rows[a], out_cols[b]) = in(in_rows[a], in_cols[b]): a local copy between two
// shards, for blocks that line up entry by entry (no message).
template <class ExecSpace, class In, class Out>
void copy_blocks(const In& in, const BlockLists& from, const Out& out, const BlockLists& to) {
  using MemSpace = typename Out::memory_space;
  const auto in_rows = to_space<MemSpace>(from.rows);
  const auto in_cols = to_space<MemSpace>(from.cols);
  const auto out_rows = to_space<MemSpace>(to.rows);
  const auto out_cols = to_space<MemSpace>(to.cols);
  for (std::size_t k = 0; k < from.blocks.size(); ++k) {
    const Block& b = from.blocks[k];
    if (b.rows == 0 || b.cols == 0) continue;
    const index_t rb = b.row_begin;
    const index_t cb = b.col_begin;
    const index_t orb = to.blocks[k].row_begin;
    const index_t ocb = to.blocks[k].col_begin;
    Kokkos::parallel_for(
        "kshard::redistribute::copy",
        Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {b.rows, b.cols}),
        KOKKOS_LAMBDA(const index_t i, const index_t j) {
          out(out_rows(orb + i), out_cols(ocb + j)) = in(in_rows(rb + i), in_cols(cb + j));
        });
  }
}

// shard /= divisor, elementwise (the mean of a Partial<avg>).
template <class ExecSpace, class Shard>
void divide_all(const Shard& shard, int divisor) {
  using T = typename Shard::non_const_value_type;
  const T d = static_cast<T>(divisor);
  const auto rows = static_cast<index_t>(shard.extent(0));
  const auto cols = static_cast<index_t>(shard.extent(1));
  if (rows == 0 || cols == 0) return;
  Kokkos::parallel_for(
      "kshard::redistribute::average",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {rows, cols}),
      KOKKOS_LAMBDA(const index_t i, const index_t j) { shard(i, j) = shard(i, j) / d; });
}

}  // namespace kshard::detail
