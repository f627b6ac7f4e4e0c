// Reduce-from and copy-to the tensor-parallel region (kshard/tensor_parallel/region.hpp), forward
// and backward, on every tensor-parallel mesh, against a serial reference.

#include <gtest/gtest.h>

#include "support.hpp"

namespace {

using namespace kshard::test::tp;  // NOLINT(google-build-using-namespace): the tests' helpers

TEST(TensorParallelRegion, ReduceAndCopyPairs) {
  for_each_tp_mesh([&](const kshard::Mesh<2>& mesh, std::size_t tp) {
    SCOPED_TRACE(::testing::Message() << fmt::format("{}, tp = {}", mesh, tp));
    const bool reduces = mesh.extent(tp) > 1;
    auto value = [](int rank, std::size_t i, std::size_t j) {
      return 100.0 * rank + 10.0 * static_cast<double>(i) + static_cast<double>(j);
    };
    // Expected sum over the ranks that differ from this one only along tp.
    auto summed = [&](std::size_t i, std::size_t j) {
      double sum = 0;
      auto coords = mesh.coords();
      for (int c = 0; c < mesh.extent(tp); ++c) {
        coords[tp] = c;
        sum += value(mesh.rank_of(coords), i, j);
      }
      return sum;
    };
    HostMatrix<double> host("host", 3, 4);
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 4; ++j) host(i, j) = value(mesh.my_rank(), i, j);

    // reduce_from_tp forward: its agreements and one all-reduce of 12 doubles; backward:
    // identity, silent.
    auto values = to_device(host);
    kshard::reset_comm_stats();
    kshard::reduce_from_tp<ExecSpace>(mesh, TpDim{tp}, values);
    bool ok = kshard::comm_stats().collectives == (reduces ? 1 : 0) &&
              kshard::comm_stats().agreements == tp_agreements(mesh, tp) &&
              kshard::comm_stats().bytes_sent == (reduces ? 12 * 8 : 0);
    auto got = to_host(values);
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 4; ++j) ok = ok && got(i, j) == summed(i, j);
    kshard::reset_comm_stats();
    const auto identity = kshard::reduce_from_tp_backward(values);
    ok = ok && identity.data() == values.data() && kshard::comm_stats().collectives == 0;
    EXPECT_TRUE(all_ranks(ok)) << "reduce_from_tp";

    // copy_to_tp forward: identity, silent; backward: the all-reduce.
    auto grads = to_device(host);
    kshard::reset_comm_stats();
    ok = kshard::copy_to_tp(grads).data() == grads.data() && kshard::comm_stats().collectives == 0;
    kshard::copy_to_tp_backward<ExecSpace>(mesh, TpDim{tp}, grads);
    ok = ok && kshard::comm_stats().collectives == (reduces ? 1 : 0);
    got = to_host(grads);
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 4; ++j) ok = ok && got(i, j) == summed(i, j);
    EXPECT_TRUE(all_ranks(ok)) << "copy_to_tp";

    // A rank-1 int64 view, and a non-contiguous column slice whose other columns stay.
    Kokkos::View<std::int64_t*, MemSpace> counts("counts", 2);
    Kokkos::deep_copy(counts, std::int64_t{mesh.my_rank() + 1});
    kshard::reduce_from_tp<ExecSpace>(mesh, TpDim{tp}, counts);
    auto wide = to_device(host);
    const auto slice = Kokkos::subview(wide, Kokkos::ALL, std::make_pair(1, 3));
    kshard::reduce_from_tp<ExecSpace>(mesh, TpDim{tp}, slice);
    const auto counts_host = to_host(counts);
    std::int64_t want_count = 0;
    auto coords = mesh.coords();
    for (int c = 0; c < mesh.extent(tp); ++c) {
      coords[tp] = c;
      want_count += mesh.rank_of(coords) + 1;
    }
    ok = counts_host(0) == want_count && counts_host(1) == want_count;
    got = to_host(wide);
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 4; ++j)
        ok = ok && got(i, j) == (j == 1 || j == 2 ? summed(i, j) : host(i, j));
    EXPECT_TRUE(all_ranks(ok)) << "rank-1 and strided views";
  });
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  auto values = to_device(reference_matrix<float>(2, 2, 5));
  const auto message =
      collective_error([&] { kshard::reduce_from_tp<ExecSpace>(line, TpDim{1}, values); });
  EXPECT_NE(message.find("kshard::reduce_from_tp: tp_dim is 1"), std::string::npos) << message;
}

}  // namespace
