#pragma once

// The collective steps kshard::io builds on: an error of one rank made a problem for the next
// agreement (attempt), row ids agreed on, bytes broadcast in pieces MPI counts can hold, and the
// part of a matrix each rank transfers (its first copies only, as datatypes and, for a write,
// packed bytes).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/agreement.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/detail/digest.hpp"
#include "kshard/index.hpp"
#include "kshard/io/engine/mpi_file.hpp"
#include "kshard/io/model/dtype.hpp"
#include "kshard/kernels/copies.hpp"

namespace kshard::detail {

// Runs `step`; an error it throws becomes this rank's problem for the agreement that follows.
template <class Step>
std::optional<std::string> attempt(Step&& step) {
  try {
    step();
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// Broadcasts `size` bytes from rank 0 in pieces that keep MPI counts below 2^31.
inline void broadcast_bytes(void* data, std::uint64_t size, const comm::Group& group) {
  constexpr std::uint64_t piece = std::uint64_t{1} << 30;
  auto* bytes = static_cast<char*>(data);
  for (std::uint64_t done = 0; done < size; done += piece)
    group.bcast(bytes + done, static_cast<int>(std::min(piece, size - done)), 0);
}

// Rank 0's `text` on every rank of `group`.
inline void broadcast_text(std::string& text, const comm::Group& group) {
  auto size = static_cast<std::int64_t>(text.size());
  group.bcast(&size, 1, 0);
  text.resize(static_cast<std::size_t>(size));
  broadcast_bytes(text.data(), text.size(), group);
}

// Row ids `ids` (sorted, unique) of tensor `name`, `what` is done to them: the same on every
// rank, and each in [0, rows).
inline void same_row_ids(Agreement& agreement, std::string_view what, std::string_view name,
                         const std::vector<index_t>& ids, index_t rows) {
  Digest digest;
  for (const index_t id : ids) digest.add(id);
  agreement.same(fmt::format("the rows of {} {}", in_quotes(name), what), digest.value(),
                 [](std::int64_t) { return std::string(); });
  if (!ids.empty() && (ids.front() < 0 || ids.back() >= rows))
    agreement.problem(fmt::format("kshard::io: row id {} of {} is outside [0, {})",
                                  ids.front() < 0 ? ids.front() : ids.back(), in_quotes(name),
                                  rows));
}

// True where this rank holds the first copy of its block: the ranks that read or write it.
template <class M>
bool transfers(const M& matrix) {
  return M::layout_type::is_first_copy(matrix.mesh().coords(), {0, 1});
}

// This rank's part of a whole-matrix transfer: its shard's datatypes, or none.
template <class M>
ShardTypes transfer_types(const M& matrix) {
  if (!transfers(matrix)) return {};
  return shard_types(matrix.mapping(), matrix.mapping().rows.runs(),
                     static_cast<int>(sizeof(typename M::value_type)));
}

// This rank's part of an update: the datatypes and the packed bytes it writes (empty on ranks
// that hold no first copy).
struct UpdatePart {
  ShardTypes types;
  std::vector<std::byte> bytes;
};

// The runs of `rows` (sorted global ids) that this rank's shard holds, each consecutive in the
// file and in the shard.
template <class Map>
std::vector<IndexRun> runs_of_rows(const Map& rows_map, const std::vector<index_t>& rows) {
  std::vector<IndexRun> runs;
  for (const index_t id : rows)
    if (const index_t local = rows_map.to_local(id); local == invalid_index)
      continue;
    else if (!runs.empty() && runs.back().global_end() == id &&
             runs.back().local_begin + runs.back().size == local)
      ++runs.back().size;
    else
      runs.push_back({id, local, 1});
  return runs;
}

// The part of `matrix` this rank writes: its whole shard, or with `rows`, the rows of them it
// holds, packed in increasing id order.
template <class ExecSpace, class M>
UpdatePart update_part(const ExecSpace& space, const M& matrix,
                       const std::optional<std::vector<index_t>>& rows) {
  using T = typename M::value_type;
  UpdatePart part;
  if (!transfers(matrix)) return part;
  const auto& map = matrix.mapping();
  const std::vector<IndexRun> runs = rows ? runs_of_rows(map.rows, *rows) : map.rows.runs();
  part.types = shard_types(map, runs, static_cast<int>(sizeof(T)));
  const auto host = to_host(space, matrix.local(), "kshard::io: the shard, for the write");
  const auto row_bytes = static_cast<std::size_t>(map.cols.local_extent()) * sizeof(T);
  part.bytes.resize(static_cast<std::size_t>(part.types.bytes));
  std::size_t at = 0;
  for (const IndexRun& run : runs) {
    const std::size_t n = static_cast<std::size_t>(run.size) * row_bytes;
    if (n > 0) std::memcpy(part.bytes.data() + at, &host(run.local_begin, 0), n);
    at += n;
  }
  return part;
}

}  // namespace kshard::detail
