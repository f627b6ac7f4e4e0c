// Mesh: coordinates, sub-communicators and collective errors, for every mesh shape of rank
// 1-3 that fits the world size.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kshard/mesh.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::test::all_ranks;
using kshard::test::collective_error;
using kshard::test::world_rank;
using kshard::test::world_size;

template <std::size_t N>
void check_mesh(const std::array<int, N>& shape) {
  kshard::Mesh<N> mesh(MPI_COMM_WORLD, shape);
  SCOPED_TRACE(::testing::Message() << "mesh shape " << ::testing::PrintToString(shape));
  EXPECT_EQ(mesh.size(), world_size());
  EXPECT_EQ(mesh.my_rank(), world_rank());
  EXPECT_EQ(mesh.coords(), mesh.coords_of(mesh.my_rank()));
  for (int r = 0; r < mesh.size(); ++r) {
    const auto c = mesh.coords_of(r);
    EXPECT_EQ(mesh.rank_of(c), r);
    for (std::size_t m = 0; m < N; ++m) EXPECT_TRUE(c[m] >= 0 && c[m] < shape[m]);
  }
  // Row-major: the last coordinate varies fastest.
  if (mesh.size() > 1 && shape[N - 1] > 1) {
    EXPECT_EQ(mesh.coords_of(1)[N - 1], 1);
  }
  for (std::size_t m = 0; m < N; ++m) {
    MPI_Comm sub = mesh.dim_comm(m);
    int sub_size = 0;
    int sub_rank = 0;
    MPI_Comm_size(sub, &sub_size);
    MPI_Comm_rank(sub, &sub_rank);
    EXPECT_EQ(sub_size, shape[m]);
    EXPECT_EQ(sub_rank, mesh.coords()[m]);
    // Members, in sub-communicator order, are the ranks differing only in coordinate m.
    std::vector<int> members(static_cast<std::size_t>(sub_size));
    const int me = mesh.my_rank();
    MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, sub);
    for (int i = 0; i < sub_size; ++i) {
      auto expected = mesh.coords();
      expected[m] = i;
      EXPECT_EQ(members[static_cast<std::size_t>(i)], mesh.rank_of(expected));
    }
  }
}

TEST(Mesh, EveryShapeOfRank1To3) {
  for (const auto& shape : kshard::test::mesh_shapes<1>(world_size())) check_mesh<1>(shape);
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) check_mesh<2>(shape);
  for (const auto& shape : kshard::test::mesh_shapes<3>(world_size())) check_mesh<3>(shape);
}

TEST(Mesh, NamesAndCheapCopies) {
  kshard::Mesh mesh(MPI_COMM_WORLD, {1, world_size()}, {"dp", "tp"});
  EXPECT_EQ(mesh.dim("dp"), 0u);
  EXPECT_EQ(mesh.dim("tp"), 1u);
  EXPECT_THROW((void)mesh.dim("pp"), kshard::error);
  const auto copy = mesh;
  EXPECT_TRUE(copy == mesh);
  EXPECT_EQ(copy.comm(), mesh.comm());
  EXPECT_EQ(copy.dim_comm(1), mesh.dim_comm(1));
  // A duplicate, not the world communicator itself.
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(mesh.comm(), MPI_COMM_WORLD, &result);
  EXPECT_EQ(result, MPI_CONGRUENT);
}

TEST(Mesh, WrongShapeIsTheSameErrorOnEveryRank) {
  const int size = world_size();
  auto message = collective_error([&] { kshard::Mesh<2> m(MPI_COMM_WORLD, {2, size}); });
  EXPECT_NE(message.find("holds " + std::to_string(2 * size) + " ranks but the communicator has " +
                         std::to_string(size)),
            std::string::npos)
      << message;
  message = collective_error([&] { kshard::Mesh<1> m(MPI_COMM_WORLD, {0}); });
  EXPECT_NE(message.find("extent 0; it must be >= 1"), std::string::npos) << message;
  message = collective_error([&] { kshard::Mesh m(MPI_COMM_WORLD, {size, 1}, {"x", "x"}); });
  EXPECT_NE(message.find("'x' is used twice"), std::string::npos) << message;
  // A bad shape on one rank only.
  message = collective_error([&] {
    const int last = world_rank() == size - 1 ? size + 1 : size;
    kshard::Mesh<1> m(MPI_COMM_WORLD, {last});
  });
  EXPECT_NE(message.find("holds " + std::to_string(size + 1) + " ranks"), std::string::npos)
      << message;
}

// An error inside MPI on a mesh communicator is a kshard::error carrying MPI's message, not an
// abort: the process can go on to the next collective. The error is one every MPI reports at
// run time on every rank (a receive shorter than its message; argument checks may be compiled
// out, as in Debian's MPICH). MPI's own text may differ between ranks (MPICH's error stack
// names buffer addresses), so each rank checks its own message.
TEST(Mesh, MpiErrorsBecomeExceptions) {
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  const auto size = static_cast<std::size_t>(world_size());
  const std::vector<double> send(2 * size, 1.0);
  std::vector<double> recv(size);
  std::vector<int> send_counts(size, 2), recv_counts(size, 1), send_displs(size), recv_displs(size);
  for (std::size_t r = 0; r < size; ++r) {
    send_displs[r] = static_cast<int>(2 * r);
    recv_displs[r] = static_cast<int>(r);
  }
  std::string message;
  try {
    const kshard::detail::Operation operation("redistribute");
    kshard::detail::alltoallv(send.data(), send_counts.data(), send_displs.data(), recv.data(),
                              recv_counts.data(), recv_displs.data(), mesh.dim_comm(0));
  } catch (const kshard::error& e) {
    message = e.what();
  }
  EXPECT_TRUE(all_ranks(message.rfind("kshard::redistribute: MPI_Alltoallv failed: ", 0) == 0))
      << message;
  double value = 1;
  kshard::detail::allreduce(&value, 1, MPI_SUM, mesh.comm());
  EXPECT_EQ(value, world_size());
}

}  // namespace
