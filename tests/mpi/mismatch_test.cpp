// Arguments that differ between ranks, and sizes at the edge of int64: for every public
// collective entry point, each argument (values, shapes, layouts and their types, configs,
// counts) is changed on the last rank only, as a rank-dependent `if` in user code would. Every
// rank must throw the same kshard::error naming what differs, leave the matrices unchanged
// (checksums) and be able to run the next collective; nothing may hang, truncate or go on with
// wrong data. docs/design.md has the table of entry points x arguments this covers.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "block_cyclic.hpp"
#include "kshard/kshard.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::Partial;
using kshard::ReduceOp;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using kshard::test::all_ranks;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::expect_collective_refusal;
using kshard::test::expect_local_refusal;
using kshard::test::Matrix;
using kshard::test::MemSpace;
using kshard::test::same_bits;
using kshard::test::watch;
using kshard::test::Watched;
using kshard::test::world_size;

using DeviceMatrix = Kokkos::View<float**, Kokkos::LayoutRight, MemSpace>;
using Ids = Kokkos::View<std::int64_t*, MemSpace>;

constexpr bool one_rank_only = true;
constexpr index_t int64_max = std::numeric_limits<index_t>::max();

template <class L, std::size_t M>
Matrix<float, L> make(const kshard::Mesh<M>& mesh, const L& layout, index_t rows, index_t cols,
                      std::uint64_t seed = 1) {
  const auto full = kshard::test::reference_matrix<float>(rows, cols, seed);
  return kshard::distribute<ExecSpace, MemSpace>(mesh, layout,
                                                 kshard::HostMatrix<const float>(full));
}

Ids ids_of(const std::vector<std::int64_t>& values) {
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> host("ids", values.size());
  for (std::size_t i = 0; i < values.size(); ++i) host(i) = values[i];
  Ids ids("ids", values.size());
  Kokkos::deep_copy(ids, host);
  return ids;
}

// An agreement compares every value it is given: each in a slot of its own up to its capacity,
// the rest folded into one digest. A value differing on one rank is found wherever it stands.
TEST(Mismatch, AgreementComparesEveryValue) {
  constexpr std::size_t capacity = kshard::detail::Agreement::capacity;
  constexpr std::size_t values = capacity + 10;
  for (const std::size_t differing : {std::size_t{0}, capacity - 4, capacity - 3, values - 1}) {
    const bool own_slot = differing + 3 < capacity;
    expect_collective_refusal(
        fmt::format("value {} of {}", differing, values),
        {own_slot
             ? fmt::format("value {} differs between ranks: 0 on rank 0, 1 on another", differing)
             : std::string("the ranks passed different arguments")},
        [&](bool here) {
          const kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
          kshard::detail::Agreement agreement(line.group());
          for (std::size_t i = 0; i < values; ++i)
            agreement.same(fmt::format("value {}", i), here && i == differing ? 1 : 0);
          agreement.settle();
        },
        {}, one_rank_only);
  }
}

TEST(Mismatch, MeshRankNamesAndCommunicator) {
  const int size = world_size();
  expect_collective_refusal(
      "mesh rank", {"the mesh rank (number of dimensions) differs between ranks: 1 on rank 0, 2"},
      [&](bool here) {
        if (here)
          kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size});
        else
          kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
      },
      {}, one_rank_only);
  expect_collective_refusal(
      "dimension names", {"the mesh dimension names differs between ranks: (dp, tp) on rank 0"},
      [&](bool here) {
        kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size}, {here ? "data" : "dp", "tp"});
      },
      {}, one_rank_only);
  // A rank outside the communicator cannot reach the others: it throws alone, before MPI.
  expect_local_refusal("null communicator", "MPI_COMM_NULL", [&](bool here) {
    if (here) kshard::Mesh<1> mesh(MPI_COMM_NULL, {1});
  });
}

TEST(Mismatch, MatrixLayoutTypeAndShape) {
  const auto mesh = kshard::test::dp_tp_mesh();
  // The case: a rank-dependent `if` picks another layout type on one rank.
  expect_collective_refusal(
      "layout", {"the placement of the matrix on mesh dimension 0 differs between ranks"},
      [&](bool here) {
        if (here)
          Matrix<float, Layout<Replicate, Shard<0>>> m(mesh, {}, 8, 3);
        else
          Matrix<float, Layout<Shard<0>, Shard<0>>> m(mesh, {}, 8, 3);
      },
      {}, one_rank_only);
  expect_collective_refusal(
      "reduction", {"differs between ranks: Partial(sum) on rank 0, Partial(max) on another"},
      [&](bool here) {
        if (here)
          Matrix<float, Layout<Partial<ReduceOp::max>, Replicate>> m(mesh, {}, 8, 3);
        else
          Matrix<float, Layout<Partial<ReduceOp::sum>, Replicate>> m(mesh, {}, 8, 3);
      },
      {}, one_rank_only);
  expect_collective_refusal(
      "element type", {"the element type of the matrix differs between ranks: float on rank 0"},
      [&](bool here) {
        if (here)
          Matrix<double, Layout<Replicate, Shard<0>>> m(mesh, {}, 8, 3);
        else
          Matrix<float, Layout<Replicate, Shard<0>>> m(mesh, {}, 8, 3);
      },
      {}, one_rank_only);
  expect_collective_refusal(
      "columns", {"the number of columns of the matrix differs between ranks: 3 on rank 0, 4"},
      [&](bool here) { Matrix<float, Layout<Replicate, Shard<0>>> m(mesh, {}, 8, here ? 4 : 3); },
      {}, one_rank_only);
  expect_collective_refusal(
      "distribute", {"the number of rows of the matrix differs between ranks: 8 on rank 0, 9"},
      [&](bool here) { (void)make(mesh, Layout(Replicate{}, Shard<0>{}), here ? 9 : 8, 3); }, {},
      one_rank_only);
}

// A placement defined outside kshard is agreed on like a built-in one: its type (by name) and
// its runtime factor.
TEST(Mismatch, CustomPlacementTypeAndFactor) {
  using kshard::test::BlockCyclic;
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  expect_collective_refusal(
      "custom placement",
      {"the placement of the matrix on mesh dimension 0 differs between ranks",
       "a custom placement of dimension 0"},
      [&](bool here) {
        if (here)
          Matrix<float, Layout<BlockCyclic<0>>> m(mesh, Layout(BlockCyclic<0>{2}), 8, 3);
        else
          Matrix<float, Layout<Shard<0>>> m(mesh, {}, 8, 3);
      },
      {}, one_rank_only);
  expect_collective_refusal(
      "block size",
      {"the split factor of the matrix on mesh dimension 0 differs between ranks: 2 on rank 0, 3"},
      [&](bool here) {
        Matrix<float, Layout<BlockCyclic<0>>> m(mesh, Layout(BlockCyclic<0>{here ? 3 : 2}), 8, 3);
      },
      {}, one_rank_only);
}

TEST(Mismatch, GatherOfAnotherMatrix) {
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  const auto by_rows = make(mesh, Layout(Shard<0>{}), 8, 3);
  const auto replicated = make(mesh, Layout(Replicate{}), 8, 3);
  const auto taller = make(mesh, Layout(Shard<0>{}), 9, 3);
  expect_collective_refusal(
      "layout", {"the placement of the matrix on mesh dimension 0 differs between ranks"},
      [&](bool here) {
        if (here)
          (void)kshard::gather(replicated);
        else
          (void)kshard::gather(by_rows);
      },
      {watch(by_rows), watch(replicated)}, one_rank_only);
  expect_collective_refusal(
      "shape", {"the number of rows of the matrix differs between ranks: 8 on rank 0, 9"},
      [&](bool here) { (void)kshard::gather(here ? taller : by_rows); },
      {watch(by_rows), watch(taller)}, one_rank_only);
}

// Two meshes built alike (the same communicator, shape and names) are one mesh: a rank-dependent
// `if` that picks the matrix of the other one on some ranks gets the same collectives, and the
// right answers, instead of ranks waiting on communicators of their own. Meshes built otherwise
// (other names) stay apart, and one built while its twin lives on some ranks only is new.
TEST(Mismatch, MeshesBuiltAlikeAreOneMesh) {
  const int size = world_size();
  const bool last = kshard::test::world_rank() == size - 1;
  const kshard::Mesh<1> a(MPI_COMM_WORLD, {size});
  const kshard::Mesh<1> b(MPI_COMM_WORLD, {size});
  EXPECT_TRUE(a == b);
  EXPECT_EQ(a.comm(), b.comm());
  EXPECT_EQ(a.sub(0).comm(), b.sub(0).comm());
  const kshard::Mesh<1> named(MPI_COMM_WORLD, {size}, {"other"});
  EXPECT_FALSE(named == a);
  const kshard::Mesh<2> grid(MPI_COMM_WORLD, {1, size});
  const kshard::Mesh<2> grid_again(MPI_COMM_WORLD, {1, size});
  EXPECT_TRUE(grid == grid_again);

  const auto full = kshard::test::reference_matrix<float>(8, 3, 1);
  const auto is_full = [&](const auto& host) { return all_ranks(same_bits(host, full)); };
  const auto m = make(last ? b : a, Layout(Shard<0>{}), 8, 3);
  EXPECT_TRUE(is_full(kshard::gather(m)));
  const Matrix<float, Layout<Replicate>> on_a(a, {}, 8, 3);
  const Matrix<float, Layout<Replicate>> on_b(b, {}, 8, 3);
  const auto& target = last ? on_b : on_a;
  kshard::redistribute_into(m, target);
  EXPECT_TRUE(is_full(Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), target.local())));
  const auto on_a_only = make(a, Layout(Shard<0>{}), 8, 3);
  const auto report = kshard::find_damaged_rows(last ? m : on_a_only);
  EXPECT_TRUE(all_ranks(report && report->repaired_row_ids.empty()));

  std::optional<kshard::Mesh<1>> kept;  // alive on rank 0 only
  {
    const kshard::Mesh<1> first(MPI_COMM_WORLD, {size}, {"once"});
    if (kshard::test::world_rank() == 0) kept.emplace(first);
  }
  const kshard::Mesh<1> again(MPI_COMM_WORLD, {size}, {"once"});
  EXPECT_EQ(kept && *kept == again, size == 1);  // alive on every rank only when there is one
  EXPECT_TRUE(all_ranks(kshard::gather(make(again, Layout(Shard<0>{}), 8, 3))(7, 2) == full(7, 2)));
}

// Meshes of other shapes over one communicator share its duplicate, and a dimension or
// sub-mesh holding every rank in mesh order is that communicator: ranks that pick matrices on
// different such meshes (a rank-dependent choice) meet in one agreement that names the
// difference, or get the right answer where the meshes are the same ranks alike.
TEST(Mismatch, MeshesOfOtherShapesMeetInOneAgreement) {
  const int size = world_size();
  const bool last = kshard::test::world_rank() == size - 1;
  const kshard::Mesh<2> wide(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const kshard::Mesh<2> tall(MPI_COMM_WORLD, {size, 1}, {"tp", "dp"});
  const kshard::Mesh<1> line(MPI_COMM_WORLD, {size}, {"tp"});
  EXPECT_EQ(wide.comm(), tall.comm());
  EXPECT_EQ(wide.dim_comm(1), wide.comm());
  EXPECT_EQ(wide.sub("tp").comm(), line.comm());
  if (size > 1) {  // on one rank every group is the whole
    EXPECT_NE(wide.dim_comm(0), wide.comm());
  }

  const auto on_wide = make(wide, Layout(Replicate{}, Shard<0>{}), 11, 4);
  const auto on_tall = make(tall, Layout(Shard<0>{}, Replicate{}), 11, 4);
  expect_collective_refusal(
      "lookup tables on meshes of other shapes",
      {"the placement of the table on mesh dimension 0 differs between ranks"},
      [&](bool here) {
        if (here)
          (void)kshard::vocab_parallel_lookup(on_tall, ids_of({1, 2}));
        else
          (void)kshard::vocab_parallel_lookup(on_wide, ids_of({1, 2}));
      },
      {watch(on_wide), watch(on_tall)}, one_rank_only);
  expect_collective_refusal(
      "gather on meshes of other shapes", {"differs between ranks"},
      [&](bool here) {
        if (here)
          (void)kshard::gather(on_tall);
        else
          (void)kshard::gather(on_wide);
      },
      {watch(on_wide), watch(on_tall)}, one_rank_only);

  // The tp sub-mesh of `wide` and `line` are the same ranks in the same order: a matrix on
  // either gathers whole.
  const auto full = kshard::test::reference_matrix<float>(8, 3, 1);
  const auto sub = wide.sub("tp");
  const auto rows = make(last ? sub : line, Layout(Shard<0>{}), 8, 3);
  EXPECT_TRUE(all_ranks(same_bits(kshard::gather(rows), full)));
}

TEST(Mismatch, RedistributeTargetsAndSources) {
  const int size = world_size();
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  const auto m = make(mesh, Layout(Shard<0>{}), 8, 3);
  const auto wide = make(mesh, Layout(Shard<0>{}), 8, 4);
  expect_collective_refusal(
      "target layout type", {"the placement of the target on mesh dimension 0 differs"},
      [&](bool here) {
        if (here)
          (void)kshard::redistribute(m, Layout(Shard<1>{}));
        else
          (void)kshard::redistribute(m, Layout(Replicate{}));
      },
      {watch(m)}, one_rank_only);
  expect_collective_refusal(
      "source", {"the number of columns of the matrix differs between ranks: 3 on rank 0, 4"},
      [&](bool here) { (void)kshard::redistribute(here ? wide : m, Layout(Replicate{})); },
      {watch(m), watch(wide)}, one_rank_only);
  const kshard::Mesh<2> flat(MPI_COMM_WORLD, {1, size});
  const kshard::Mesh<2> tall(MPI_COMM_WORLD, {size, 1});
  expect_collective_refusal(
      "target mesh", {"the target mesh differs between ranks"},
      [&](bool here) {
        (void)kshard::redistribute(m, here ? tall : flat, Layout(Replicate{}, Shard<0>{}));
      },
      {watch(m)}, one_rank_only);
  const Matrix<float, Layout<Replicate>> everywhere(mesh, {}, 8, 3);
  const Matrix<float, Layout<Shard<1>>> by_columns(mesh, {}, 8, 3);
  expect_collective_refusal(
      "redistribute_into target", {"the placement of the target on mesh dimension 0 differs"},
      [&](bool here) {
        if (here)
          kshard::redistribute_into(m, by_columns);
        else
          kshard::redistribute_into(m, everywhere);
      },
      {watch(m), watch(everywhere), watch(by_columns)}, one_rank_only);
}

TEST(Mismatch, RepairConfigAndKeptRows) {
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {world_size()});
  auto input_full = kshard::test::reference_matrix<float>(10, 4, 7);
  for (std::size_t c = 0; c < 4; ++c) input_full(1, c) = 0.0f;
  const auto input = kshard::distribute<ExecSpace, MemSpace>(
      mesh, Layout(Shard<0>{}), kshard::HostMatrix<const float>(input_full));
  const auto output = make(mesh, Layout(Shard<0>{}), 10, 4, 8);
  const kshard::RepairConfig config(true, 1e-4, 4);
  const std::vector<kshard::test::Watched> both{watch(input), watch(output)};
  // The hang: a disabled config returned before the agreement on some ranks.
  expect_collective_refusal(
      "enabled", {"RepairConfig::enabled() differs between ranks: 1 on rank 0, 0 on another"},
      [&](bool here) {
        (void)kshard::repair_embedding_rows(input, output, kshard::RepairConfig(!here, 1e-4, 4));
      },
      both, one_rank_only);
  expect_collective_refusal(
      "max_rows", {"RepairConfig::max_rows() differs between ranks: 4 on rank 0, 5"},
      [&](bool here) {
        (void)kshard::repair_embedding_rows(input, output,
                                            kshard::RepairConfig(true, 1e-4, here ? 5 : 4));
      },
      both, one_rank_only);
  expect_collective_refusal(
      "kept rows", {"the list of kept row ids differs between ranks: [1] on rank 0"},
      [&](bool here) {
        (void)kshard::repair_embedding_rows(input, output, config.keep_rows({here ? 2 : 1}));
      },
      both, one_rank_only);
  expect_collective_refusal(
      "kept row out of range", {"kept row 10 is out of range for a matrix of 10 rows"},
      [&](bool here) {
        (void)kshard::repair_embedding_rows(input, output, config.keep_rows({here ? 10 : -10}));
      },
      both);
  // The names are in every message and report: the same text on every rank.
  expect_collective_refusal(
      "names", {"the name of the input embedding differs between ranks: 'embed_tokens' on rank 0"},
      [&](bool here) {
        (void)kshard::repair_embedding_rows(input, output, config,
                                            {here ? "wte" : "embed_tokens", "lm_head"});
      },
      both, one_rank_only);
  const auto mean = kshard::RepairConfig(true, 1e-4, 4, kshard::RepairStrategy::mean_direction);
  expect_collective_refusal(
      "output given", {"whether an output embedding is given differs between ranks"},
      [&](bool here) {
        if (here)
          (void)kshard::repair_embedding_rows(input, mean);
        else
          (void)kshard::repair_embedding_rows(input, output, mean);
      },
      both, one_rank_only);
}

TEST(Mismatch, LookupIdsWithinATpGroup) {
  const int size = world_size();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const auto table = make(mesh, Layout(Replicate{}, Shard<0>{}), 11, 4);
  // The case: one rank of the tp group looks up another number of ids.
  expect_collective_refusal(
      "count",
      {"the number of token ids differs between the ranks of a tp group: 3 on rank 0, 4 on "
       "another"},
      [&](bool here) {
        (void)kshard::vocab_parallel_lookup(table,
                                            ids_of(here ? std::vector<std::int64_t>{1, 2, 3, 4}
                                                        : std::vector<std::int64_t>{1, 2, 3}),
                                            kshard::TpDim{1});
      },
      {watch(table)}, one_rank_only);
  expect_collective_refusal(
      "values", {"the list of token ids differs between the ranks of a tp group"},
      [&](bool here) {
        (void)kshard::vocab_parallel_lookup(table, ids_of({1, here ? 7 : 2, 3}), kshard::TpDim{1});
      },
      {watch(table)}, one_rank_only);
  expect_collective_refusal(
      "same ids, another order", {"the list of token ids differs"},
      [&](bool here) {
        (void)kshard::vocab_parallel_lookup(
            table, ids_of(here ? std::vector<std::int64_t>{3, 1} : std::vector<std::int64_t>{1, 3}),
            kshard::TpDim{1});
      },
      {watch(table)}, one_rank_only);
  expect_collective_refusal(
      "tp_dim", {"does not shard tensor dimension 0 over mesh dimension 0 ('dp')"},
      [&](bool here) {
        (void)kshard::vocab_parallel_lookup(table, ids_of({1}), kshard::TpDim{here ? 0 : 1});
      },
      {watch(table)}, one_rank_only);
  // Each rank's rows would be scaled by their owner's scale: every rank a wrong answer.
  expect_collective_refusal(
      "scale", {"the scale differs between the ranks of a tp group: 2 on rank 0, 8 on another"},
      [&](bool here) {
        (void)kshard::vocab_parallel_lookup(table, ids_of({1, 2}), here ? 8.0 : 2.0);
      },
      {watch(table)}, one_rank_only);
}

// Different tp groups (different dp coordinates) may look up different numbers of ids: each
// group's rows must still be right.
TEST(Mismatch, LookupCountsMayDifferBetweenDpGroups) {
  const auto mesh = kshard::test::dp_tp_mesh();
  const auto full = kshard::test::reference_matrix<float>(11, 4, 5);
  const auto table = kshard::distribute<ExecSpace, MemSpace>(mesh, Layout(Replicate{}, Shard<0>{}),
                                                             kshard::HostMatrix<const float>(full));
  const std::vector<std::int64_t> ids = mesh.coords()[0] == 0
                                            ? std::vector<std::int64_t>{10, 0, 3}
                                            : std::vector<std::int64_t>{4, 4, 9, 1, 2};
  const auto got = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), kshard::vocab_parallel_lookup(table, ids_of(ids), kshard::TpDim{1}));
  bool ok = got.extent(0) == ids.size();
  for (std::size_t i = 0; ok && i < ids.size(); ++i)
    for (std::size_t j = 0; j < 4; ++j)
      ok = ok && got(i, j) == full(static_cast<std::size_t>(ids[i]), j);
  EXPECT_TRUE(all_ranks(ok));
}

TEST(Mismatch, LinearLayerTokenCountsAndBias) {
  const int size = world_size();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const auto row_weight = make(mesh, Layout(Replicate{}, Shard<1>{}), 6, 5);
  const auto column_weight = make(mesh, Layout(Replicate{}, Shard<0>{}), 6, 5);
  const auto in_local = static_cast<std::size_t>(row_weight.mapping().cols.local_extent());
  const auto out_local = static_cast<std::size_t>(column_weight.mapping().rows.local_extent());
  const Kokkos::View<float*, MemSpace> bias("bias", 6);
  expect_collective_refusal(
      "row-parallel tokens",
      {"the number of rows of x_local (tokens) differs between the ranks of a tp group: 3 on "
       "rank 0, 2"},
      [&](bool here) {
        (void)kshard::row_parallel_linear(row_weight, DeviceMatrix("x", here ? 2 : 3, in_local),
                                          kshard::no_bias, kshard::TpDim{1});
      },
      {watch(row_weight)}, one_rank_only);
  expect_collective_refusal(
      "row-parallel bias", {"whether a bias is given differs between ranks"},
      [&](bool here) {
        const DeviceMatrix x("x", 3, in_local);
        if (here)
          (void)kshard::row_parallel_linear(row_weight, x, kshard::no_bias, kshard::TpDim{1});
        else
          (void)kshard::row_parallel_linear(row_weight, x, bias, kshard::TpDim{1});
      },
      {watch(row_weight)}, one_rank_only);
  auto grad = make(mesh, Layout(Replicate{}, Shard<0>{}), 6, 5, 3);
  expect_collective_refusal(
      "column-parallel backward tokens",
      {"the number of rows of x (tokens) differs between the ranks of a tp group: 3 on rank 0, 4"},
      [&](bool here) {
        const index_t n = here ? 4 : 3;
        (void)kshard::column_parallel_linear_backward(column_weight, DeviceMatrix("x", n, 5),
                                                      DeviceMatrix("gy", n, out_local), grad,
                                                      kshard::no_bias, kshard::TpDim{1});
      },
      {watch(column_weight), watch(grad)}, one_rank_only);
}

// reduce_from_tp's all-reduce needs the same element type and extents on every rank of a tp
// group: another count would truncate on one rank and hang the others, another type would sum
// the bytes of floats as doubles.
TEST(Mismatch, ReduceFromTpViewsWithinATpGroup) {
  const int size = world_size();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  using Doubles = Kokkos::View<double**, Kokkos::LayoutRight, MemSpace>;
  const auto filled = [](Doubles values) {
    Kokkos::deep_copy(values, 1.5);
    return values;
  };
  const Doubles kept = filled(Doubles("kept", 3, 2));
  const Watched unchanged = [&] {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kept);
    return static_cast<std::uint64_t>(host(0, 0) == 1.5 && host(2, 1) == 1.5);
  };
  expect_collective_refusal(
      "extent 0",
      {"kshard::reduce_from_tp: extent 0 of values differs between the ranks of a tp group: 3 on "
       "rank 0, 4 on another"},
      [&](bool here) {
        kshard::reduce_from_tp(mesh, kshard::TpDim{1}, here ? filled(Doubles("v", 4, 2)) : kept);
      },
      {unchanged}, one_rank_only);
  expect_collective_refusal(
      "element type",
      {"the element type of values differs between the ranks of a tp group: double on rank 0, "
       "float on another"},
      [&](bool here) {
        if (here)
          kshard::reduce_from_tp(mesh, kshard::TpDim{1}, DeviceMatrix("v", 3, 2));
        else
          kshard::reduce_from_tp(mesh, kshard::TpDim{1}, kept);
      },
      {unchanged}, one_rank_only);
  expect_collective_refusal(
      "view rank",
      {"the rank of values differs between the ranks of a tp group: 2 on rank 0, 1 on another"},
      [&](bool here) {
        if (here)
          kshard::copy_to_tp_backward(mesh, kshard::TpDim{1},
                                      Kokkos::View<double*, MemSpace>("v", 6));
        else
          kshard::copy_to_tp_backward(mesh, kshard::TpDim{1}, kept);
      },
      {unchanged}, one_rank_only);
}

// Different tp groups may reduce different extents (their dp replicas hold other batches).
TEST(Mismatch, ReduceFromTpExtentsMayDifferBetweenDpGroups) {
  const auto mesh = kshard::test::dp_tp_mesh();
  const auto rows = static_cast<std::size_t>(2 + mesh.coords()[0]);
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, MemSpace> values("v", rows, 3);
  Kokkos::deep_copy(values, std::int64_t{mesh.my_rank()});
  kshard::reduce_from_tp(mesh, kshard::TpDim{1}, values);
  std::int64_t want = 0;
  auto coords = mesh.coords();
  for (int c = 0; c < mesh.extent(1); ++c) {
    coords[1] = c;
    want += mesh.rank_of(coords);
  }
  const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values);
  bool ok = got.extent(0) == rows;
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < 3; ++j) ok = ok && got(i, j) == want;
  EXPECT_TRUE(all_ranks(ok));
}

// Row norms of a column-split matrix sum over the column shards: a rank-dependent choice
// between two matrices is refused alike everywhere, and so is one between a row-split and a
// column-split matrix (the layout decides whether the ranks sum: only some would wait in it).
TEST(Mismatch, RowNormsOfAnotherMatrix) {
  const int size = world_size();
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  const auto five = make(mesh, Layout(Shard<1>{}), 5, 6);
  const auto seven = make(mesh, Layout(Shard<1>{}), 7, 6);
  expect_collective_refusal(
      "rows",
      {"kshard::row_squared_norms: the number of rows of the matrix differs between ranks: 5 on "
       "rank 0, 7 on another"},
      [&](bool here) { (void)kshard::row_squared_norms(here ? seven : five); },
      {watch(five), watch(seven)}, one_rank_only);
  const auto by_rows = make(mesh, Layout(Shard<0>{}), 5, 6);
  expect_collective_refusal(
      "row-split on one rank",
      {"kshard::row_squared_norms: the placement of the matrix on mesh dimension 0 differs"},
      [&](bool here) {
        if (here)
          (void)kshard::row_squared_norms(by_rows);
        else
          (void)kshard::row_squared_norms(five);
      },
      {watch(five), watch(by_rows)}, one_rank_only);
}

// The hang: one rank passes a table split over the other mesh dimension (a
// rank-dependent `if`); the group of the lookup is agreed over the whole mesh first.
TEST(Mismatch, TpGroupsChosenFromAgreedLayouts) {
  const auto mesh = kshard::test::dp_tp_mesh();
  const auto over_tp = make(mesh, Layout(Replicate{}, Shard<0>{}), 11, 4);
  const auto over_dp = make(mesh, Layout(Shard<0>{}, Replicate{}), 11, 4);
  expect_collective_refusal(
      "lookup", {"kshard::vocab_parallel_lookup: the placement of the table on mesh dimension 0"},
      [&](bool here) {
        if (here)
          (void)kshard::vocab_parallel_lookup(over_dp, ids_of({1, 2}));
        else
          (void)kshard::vocab_parallel_lookup(over_tp, ids_of({1, 2}));
      },
      {watch(over_tp), watch(over_dp)}, one_rank_only);
  // Meshes {S, 1} and {dp, tp} over the same ranks: the same layout, other rows.
  const kshard::Mesh<2> tall(MPI_COMM_WORLD, {world_size(), 1}, {"dp", "tp"});
  const auto on_tall = make(tall, Layout(Shard<0>{}, Replicate{}), 11, 4);
  const auto on_usual = make(mesh, Layout(Shard<0>{}, Replicate{}), 11, 4);
  if (tall.shape() == mesh.shape()) return;  // at 2 ranks the usual mesh is {2, 1}
  expect_collective_refusal(
      "repair on a mesh of another shape", {"the mesh of 'embed_tokens' differs between ranks"},
      [&](bool here) { (void)kshard::find_damaged_rows(here ? on_tall : on_usual); },
      {watch(on_tall), watch(on_usual)}, one_rank_only);
}

TEST(Overflow, SizesPastInt64AreRefusedBeforeAllocating) {
  const int size = world_size();
  kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
  const index_t two_32 = index_t{1} << 32;
  const index_t two_31 = index_t{1} << 31;
  const std::vector<std::string> limit{"more than the limit of 9223372036854775807 bytes",
                                       "differs between ranks"};
  // With rows sharded over enough ranks each shard's bytes fit in int64: then the allocation
  // is what fails (every rank the same way).
  const std::vector<std::string> limit_or_memory{limit[0], limit[1], "failed"};
  const auto sharded = [&](index_t rows, index_t cols) {
    const index_t shard_rows = rows / size + (rows % size != 0 ? 1 : 0);
    return shard_rows > int64_max / (cols * index_t{4}) ? limit : limit_or_memory;
  };
  expect_collective_refusal(
      "2^32 x 2^32 float, rows sharded", sharded(two_32, two_32), [&](bool here) {
        Matrix<float, Layout<Shard<0>>> m(mesh, {}, here ? two_32 : 8, here ? two_32 : 3);
      });
  expect_collective_refusal("2^31 x 2^31 float, replicated", limit, [&](bool here) {
    Matrix<float, Layout<Replicate>> m(mesh, {}, here ? two_31 : 8, here ? two_31 : 3);
  });
  expect_collective_refusal("INT64_MAX rows", sharded(int64_max, 1), [&](bool here) {
    Matrix<float, Layout<Shard<0>>> m(mesh, {}, here ? int64_max : 8, 1);
  });
  // Representable but far beyond memory: every rank refuses, none is left waiting.
  expect_collective_refusal(
      "2^31 x 2^31 float, rows sharded", {"more than the limit", "failed", "differs between ranks"},
      [&](bool here) {
        Matrix<float, Layout<Shard<0>>> m(mesh, {}, here ? two_31 : 8, here ? two_31 : 3);
      });
  // Extreme but valid: split factors and extents at INT64_MAX map exactly.
  const auto strided = make(mesh, Layout(StridedShard<0>{int64_max}), 10, 3);
  const auto full = kshard::test::reference_matrix<float>(10, 3, 1);
  EXPECT_TRUE(all_ranks(same_bits(kshard::gather(strided), full)));
  const Matrix<float, Layout<Shard<0>>> empty_columns(mesh, {}, int64_max, 0);
  index_t rows = 0;
  const index_t mine = empty_columns.mapping().rows.local_extent();
  MPI_Allreduce(&mine, &rows, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(rows, int64_max);
  EXPECT_FALSE(kshard::zero_row(empty_columns, -1));
}

}  // namespace
