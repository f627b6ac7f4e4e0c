// Mesh::sub: sub-meshes over some dimensions of a mesh (DeviceMesh's mesh["tp"]) have the
// right ranks, coordinates and names, behave like meshes built directly, and refuse bad
// dimensions with the same error on every rank.

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "kshard/distribute.hpp"
#include "kshard/mesh.hpp"
#include "kshard/redistribute.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::Layout;
using kshard::Replicate;
using kshard::Shard;
using kshard::test::all_ranks;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::MemSpace;
using kshard::test::world_rank;
using kshard::test::world_size;

// World ranks of `comm`'s members, in its rank order.
std::vector<int> members(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> ranks(static_cast<std::size_t>(size));
  const int me = world_rank();
  MPI_Allgather(&me, 1, MPI_INT, ranks.data(), 1, MPI_INT, comm);
  return ranks;
}

bool congruent(MPI_Comm a, MPI_Comm b) {
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(a, b, &result);
  return result == MPI_CONGRUENT || result == MPI_IDENT;
}

// `sub` is `parent.sub(dims...)`: its ranks are the parent's ranks that share this rank's
// coordinates along the other dimensions, row-major in the order of `dims` (compared as world
// ranks).
template <std::size_t N, std::size_t K>
void check_sub(const kshard::Mesh<N>& parent, const kshard::Mesh<K>& sub,
               const std::array<std::size_t, K>& dims) {
  for (std::size_t i = 0; i < K; ++i) {
    EXPECT_EQ(sub.extent(i), parent.extent(dims[i]));
    EXPECT_EQ(sub.names()[i], parent.names()[dims[i]]);
    EXPECT_EQ(sub.coords()[i], parent.coords()[dims[i]]);
    EXPECT_TRUE(congruent(sub.dim_comm(i), parent.dim_comm(dims[i])));
  }
  EXPECT_EQ(sub.my_rank(), sub.rank_of(sub.coords()));
  const auto parent_ranks = members(parent.comm());
  const auto ranks = members(sub.comm());
  ASSERT_EQ(static_cast<int>(ranks.size()), sub.size());
  for (int r = 0; r < sub.size(); ++r) {
    auto expected = parent.coords();
    const auto c = sub.coords_of(r);
    for (std::size_t i = 0; i < K; ++i) expected[dims[i]] = c[i];
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)],
              parent_ranks[static_cast<std::size_t>(parent.rank_of(expected))])
        << "sub rank " << r;
  }
}

TEST(MeshSub, OneDimensionByNameOrIndex) {
  for (const auto& shape : kshard::test::mesh_shapes<3>(world_size())) {
    SCOPED_TRACE(::testing::Message() << "mesh shape " << ::testing::PrintToString(shape));
    const kshard::Mesh mesh(MPI_COMM_WORLD, shape, {"pp", "dp", "tp"});
    for (std::size_t m = 0; m < 3; ++m) {
      const kshard::Mesh<1> by_name = mesh.sub(mesh.names()[m]);
      const kshard::Mesh<1> by_index = mesh.sub(m);
      check_sub(mesh, by_name, {m});
      check_sub(mesh, by_index, {m});
      EXPECT_EQ(by_name.size(), shape[m]);
      EXPECT_EQ(by_name.my_rank(), mesh.coords()[m]);
      EXPECT_EQ(by_name.dim(mesh.names()[m]), 0u);
    }
  }
}

TEST(MeshSub, SeveralDimensionsInTheOrderGiven) {
  for (const auto& shape : kshard::test::mesh_shapes<3>(world_size())) {
    SCOPED_TRACE(::testing::Message() << "mesh shape " << ::testing::PrintToString(shape));
    const kshard::Mesh mesh(MPI_COMM_WORLD, shape, {"pp", "dp", "tp"});
    const kshard::Mesh<2> dp_tp = mesh.sub("dp", "tp");
    check_sub(mesh, dp_tp, {1, 2});
    const kshard::Mesh<2> tp_pp = mesh.sub("tp", 0);
    check_sub(mesh, tp_pp, {2, 0});
    EXPECT_EQ(tp_pp.names(), (std::array<std::string, 2>{"tp", "pp"}));
    const kshard::Mesh<3> all = mesh.sub(2, 1, 0);
    check_sub(mesh, all, {2, 1, 0});
    EXPECT_EQ(all.size(), world_size());
    // A sub-mesh of a sub-mesh.
    check_sub(dp_tp, dp_tp.sub("tp"), {1});
  }
}

// The local shards as flat host copies, to compare two matrices' shards.
template <class M>
std::vector<double> shard_values(const M& matrix) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, matrix.local());
  return {host.data(), host.data() + host.size()};
}

// distribute, redistribute and gather on `sub` give what they give on `direct`, a mesh over
// the same ranks built by its constructor.
template <std::size_t K, class From, class To>
void expect_same_as_direct(const kshard::Mesh<K>& sub, const kshard::Mesh<K>& direct,
                           const From& from, const To& to) {
  const auto full = kshard::test::reference_matrix<double>(7, 5, 3);
  const kshard::HostMatrix<const double> source(full);
  const auto on_sub = kshard::distribute<ExecSpace, MemSpace>(sub, from, source);
  const auto on_direct = kshard::distribute<ExecSpace, MemSpace>(direct, from, source);
  EXPECT_EQ(shard_values(on_sub), shard_values(on_direct));
  const auto moved_sub = kshard::redistribute(on_sub, to);
  const auto moved_direct = kshard::redistribute(on_direct, to);
  EXPECT_EQ(shard_values(moved_sub), shard_values(moved_direct));
  const auto gathered = kshard::gather(moved_sub);
  bool same = true;
  for (std::size_t r = 0; r < full.extent(0); ++r)
    for (std::size_t c = 0; c < full.extent(1); ++c) same = same && gathered(r, c) == full(r, c);
  EXPECT_TRUE(all_ranks(same));
}

TEST(MeshSub, WorksLikeAMeshBuiltDirectly) {
  for (const auto& shape : kshard::test::mesh_shapes<3>(world_size())) {
    SCOPED_TRACE(::testing::Message() << "mesh shape " << ::testing::PrintToString(shape));
    const kshard::Mesh mesh(MPI_COMM_WORLD, shape, {"pp", "dp", "tp"});
    const kshard::Mesh<1> tp(mesh.dim_comm(2), {shape[2]}, {"tp"});
    expect_same_as_direct(mesh.sub("tp"), tp, Layout(Shard<0>{}), Layout(Shard<1>{}));
    expect_same_as_direct(mesh.sub("tp"), tp, Layout(Replicate{}), Layout(Shard<0>{}));
    // The (dp, tp) plane of this rank, split from the world as Mesh::sub splits it.
    MPI_Comm plane = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, mesh.coords()[0], world_rank(), &plane);
    {
      const kshard::Mesh<2> dp_tp(plane, {shape[1], shape[2]}, {"dp", "tp"});
      expect_same_as_direct(mesh.sub("dp", "tp"), dp_tp, Layout(Shard<0>{}, Shard<1>{}),
                            Layout(Replicate{}, Shard<0>{}));
    }
    MPI_Comm_free(&plane);
  }
}

TEST(MeshSub, BadDimensionsAreTheSameErrorOnEveryRank) {
  const auto mesh = kshard::test::dp_tp_mesh();
  auto message = collective_error([&] { (void)mesh.sub("pp"); });
  // The message names the call the user made.
  EXPECT_NE(message.find("kshard::Mesh::sub: mesh has no dimension named 'pp' (it has dp, tp)"),
            std::string::npos)
      << message;
  message = collective_error([&] { (void)mesh.sub(2); });
  EXPECT_NE(message.find("kshard::Mesh::sub: mesh dimension index 2 is out of range: the mesh has "
                         "2 dimensions, 0 to 1 (dp, tp)"),
            std::string::npos)
      << message;
  message = collective_error([&] { (void)mesh.sub(-1); });
  EXPECT_NE(message.find("index -1 is out of range"), std::string::npos) << message;
  message = collective_error([&] { (void)mesh.sub("tp", "pp"); });
  EXPECT_NE(message.find("no dimension named 'pp'"), std::string::npos) << message;
  message = collective_error([&] { (void)mesh.sub("tp", 1); });
  EXPECT_NE(message.find("mesh dimension 1 ('tp') is chosen twice"), std::string::npos) << message;
  if (world_size() > 1) {
    // Ranks that choose different dimensions would split the mesh inconsistently.
    message = collective_error([&] {
      if (world_rank() == 0)
        (void)mesh.sub("dp", "tp");
      else
        (void)mesh.sub("tp", "dp");
    });
    EXPECT_NE(message.find("the sub-mesh dimensions"), std::string::npos) << message;
    // One dimension too: the ranks that chose right must not go on alone.
    message = collective_error([&] { (void)mesh.sub(world_rank() == 0 ? "dp" : "tp"); });
    EXPECT_NE(message.find("the sub-mesh dimensions"), std::string::npos) << message;
    message = collective_error([&] { (void)mesh.sub(world_rank() == 0 ? "pp" : "tp"); });
    EXPECT_NE(message.find("no dimension named 'pp'"), std::string::npos) << message;
  }
}

}  // namespace
