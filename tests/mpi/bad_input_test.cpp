// The bad-input catalogue: every argument kshard refuses, given wrong on every rank and on one
// rank only. A collective operation must raise the same kshard::error on every rank within
// the test timeout, leave the matrices bit for bit unchanged (checksums before and after), and
// leave the process able to run the next collective. Operations that do not communicate
// (zero_row, RepairConfig, the lookup backward) raise on exactly the ranks given a bad value
// and never block the others.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kshard/kshard.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using kshard::test::all_ranks;
using kshard::test::checksum;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::expect_collective_refusal;
using kshard::test::expect_local_refusal;
using kshard::test::MemSpace;
using kshard::test::watch;
using kshard::test::world_rank;
using kshard::test::world_size;

using Rows = Layout<Shard<0>>;
using Matrix = kshard::DistMatrix<float, Rows, ExecSpace, MemSpace>;

// A reference table; with `zero_row_1`, row 1 is zero (a damaged embedding row).
kshard::HostMatrix<float> table(index_t rows, index_t cols, bool zero_row_1 = false) {
  auto full = kshard::test::reference_matrix<float>(rows, cols, 99);
  if (zero_row_1)
    for (index_t c = 0; c < cols; ++c) full(1, static_cast<std::size_t>(c)) = 0.0f;
  return full;
}

Matrix make(const kshard::Mesh<1>& mesh, const kshard::HostMatrix<float>& full) {
  return kshard::distribute<ExecSpace, MemSpace>(mesh, Rows{},
                                                 kshard::HostMatrix<const float>(full));
}

TEST(BadInput, MeshAndMatrixConstruction) {
  const int size = world_size();
  expect_collective_refusal("mesh shape", {"holds", "differs between ranks"}, [&](bool here) {
    kshard::Mesh<1> mesh(MPI_COMM_WORLD, {here ? size + 1 : size});
  });
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  using Strided = Layout<StridedShard<0>>;
  expect_collective_refusal("split factor", {"split factor 0", "differs between ranks"},
                            [&](bool here) {
                              kshard::DistMatrix<float, Strided, ExecSpace, MemSpace> m(
                                  mesh, Strided(StridedShard<0>{here ? 0 : 2}), 8, 3);
                            });
  expect_collective_refusal("negative split factor", {"split factor -1", "differs between ranks"},
                            [&](bool here) {
                              kshard::DistMatrix<float, Strided, ExecSpace, MemSpace> m(
                                  mesh, Strided(StridedShard<0>{here ? -1 : 2}), 8, 3);
                            });
  const auto mine = static_cast<std::size_t>(kshard::chunk_extent(8, size, mesh.my_rank()));
  expect_collective_refusal("wrapped view shape", {"wrapped local view"}, [&](bool here) {
    Matrix m(mesh, Rows{}, 8, 3, Matrix::view_type("v", here ? mine + 1 : mine, 3));
  });
}

// An MPI error that gets past the argument checks names the kshard operation, the MPI call,
// MPI's own text and the likely cause.
TEST(BadInput, MpiErrorsNameTheOperationAndTheLikelyCause) {
  const kshard::detail::Operation operation("gather");
  const auto message = [](int rc) {
    try {
      kshard::detail::check_mpi(rc, "MPI_Allgatherv");
    } catch (const kshard::error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string truncated = message(MPI_ERR_TRUNCATE);
  EXPECT_EQ(truncated.rfind("kshard::gather: MPI_Allgatherv failed: ", 0), 0u) << truncated;
  EXPECT_NE(truncated.find("the ranks most likely passed different sizes"), std::string::npos)
      << truncated;
  const std::string io = message(MPI_ERR_IO);
  EXPECT_NE(io.find("the file system refused"), std::string::npos) << io;
  EXPECT_EQ(message(MPI_SUCCESS), "");
}

TEST(BadInput, ZeroRowOutOfRange) {
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  const auto m = make(mesh, table(6, 4, true));
  const auto before = checksum(m);
  // The good calls zero row 1, which is already zero: nothing may change anywhere.
  expect_local_refusal("row >= V", "row 6 is out of range",
                       [&](bool here) { kshard::zero_row(m, here ? 6 : 1); });
  expect_local_refusal("row < -V", "row -7 is out of range",
                       [&](bool here) { kshard::zero_row(m, here ? -7 : 1); });
  EXPECT_TRUE(all_ranks(before == checksum(m)));
  const auto empty = make(mesh, table(0, 4));
  expect_local_refusal("no rows", "row 0 is out of range: the matrix has no rows", [&](bool here) {
    if (here) kshard::zero_row(empty, 0);
  });
}

// A matrix of no columns holds no bytes at any row count, but its norms would: refused, as
// what needs them, before anything is allocated (INT64_MAX doubles hung in the kernel launch).
TEST(BadInput, NormsOfMoreRowsThanMemory) {
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  const kshard::index_t rows = std::numeric_limits<kshard::index_t>::max();
  const kshard::DistMatrix<float, Layout<Replicate>, ExecSpace, MemSpace> m(
      mesh, Layout(Replicate{}), rows, 0);
  const std::string phrase = fmt::format("the matrix has {} rows, whose norms would need", rows);
  for (const std::string& message :
       {kshard::test::collective_error([&] { (void)kshard::row_squared_norms(m); }),
        kshard::test::collective_error([&] { (void)kshard::find_damaged_rows(m); })})
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
}

TEST(BadInput, RepairConfigAndArguments) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const double bad_norm : {nan, inf, -inf, -1.0})
    expect_local_refusal(fmt::format("min_norm {}", bad_norm), "min_norm is",
                         [&](bool here) { kshard::RepairConfig(true, here ? bad_norm : 1e-4, 4); });
  for (const index_t bad_rows : {index_t{0}, index_t{-3}})
    expect_local_refusal(fmt::format("max_rows {}", bad_rows), "max_rows is",
                         [&](bool here) { kshard::RepairConfig(true, 1e-4, here ? bad_rows : 4); });

  const int size = world_size();
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  // 3 rows per rank (10 at least): no shard is empty at any rank count, so "tied on the last
  // rank only" is tied storage (an empty shard shares no storage).
  const index_t rows = std::max<index_t>(10, 3 * size);
  const auto input = make(mesh, table(rows, 4, true));  // one damaged row
  const auto output = make(mesh, table(rows, 4));
  const kshard::RepairConfig config(true, 1e-4, 4);
  expect_collective_refusal(
      "config differs", {"differs between ranks"},
      [&](bool here) {
        (void)kshard::repair_embedding_rows(input, output,
                                            kshard::RepairConfig(true, here ? 1e-3 : 1e-4, 4));
      },
      {watch(input), watch(output)}, /*one_rank_only=*/true);
  expect_collective_refusal(
      "tied storage", {"tied weights"},
      [&](bool here) { (void)kshard::repair_embedding_rows(input, here ? input : output, config); },
      {watch(input), watch(output)});
  const auto damaged_output = make(mesh, table(rows, 4, true));
  expect_collective_refusal(
      "damaged output rows", {"are damaged too"},
      [&](bool) { (void)kshard::repair_embedding_rows(input, damaged_output, config); },
      {watch(input), watch(damaged_output)});
  const auto zeros = make(mesh, kshard::HostMatrix<float>("zeros", rows, 4));
  expect_collective_refusal(
      "all rows damaged", {"more than max_rows", "no healthy rows"},
      [&](bool) { (void)kshard::repair_embedding_rows(zeros, output, config); },
      {watch(zeros), watch(output)});
  const auto wide = make(mesh, kshard::test::reference_matrix<float>(rows, 5, 3));
  expect_collective_refusal("shape mismatch", {fmt::format("is {} x 5 but input embedding", rows)},
                            [&](bool) { (void)kshard::repair_embedding_rows(input, wide, config); },
                            {watch(input), watch(wide)});
  using Strided = Layout<StridedShard<0>>;
  const auto strided_in = kshard::distribute<ExecSpace, MemSpace>(
      mesh, Strided(StridedShard<0>{2}), kshard::HostMatrix<const float>(table(rows, 4, true)));
  expect_collective_refusal("layout mismatch", {"layouts differ", "differs between ranks"},
                            [&](bool here) {
                              const auto out = kshard::distribute<ExecSpace, MemSpace>(
                                  mesh, Strided(StridedShard<0>{here ? 3 : 2}),
                                  kshard::HostMatrix<const float>(table(rows, 4)));
                              (void)kshard::repair_embedding_rows(strided_in, out, config);
                            });
}

TEST(BadInput, TokenIds) {
  const int size = world_size();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  using TpLayout = Layout<Replicate, Shard<0>>;
  const auto full = kshard::test::reference_matrix<float>(11, 4, 5);
  const auto tokens = kshard::distribute<ExecSpace, MemSpace>(
      mesh, TpLayout{}, kshard::HostMatrix<const float>(full));
  for (const std::int64_t bad_id : {std::int64_t{-1}, std::int64_t{11}, std::int64_t{1} << 40}) {
    // On the last rank only the ids also differ within the tp group: the cause is named.
    expect_collective_refusal(fmt::format("id {}", bad_id),
                              {fmt::format("vocab_parallel_lookup: token id {} is out of range "
                                           "for a vocabulary of 11 rows",
                                           bad_id)},
                              [&](bool here) {
                                Kokkos::View<std::int64_t*, MemSpace> ids("ids", 3);
                                Kokkos::deep_copy(ids, here ? bad_id : 2);
                                (void)kshard::vocab_parallel_lookup(tokens, ids, kshard::TpDim{1});
                              });
  }
  // The backward does not communicate: a bad gradient shape throws where it is given.
  auto grad_table = kshard::distribute<ExecSpace, MemSpace>(
      mesh, TpLayout{}, kshard::HostMatrix<const float>(kshard::HostMatrix<float>("g", 11, 4)));
  expect_local_refusal("gradient shape", "vocab_parallel_lookup_backward", [&](bool here) {
    Kokkos::View<std::int64_t*, MemSpace> ids("ids", 3);
    Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> grad("grad", 3, here ? 5 : 4);
    kshard::vocab_parallel_lookup_backward(grad_table, ids, grad, kshard::TpDim{1});
  });
}

TEST(BadInput, TensorParallelArguments) {
  const int size = world_size();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const auto w = kshard::test::reference_matrix<float>(6, 5, 7);
  using RowLayout = Layout<Replicate, Shard<1>>;
  using ColumnLayout = Layout<Replicate, Shard<0>>;
  const auto row_weight = kshard::distribute<ExecSpace, MemSpace>(
      mesh, RowLayout{}, kshard::HostMatrix<const float>(w));
  const auto column_weight = kshard::distribute<ExecSpace, MemSpace>(
      mesh, ColumnLayout{}, kshard::HostMatrix<const float>(w));
  using View = Kokkos::View<float**, Kokkos::LayoutRight, MemSpace>;
  const auto in_local = static_cast<std::size_t>(row_weight.mapping().cols.local_extent());
  const auto out_local = static_cast<std::size_t>(column_weight.mapping().rows.local_extent());
  const View x_local("x_local", 3, in_local);
  const View x("x", 3, 5);
  const View grad_y_local("grad_y_local", 3, out_local);

  expect_collective_refusal(
      "tp_dim differs", {"does not shard tensor dimension 1 over mesh dimension 0"},
      [&](bool here) {
        (void)kshard::row_parallel_linear(row_weight, x_local, kshard::no_bias,
                                          kshard::TpDim{here ? 0 : 1});
      },
      {watch(row_weight)});
  expect_collective_refusal("x_local width", {"x_local on rank"},
                            [&](bool here) {
                              (void)kshard::row_parallel_linear(
                                  row_weight, here ? View("bad", 3, in_local + 1) : x_local,
                                  kshard::no_bias, kshard::TpDim{1});
                            },
                            {watch(row_weight)});

  // Gradient matrices that do not match their weight: another shape, another mesh.
  using ColumnMatrix = kshard::DistMatrix<float, ColumnLayout, ExecSpace, MemSpace>;
  const ColumnMatrix grad(mesh, ColumnLayout{}, 6, 5);
  const ColumnMatrix narrow(mesh, ColumnLayout{}, 6, 4);
  expect_collective_refusal("gradient shape", {"grad_weight is 6 x 4 but the weight is 6 x 5"},
                            [&](bool here) {
                              (void)kshard::column_parallel_linear_backward(
                                  column_weight, x, grad_y_local, here ? narrow : grad,
                                  kshard::no_bias, kshard::TpDim{1});
                            },
                            {watch(column_weight), watch(grad), watch(narrow)});
  if (size > 1) {  // one rank has no other mesh shape
    kshard::Mesh<2> transposed(MPI_COMM_WORLD, {size, 1}, {"dp", "tp"});
    const ColumnMatrix elsewhere(transposed, ColumnLayout{}, 6, 5);
    expect_collective_refusal("gradient on another mesh", {"not the same mesh"},
                              [&](bool here) {
                                (void)kshard::column_parallel_linear_backward(
                                    column_weight, x, grad_y_local, here ? elsewhere : grad,
                                    kshard::no_bias, kshard::TpDim{1});
                              },
                              {watch(column_weight), watch(grad), watch(elsewhere)});
  }
  const auto table = kshard::distribute<ExecSpace, MemSpace>(mesh, ColumnLayout{},
                                                             kshard::HostMatrix<const float>(w));
  Kokkos::View<std::int32_t*, MemSpace> ids("ids", 4);
  expect_collective_refusal(
      "lookup tp_dim differs", {"does not shard tensor dimension 0 over mesh dimension 0"},
      [&](bool here) {
        (void)kshard::vocab_parallel_lookup(table, ids, kshard::TpDim{here ? 0 : 1});
      },
      {watch(table)});
}

TEST(BadInput, RedistributeTargets) {
  const int size = world_size();
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  const auto m = make(mesh, table(8, 3));
  using Strided = Layout<StridedShard<0>>;
  expect_collective_refusal(
      "target split factor", {"split factor 0", "differs between ranks"},
      [&](bool here) { (void)kshard::redistribute(m, Strided(StridedShard<0>{here ? 0 : 2})); },
      {watch(m)});
  // The message names the call the user made.
  expect_collective_refusal(
      "plan split factor",
      {"kshard::plan_redistribute: target StridedShard on mesh dimension 0 ('d0') has split "
       "factor 0"},
      [&](bool) { (void)kshard::plan_redistribute(m, Strided(StridedShard<0>{0})); }, {watch(m)});
  const Matrix right(mesh, Rows{}, 8, 3);
  const Matrix taller(mesh, Rows{}, 9, 3);
  expect_collective_refusal("redistribute_into shape",
                            {"the target is 9 x 3 but the matrix is 8 x 3"},
                            [&](bool here) { kshard::redistribute_into(m, here ? taller : right); },
                            {watch(m), watch(right), watch(taller)});
  if (size > 1) {  // on one rank every communicator is congruent with the world
    // A target mesh of another size, over this rank alone: not the matrix's communicator.
    using Target = Layout<Replicate, Shard<0>>;
    const kshard::Mesh<2> alone(MPI_COMM_SELF, {1, 1});
    const kshard::Mesh<2> wide(MPI_COMM_WORLD, {1, size});
    expect_collective_refusal(
        "target mesh on another communicator", {"different communicator"},
        [&](bool here) { (void)kshard::redistribute(m, here ? alone : wide, Target{}); },
        {watch(m)});
    const kshard::DistMatrix<float, Target, ExecSpace, MemSpace> over_alone(alone, Target{}, 8, 3);
    const kshard::DistMatrix<float, Target, ExecSpace, MemSpace> over_wide(wide, Target{}, 8, 3);
    expect_collective_refusal(
        "redistribute_into another communicator", {"different communicator"},
        [&](bool here) { kshard::redistribute_into(m, here ? over_alone : over_wide); },
        {watch(m), watch(over_alone), watch(over_wide)});
  }
}

}  // namespace
