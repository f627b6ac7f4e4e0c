// Formatting of meshes and matrices (they need a communicator).

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "kshard/format.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::test::ExecSpace;
using kshard::test::MemSpace;
using kshard::test::world_size;

TEST(FormatMpi, MeshAndMatrix) {
  const int size = world_size();
  kshard::Mesh mesh(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  EXPECT_EQ(fmt::format("{}", mesh), fmt::format("Mesh(dp=1, tp={})", size));
  kshard::Layout layout(kshard::Replicate{}, kshard::Shard<0>{});
  kshard::DistMatrix<float, decltype(layout), ExecSpace, MemSpace> matrix(mesh, layout, 6, 4);
  EXPECT_EQ(
      fmt::format("{}", matrix),
      fmt::format("DistMatrix<float>[6 x 4] (Replicate(), Shard(0)) on Mesh(dp=1, tp={})", size));
  const kshard::DistMatrix<kshard::bf16, decltype(layout), ExecSpace, MemSpace> weights(
      mesh, layout, 6, 4);
  EXPECT_EQ(
      fmt::format("{}", weights),
      fmt::format("DistMatrix<bf16>[6 x 4] (Replicate(), Shard(0)) on Mesh(dp=1, tp={})", size));
  EXPECT_EQ(kshard::sharding_picture(matrix),
            kshard::sharding_picture(layout, mesh.shape(), mesh.names(), 6, 4));
}

}  // namespace
