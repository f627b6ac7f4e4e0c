// kshard::redistribute, every pair of placements on meshes of rank 1 (the five Replicate /
// Shard / StridedShard placements, the four Partial ones and the test-only block-cyclic one),
// on every mesh shape of the world size, for random shapes (0 rows, fewer rows than ranks,
// uneven), and at a size that takes the kernels; each case checked by check_transition
// (redistribute_checks.hpp).

#include <gtest/gtest.h>

#include "redistribute_checks.hpp"

namespace {

using namespace kshard::test::redistribute_checks;

TEST(Redistribute, EveryPairOnMeshRank1) {
  std::uint64_t seed = 1000;
  for (const auto& shape : kshard::test::mesh_shapes<1>(world_size())) {
    kshard::Mesh<1> mesh(MPI_COMM_WORLD, shape);
    for_each_placement_or_partial([&](auto p) {
      for_each_placement_or_partial([&](auto q) {
        for (int repeat = 0; repeat < 3; ++repeat) {
          auto rng = kshard::test::shared_rng(seed);
          const Layout source(make_placement<decltype(p)>(rng));
          const Layout target(make_placement<decltype(q)>(rng));
          const auto [rows, cols] = random_shape(seed);
          check_transition<double>(mesh, source, target, rows, cols, seed++);
        }
      });
    });
  }
}

// The test-only block-cyclic placement (tests/support/block_cyclic.hpp) to and from every
// placement, on meshes of rank 1 and 2: kshard maps, plans and moves it through its split
// rule alone, with the same checks (values, gather, plan, bytes sent) as the built-in ones.
TEST(Redistribute, CustomPlacementToAndFromEveryPlacement) {
  using kshard::test::BlockCyclic;
  std::uint64_t seed = 9000;
  auto block = [](std::uint64_t salt) {
    auto rng = kshard::test::shared_rng(salt);
    return std::uniform_int_distribution<index_t>(1, 4)(rng);
  };
  for (const auto& shape : kshard::test::mesh_shapes<1>(world_size())) {
    kshard::Mesh<1> mesh(MPI_COMM_WORLD, shape);
    for_each_placement_or_partial([&](auto p) {
      for (int repeat = 0; repeat < 2; ++repeat) {
        auto rng = kshard::test::shared_rng(seed);
        const Layout other(make_placement<decltype(p)>(rng));
        const auto [rows, cols] = random_shape(seed);
        const Layout by_rows(BlockCyclic<0>{block(seed)});
        const Layout by_cols(BlockCyclic<1>{block(seed + 1)});
        check_transition<double>(mesh, by_rows, other, rows, cols, seed++);
        check_transition<double>(mesh, other, by_rows, rows, cols, seed++);
        check_transition<double>(mesh, other, by_cols, rows, cols, seed++);
      }
    });
  }
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    for (int repeat = 0; repeat < 3; ++repeat) {
      auto rng = kshard::test::shared_rng(seed);
      const Layout dealt(BlockCyclic<0>{block(seed)}, Shard<1>{});
      const Layout twice(BlockCyclic<1>{block(seed + 1)}, BlockCyclic<0>{block(seed + 2)});
      const Layout fsdp(make_placement<StridedShard<0>>(rng), Shard<0>{});
      const auto [rows, cols] = random_shape(seed);
      check_transition<float>(mesh, dealt, fsdp, rows, cols, seed++);
      check_transition<float>(mesh, fsdp, dealt, rows, cols, seed++);
      check_transition<float>(mesh, dealt, twice, rows, cols, seed++);
      check_transition<float>(mesh, twice, Layout(Replicate{}, Replicate{}), rows, cols, seed++);
      check_transition<float>(mesh, Layout(Sum{}, Shard<0>{}), dealt, rows, cols, seed++);
    }
  }
}

// On a host backend a step that moves more than detail::host_inline_elements elements runs a
// kernel, one that moves fewer copies on the calling thread (the tests above are all small):
// every placement pair of a line mesh at 300 x 300, above the limit on every rank count up to 4.
TEST(Redistribute, LargeMovesTakeTheKernel) {
  static_assert(300 * 300 / 16 * 3 > kshard::detail::host_inline_elements);
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  std::uint64_t seed = 9000;
  for_each_placement([&](auto p) {
    for_each_placement([&](auto q) {
      auto rng = kshard::test::shared_rng(seed);
      const Layout source(make_placement<decltype(p)>(rng));
      const Layout target(make_placement<decltype(q)>(rng));
      check_transition<float>(line, source, target, 300, 300, seed++);
    });
  });
}

}  // namespace
