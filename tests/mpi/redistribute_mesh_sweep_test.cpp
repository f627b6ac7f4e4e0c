// kshard::redistribute, every pair of placements on meshes of rank 2, layouts with Partial
// dimensions, and several layouts of rank 3, on every mesh shape of the world size, for
// random shapes; each case checked by check_transition (redistribute_checks.hpp).

#include <gtest/gtest.h>

#include "redistribute_checks.hpp"

namespace {

using namespace kshard::test::redistribute_checks;

// Every source layout of two placements, to the layout with the placements swapped (so each
// mesh dim sees every transition between the five placements) and to a few fixed layouts.
TEST(Redistribute, EveryPlacementPairOnMeshRank2) {
  std::uint64_t seed = 2000;
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    for_each_placement([&](auto p0) {
      for_each_placement([&](auto p1) {
        auto rng = kshard::test::shared_rng(seed);
        const Layout source(make_placement<decltype(p0)>(rng), make_placement<decltype(p1)>(rng));
        const Layout swapped(make_placement<decltype(p1)>(rng), make_placement<decltype(p0)>(rng));
        const Layout fsdp(StridedShard<0>{make_placement<StridedShard<0>>(rng).factor}, Shard<0>{});
        for (int repeat = 0; repeat < 2; ++repeat) {
          auto [rows, cols] = random_shape(seed);
          check_transition<float>(mesh, source, swapped, rows, cols, seed++);
          check_transition<float>(mesh, source, Layout(Replicate{}, Replicate{}), rows, cols,
                                  seed++);
          check_transition<float>(mesh, source, Layout(Shard<1>{}, Shard<0>{}), rows, cols, seed++);
          check_transition<float>(mesh, source, fsdp, rows, cols, seed++);
        }
      });
    });
  }
}

TEST(Redistribute, PartialLayoutsOnMeshRank2) {
  std::uint64_t seed = 3000;
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    for (int repeat = 0; repeat < 3; ++repeat) {
      const auto [rows, cols] = random_shape(seed);
      check_transition<double>(mesh, Layout(Sum{}, Shard<1>{}), Layout(Shard<0>{}, Shard<1>{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Sum{}, Shard<0>{}), Layout(Shard<0>{}, Shard<0>{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Shard<0>{}, Max{}), Layout(Replicate{}, Shard<1>{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Sum{}, Avg{}), Layout(StridedShard<0>{2}, Shard<0>{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Sum{}, Shard<1>{}), Layout(Sum{}, Shard<0>{}), rows,
                               cols, seed++);
      check_transition<double>(mesh, Layout(Shard<1>{}, StridedShard<0>{2}), Layout(Min{}, Sum{}),
                               rows, cols, seed++);
      check_transition<double>(mesh, Layout(Max{}, Replicate{}), Layout(Min{}, Shard<0>{}), rows,
                               cols, seed++);
    }
  }
}

TEST(Redistribute, SeveralLayoutsOnMeshRank3) {
  std::uint64_t seed = 4000;
  for (const auto& shape : kshard::test::mesh_shapes<3>(world_size())) {
    kshard::Mesh<3> mesh(MPI_COMM_WORLD, shape, {"pp", "dp", "tp"});
    for (int repeat = 0; repeat < 2; ++repeat) {
      const auto [rows, cols] = random_shape(seed);
      check_transition<double>(mesh, Layout(Shard<0>{}, StridedShard<0>{2}, Replicate{}),
                               Layout(Replicate{}, Shard<1>{}, Shard<0>{}), rows, cols, seed++);
      check_transition<double>(mesh, Layout(StridedShard<0>{3}, Shard<1>{}, Shard<0>{}),
                               Layout(Shard<0>{}, Shard<0>{}, StridedShard<1>{2}), rows, cols,
                               seed++);
      check_transition<float>(mesh, Layout(Replicate{}, StridedShard<1>{2}, StridedShard<0>{2}),
                              Layout(Shard<1>{}, Replicate{}, Replicate{}), rows, cols, seed++);
      check_transition<float>(mesh, Layout(Sum{}, Shard<0>{}, Avg{}),
                              Layout(Shard<1>{}, Shard<0>{}, StridedShard<0>{3}), rows, cols,
                              seed++);
      check_transition<double>(mesh, Layout(Shard<1>{}, Shard<0>{}, Sum{}),
                               Layout(Shard<1>{}, Replicate{}, Shard<0>{}), rows, cols, seed++);
      check_transition<double>(mesh, Layout(Replicate{}, Replicate{}, Replicate{}),
                               Layout(Shard<0>{}, StridedShard<0>{2}, Shard<1>{}), rows, cols,
                               seed++);
    }
  }
}

}  // namespace
