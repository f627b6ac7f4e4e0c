// Fuzzes kshard's layout mapping: for a layout, mesh and matrix shape decoded from the input,
// every coordinate's maps must be consistent: each global element held by exactly as many
// coordinates as the layout replicates it, local <-> global round trips, runs that cover
// exactly the held indices in local order and are maximal, and a contiguity flag that agrees
// with the runs. Any violation traps.
//
// The bytes left after that drive a second check at the ends of the value range: extents and
// split factors near 0, near INT64_MAX, at powers of two +- 2, rank counts up to 4097, up to
// three splits of one axis. There only a bounded sample of indices is checked: each level's
// coordinates partition their parent extent (local extents >= 0 that add up), every sampled
// index has exactly one owner per level with an exact round trip, runs are consistent and
// maximal, and out-of-range queries answer `invalid_index`. UBSan traps on any overflow.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "kshard/layout_mapping.hpp"

namespace {

using kshard::index_t;
using kshard::MeshDimAction;
using kshard::PlacementKind;

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  // A value in [0, bound), 0 once the input is used up.
  int next(int bound) { return pos_ < size_ ? data_[pos_++] % bound : 0; }
  // `bytes` bytes big-endian, zeros once the input is used up.
  std::uint64_t raw(int bytes) {
    std::uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) value = value << 8 | static_cast<std::uint64_t>(next(256));
    return value;
  }
  bool more() const { return pos_ < size_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

void require(bool ok) {
  if (!ok) __builtin_trap();
}

template <std::size_t N>
void check(Input& in) {
  std::array<MeshDimAction, N> actions{};
  std::array<int, N> shape{};
  int size = 1;
  for (std::size_t m = 0; m < N; ++m) {
    shape[m] = 1 + in.next(5);
    size *= shape[m];
    switch (in.next(5)) {
      case 0:
        actions[m] = {PlacementKind::replicate, -1, 1};
        break;
      case 1:
        actions[m] = {PlacementKind::shard, 0, 1};
        break;
      case 2:
        actions[m] = {PlacementKind::shard, 1, 1};
        break;
      case 3:
        actions[m] = {PlacementKind::strided_shard, 0, 1 + in.next(7)};
        break;
      default:
        actions[m] = {PlacementKind::strided_shard, 1, 1 + in.next(7)};
        break;
    }
  }
  const index_t rows = in.next(64);
  const index_t cols = in.next(24);
  int replicas = 1;
  for (std::size_t m = 0; m < N; ++m)
    if (actions[m].tensor_dim < 0) replicas *= shape[m];

  std::vector<int> held(static_cast<std::size_t>(rows * cols), 0);
  for (int r = 0; r < size; ++r) {
    std::array<int, N> coord{};
    for (std::size_t m = N, rest = static_cast<std::size_t>(r); m-- > 0;) {
      coord[m] = static_cast<int>(rest % static_cast<std::size_t>(shape[m]));
      rest /= static_cast<std::size_t>(shape[m]);
    }
    const auto map = kshard::map_layout(actions, shape, coord, rows, cols);
    for (int d = 0; d < 2; ++d) {
      const auto& axis = map.axis(d);
      const index_t n = d == 0 ? rows : cols;
      const auto runs = axis.runs();
      index_t local = 0;
      for (std::size_t i = 0; i < runs.size(); ++i) {
        require(runs[i].size > 0 && runs[i].local_begin == local);
        if (i > 0) require(runs[i].global_begin > runs[i - 1].global_end());
        for (index_t k = 0; k < runs[i].size; ++k) {
          require(axis.to_global(local + k) == runs[i].global_begin + k);
          require(axis.to_local(runs[i].global_begin + k) == local + k);
        }
        local += runs[i].size;
      }
      require(local == axis.local_extent());
      require(axis.is_contiguous() == (runs.size() <= 1));
      require(axis.global_offset() == (runs.empty() ? n : runs[0].global_begin));
      index_t held_here = 0;
      for (index_t g = -1; g <= n; ++g) held_here += axis.is_local(g) ? 1 : 0;
      require(held_here == local);
      require(axis.to_global(local) == kshard::invalid_index);
    }
    for (const auto& rr : map.rows.runs())
      for (const auto& cr : map.cols.runs())
        for (index_t i = 0; i < rr.size; ++i)
          for (index_t j = 0; j < cr.size; ++j)
            ++held[static_cast<std::size_t>((rr.global_begin + i) * cols + cr.global_begin + j)];
  }
  for (int count : held) require(count == replicas);
}

// ---- Extreme values ----

constexpr index_t max = std::numeric_limits<index_t>::max();
constexpr index_t invalid = kshard::invalid_index;
using wide = __int128;

// A value in [lo, INT64_MAX], mostly at the edges: small, INT64_MAX - small, 2^e +- 2,
// INT64_MAX / d - small, or any 63-bit value.
index_t extreme(Input& in, index_t lo) {
  index_t value = 0;
  switch (in.next(6)) {
    case 0:
      value = in.next(256);
      break;
    case 1:
      value = max - in.next(256);
      break;
    case 2:
      value = (index_t{1} << in.next(63)) + (in.next(5) - 2);
      break;
    case 3:
      value = max / (1 + in.next(256)) - in.next(3);
      break;
    default:
      value = static_cast<index_t>(in.raw(8) >> 1);
      break;
  }
  return value < lo ? lo : value;
}

// A rank count in [1, 4097]: mostly up to 8, as large ones make an input slow.
index_t rank_count(Input& in) {
  switch (in.next(16)) {
    case 14: {
      const index_t value = (index_t{1} << in.next(13)) + in.next(3) - 1;
      return value < 1 ? 1 : value;
    }
    case 15:
      return 1 + static_cast<index_t>(in.raw(2) % 4096);
    default:
      return 1 + in.next(8);
  }
}

struct Split {
  index_t factor = 1;
  index_t ranks = 1;
  index_t coord = 0;
};
using Splits = std::array<Split, 3>;
using Axis = kshard::AxisMap<3>;

Axis axis_of(index_t n, const Splits& splits, std::size_t levels) {
  Axis axis(n);
  for (std::size_t j = 0; j < levels; ++j)
    axis.add_split(splits[j].factor, splits[j].ranks, splits[j].coord);
  return axis;
}

// Global index `g` of an axis of `n` has exactly one owner per level, and every owner's map
// round-trips it.
void check_owners(index_t n, Splits splits, std::size_t levels, index_t g) {
  for (std::size_t j = 0; j < levels; ++j) {
    const Axis prefix = axis_of(n, splits, j);
    index_t owners = 0;
    index_t owner = 0;
    for (index_t c = 0; c < splits[j].ranks; ++c) {
      Axis axis = prefix;
      axis.add_split(splits[j].factor, splits[j].ranks, c);
      const index_t local = axis.to_local(g);
      if (local == invalid) continue;
      require(local >= 0 && local < axis.local_extent() && axis.to_global(local) == g);
      ++owners;
      owner = c;
    }
    require(owners == 1);
    splits[j].coord = owner;
  }
}

void check_extreme(Input& in) {
  const index_t n = extreme(in, 0);
  const auto levels = static_cast<std::size_t>(1 + in.next(3));
  Splits splits{};
  for (std::size_t j = 0; j < levels; ++j) {
    Split& s = splits[j];
    s.factor = in.next(3) == 0 ? 1 : extreme(in, 1);
    s.ranks = rank_count(in);
    switch (in.next(4)) {
      case 0:
        s.coord = 0;
        break;
      case 1:
        s.coord = s.ranks - 1;
        break;
      case 2:
        s.coord = s.ranks / 2;
        break;
      default:
        s.coord = static_cast<index_t>(in.raw(2) % static_cast<std::uint64_t>(s.ranks));
        break;
    }
  }

  // Every level's coordinates partition its parent extent.
  for (std::size_t j = 0; j < levels; ++j) {
    const Axis prefix = axis_of(n, splits, j);
    wide total = 0;
    for (index_t c = 0; c < splits[j].ranks; ++c) {
      Axis axis = prefix;
      axis.add_split(splits[j].factor, splits[j].ranks, c);
      require(axis.local_extent() >= 0 && axis.local_extent() <= prefix.local_extent());
      total += axis.local_extent();
    }
    require(total == prefix.local_extent());
  }

  // Sampled global indices: the ends, around piece boundaries, drawn ones, the middle. Each
  // costs one map per coordinate of every level, so large meshes get fewer samples (at most
  // ~4k maps per input, at least two samples).
  if (n > 0) {
    const wide piece = (wide{n} + splits[0].factor - 1) / splits[0].factor;
    const wide multiple = piece * static_cast<index_t>(in.raw(1));
    std::vector<wide> samples{0, wide{n} - 1, piece, piece - 1, multiple, multiple - 1};
    for (int t = 0; t < 3; ++t) samples.push_back(extreme(in, 0) % n);
    for (wide g : {multiple + 1, wide{1}, wide{n / 2}, wide{n} - 2}) samples.push_back(g);
    index_t cost = 0;
    for (std::size_t j = 0; j < levels; ++j) cost += splits[j].ranks;
    const std::size_t budget = cost > 2048 ? 2 : static_cast<std::size_t>(4096 / cost);
    for (std::size_t i = 0; i < samples.size() && i < budget; ++i)
      if (samples[i] >= 0 && samples[i] < n)
        check_owners(n, splits, levels, static_cast<index_t>(samples[i]));
  }

  // The drawn coordinate's map, built as matrices build it.
  const index_t cols = extreme(in, 0);
  std::array<MeshDimAction, 3> actions{};
  std::array<int, 3> shape{1, 1, 1};
  std::array<int, 3> coord{};
  for (std::size_t j = 0; j < levels; ++j) {
    actions[j] = {PlacementKind::strided_shard, 0, splits[j].factor};
    shape[j] = static_cast<int>(splits[j].ranks);
    coord[j] = static_cast<int>(splits[j].coord);
  }
  const auto mapping = kshard::map_layout(actions, shape, coord, n, cols);
  const auto& axis = mapping.rows;
  const index_t extent = axis.local_extent();
  require(axis.global_extent() == n && extent == axis_of(n, splits, levels).local_extent());
  require(mapping.cols.local_extent() == cols);
  const wide size = wide{extent} * cols;
  require(mapping.local_size() == (size > max ? max : static_cast<index_t>(size)));

  for (index_t out : {std::numeric_limits<index_t>::min(), index_t{-1}, n, max})
    if (out < 0 || out >= n) require(axis.to_local(out) == invalid);
  for (index_t out : {std::numeric_limits<index_t>::min(), index_t{-1}, extent, max})
    if (out < 0 || out >= extent)
      require(axis.to_global(out) == invalid && axis.run_length(out) == 0);
  require(axis.is_contiguous() == (extent == 0 || axis.run_length(0) == extent));
  require(axis.global_offset() == (extent == 0 ? n : axis.to_global(0)));

  std::vector<index_t> locals{0, 1, extent / 2, extent - 2, extent - 1};
  if (extent > 0)
    for (int t = 0; t < 2; ++t) locals.push_back(extreme(in, 0) % extent);
  for (index_t l : locals) {
    if (l < 0 || l >= extent) continue;
    const index_t g = axis.to_global(l);
    require(g >= 0 && g < n && axis.to_local(g) == l);
    if (l > 0) require(axis.to_global(l - 1) < g);  // local order is global order
    const index_t run = axis.run_length(l);
    require(run >= 1 && run <= extent - l);
    require(axis.to_global(l + run - 1) == g + run - 1);
    if (l + run < extent) require(axis.to_global(l + run) > g + run);  // maximal
  }

  if (extent <= 4096) {  // small enough to list: runs cover the local range in order
    index_t local = 0;
    const auto runs = axis.runs();
    for (std::size_t i = 0; i < runs.size(); ++i) {
      require(runs[i].size > 0 && runs[i].local_begin == local);
      if (i > 0) require(runs[i].global_begin > runs[i - 1].global_end());
      for (index_t k = 0; k < runs[i].size; ++k)
        require(axis.to_local(runs[i].global_begin + k) == local + k);
      local += runs[i].size;
    }
    require(local == extent);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  switch (in.next(3)) {
    case 0:
      check<1>(in);
      break;
    case 1:
      check<2>(in);
      break;
    default:
      check<3>(in);
      break;
  }
  if (in.more()) check_extreme(in);
  return 0;
}
