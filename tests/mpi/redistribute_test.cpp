// kshard::redistribute on the backend under test, beyond the exhaustive sweeps of placement
// pairs (redistribute_line_sweep_test.cpp, redistribute_mesh_sweep_test.cpp): the named
// transitions at their exact costs, FSDP unshard and reshard, Partial sums against serial sums,
// mesh changes (checkpoint resharding) that round-trip bit for bit and send only what moves,
// the instance overloads, and collective errors of redistribute, redistribute_into and plans.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "redistribute_checks.hpp"

namespace {

using namespace kshard::test::redistribute_checks;

// The transitions the issue names, with their exact costs.
TEST(Redistribute, NamedTransitionsSendTheirMinimum) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const index_t rows = 13;
  const index_t cols = 6;
  const auto full = reference_matrix<double>(rows, cols, 11);
  const kshard::HostMatrix<const double> source(full);
  const auto per_rank = [&](index_t r, index_t c) {
    return static_cast<std::int64_t>(r * c * static_cast<index_t>(sizeof(double)));
  };
  const index_t my_rows = kshard::chunk_extent(rows, size, line.my_rank());
  const index_t my_cols = kshard::chunk_extent(cols, size, line.my_rank());
  // Replicate -> Shard: a local slice.
  auto replicated = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Replicate{}), source);
  kshard::reset_comm_stats();
  auto sharded = kshard::redistribute(replicated, Layout(Shard<0>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
  EXPECT_TRUE(all_ranks(shard_matches(sharded, full, 0)));
  // Shard -> Replicate: all-gather of the local rows.
  kshard::reset_comm_stats();
  auto back = kshard::redistribute(sharded, Layout(Replicate{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == (size > 1 ? per_rank(my_rows, cols) : 0)));
  EXPECT_TRUE(all_ranks(shard_matches(back, full, 0)));
  // Shard<0> -> Shard<1>: all-to-all; this rank keeps its own block.
  kshard::reset_comm_stats();
  auto by_cols = kshard::redistribute(sharded, Layout(Shard<1>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == per_rank(my_rows, cols - my_cols)));
  EXPECT_TRUE(all_ranks(shard_matches(by_cols, full, 0)));
  // Partial -> Replicate: all-reduce; Partial -> Shard: reduce-scatter.
  auto partial = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Sum{}), source);
  kshard::reset_comm_stats();
  auto reduced = kshard::redistribute(partial, Layout(Replicate{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == (size > 1 ? per_rank(rows, cols) : 0)));
  EXPECT_TRUE(all_ranks(shard_matches(reduced, full, 0)));
  kshard::reset_comm_stats();
  auto scattered = kshard::redistribute(partial, Layout(Shard<0>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == per_rank(rows - my_rows, cols)));
  EXPECT_TRUE(all_ranks(shard_matches(scattered, full, 0)));
  // Replicate -> Partial: local.
  kshard::reset_comm_stats();
  auto addends = kshard::redistribute(replicated, Layout(Sum{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
  EXPECT_TRUE(all_ranks(shard_matches(addends, full, 0)));
}

// FSDP2 x TP: unshard the (StridedShard, Shard) embedding over dp (all-gather of the local
// block) and reshard it (local, nothing sent).
TEST(Redistribute, FsdpUnshardAndReshard) {
  const int size = world_size();
  if (size % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {2, size / 2}, {"dp", "tp"});
  for (index_t rows : {index_t{10}, index_t{8}, index_t{3}, index_t{0}}) {
    const auto full = reference_matrix<float>(rows, 5, static_cast<std::uint64_t>(rows));
    const auto fsdp = kshard::distribute<ExecSpace, MemSpace>(
        mesh, Layout(StridedShard<0>{size / 2}, Shard<0>{}), kshard::HostMatrix<const float>(full));
    kshard::reset_comm_stats();
    const auto unsharded = kshard::redistribute(fsdp, Layout(Replicate{}, Shard<0>{}));
    const auto local = static_cast<std::int64_t>(fsdp.mapping().local_size() *
                                                 static_cast<index_t>(sizeof(float)));
    EXPECT_TRUE(all_ranks(bytes_sent() == local)) << bytes_sent() << " vs " << local;
    EXPECT_TRUE(all_ranks(shard_matches(unsharded, full, 0)));
    kshard::reset_comm_stats();
    const auto resharded = kshard::redistribute(unsharded, fsdp.layout());
    EXPECT_TRUE(all_ranks(bytes_sent() == 0));
    EXPECT_TRUE(all_ranks(shard_matches(resharded, full, 0)));
  }
}

// Genuinely different addends (small integers, so sums are exact in any order) against the
// serial reduction.
template <ReduceOp Op, std::size_t N, class L, class LT>
void check_partial_against_serial(const kshard::Mesh<N>& mesh, const L& source, const LT& target,
                                  index_t rows, index_t cols, std::size_t partial_dim) {
  SCOPED_TRACE(::testing::Message() << "mesh " << ::testing::PrintToString(mesh.shape()) << " "
                                    << rows << " x " << cols << " op " << kshard::to_string(Op));
  auto addend = [](index_t r, index_t c, int p) {
    return static_cast<double>((r * 7 + c * 3 + p * 5) % 11 - 5);
  };
  const int k = mesh.extent(partial_dim);
  kshard::HostMatrix<double> reduced("reduced", static_cast<std::size_t>(rows),
                                     static_cast<std::size_t>(cols));
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) {
      double acc = addend(r, c, 0);
      for (int p = 1; p < k; ++p) {
        const double x = addend(r, c, p);
        acc = Op == ReduceOp::max   ? std::max(acc, x)
              : Op == ReduceOp::min ? std::min(acc, x)
                                    : acc + x;
      }
      reduced(r, c) = Op == ReduceOp::avg ? acc / static_cast<double>(k) : acc;
    }
  const auto map = kshard::map_layout(source.actions(), mesh.shape(), mesh.coords(), rows, cols);
  typename Matrix<double, L>::view_type local("addends",
                                              static_cast<std::size_t>(map.rows.local_extent()),
                                              static_cast<std::size_t>(map.cols.local_extent()));
  auto host = Kokkos::create_mirror_view(local);
  for (index_t i = 0; i < map.rows.local_extent(); ++i)
    for (index_t j = 0; j < map.cols.local_extent(); ++j)
      host(i, j) = addend(map.rows.to_global(i), map.cols.to_global(j), mesh.coords()[partial_dim]);
  Kokkos::deep_copy(local, host);
  const Matrix<double, L> matrix(mesh, source, rows, cols, local);
  kshard::reset_comm_stats();
  const auto moved = kshard::redistribute(matrix, target);
  const std::int64_t expected = single_dim_bytes<double>(mesh, source, target, rows, cols);
  if (expected >= 0) {
    EXPECT_TRUE(all_ranks(bytes_sent() == expected)) << bytes_sent();
  }
  EXPECT_TRUE(all_ranks(shard_matches(moved, reduced, 0)));
}

TEST(Redistribute, PartialMatchesSerialReduction) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  for (index_t rows : {index_t{0}, index_t{3}, index_t{11}}) {
    check_partial_against_serial<ReduceOp::sum>(line, Layout(Sum{}), Layout(Replicate{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::sum>(line, Layout(Sum{}), Layout(Shard<0>{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::sum>(line, Layout(Sum{}), Layout(Shard<1>{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::sum>(line, Layout(Sum{}), Layout(StridedShard<0>{2}),
                                                rows, 7, 0);
    check_partial_against_serial<ReduceOp::max>(line, Layout(Max{}), Layout(Shard<0>{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::min>(line, Layout(Min{}), Layout(Replicate{}), rows, 7,
                                                0);
    check_partial_against_serial<ReduceOp::avg>(line, Layout(Avg{}), Layout(StridedShard<1>{3}),
                                                rows, 7, 0);
  }
  for (const auto& shape : kshard::test::mesh_shapes<2>(size)) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, shape, {"dp", "tp"});
    check_partial_against_serial<ReduceOp::sum>(mesh, Layout(Sum{}, Shard<1>{}),
                                                Layout(Shard<0>{}, Shard<1>{}), 9, 5, 0);
    check_partial_against_serial<ReduceOp::sum>(mesh, Layout(Shard<0>{}, Sum{}),
                                                Layout(Shard<0>{}, Shard<0>{}), 9, 5, 1);
    check_partial_against_serial<ReduceOp::avg>(mesh, Layout(Replicate{}, Avg{}),
                                                Layout(StridedShard<0>{2}, Shard<0>{}), 10, 3, 1);
  }
}

// Checkpoint resharding: another mesh shape over the same communicator, and back.
template <class T, std::size_t N, std::size_t NT, class L, class LT>
void check_mesh_change(const kshard::Mesh<N>& mesh, const L& layout,
                       const kshard::Mesh<NT>& target_mesh, const LT& target, index_t rows,
                       index_t cols, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "from " << ::testing::PrintToString(mesh.shape()) << " to "
               << ::testing::PrintToString(target_mesh.shape()) << " " << rows << " x " << cols);
  const auto full = reference_matrix<T>(rows, cols, seed);
  const auto matrix =
      kshard::distribute<ExecSpace, MemSpace>(mesh, layout, kshard::HostMatrix<const T>(full));
  kshard::reset_comm_stats();
  const auto moved = kshard::redistribute(matrix, target_mesh, target);
  const std::int64_t sent = bytes_sent();
  check_into(matrix, target_mesh, moved, sent);
  const auto move = [&](const auto& m) { return kshard::redistribute(m, target_mesh, target); };
  check_plan(matrix, kshard::plan_redistribute(matrix, target_mesh, target), move, sent, seed, 0.0);
  check_plan(matrix, kshard::plan_redistribute(matrix, moved), move, sent, seed + 1, 0.0);
  EXPECT_TRUE(all_ranks(shard_matches(moved, full, 0)));
  if constexpr (!L::has_partial) {
    const auto back = kshard::redistribute(moved, mesh, layout);
    EXPECT_TRUE(all_ranks(shard_matches(back, full, 0)));
    EXPECT_TRUE(all_ranks(same_bits(kshard::gather(back), full)));
  }
}

TEST(Redistribute, MeshChangeRoundTrips) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  kshard::Mesh<2> wide(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  std::uint64_t seed = 5000;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const auto [rows, cols] = random_shape(seed);
    check_mesh_change<double>(line, Layout(Shard<0>{}), wide, Layout(Shard<1>{}, Shard<0>{}), rows,
                              cols, seed++);
    check_mesh_change<double>(line, Layout(StridedShard<0>{2}), wide,
                              Layout(Replicate{}, StridedShard<1>{3}), rows, cols, seed++);
    check_mesh_change<float>(line, Layout(Sum{}), wide, Layout(Replicate{}, Shard<1>{}), rows, cols,
                             seed++);
    check_mesh_change<float>(line, Layout(Shard<1>{}), wide, Layout(Shard<0>{}, Sum{}), rows, cols,
                             seed++);
    for (const auto& shape : kshard::test::mesh_shapes<2>(size)) {
      kshard::Mesh<2> grid(MPI_COMM_WORLD, shape, {"dp", "tp"});
      check_mesh_change<double>(line, Layout(Shard<0>{}), grid,
                                Layout(StridedShard<0>{2}, Shard<0>{}), rows, cols, seed++);
      check_mesh_change<double>(grid, Layout(Shard<1>{}, StridedShard<0>{2}), line,
                                Layout(Shard<1>{}), rows, cols, seed++);
    }
    for (const auto& shape : kshard::test::mesh_shapes<3>(size)) {
      kshard::Mesh<3> cube(MPI_COMM_WORLD, shape, {"pp", "dp", "tp"});
      check_mesh_change<double>(cube, Layout(Shard<0>{}, Replicate{}, StridedShard<1>{2}), wide,
                                Layout(Shard<0>{}, Shard<1>{}), rows, cols, seed++);
    }
  }
}

// Moving to a mesh whose ranks already hold what they need sends nothing.
TEST(Redistribute, MeshChangeSendsOnlyWhatMoves) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  kshard::Mesh<2> wide(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const auto full = reference_matrix<double>(10, 4, 3);
  const kshard::HostMatrix<const double> source(full);
  const auto rows = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Shard<0>{}), source);
  kshard::reset_comm_stats();
  const auto same = kshard::redistribute(rows, wide, Layout(StridedShard<1>{2}, Shard<0>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
  EXPECT_TRUE(all_ranks(shard_matches(same, full, 0)));
  const auto replicated =
      kshard::distribute<ExecSpace, MemSpace>(line, Layout(Replicate{}), source);
  kshard::reset_comm_stats();
  const auto sliced = kshard::redistribute(replicated, wide, Layout(Shard<1>{}, Shard<1>{}));
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
  EXPECT_TRUE(all_ranks(shard_matches(sliced, full, 0)));
  // Rows -> columns: each rank sends its rows except its own column block.
  kshard::reset_comm_stats();
  const auto by_cols = kshard::redistribute(rows, wide, Layout(Replicate{}, Shard<1>{}));
  const index_t my_rows = kshard::chunk_extent(10, size, line.my_rank());
  const index_t my_cols = kshard::chunk_extent(4, size, line.my_rank());
  EXPECT_TRUE(all_ranks(
      bytes_sent() ==
      static_cast<std::int64_t>(my_rows * (4 - my_cols) * static_cast<index_t>(sizeof(double)))));
  EXPECT_TRUE(all_ranks(shard_matches(by_cols, full, 0)));
}

// Calls f with a 1-D mesh over half of the world's ranks: not the world's communicator.
template <class F>
void on_half_mesh(F&& f) {
  const int rank = kshard::test::world_rank();
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < world_size() / 2 ? 0 : 1, rank, &half);
  int half_size = 0;
  MPI_Comm_size(half, &half_size);
  {
    const kshard::Mesh<1> mesh(half, {half_size});
    f(mesh);
  }
  MPI_Comm_free(&half);
}

TEST(Redistribute, BadArgumentsAreCollectiveErrors) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const auto full = reference_matrix<double>(6, 4, 9);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}), kshard::HostMatrix<const double>(full));
  auto message =
      collective_error([&] { (void)kshard::redistribute(matrix, Layout(StridedShard<1>{0})); });
  EXPECT_NE(message.find("split factor 0; it must be >= 1"), std::string::npos) << message;
  message = collective_error([&] {
    (void)kshard::redistribute(matrix, Layout(StridedShard<1>{line.my_rank() == size - 1 ? 3 : 2}));
  });
  if (size > 1) {
    EXPECT_NE(message.find("differs between ranks"), std::string::npos) << message;
  }
  if (size > 1) {
    on_half_mesh([&](const kshard::Mesh<1>& other) {
      message =
          collective_error([&] { (void)kshard::redistribute(matrix, other, Layout(Replicate{})); });
      EXPECT_NE(message.find("different communicator"), std::string::npos) << message;
    });
  }
  // Nothing was sent by a failed call (only the agreement's metadata, which is not counted).
  kshard::reset_comm_stats();
  (void)collective_error([&] { (void)kshard::redistribute(matrix, Layout(StridedShard<0>{-1})); });
  EXPECT_TRUE(all_ranks(bytes_sent() == 0));
}

TEST(Redistribute, IntoRefusesWrongTargetsAndWritesNothing) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const auto full = reference_matrix<double>(6, 4, 10);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}), kshard::HostMatrix<const double>(full));
  const auto expect_refused = [&](const auto& target, const std::string& expected) {
    const auto before = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), target.local());
    const auto message = collective_error([&] { kshard::redistribute_into(matrix, target); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_TRUE(all_ranks(same_bits(target.local(), before)));
    EXPECT_TRUE(all_ranks(shard_matches(matrix, full, 0)));
  };
  // A different global shape.
  Matrix<double, Layout<Replicate>> wider(line, Layout(Replicate{}), 6, 5);
  Kokkos::deep_copy(wider.local(), 3.0);
  expect_refused(wider, "the target is 6 x 5 but the matrix is 6 x 4");
  // The matrix's own storage, under another layout where that is possible: at 1 rank, a
  // Replicate matrix wrapping the Shard<0> one's view.
  if (size == 1) {
    const Matrix<double, Layout<Replicate>> alias(line, Layout(Replicate{}), 6, 4, matrix.local());
    expect_refused(alias, "shares memory with the matrix's");
  }
  if (size > 1) {
    on_half_mesh([&](const kshard::Mesh<1>& other) {
      Matrix<double, Layout<Replicate>> elsewhere(other, Layout(Replicate{}), 6, 4);
      Kokkos::deep_copy(elsewhere.local(), 3.0);
      expect_refused(elsewhere, "different communicator");
    });
  }
}

// The forms with an execution-space instance first give what the default-instance forms give.
TEST(Redistribute, InstanceOverloadsMatchTheDefaultInstance) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  kshard::Mesh<2> wide(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const auto full = reference_matrix<double>(11, 7, 21);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}), kshard::HostMatrix<const double>(full));
  const ExecSpace instance = other_instance();
  kshard::reset_comm_stats();
  const auto expected = kshard::redistribute(matrix, Layout(Shard<1>{}));
  const std::int64_t sent = bytes_sent();
  kshard::reset_comm_stats();
  const auto moved = kshard::redistribute(instance, matrix, Layout(Shard<1>{}));
  instance.fence();
  EXPECT_TRUE(all_ranks(bytes_sent() == sent));
  EXPECT_TRUE(all_ranks(same_bits(moved.local(), expected.local())));
  Matrix<double, Layout<Shard<1>>> into(line, Layout(Shard<1>{}), 11, 7);
  kshard::redistribute_into(instance, matrix, into);
  instance.fence();
  EXPECT_TRUE(all_ranks(same_bits(into.local(), expected.local())));
  const auto reshaped =
      kshard::redistribute(instance, matrix, wide, Layout(Shard<1>{}, Shard<0>{}));
  instance.fence();
  EXPECT_TRUE(all_ranks(shard_matches(reshaped, full, 0)));
}

// A plan applied to matrices it was not made for: the same kshard::error on every rank, naming
// what differs, with neither matrix changed; the plan still works afterwards.
TEST(Redistribute, PlanRefusesOtherMatricesAndChangesNothing) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  kshard::Mesh<1> twin(MPI_COMM_WORLD, {size}, {"twin"});  // the same ranks, another mesh
  using Source = Layout<StridedShard<0>>;
  using Target = Layout<Shard<1>>;
  const auto full = reference_matrix<double>(9, 6, 31);
  const kshard::HostMatrix<const double> host(full);
  const auto matrix =
      kshard::distribute<ExecSpace, MemSpace>(line, Source(StridedShard<0>{2}), host);
  auto plan = kshard::plan_redistribute(matrix, Target{});
  const auto target = plan.make_target();
  plan.apply(matrix, target);
  const auto expect_refused = [&](const Matrix<double, Source>& source,
                                  const Matrix<double, Target>& into, const std::string& phrase) {
    const auto source_before =
        Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), source.local());
    const auto into_before = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), into.local());
    kshard::reset_comm_stats();
    const auto message = collective_error([&] { plan.apply(source, into); });
    EXPECT_NE(message.find(phrase), std::string::npos) << message;
    EXPECT_TRUE(all_ranks(bytes_sent() == 0 && kshard::comm_stats().collectives == 0));
    EXPECT_TRUE(all_ranks(same_bits(source.local(), source_before)));
    EXPECT_TRUE(all_ranks(same_bits(into.local(), into_before)));
  };
  const auto taller_full = reference_matrix<double>(10, 6, 32);
  const auto taller = kshard::distribute<ExecSpace, MemSpace>(
      line, Source(StridedShard<0>{2}), kshard::HostMatrix<const double>(taller_full));
  expect_refused(taller, target, "the matrix is 10 x 6 but the plan was made for 9 x 6");
  const auto strided3 =
      kshard::distribute<ExecSpace, MemSpace>(line, Source(StridedShard<0>{3}), host);
  expect_refused(strided3, target, "the matrix's layout is (StridedShard(0, sf=3))");
  const auto elsewhere =
      kshard::distribute<ExecSpace, MemSpace>(twin, Source(StridedShard<0>{2}), host);
  expect_refused(elsewhere, target, "the matrix is on another mesh");
  Matrix<double, Target> wide_target(line, Target{}, 9, 7);
  expect_refused(matrix, wide_target, "the target is 9 x 7 but the plan was made for 9 x 6");
  Matrix<double, Target> twin_target(twin, Target{}, 9, 6);
  expect_refused(matrix, twin_target, "the target is on another mesh");
  // The plan still works, and gives what redistribute gives.
  Kokkos::deep_copy(target.local(), -1.0);
  plan.apply(matrix, target);
  EXPECT_TRUE(all_ranks(shard_matches(target, full, 0)));
}

// Planning agrees on its arguments as redistribute does: the same errors on every rank.
TEST(Redistribute, PlanningErrorsAreCollective) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const auto full = reference_matrix<double>(6, 4, 9);
  const auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}), kshard::HostMatrix<const double>(full));
  auto message = collective_error(
      [&] { (void)kshard::plan_redistribute(matrix, Layout(StridedShard<1>{0})); });
  EXPECT_NE(message.find("split factor 0; it must be >= 1"), std::string::npos) << message;
  Matrix<double, Layout<Replicate>> wider(line, Layout(Replicate{}), 6, 5);
  message = collective_error([&] { (void)kshard::plan_redistribute(matrix, wider); });
  EXPECT_NE(message.find("the target is 6 x 5 but the matrix is 6 x 4"), std::string::npos)
      << message;
  if (size > 1) {
    on_half_mesh([&](const kshard::Mesh<1>& other) {
      message = collective_error(
          [&] { (void)kshard::plan_redistribute(matrix, other, Layout(Replicate{})); });
      EXPECT_NE(message.find("different communicator"), std::string::npos) << message;
    });
  }
}

}  // namespace
