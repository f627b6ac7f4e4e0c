// The vocabulary-parallel lookup and its backward (kshard/tensor_parallel/embedding.hpp) on meshes
// (n), (1, n), (n, 1) and (2, n/2), against a serial reference: results, the collectives each
// issues, and every refusal (the same message on every rank, nothing written).

#include <gtest/gtest.h>

#include "support.hpp"

namespace {

using namespace kshard::test::tp;  // NOLINT(google-build-using-namespace): the tests' helpers

TEST(VocabParallelLookup, ForwardAndBackwardAgainstSerial) {
  std::uint64_t seed = 4000;
  for_each_tp_mesh([&](const kshard::Mesh<2>& mesh, std::size_t tp) {
    with_tp_layout(tp, Shard<0>{}, [&](const auto& layout) {
      // Uneven V, repeated ids, int32 ids.
      check_lookup<float, std::int32_t>(mesh, tp, layout, 7, 5, random_ids(13, 7, seed), 1.0,
                                        std::nullopt, seed);
      seed += 10;
      // V < tp at 3 and 4 ranks, int64 ids, scale, a padding id that appears.
      check_lookup<double, std::int64_t>(mesh, tp, layout, 2, 3, {1, 0, 1, 1, 0}, 2.5, 0, seed);
      seed += 10;
      // N = 0, bf16 table (float output).
      check_lookup<kshard::bf16, std::int64_t>(mesh, tp, layout, 10, 4, {}, 1.0, std::nullopt,
                                               seed);
      seed += 10;
      check_lookup<kshard::bf16, std::int32_t>(mesh, tp, layout, 5, 6, {4, 4, 0, 3}, 3.0, 3, seed);
      seed += 10;
      check_lookup<kshard::f16, std::int32_t>(mesh, tp, layout, 6, 5, {5, 1, 1, 0}, 0.5, 0, seed);
      seed += 10;
    });
    with_tp_layout(tp, StridedShard<0>{2}, [&](const auto& layout) {
      check_lookup<float, std::int32_t>(mesh, tp, layout, 11, 4, random_ids(9, 11, seed),
                                        std::sqrt(4.0), 3, seed);
      seed += 10;
      check_lookup<double, std::int64_t>(mesh, tp, layout, 3, 2, {2, 2, 2}, 1.0, std::nullopt,
                                         seed);
      seed += 10;
    });
  });
}

TEST(VocabParallelLookup, OneDimensionalMesh) {
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()}, {"tp"});
  const auto full = reference_matrix<float>(9, 3, 77);
  const auto table = make(line, Layout(Shard<0>{}), full);
  const std::vector<index_t> ids{8, 0, 4, 8};
  const auto out =
      to_host(kshard::vocab_parallel_lookup(table, to_device<std::int64_t>(ids), TpDim{0}));
  bool ok = true;
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t j = 0; j < 3; ++j)
      ok = ok && out(i, j) == full(static_cast<std::size_t>(ids[i]), j);
  EXPECT_TRUE(all_ranks(ok));
}

TEST(VocabParallelLookup, BadIdsRaiseOnEveryRankAndWriteNothing) {
  const int size = world_size();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const Layout layout(Replicate{}, Shard<0>{});
  const auto full = reference_matrix<float>(7, 4, 31);
  const auto table = make(mesh, layout, full);
  auto message = collective_error([&] {
    (void)kshard::vocab_parallel_lookup(table, to_device<std::int32_t>(std::vector<int>{0, -1, 2}),
                                        TpDim{1});
  });
  EXPECT_NE(message.find("token id -1 is out of range for a vocabulary of 7 rows"),
            std::string::npos)
      << message;
  message = collective_error([&] {
    (void)kshard::vocab_parallel_lookup(table, to_device<std::int64_t>(std::vector<int>{7}),
                                        TpDim{1});
  });
  EXPECT_NE(message.find("token id 7 is out of range"), std::string::npos) << message;

  // A bad id on the last rank only: every rank throws its message.
  const bool last = world_rank() == size - 1;
  message = collective_error([&] {
    const std::vector<int> ids = last ? std::vector<int>{0, 9} : std::vector<int>{0, 1};
    (void)kshard::vocab_parallel_lookup(table, to_device<std::int32_t>(ids), TpDim{1});
  });
  // (the ids differ within the tp group too; the agreement names the range or the difference)
  EXPECT_TRUE(message.find("token id 9 is out of range") != std::string::npos ||
              message.find("the list of token ids differs") != std::string::npos)
      << message;

  // Backward: the same refusal, and the gradient is untouched.
  const auto grad_table = make(mesh, layout, full);
  const auto grad_out = to_device(reference_matrix<float>(3, 4, 32));
  message = collective_error([&] {
    kshard::vocab_parallel_lookup_backward(
        grad_table, to_device<std::int64_t>(std::vector<int>{1, 7, 2}), grad_out, TpDim{1});
  });
  EXPECT_NE(message.find("token id 7 is out of range"), std::string::npos) << message;
  message = collective_error([&] {
    kshard::vocab_parallel_lookup_backward(
        grad_table, to_device<std::int64_t>(std::vector<int>{1, -2, 2}), grad_out, TpDim{1});
  });
  EXPECT_NE(message.find("token id -2 is out of range"), std::string::npos) << message;
  EXPECT_TRUE(all_ranks(same_bits(kshard::gather(grad_table), full)));
}

TEST(VocabParallelLookup, RefusesWrongLayoutsAndShapes) {
  const int size = world_size();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {size, 1}, {"dp", "tp"});
  const auto full = reference_matrix<double>(6, 3, 41);
  const auto table = make(mesh, Layout(Shard<0>{}, Replicate{}), full);
  const auto ids = to_device<std::int32_t>(std::vector<int>{1, 2});
  auto message =
      collective_error([&] { (void)kshard::vocab_parallel_lookup(table, ids, TpDim{1}); });
  EXPECT_NE(message.find("does not shard tensor dimension 0 over mesh dimension 1 ('tp')"),
            std::string::npos)
      << message;
  message = collective_error([&] { (void)kshard::vocab_parallel_lookup(table, ids, TpDim{2}); });
  EXPECT_NE(message.find("tp_dim is 2, but the mesh Mesh(dp="), std::string::npos) << message;

  // An output buffer of the wrong shape, on every rank or on the last one only: refused
  // everywhere, the buffer untouched.
  const auto row_table = make(mesh, Layout(Replicate{}, Shard<0>{}), full);
  for (const bool everywhere : {true, false}) {
    const bool wrong = everywhere || world_rank() == size - 1;
    Kokkos::View<double**, Kokkos::LayoutRight, MemSpace> out("out", 2, wrong ? 4 : 3);
    Kokkos::deep_copy(out, 5.0);
    message =
        collective_error([&] { kshard::vocab_parallel_lookup(row_table, ids, out, TpDim{1}); });
    EXPECT_NE(message.find("out is 2 x 4 but must be 2 x 3"), std::string::npos) << message;
    const auto kept = to_host(out);
    bool untouched = true;
    for (std::size_t k = 0; k < kept.span(); ++k) untouched = untouched && kept.data()[k] == 5.0;
    EXPECT_TRUE(all_ranks(untouched));
  }

  const auto grad_table = make(mesh, Layout(Shard<0>{}, Replicate{}), full);
  message = collective_error([&] {
    kshard::vocab_parallel_lookup_backward(grad_table, ids,
                                           to_device(reference_matrix<double>(2, 4, 1)), TpDim{0});
  });
  EXPECT_NE(message.find("grad_output is 2 x 4 but there are 2 ids and the table is 6 x 3"),
            std::string::npos)
      << message;
  message = collective_error([&] {
    kshard::vocab_parallel_lookup_backward(
        grad_table, ids, to_device(reference_matrix<double>(2, 3, 1)), TpDim{0}, 1.0, 6);
  });
  EXPECT_NE(message.find("padding id 6 is out of range"), std::string::npos) << message;
  const auto after = kshard::gather(grad_table);
  bool same = true;
  for (std::size_t r = 0; r < 6; ++r)
    for (std::size_t c = 0; c < 3; ++c) same = same && after(r, c) == full(r, c);
  EXPECT_TRUE(all_ranks(same));
}

}  // namespace
