#pragma once

// Moving blocks of a shard in and out of flat message buffers with Kokkos kernels. The moves of
// a whole step (every block for every peer, and the elements a rank keeps) are built on the host
// once, when a plan is made, as a list of contiguous runs in device memory; each pack or unpack
// is then one kernel over that list.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "kshard/detail/kokkos_compat.hpp"
#include "kshard/index.hpp"
#include "kshard/kernels/copies.hpp"
#include "kshard/layout_mapping.hpp"
#include "kshard/redistribute/plan.hpp"

namespace kshard::detail {

// One contiguous run of a move: `count` elements from flat position `from` of source `source`
// (0: the primary source, 1: the secondary) to flat position `to` of the destination. Shards
// are row-major and contiguous, so position = local row * local width + local column; a
// message buffer is its own flat positions.
struct Move {
  index_t from = 0;
  index_t to = 0;
  index_t count = 0;
  int source = 0;
};

// One end of a block: a shard (its local indices on side a or b of the overlaps, `width`
// columns wide) or a message buffer (the block stored row-major from `offset`).
struct MoveEnd {
  bool buffer = false;
  bool side_a = true;
  index_t width = 0;
  index_t offset = 0;
};

inline MoveEnd shard_end(bool side_a, index_t width) { return {false, side_a, width, 0}; }
inline MoveEnd buffer_end(index_t offset) { return {true, true, 0, offset}; }

// Runs of a move built on the host; consecutive runs that continue each other are merged (whole
// rows of a full-width block become one run).
class MoveList {
 public:
  void add(int source, index_t from, index_t to, index_t count) {
    if (count <= 0) return;
    if (!moves_.empty()) {
      Move& last = moves_.back();
      if (last.source == source && last.from + last.count == from && last.to + last.count == to) {
        last.count += count;
        return;
      }
    }
    moves_.push_back({from, to, count, source});
  }

  // Adds the block of elements both `a` and `b` hold (sides a and b of their overlaps) from
  // `from` (of source `source`) to `to`; returns its number of elements.
  template <std::size_t A, std::size_t B>
  index_t add_block(const LayoutMapping<A>& a, const LayoutMapping<B>& b, int source,
                    const MoveEnd& from, const MoveEnd& to) {
    const std::vector<Overlap> row_runs = overlaps(a.rows, b.rows);
    const std::vector<Overlap> col_runs = overlaps(a.cols, b.cols);
    const index_t width = total_size(col_runs);
    const index_t height = total_size(row_runs);
    if (width == 0 || height == 0) return 0;
    auto position = [&](const MoveEnd& end, index_t block_row, index_t block_col,
                        const Overlap& row, index_t k, const Overlap& col) {
      if (end.buffer) return end.offset + block_row * width + block_col;
      const index_t r = (end.side_a ? row.a_local : row.b_local) + k;
      const index_t c = end.side_a ? col.a_local : col.b_local;
      return r * end.width + c;
    };
    index_t block_row = 0;
    for (const Overlap& row : row_runs)
      for (index_t k = 0; k < row.size; ++k, ++block_row) {
        index_t block_col = 0;
        for (const Overlap& col : col_runs) {
          add(source, position(from, block_row, block_col, row, k, col),
              position(to, block_row, block_col, row, k, col), col.size);
          block_col += col.size;
        }
      }
    return width * height;
  }

  // Appends the runs of `other` (after this list's).
  void append(const MoveList& other) {
    for (const Move& m : other.moves_) add(m.source, m.from, m.to, m.count);
  }

  [[nodiscard]] const std::vector<Move>& moves() const { return moves_; }
  [[nodiscard]] bool empty() const { return moves_.empty(); }

  // True when the moves copy buffer position p to shard position p for every element of a
  // buffer of `size` elements (a block layout that lands in place).
  [[nodiscard]] bool is_identity(index_t size) const {
    index_t next = 0;
    for (const Move& m : moves_) {
      if (m.source != 0 || m.from != m.to || m.from != next) return false;
      next += m.count;
    }
    return next == size;
  }

 private:
  std::vector<Move> moves_;
};

// Runs of one length whose starts advance by fixed steps on both ends, as one strided copy (the
// rows of a block): how the host copies a few elements.
struct StridedRuns {
  Move first;
  index_t repeat = 1;  // runs
  index_t from_step = 0;
  index_t to_step = 0;
};

inline std::vector<StridedRuns> strided_runs(const std::vector<Move>& moves) {
  std::vector<StridedRuns> groups;
  for (const Move& m : moves) {
    if (!groups.empty()) {
      StridedRuns& g = groups.back();
      const bool alike = m.source == g.first.source && m.count == g.first.count;
      if (alike && g.repeat == 1) {
        g.from_step = m.from - g.first.from;
        g.to_step = m.to - g.first.to;
        g.repeat = 2;
        continue;
      }
      if (alike && m.from == g.first.from + g.repeat * g.from_step &&
          m.to == g.first.to + g.repeat * g.to_step) {
        ++g.repeat;
        continue;
      }
    }
    groups.push_back({m});
  }
  return groups;
}

// At most this many elements, a host instance's moves are copied by the calling thread once the
// instance is done: a kernel launch, and a kernel that loads each run's bounds, cost more than
// such a copy (a 64 x 64 fp32 Shard<0> -> Shard<1> plan on 2 ranks spent 350 cycles on each of
// its pack and unpack kernels, where loops over the rows of the blocks take 130-190).
inline constexpr index_t host_inline_elements = 16384;

// Whether the calling thread copies `elements` elements of `MemSpace` for `space` (a host
// instance and few elements); if so, `space` has finished its work when this returns.
template <class MemSpace, class ExecSpace>
bool copy_on_calling_thread(const ExecSpace& space, index_t elements) {
  if constexpr (is_host_space_v<ExecSpace> &&
                Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible) {
    if (elements > host_inline_elements) return false;
    fence(space, "kshard::redistribute: before a copy of a few elements on the host");
    return true;
  } else {
    (void)space;
    (void)elements;
    return false;
  }
}

// A move list in the memory of `MemSpace`, its runs cut to at most `chunk` elements so that one
// kernel spreads a large block over every thread; where the host can read that memory, also the
// runs as strided copies, for moves of a few elements.
template <class MemSpace>
struct DeviceMoves {
  Kokkos::View<const Move*, MemSpace> moves;
  index_t size = 0;      // number of runs
  index_t elements = 0;  // in all runs
  std::vector<StridedRuns> host_runs;

  static constexpr index_t chunk = 8192;

  DeviceMoves() = default;
  template <class Space>
  DeviceMoves(const Space& space, const MoveList& list) {
    std::vector<Move> cut;
    for (const Move& m : list.moves())
      for (index_t done = 0; done < m.count; done += chunk)
        cut.push_back({m.from + done, m.to + done, std::min(chunk, m.count - done), m.source});
    size = static_cast<index_t>(cut.size());
    for (const Move& m : cut) elements += m.count;
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible)
      if (elements <= host_inline_elements) host_runs = strided_runs(list.moves());
    moves = vector_to_space<MemSpace>(space, cut, "kshard::redistribute::moves");  // plan time
  }
};

// out[0, count) = src[0, count), the two not overlapping: said to the compiler, which then
// copies without checking for overlap first (1.1-1.2x faster on large runs): on the host, a call
// to memcpy.
template <class T>
KOKKOS_INLINE_FUNCTION void copy_long_run(T* KOKKOS_RESTRICT out, const T* KOKKOS_RESTRICT src,
                                          const index_t count) {
  for (index_t j = 0; j < count; ++j) out[j] = src[j];
}

// Below this many bytes, a host build with AVX2 or wider vectors copies a run with its own
// vector loop: a call to memcpy per 2 KiB run took 1.17x as long as the loop on a Xeon (the rows
// of a Shard<0> -> Shard<1> pack, 65536 x 1024 fp32 on 2 ranks). Built for SSE2 only, the loop
// is slower than memcpy at every length (glibc chooses its AVX form at run time).
inline constexpr std::size_t short_run_bytes = 4096;

// out[0, count) = src[0, count), the two not overlapping.
template <class T>
KOKKOS_INLINE_FUNCTION void copy_run(T* out, const T* src, const index_t count) {
#if defined(__AVX2__)
  if (static_cast<std::size_t>(count) * sizeof(T) < short_run_bytes) {
    for (index_t j = 0; j < count; ++j) out[j] = src[j];
    return;
  }
#endif
  copy_long_run(out, src, count);
}

// dst[m.to + j] = (m.source == 0 ? src0 : src1)[m.from + j] for every run m. On host spaces one
// iteration per run (a straight loop the compiler vectorises); elsewhere one team per run, its
// threads on consecutive elements.
template <class T, class Moves>
struct RunMoves {
  Moves moves;
  T* dst;
  const T* src0;
  const T* src1;

  KOKKOS_INLINE_FUNCTION void operator()(const index_t k) const {
    const Move m = moves(k);
    copy_run(dst + m.to, (m.source == 0 ? src0 : src1) + m.from, m.count);
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const Move m = moves(member.league_rank());
    const T* src = (m.source == 0 ? src0 : src1) + m.from;
    T* out = dst + m.to;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, m.count),
                         [&](const index_t j) { out[j] = src[j]; });
  }
};

// The moves of `runs`, on the calling thread.
template <class T>
void copy_strided_runs(const std::vector<StridedRuns>& runs, T* dst, const T* src0, const T* src1) {
  for (const StridedRuns& g : runs) {
    const T* src = (g.first.source == 0 ? src0 : src1) + g.first.from;
    T* out = dst + g.first.to;
    const index_t count = g.first.count;
    for (index_t r = 0; r < g.repeat; ++r, src += g.from_step, out += g.to_step)
      for (index_t j = 0; j < count; ++j) out[j] = src[j];
  }
}

// One kernel on `space` that runs every move of `moves` (nothing when there are none); a few
// elements on a host instance, strided copies on the calling thread after the instance's work.
template <class ExecSpace, class T, class MemSpace>
void run_moves(const ExecSpace& space, const DeviceMoves<MemSpace>& moves, T* dst, const T* src0,
               const T* src1) {
  if (moves.size == 0) return;
  using Functor = RunMoves<T, Kokkos::View<const Move*, MemSpace>>;
  const Functor functor{moves.moves, dst, src0, src1};
  if (copy_on_calling_thread<MemSpace>(space, moves.elements)) {
    copy_strided_runs(moves.host_runs, dst, src0, src1);
    return;
  }
  if constexpr (is_host_space_v<ExecSpace>) {
    Kokkos::parallel_for(
        "kshard::redistribute::move",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(space, 0, moves.size), functor);
  } else {
    Kokkos::parallel_for(
        "kshard::redistribute::move",
        Kokkos::TeamPolicy<ExecSpace>(
            space, checked_int(moves.size, "redistribute", "the number of runs (a team each)"),
            Kokkos::AUTO),
        functor);
  }
}

// The block a host instance copies a large shard in: Kokkos::deep_copy hands a host copy to one
// memcpy, which streams a large one with non-temporal stores, 1.15-1.2x slower on a Zen 5 core
// than memcpys of 128 KiB (the block Open MPI copies a buffer in, so that its collectives on one
// rank outran kshard's copy).
inline constexpr std::size_t host_copy_block_bytes = std::size_t{1} << 17;

// dst[0, size) = src[0, size) by blocks of host_copy_block_bytes, a work item each: a functor of
// host instances only (it calls memcpy, which a loop without `restrict` would not become).
template <class T>
struct HostBlockCopy {
  static constexpr auto block = static_cast<index_t>(host_copy_block_bytes / sizeof(T));
  T* dst;
  const T* src;
  index_t size;

  void operator()(const index_t b) const {
    const index_t begin = b * block;
    std::memcpy(dst + begin, src + begin,
                static_cast<std::size_t>(std::min(block, size - begin)) * sizeof(T));
  }
};

// dst = src (contiguous views of one shape) on `space`; a few elements on a host instance, on
// the calling thread after the instance's work (Kokkos::deep_copy costs more than the copy);
// more on a host instance, by HostBlockCopy.
template <class ExecSpace, class View>
void copy_shard(const ExecSpace& space, const View& dst, const View& src) {
  using MemSpace = typename View::memory_space;
  using T = typename View::value_type;
  const auto size = static_cast<index_t>(src.size());
  if (copy_on_calling_thread<MemSpace>(space, size)) {
    std::copy_n(src.data(), src.size(), dst.data());
  } else if constexpr (is_host_space_v<ExecSpace>) {
    constexpr index_t block = HostBlockCopy<T>::block;
    Kokkos::parallel_for("kshard::redistribute::copy",
                         Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(
                             space, 0, (size + block - 1) / block),
                         HostBlockCopy<T>{dst.data(), src.data(), size});
  } else {
    Kokkos::deep_copy(space, dst, src);
  }
}

template <class T>
struct DivideAll {
  T* data;
  T divisor;
  KOKKOS_INLINE_FUNCTION void operator()(index_t i) const { data[i] = data[i] / divisor; }
};

// Divides every element of a contiguous buffer of `size` elements by `divisor` (the mean of a
// Partial<avg>), on `space`.
template <class ExecSpace, class T>
void divide_all(const ExecSpace& space, T* data, index_t size, int divisor) {
  if (size == 0) return;
  Kokkos::parallel_for("kshard::redistribute::average",
                       Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(space, 0, size),
                       DivideAll<T>{data, static_cast<T>(divisor)});
}

}  // namespace kshard::detail
