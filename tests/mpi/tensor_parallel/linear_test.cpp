// Row- and column-parallel linear layers (kshard/tensor_parallel/linear.hpp), forward and
// backward, alone and as a column-then-row pair, against a serial reference in double, with
// the collectives each issues and every refusal.

#include <gtest/gtest.h>

#include "support.hpp"

namespace {

using namespace kshard::test::tp;  // NOLINT(google-build-using-namespace): the tests' helpers

TEST(RowParallelLinear, ForwardAndBackwardAgainstSerial) {
  std::uint64_t seed = 5000;
  for_each_tp_mesh([&](const kshard::Mesh<2>& mesh, std::size_t tp) {
    with_tp_layout(tp, Shard<1>{}, [&](const auto& layout) {
      check_row_parallel<float>(mesh, tp, layout, 5, 6, 7, true, seed += 10);      // uneven in
      check_row_parallel<double>(mesh, tp, layout, 3, 2, 3, true, seed += 10);     // empty shards
      check_row_parallel<double>(mesh, tp, layout, 0, 4, 5, true, seed += 10);     // N = 0
      check_row_parallel<float>(mesh, tp, layout, 21, 19, 37, false, seed += 10);  // edge tiles
      check_row_parallel<double>(mesh, tp, layout, 9, 17, 12, true, seed += 10);
    });
    with_tp_layout(tp, StridedShard<1>{2}, [&](const auto& layout) {
      check_row_parallel<double>(mesh, tp, layout, 4, 5, 9, true, seed += 10);
    });
  });
}

TEST(ColumnParallelLinear, ForwardAndBackwardAgainstSerial) {
  std::uint64_t seed = 6000;
  for_each_tp_mesh([&](const kshard::Mesh<2>& mesh, std::size_t tp) {
    with_tp_layout(tp, Shard<0>{}, [&](const auto& layout) {
      check_column_parallel<float>(mesh, tp, layout, 5, 7, 6, true, seed += 10);
      check_column_parallel<double>(mesh, tp, layout, 3, 3, 2, true, seed += 10);
      check_column_parallel<double>(mesh, tp, layout, 0, 5, 4, true, seed += 10);
      check_column_parallel<float>(mesh, tp, layout, 18, 37, 23, false, seed += 10);
      check_column_parallel<double>(mesh, tp, layout, 9, 19, 10, true, seed += 10);
    });
    with_tp_layout(tp, StridedShard<0>{3}, [&](const auto& layout) {
      check_column_parallel<double>(mesh, tp, layout, 4, 10, 3, true, seed += 10);
    });
  });
}

// A Megatron MLP pair: column-parallel up, row-parallel down, with no communication between
// them; forward and the chained backward against the serial product.
TEST(TensorParallelLinear, ColumnThenRowPair) {
  for_each_tp_mesh([&](const kshard::Mesh<2>& mesh, std::size_t tp) {
    SCOPED_TRACE(::testing::Message() << fmt::format("{}, tp = {}", mesh, tp));
    const index_t n = 4, hidden = 5, ffn = 7;
    const auto w1 = reference_matrix<double>(ffn, hidden, 71);
    const auto w2 = reference_matrix<double>(hidden, ffn, 72);
    const auto x = reference_matrix<double>(n, hidden, 73);
    const auto gy = reference_matrix<double>(n, hidden, 74);
    with_tp_layout(tp, Shard<0>{}, [&](const auto& up_layout) {
      with_tp_layout(tp, Shard<1>{}, [&](const auto& down_layout) {
        const auto up = make(mesh, up_layout, w1);
        const auto down = make(mesh, down_layout, w2);
        const auto up_grad = make(mesh, up_layout, HostMatrix<double>("z", ffn, hidden));
        const auto down_grad = make(mesh, down_layout, HostMatrix<double>("z", hidden, ffn));
        const auto x_dev = to_device(x);
        const auto u_local = kshard::column_parallel_linear(up, x_dev, kshard::no_bias, TpDim{tp});
        const auto y =
            to_host(kshard::row_parallel_linear(down, u_local, kshard::no_bias, TpDim{tp}));
        const auto gu_local = kshard::row_parallel_linear_backward(
            down, u_local, to_device(gy), down_grad, kshard::no_bias, TpDim{tp});
        const auto gx = to_host(kshard::column_parallel_linear_backward(
            up, x_dev, gu_local, up_grad, kshard::no_bias, TpDim{tp}));
        bool ok = true;
        for (std::size_t i = 0; i < 4; ++i)
          for (std::size_t j = 0; j < 5; ++j) {
            double want_y = 0, want_gx = 0;
            for (std::size_t f = 0; f < 7; ++f) {
              double u = 0, gu = 0;
              for (std::size_t k = 0; k < 5; ++k) {
                u += x(i, k) * w1(f, k);
                gu += gy(i, k) * w2(k, f);
              }
              want_y += u * w2(j, f);
              want_gx += gu * w1(f, j);
            }
            ok = ok && close(y(i, j), want_y, 1e-13) && close(gx(i, j), want_gx, 1e-13);
          }
        EXPECT_TRUE(all_ranks(ok));
      });
    });
  });
}

TEST(TensorParallelLinear, RefusesWrongShapesLayoutsAndMeshes) {
  const int size = world_size();
  const bool last = world_rank() == size - 1;
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, size}, {"dp", "tp"});
  const auto w = reference_matrix<float>(6, 5, 81);
  const Layout row_layout(Replicate{}, Shard<1>{});
  const Layout column_layout(Replicate{}, Shard<0>{});
  const auto row_weight = make(mesh, row_layout, w);
  const auto column_weight = make(mesh, column_layout, w);
  const auto in_local = static_cast<std::size_t>(row_weight.mapping().cols.local_extent());
  const DeviceMatrix<float> x_local("x_local", 2, in_local);
  const DeviceMatrix<float> x("x", 2, 5);
  const DeviceVector<float> bias("bias", 6);

  // x_local with a wrong width on every rank, then on the last rank only.
  auto message = collective_error([&] {
    (void)kshard::row_parallel_linear(row_weight, DeviceMatrix<float>("bad", 2, in_local + 1), bias,
                                      TpDim{1});
  });
  EXPECT_NE(message.find("kshard::row_parallel_linear: x_local on rank 0 is 2 x "),
            std::string::npos)
      << message;
  message = collective_error([&] {
    (void)kshard::row_parallel_linear(row_weight,
                                      last ? DeviceMatrix<float>("bad", 2, in_local + 2) : x_local,
                                      kshard::no_bias, TpDim{1});
  });
  EXPECT_NE(message.find(fmt::format("x_local on rank {} is 2 x ", size - 1)), std::string::npos)
      << message;
  message = collective_error([&] {
    (void)kshard::row_parallel_linear(row_weight, x_local, DeviceVector<float>("b", 5), TpDim{1});
  });
  EXPECT_NE(message.find("the bias has 5 elements but the weight is 6 x 5"), std::string::npos)
      << message;

  // Wrong mesh dimension, out-of-range tp_dim.
  message = collective_error(
      [&] { (void)kshard::row_parallel_linear(row_weight, x_local, kshard::no_bias, TpDim{0}); });
  EXPECT_NE(message.find("does not shard tensor dimension 1 over mesh dimension 0 ('dp')"),
            std::string::npos)
      << message;
  message = collective_error(
      [&] { (void)kshard::column_parallel_linear(column_weight, x, kshard::no_bias, TpDim{3}); });
  EXPECT_NE(message.find("tp_dim is 3"), std::string::npos) << message;

  // Column-parallel shapes, forward (local) and backward (agreed).
  message = collective_error([&] {
    (void)kshard::column_parallel_linear(column_weight, DeviceMatrix<float>("bad", 2, 4),
                                         kshard::no_bias, TpDim{1});
  });
  EXPECT_NE(message.find("x is 2 x 4 but the weight is 6 x 5"), std::string::npos) << message;
  const auto prior = reference_matrix<float>(6, 5, 82);
  const auto column_grad = make(mesh, column_layout, prior);
  const auto out_local = static_cast<std::size_t>(column_weight.mapping().rows.local_extent());
  message = collective_error([&] {
    (void)kshard::column_parallel_linear_backward(
        column_weight, x, DeviceMatrix<float>("gy", 2, last ? out_local + 1 : out_local),
        column_grad, kshard::no_bias, TpDim{1});
  });
  EXPECT_NE(message.find(fmt::format("grad_y_local on rank {} is 2 x ", size - 1)),
            std::string::npos)
      << message;

  // Gradient matrices of the wrong shape or on another mesh; nothing written.
  const auto row_grad = make(mesh, row_layout, prior);
  message = collective_error([&] {
    (void)kshard::row_parallel_linear_backward(
        row_weight, x_local, DeviceMatrix<float>("gy", 2, 6),
        make(mesh, row_layout, reference_matrix<float>(7, 5, 1)), kshard::no_bias, TpDim{1});
  });
  EXPECT_NE(message.find("grad_weight is 7 x 5 but the weight is 6 x 5"), std::string::npos)
      << message;
  message = collective_error([&] {
    (void)kshard::row_parallel_linear_backward(row_weight, x_local, DeviceMatrix<float>("gy", 2, 7),
                                               row_grad, kshard::no_bias, TpDim{1});
  });
  EXPECT_NE(message.find("grad_y is 2 x 7 but the weight is 6 x 5"), std::string::npos) << message;
  if (size > 1) {
    kshard::Mesh<2> other(MPI_COMM_WORLD, {size, 1}, {"dp", "tp"});
    message = collective_error([&] {
      (void)kshard::row_parallel_linear_backward(
          row_weight, x_local, DeviceMatrix<float>("gy", 2, 6), make(other, row_layout, prior),
          kshard::no_bias, TpDim{1});
    });
    EXPECT_NE(message.find("not the same mesh"), std::string::npos) << message;
  }
  bool same = true;
  auto unchanged = [&](const auto& grad) {
    const auto after = kshard::gather(grad);
    for (std::size_t r = 0; r < 6; ++r)
      for (std::size_t c = 0; c < 5; ++c) same = same && after(r, c) == prior(r, c);
  };
  unchanged(row_grad);
  unchanged(column_grad);
  EXPECT_TRUE(all_ranks(same)) << "a refused call wrote a gradient";
}

}  // namespace
