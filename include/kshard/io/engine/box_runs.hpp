#pragma once

// Byte moves between boxes of one N-D tensor: where a stored piece and a destination (a shard in
// memory, a part of an output file) share elements, the runs of bytes that copy them, coalesced
// wherever both sides are contiguous (a row-wise piece into a row-wise destination is one run).
// Pure arithmetic on byte positions: the readers and writers of io/ execute the runs.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kshard/io/model/stored_tensor.hpp"

namespace kshard::detail {

// A box of a tensor in some storage: element `offsets + i` (global index) lies at byte
// `base + (sum_d i_d * strides[d]) * element_bytes`. A row-major box has the strides of its
// shape (row_major_strides); a shard's part in memory has the shard's strides.
struct BoxStorage {
  std::vector<std::int64_t> offsets;  // global index of the first element
  std::vector<std::int64_t> shape;    // extents
  std::vector<std::int64_t> strides;  // in elements, per dimension
  std::uint64_t base = 0;             // byte position of the first element
};

// The strides, in elements, of a row-major array of `shape`. An array without elements (an
// extent 0) keeps strides 1, which no element uses: the extents after a leading 0 may multiply
// past INT64_MAX (shapes are checked left to right, as safetensors checks them).
inline std::vector<std::int64_t> row_major_strides(std::span<const std::int64_t> shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return strides;
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// A row-major box: `shape` elements from global index `offsets`, stored from byte `base`.
inline BoxStorage row_major_box(std::vector<std::int64_t> offsets, std::vector<std::int64_t> shape,
                                std::uint64_t base) {
  std::vector<std::int64_t> strides = row_major_strides(shape);
  return {std::move(offsets), std::move(shape), std::move(strides), base};
}

// Where `piece` keeps its elements in its file.
inline BoxStorage stored_box(const io::StoredPiece& piece) {
  if (piece.strides.empty()) return row_major_box(piece.offsets, piece.shape, piece.file_offset);
  return {piece.offsets, piece.shape, piece.strides, piece.file_offset};
}

// `bytes` bytes copied from byte `from` of the source to byte `to` of the destination.
struct ByteRun {
  std::uint64_t from = 0;
  std::uint64_t to = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const ByteRun&, const ByteRun&) = default;
};

// Appends a run, merging it into the last one where both sides continue it.
inline void append_run(std::vector<ByteRun>& runs, const ByteRun& run) {
  if (!runs.empty()) {
    ByteRun& last = runs.back();
    if (last.from + last.bytes == run.from && last.to + last.bytes == run.to) {
      last.bytes += run.bytes;
      return;
    }
  }
  runs.push_back(run);
}

// `runs` with each run longer than `limit` bytes cut into runs of at most `limit` (MPI counts
// are ints).
inline std::vector<ByteRun> split_runs(const std::vector<ByteRun>& runs, std::uint64_t limit) {
  std::vector<ByteRun> pieces;
  for (const ByteRun& run : runs)
    for (std::uint64_t done = 0; done < run.bytes; done += limit)
      pieces.push_back({run.from + done, run.to + done, std::min(limit, run.bytes - done)});
  return pieces;
}

// Byte position in `box` of the element at global index `index`.
inline std::uint64_t byte_at(const BoxStorage& box, std::span<const std::int64_t> index,
                             std::uint64_t element_bytes) {
  std::int64_t element = 0;
  for (std::size_t d = 0; d < index.size(); ++d)
    element += (index[d] - box.offsets[d]) * box.strides[d];
  return box.base + static_cast<std::uint64_t>(element) * element_bytes;
}

// Appends to `runs` the moves of the elements boxes `from` and `to` (of the same tensor) share,
// in row-major order of the shared box: one run per row of the last dimension where both store
// it contiguously (unit strides), else one per element (a transposed piece); coalesced.
inline void append_shared_runs(const BoxStorage& from, const BoxStorage& to,
                               std::uint64_t element_bytes, std::vector<ByteRun>& runs) {
  const std::size_t rank = from.shape.size();
  std::vector<std::int64_t> low(rank), high(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    low[d] = std::max(from.offsets[d], to.offsets[d]);
    high[d] = std::min(from.offsets[d] + from.shape[d], to.offsets[d] + to.shape[d]);
    if (low[d] >= high[d]) return;
  }
  const bool rows = rank > 0 && from.strides[rank - 1] == 1 && to.strides[rank - 1] == 1;
  const std::size_t walked = rows ? rank - 1 : rank;  // the dimensions the odometer turns
  const std::uint64_t run_bytes =
      rows ? static_cast<std::uint64_t>(high[rank - 1] - low[rank - 1]) * element_bytes
           : element_bytes;
  std::vector<std::int64_t> index = low;
  while (true) {
    append_run(runs,
               {byte_at(from, index, element_bytes), byte_at(to, index, element_bytes), run_bytes});
    std::size_t d = walked;
    while (d > 0 && ++index[d - 1] == high[d - 1]) {
      index[d - 1] = low[d - 1];
      --d;
    }
    if (d == 0) return;
  }
}

// Calls `emit(offsets, shape)` for boxes that together are the elements `[begin, end)` (in
// row-major order) of an array of `shape`, each contiguous in that order, at most 2 per
// dimension, in order.
template <class Emit>
void boxes_of_range(std::span<const std::int64_t> shape, std::int64_t begin, std::int64_t end,
                    Emit&& emit, std::vector<std::int64_t> prefix = {}) {
  if (begin >= end) return;
  const std::size_t d = prefix.size();
  const auto box = [&](std::int64_t first, std::int64_t count) {
    std::vector<std::int64_t> offsets = prefix, extents(prefix.size(), 1);
    offsets.push_back(first);
    extents.push_back(count);
    for (std::size_t k = d + 1; k < shape.size(); ++k) {
      offsets.push_back(0);
      extents.push_back(shape[k]);
    }
    emit(offsets, extents);
  };
  if (d == shape.size()) {  // a scalar: its one element
    emit(prefix, std::vector<std::int64_t>{});
    return;
  }
  std::int64_t inner = 1;
  for (std::size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  std::int64_t first = begin / inner;
  const std::int64_t last = end / inner;  // the block [last * inner, end) is partial
  const auto descend = [&](std::int64_t index, std::int64_t from, std::int64_t to) {
    std::vector<std::int64_t> deeper = prefix;
    deeper.push_back(index);
    boxes_of_range(shape, from, to, emit, std::move(deeper));
  };
  if (first == last) {  // inside one block of dimension d
    descend(first, begin - first * inner, end - first * inner);
    return;
  }
  if (begin % inner != 0) {
    descend(first, begin - first * inner, inner);
    ++first;
  }
  if (first < last) box(first, last - first);
  if (end % inner != 0) descend(last, 0, end - last * inner);
}

}  // namespace kshard::detail
