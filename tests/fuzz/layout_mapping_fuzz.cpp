// Fuzzes kshard's layout mapping: for a layout, mesh and matrix shape decoded from the input,
// every coordinate's maps must be consistent: each global element held by exactly as many
// coordinates as the layout replicates it, local <-> global round trips, runs that cover
// exactly the held indices in local order and are maximal, and a contiguity flag that agrees
// with the runs. Any violation traps.

#include <array>
#include <cstddef>
#include <cstdint>
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
  return 0;
}
