// tp_dim inferred from the layout type (the same bits as an explicit kshard::TpDim and the serial
// reference), biases distributed like their weight's rows (kshard::distribute_bias), and the
// refusals of a tp_dim or bias that does not fit.

#include <gtest/gtest.h>

#include "support.hpp"

namespace {

using namespace kshard::test::tp;  // NOLINT(google-build-using-namespace): the tests' helpers

TEST(TensorParallelInferred, LinearLayersMatchExplicitTpDimAndSerial) {
  std::uint64_t seed = 9500;
  for_each_tp_mesh([&](const kshard::Mesh<2>& mesh, std::size_t tp) {
    SCOPED_TRACE(::testing::Message() << fmt::format("{}, tp = {}", mesh, tp));
    const LinearReference ref(5, 7, 6, seed += 10);
    with_tp_layout(tp, Shard<0>{}, [&](const auto& l) { check_inferred_column(mesh, tp, l, ref); });
    with_tp_layout(tp, StridedShard<0>{2},
                   [&](const auto& l) { check_inferred_column(mesh, tp, l, ref); });
    with_tp_layout(tp, Shard<1>{}, [&](const auto& l) { check_inferred_row(mesh, tp, l, ref); });
  });
}

TEST(TensorParallelInferred, LookupMatchesExplicitTpDimAndSerial) {
  std::uint64_t seed = 9600;
  for_each_tp_mesh([&](const kshard::Mesh<2>& mesh, std::size_t tp) {
    SCOPED_TRACE(::testing::Message() << fmt::format("{}, tp = {}", mesh, tp));
    with_tp_layout(tp, Shard<0>{}, [&](const auto& layout) {
      const index_t vocab = 9, hidden = 4;
      const std::vector<index_t> host_ids{3, 0, 8, 3, 5};
      const auto ids = to_device<std::int32_t>(host_ids);
      const auto full = reference_matrix<float>(vocab, hidden, seed += 10);
      const auto table = make(mesh, layout, full);
      const auto out = kshard::vocab_parallel_lookup(table, ids);
      const auto scaled = kshard::vocab_parallel_lookup(other_instance(), table, ids, 2.0);
      DeviceMatrix<float> into("into", host_ids.size(), hidden);
      kshard::vocab_parallel_lookup(table, ids, into, 2.0);
      bool ok = same_bits(out, kshard::vocab_parallel_lookup(table, ids, TpDim{tp})) &&
                same_bits(scaled, kshard::vocab_parallel_lookup(table, ids, TpDim{tp}, 2.0)) &&
                same_bits(into, scaled);
      const auto got = to_host(scaled);
      for (std::size_t i = 0; i < host_ids.size(); ++i)
        for (std::size_t j = 0; j < static_cast<std::size_t>(hidden); ++j)
          ok = ok && got(i, j) == full(static_cast<std::size_t>(host_ids[i]), j) * 2.0f;
      EXPECT_TRUE(all_ranks(ok)) << "forward";

      const auto grad_out = to_device(reference_matrix<float>(5, hidden, seed + 1));
      const auto grad = make(mesh, layout, HostMatrix<float>("zero", vocab, hidden));
      const auto grad_explicit = make(mesh, layout, HostMatrix<float>("zero", vocab, hidden));
      kshard::vocab_parallel_lookup_backward(grad, ids, grad_out, 2.0, 3);
      kshard::vocab_parallel_lookup_backward(grad_explicit, ids, grad_out, TpDim{tp}, 2.0, 3);
      EXPECT_TRUE(all_ranks(same_bits(kshard::gather(grad), kshard::gather(grad_explicit))))
          << "backward";
    });
  });
}

TEST(TensorParallelInferred, RefusesMismatchedTpDimAndBias) {
  const int size = world_size();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const auto table = make(mesh, Layout(Replicate{}, Shard<0>{}), reference_matrix<float>(6, 3, 91));
  const auto ids = to_device<std::int32_t>(std::vector<index_t>{1, 2});
  auto message =
      collective_error([&] { (void)kshard::vocab_parallel_lookup(table, ids, TpDim{0}); });
  EXPECT_NE(message.find("does not shard tensor dimension 0 over mesh dimension 0 ('dp')"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("it shards dimension 0 over mesh dimension 1 ('tp')"), std::string::npos)
      << message;

  // A fused weight (two pieces per rank) whose bias was split as one piece.
  const Layout fused(Replicate{}, StridedShard<0>{2});
  const auto weight = make(mesh, fused, reference_matrix<double>(8, 5, 92));
  const DeviceMatrix<double> x("x", 2, 5);
  const auto plain_bias =
      make(mesh, Layout(Replicate{}, StridedShard<0>{1}), reference_matrix<double>(8, 1, 93));
  message = collective_error([&] { (void)kshard::column_parallel_linear(weight, x, plain_bias); });
  EXPECT_NE(message.find("kshard::column_parallel_linear: bias_local has layout"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("the bias must be split like the weight's rows"), std::string::npos)
      << message;
  const auto weight_grad = make(mesh, fused, HostMatrix<double>("zero", 8, 5));
  message = collective_error([&] {
    (void)kshard::column_parallel_linear_backward(weight, x, DeviceMatrix<double>("gy", 2, 0),
                                                  weight_grad, plain_bias);
  });
  EXPECT_NE(message.find("grad_bias_local has layout"), std::string::npos) << message;

  // A replicated bias one element too long, built by hand and by distribute_bias.
  const auto row_weight =
      make(mesh, Layout(Replicate{}, Shard<1>{}), reference_matrix<double>(4, 6, 94));
  const auto long_bias =
      make(mesh, Layout(Replicate{}, Replicate{}), reference_matrix<double>(5, 1, 95));
  const auto x_local =
      to_device(local_cols(reference_matrix<double>(2, 6, 96), row_weight.mapping().cols));
  message =
      collective_error([&] { (void)kshard::row_parallel_linear(row_weight, x_local, long_bias); });
  EXPECT_NE(message.find("the bias is 5 x 1 but the weight is 4 x 6: it must be 4 x 1"),
            std::string::npos)
      << message;
  message = collective_error([&] {
    (void)kshard::distribute_bias(row_weight, first_row(reference_matrix<double>(1, 5, 97)));
  });
  EXPECT_NE(
      message.find("kshard::distribute_bias: the bias has 5 elements but the weight is 4 x 6"),
      std::string::npos)
      << message;
}

}  // namespace
