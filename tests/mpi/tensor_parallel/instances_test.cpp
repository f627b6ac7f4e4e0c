// The execution-space instance overloads of the tensor-parallel calls: the same bits as the
// default forms, on a non-default instance.

#include <gtest/gtest.h>

#include "support.hpp"

namespace {

using namespace kshard::test::tp;  // NOLINT(google-build-using-namespace): the tests' helpers

// Every public function of kshard/tensor_parallel.hpp, called with an instance first, gives the
// bits of its default form.
TEST(TensorParallelInstances, SameResultsAsDefaultForms) {
  const ExecSpace space = other_instance();
  std::uint64_t seed = 9100;
  for_each_tp_mesh([&](const kshard::Mesh<2>& mesh, std::size_t tp) {
    SCOPED_TRACE(::testing::Message() << fmt::format("{}, tp = {}", mesh, tp));
    seed += 10;
    const index_t vocab = 11, hidden = 6, n = 5, out = 7, in = 9;

    // The lookup, both forms, and its backward.
    with_tp_layout(tp, Shard<0>{}, [&](const auto& layout) {
      const auto table = make(mesh, layout, reference_matrix<float>(vocab, hidden, seed));
      const auto ids = to_device<std::int32_t>(std::vector<index_t>{3, 0, 10, 3, 7});
      const auto want = kshard::vocab_parallel_lookup(table, ids, TpDim{tp}, 2.0);
      bool ok = same_bits(want, kshard::vocab_parallel_lookup(space, table, ids, TpDim{tp}, 2.0));
      DeviceMatrix<float> into("into", n, hidden);
      kshard::vocab_parallel_lookup(space, table, ids, into, TpDim{tp}, 2.0);
      ok = ok && same_bits(want, into);
      EXPECT_TRUE(all_ranks(ok)) << "lookup";

      const auto grad_out = to_device(reference_matrix<float>(n, hidden, seed + 1));
      const auto prior = reference_matrix<float>(vocab, hidden, seed + 2);
      const auto by_default = make(mesh, layout, prior);
      const auto by_instance = make(mesh, layout, prior);
      kshard::vocab_parallel_lookup_backward(by_default, ids, grad_out, TpDim{tp}, 0.5, index_t{0});
      kshard::vocab_parallel_lookup_backward(space, by_instance, ids, grad_out, TpDim{tp}, 0.5,
                                             index_t{0});
      EXPECT_TRUE(all_ranks(same_bits(kshard::gather(by_default), kshard::gather(by_instance))))
          << "lookup backward";
    });

    // The region functions, on a contiguous view and on a strided column window.
    {
      const auto host = reference_matrix<double>(3, 4, seed + 3);
      auto a = to_device(host);
      auto b = to_device(host);
      kshard::reduce_from_tp(mesh, TpDim{tp}, a);
      kshard::reduce_from_tp(space, mesh, TpDim{tp}, b);
      bool ok = same_bits(a, b);
      auto wide_a = to_device(host);
      auto wide_b = to_device(host);
      const auto cols = std::make_pair(std::size_t{1}, std::size_t{3});
      kshard::copy_to_tp_backward(mesh, TpDim{tp}, Kokkos::subview(wide_a, Kokkos::ALL, cols));
      kshard::copy_to_tp_backward(space, mesh, TpDim{tp},
                                  Kokkos::subview(wide_b, Kokkos::ALL, cols));
      ok = ok && same_bits(wide_a, wide_b);
      ok = ok && kshard::copy_to_tp(space, a).data() == a.data() &&
           kshard::reduce_from_tp_backward(space, a).data() == a.data();
      EXPECT_TRUE(all_ranks(ok)) << "region";
    }

    // Row-parallel forward and backward, with a bias and with kshard::no_bias.
    const LinearReference ref(n, out, in, seed + 4);
    with_tp_layout(tp, Shard<1>{}, [&](const auto& layout) {
      const auto weight = make(mesh, layout, cast<float>(ref.w));
      const auto x_local = to_device(local_cols(cast<float>(ref.x), weight.mapping().cols));
      const auto bias = row_vector<float>(ref.b);
      const auto grad_y = to_device(cast<float>(ref.gy));
      bool ok = same_bits(kshard::row_parallel_linear(weight, x_local, bias, TpDim{tp}),
                          kshard::row_parallel_linear(space, weight, x_local, bias, TpDim{tp})) &&
                same_bits(kshard::row_parallel_linear(weight, x_local, kshard::no_bias, TpDim{tp}),
                          kshard::row_parallel_linear(space, weight, x_local, kshard::no_bias,
                                                      TpDim{tp}));
      const auto gw_default = make(mesh, layout, cast<float>(ref.gw));
      const auto gw_instance = make(mesh, layout, cast<float>(ref.gw));
      const auto gb_default = row_vector<float>(ref.gb);
      const auto gb_instance = row_vector<float>(ref.gb);
      ok =
          ok && same_bits(kshard::row_parallel_linear_backward(weight, x_local, grad_y, gw_default,
                                                               gb_default, TpDim{tp}),
                          kshard::row_parallel_linear_backward(
                              space, weight, x_local, grad_y, gw_instance, gb_instance, TpDim{tp}));
      ok = ok &&
           same_bits(kshard::row_parallel_linear_backward(weight, x_local, grad_y, gw_default,
                                                          kshard::no_bias, TpDim{tp}),
                     kshard::row_parallel_linear_backward(space, weight, x_local, grad_y,
                                                          gw_instance, kshard::no_bias, TpDim{tp}));
      ok = ok && same_bits(kshard::gather(gw_default), kshard::gather(gw_instance)) &&
           same_vector(gb_default, gb_instance);
      EXPECT_TRUE(all_ranks(ok)) << "row-parallel";
    });

    // Column-parallel forward and backward.
    with_tp_layout(tp, Shard<0>{}, [&](const auto& layout) {
      const auto weight = make(mesh, layout, cast<float>(ref.w));
      const auto& rows = weight.mapping().rows;
      const auto x = to_device(cast<float>(ref.x));
      const auto bias_local =
          Kokkos::subview(to_device(local_cols(cast<float>(ref.b), rows)), 0, Kokkos::ALL);
      const auto grad_y_local = to_device(local_cols(cast<float>(ref.gy), rows));
      bool ok =
          same_bits(kshard::column_parallel_linear(weight, x, bias_local, TpDim{tp}),
                    kshard::column_parallel_linear(space, weight, x, bias_local, TpDim{tp})) &&
          same_bits(kshard::column_parallel_linear(weight, x, kshard::no_bias, TpDim{tp}),
                    kshard::column_parallel_linear(space, weight, x, kshard::no_bias, TpDim{tp}));
      const auto gw_default = make(mesh, layout, cast<float>(ref.gw));
      const auto gw_instance = make(mesh, layout, cast<float>(ref.gw));
      const auto gb_default = row_vector<float>(local_cols(ref.gb, rows));
      const auto gb_instance = row_vector<float>(local_cols(ref.gb, rows));
      ok =
          ok && same_bits(kshard::column_parallel_linear_backward(
                              weight, x, grad_y_local, gw_default, gb_default, TpDim{tp}),
                          kshard::column_parallel_linear_backward(
                              space, weight, x, grad_y_local, gw_instance, gb_instance, TpDim{tp}));
      ok = ok &&
           same_bits(kshard::column_parallel_linear_backward(weight, x, grad_y_local, gw_default,
                                                             kshard::no_bias, TpDim{tp}),
                     kshard::column_parallel_linear_backward(
                         space, weight, x, grad_y_local, gw_instance, kshard::no_bias, TpDim{tp}));
      ok = ok && same_bits(kshard::gather(gw_default), kshard::gather(gw_instance)) &&
           same_vector(gb_default, gb_instance);
      EXPECT_TRUE(all_ranks(ok)) << "column-parallel";
    });
  });
}

}  // namespace
