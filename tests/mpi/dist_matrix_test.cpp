// DistMatrix on the backend under test: allocation, wrapping, device-side maps, and
// distribute -> gather returning the input bit for bit, for random shapes (0 rows, fewer rows
// than ranks, uneven) and every layout of Replicate / Shard / StridedShard over mesh ranks 1
// and 2, plus several of rank 3, on every mesh shape that fits the world size.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <random>
#include <string>
#include <tuple>

#include "kshard/distribute.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using kshard::test::all_ranks;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::for_each_placement;
using kshard::test::make_placement;
using kshard::test::Matrix;
using kshard::test::MemSpace;
using kshard::test::reference_matrix;
using kshard::test::same_bits;
using kshard::test::world_size;

template <class T, class L, std::size_t M>
void check_round_trip(const kshard::Mesh<M>& mesh, const L& layout, index_t rows, index_t cols,
                      std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "layout #" << seed << " mesh " << ::testing::PrintToString(mesh.shape()) << " "
               << rows << " x " << cols);
  const auto full = reference_matrix<T>(rows, cols, seed);
  // A HostMatrix<T> and a HostMatrix<const T> are both accepted.
  const auto matrix = seed % 2 == 0 ? kshard::distribute<ExecSpace, MemSpace>(mesh, layout, full)
                                    : kshard::distribute<ExecSpace, MemSpace>(
                                          mesh, layout, kshard::HostMatrix<const T>(full));
  // The shard is exactly the reference at the mapped global indices.
  const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
  const auto& map = matrix.mapping();
  bool shard_ok = static_cast<index_t>(local.extent(0)) == map.rows.local_extent() &&
                  static_cast<index_t>(local.extent(1)) == map.cols.local_extent();
  for (index_t i = 0; shard_ok && i < map.rows.local_extent(); ++i)
    for (index_t j = 0; j < map.cols.local_extent(); ++j)
      shard_ok = shard_ok && local(i, j) == full(map.rows.to_global(i), map.cols.to_global(j));
  EXPECT_TRUE(all_ranks(shard_ok));
  EXPECT_TRUE(all_ranks(same_bits(kshard::gather(matrix), full)));
}

// Random shapes: 0 rows, fewer rows than ranks, uneven; same on every rank.
template <class T, class L, std::size_t M>
void check_shapes(const kshard::Mesh<M>& mesh, const L& layout, std::uint64_t seed) {
  auto rng = kshard::test::shared_rng(seed);
  auto pick = [&](index_t hi) { return std::uniform_int_distribution<index_t>(0, hi)(rng); };
  check_round_trip<T>(mesh, layout, 0, pick(5), seed);
  check_round_trip<T>(mesh, layout, pick(3), pick(3), seed + 1);
  check_round_trip<T>(mesh, layout, 7 + pick(30), 1 + pick(9), seed + 2);
}

TEST(DistMatrix, RoundTripEveryLayoutOnMeshRank1) {
  std::uint64_t seed = 100;
  for (const auto& shape : kshard::test::mesh_shapes<1>(world_size())) {
    kshard::Mesh<1> mesh(MPI_COMM_WORLD, shape);
    for_each_placement([&](auto p) {
      auto rng = kshard::test::shared_rng(seed);
      Layout layout(make_placement<decltype(p)>(rng));
      check_shapes<float>(mesh, layout, seed++);
      check_shapes<double>(mesh, layout, seed++);
    });
  }
}

TEST(DistMatrix, RoundTripEveryLayoutOnMeshRank2) {
  std::uint64_t seed = 200;
  for (const auto& shape : kshard::test::mesh_shapes<2>(world_size())) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    for_each_placement([&](auto p) {
      for_each_placement([&](auto q) {
        auto rng = kshard::test::shared_rng(seed);
        Layout layout(make_placement<decltype(p)>(rng), make_placement<decltype(q)>(rng));
        check_shapes<float>(mesh, layout, seed++);
      });
    });
  }
}

TEST(DistMatrix, RoundTripSeveralLayoutsOnMeshRank3) {
  std::uint64_t seed = 300;
  for (const auto& shape : kshard::test::mesh_shapes<3>(world_size())) {
    kshard::Mesh<3> mesh(MPI_COMM_WORLD, shape, {"pp", "dp", "tp"});
    check_shapes<double>(mesh, Layout(Shard<0>{}, StridedShard<0>{2}, Replicate{}), seed++);
    check_shapes<double>(mesh, Layout(StridedShard<0>{3}, Shard<1>{}, Shard<0>{}), seed++);
    check_shapes<float>(mesh, Layout(Replicate{}, StridedShard<1>{2}, StridedShard<0>{2}), seed++);
    check_shapes<float>(mesh, Layout(Shard<1>{}, Shard<0>{}, StridedShard<0>{3}), seed++);
  }
}

// Sets each element from its global indices, in a kernel (a free function: nvcc allows no
// device lambda in a gtest body, which is a private member function).
template <class M>
void fill_from_global_indices(const M& matrix) {
  const auto map = matrix.mapping();
  const auto local = matrix.local();
  Kokkos::parallel_for(
      "fill",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(
          {0, 0}, {map.rows.local_extent(), map.cols.local_extent()}),
      KOKKOS_LAMBDA(const index_t i, const index_t j) {
        const index_t r = map.rows.to_global(i);
        const index_t c = map.cols.to_global(j);
        // Round trip in the kernel too; a miss would show as a negative value.
        local(i, j) = map.rows.to_local(r) == i && map.cols.to_local(c) == j
                          ? static_cast<double>(100 * r + c)
                          : -1.0;
      });
}

// The maps work inside kernels on the backend: each element is set from its global indices.
TEST(DistMatrix, MapsInsideKernels) {
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, world_size()}, {"dp", "tp"});
  kshard::Layout layout(Shard<1>{}, StridedShard<0>{2});
  const index_t rows = 11;
  const index_t cols = 5;
  Matrix<double, decltype(layout)> matrix(mesh, layout, rows, cols);
  fill_from_global_indices(matrix);
  const auto full = kshard::gather(matrix);
  bool ok = true;
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) ok = ok && full(r, c) == static_cast<double>(100 * r + c);
  EXPECT_TRUE(all_ranks(ok));
}

TEST(DistMatrix, AllocatesTheMappedShape) {
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  Layout layout(Shard<0>{});
  Matrix<float, decltype(layout)> matrix(mesh, layout, 3, 4);  // fewer rows than 4 ranks
  const index_t expected = kshard::chunk_extent(3, world_size(), mesh.my_rank());
  EXPECT_EQ(static_cast<index_t>(matrix.local().extent(0)), expected);
  EXPECT_EQ(matrix.local().extent(1), 4u);
  EXPECT_EQ(matrix.rows(), 3);
  EXPECT_EQ(matrix.cols(), 4);
  EXPECT_EQ(matrix.extent(0), 3);
}

TEST(DistMatrix, WrapsAViewOfTheRightShapeAndRejectsOthers) {
  const int size = world_size();
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  Layout layout(Shard<0>{});
  using M = Matrix<float, decltype(layout)>;
  const index_t rows = 10;
  const auto mine = static_cast<std::size_t>(kshard::chunk_extent(rows, size, mesh.my_rank()));
  typename M::view_type view("wrapped", mine, 3);
  const M wrapped(mesh, layout, rows, 3, view);
  EXPECT_EQ(wrapped.local().data(), view.data());
  // Wrong on every rank.
  auto message = collective_error(
      [&] { M bad(mesh, layout, rows, 3, typename M::view_type("v", mine + 1, 3)); });
  const index_t rank0_rows = kshard::chunk_extent(rows, size, 0);  // every rank reports rank 0
  EXPECT_NE(message.find(fmt::format("on rank 0 is {} x 3, but the layout gives this rank a {} x 3",
                                     rank0_rows + 1, rank0_rows)),
            std::string::npos)
      << message;
  // Wrong on the last rank only: every rank throws that rank's message.
  message = collective_error([&] {
    const std::size_t cols = mesh.my_rank() == size - 1 ? 2 : 3;
    M bad(mesh, layout, rows, 3, typename M::view_type("v", mine, cols));
  });
  EXPECT_NE(message.find("wrapped local view on rank " + std::to_string(size - 1)),
            std::string::npos)
      << message;
}

TEST(DistMatrix, BadShapesAndSplitFactorsAreCollectiveErrors) {
  const int size = world_size();
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  using L = Layout<StridedShard<0>>;
  using M = Matrix<double, L>;
  auto message = collective_error([&] { M m(mesh, L(StridedShard<0>{0}), 4, 4); });
  EXPECT_NE(message.find("split factor 0; it must be >= 1"), std::string::npos) << message;
  message = collective_error([&] { M m(mesh, L(StridedShard<0>{2}), -3, 4); });
  EXPECT_NE(message.find("extents must be >= 0, got -3 x 4"), std::string::npos) << message;
  message = collective_error([&] {
    const index_t factor = mesh.my_rank() == size - 1 ? 0 : 2;  // one rank only
    M m(mesh, L(StridedShard<0>{factor}), 4, 4);
  });
  EXPECT_NE(message.find("split factor 0; it must be >= 1"), std::string::npos) << message;
  message = collective_error([&] {
    const index_t rows = mesh.my_rank() == 0 ? 5 : 4;
    M m(mesh, L(StridedShard<0>{2}), rows, 4);
  });
  if (size > 1) {
    EXPECT_NE(message.find("differs between ranks"), std::string::npos) << message;
  }
}

// Partial: distribute gives a valid addend set (sum: value on coordinate 0, zeros elsewhere).
TEST(DistMatrix, DistributePartialGivesValidAddends) {
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  const auto full = reference_matrix<double>(4, 3, 7);
  const auto sum = kshard::distribute<ExecSpace, MemSpace>(mesh, Layout(kshard::Partial<>{}),
                                                           kshard::HostMatrix<const double>(full));
  const auto max = kshard::distribute<ExecSpace, MemSpace>(
      mesh, Layout(kshard::Partial<kshard::ReduceOp::max>{}),
      kshard::HostMatrix<const double>(full));
  const auto sum_local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sum.local());
  const auto max_local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), max.local());
  bool ok = true;
  for (std::size_t r = 0; r < 4; ++r)
    for (std::size_t c = 0; c < 3; ++c) {
      ok = ok && sum_local(r, c) == (mesh.my_rank() == 0 ? full(r, c) : 0.0);
      ok = ok && max_local(r, c) == full(r, c);
    }
  EXPECT_TRUE(all_ranks(ok));
}

}  // namespace
