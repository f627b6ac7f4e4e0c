// Tensor-parallel primitives (kshard/tensor_parallel.hpp) on meshes (n), (1, n), (n, 1) and
// (2, n/2), against serial references computed from the whole matrices on every rank: the
// vocabulary-parallel lookup and its backward, reduce-from / copy-to TP, row- and column-
// parallel linear layers forward and backward, the collectives each one issues, every refusal
// (the same message on every rank, nothing written), the execution-space instance overloads
// (the same bits as the default forms, on a non-default instance), and the deprecated spellings
// with a bare integer for tp_dim (the same bits as the kshard::TpDim forms).

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kshard/comm/stats.hpp"
#include "kshard/distribute.hpp"
#include "kshard/format.hpp"
#include "kshard/tensor_parallel.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::HostMatrix;
using kshard::index_t;
using kshard::Layout;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using kshard::TpDim;
using kshard::test::all_ranks;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::MemSpace;
using kshard::test::other_instance;
using kshard::test::reference_matrix;
using kshard::test::same_bits;
using kshard::test::world_rank;
using kshard::test::world_size;

template <class T>
using DeviceMatrix = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;
template <class T>
using DeviceVector = Kokkos::View<T*, MemSpace>;

template <class T>
DeviceMatrix<T> to_device(const HostMatrix<T>& host) {
  DeviceMatrix<T> d("device", host.extent(0), host.extent(1));
  Kokkos::deep_copy(d, host);
  return d;
}

template <class T, class U>
DeviceVector<T> to_device(const std::vector<U>& host) {
  Kokkos::View<T*, Kokkos::HostSpace> h("host", host.size());
  for (std::size_t i = 0; i < host.size(); ++i) h(i) = static_cast<T>(host[i]);
  DeviceVector<T> d("device", host.size());
  Kokkos::deep_copy(d, h);
  return d;
}

template <class V>
auto to_host(const V& v) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
}

template <class T, class L, std::size_t M>
auto make(const kshard::Mesh<M>& mesh, const L& layout, const HostMatrix<T>& full) {
  return kshard::distribute<ExecSpace, MemSpace>(mesh, layout, HostMatrix<const T>(full));
}

// The columns of `full` that `map` holds, in local order.
template <class T, class Map>
HostMatrix<T> local_cols(const HostMatrix<T>& full, const Map& map) {
  HostMatrix<T> local("local_cols", full.extent(0), static_cast<std::size_t>(map.local_extent()));
  for (std::size_t i = 0; i < full.extent(0); ++i)
    for (index_t c = 0; c < map.local_extent(); ++c)
      local(i, static_cast<std::size_t>(c)) = full(i, static_cast<std::size_t>(map.to_global(c)));
  return local;
}

bool close(double got, double want, double tol) {
  return std::abs(got - want) <= tol * (1.0 + std::abs(want));
}

// The 2-D meshes every test runs on, with the mesh dimension used as tp: (1, n) tp = 1,
// (n, 1) tp = 0, and for even n (2, n/2) with tp = 1 and tp = 0.
template <class F>
void for_each_tp_mesh(F&& f) {
  const int n = world_size();
  {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, n}, {"dp", "tp"});
    f(mesh, std::size_t{1});
  }
  {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, {n, 1}, {"tp", "dp"});
    f(mesh, std::size_t{0});
  }
  if (n % 2 == 0) {
    kshard::Mesh<2> mesh(MPI_COMM_WORLD, {2, n / 2}, {"dp", "tp"});
    f(mesh, std::size_t{1});
    f(mesh, std::size_t{0});
  }
}

// Calls f with the layout placing `p` on mesh dimension `tp` and Replicate on the other.
template <class P, class F>
void with_tp_layout(std::size_t tp, P p, F&& f) {
  if (tp == 0)
    f(Layout(p, Replicate{}));
  else
    f(Layout(Replicate{}, p));
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel lookup

// The agreements of a tensor-parallel call: one over the mesh (the matrix, tp_dim, and the
// values of the tp group where it is the whole mesh), and where the tp groups are proper
// subgroups of more than one rank, one within the group and one more over the mesh.
int tp_agreements(const kshard::Mesh<2>& mesh, std::size_t tp) {
  return mesh.extent(tp) > 1 && mesh.extent(tp) < mesh.size() ? 3 : 1;
}

template <class T, class Id, class L>
void check_lookup(const kshard::Mesh<2>& mesh, std::size_t tp, const L& layout, index_t vocab,
                  index_t hidden, const std::vector<index_t>& ids, double scale,
                  std::optional<index_t> padding, std::uint64_t seed) {
  using Out = kshard::lookup_value_t<T>;
  SCOPED_TRACE(::testing::Message()
               << fmt::format("{} on {}, tp = {}: V = {}, H = {}, N = {}, scale {}, {}-bit ids",
                              layout, mesh, tp, vocab, hidden, ids.size(), scale, 8 * sizeof(Id)));
  const auto n = static_cast<index_t>(ids.size());
  const bool reduces = mesh.extent(tp) > 1;
  const auto full = reference_matrix<T>(vocab, hidden, seed);
  const auto table = make(mesh, layout, full);
  const auto device_ids = to_device<Id>(ids);

  // Forward: the agreements (the mesh's arguments, the tp group's ids) and one all-reduce of
  // N x H elements.
  kshard::reset_comm_stats();
  const auto out = kshard::vocab_parallel_lookup(table, device_ids, TpDim{tp}, scale);
  const auto stats = kshard::comm_stats();
  static_assert(std::is_same_v<typename decltype(out)::value_type, Out>);
  bool ok = stats.collectives == (reduces ? 1 : 0) && stats.agreements == tp_agreements(mesh, tp) &&
            stats.bytes_sent == (reduces ? n * hidden * static_cast<index_t>(sizeof(Out)) : 0);
  EXPECT_TRUE(all_ranks(ok)) << stats.collectives << " collectives, " << stats.agreements
                             << " agreements, " << stats.bytes_sent << " bytes";
  const auto got = to_host(out);
  ok = static_cast<index_t>(got.extent(0)) == n && static_cast<index_t>(got.extent(1)) == hidden;
  for (index_t i = 0; ok && i < n; ++i)
    for (index_t j = 0; j < hidden; ++j) {
      const auto id = static_cast<std::size_t>(ids[static_cast<std::size_t>(i)]);
      const Out want =
          static_cast<Out>(full(id, static_cast<std::size_t>(j))) * static_cast<Out>(scale);
      ok = ok && got(static_cast<std::size_t>(i), static_cast<std::size_t>(j)) == want;
    }
  EXPECT_TRUE(all_ranks(ok)) << "forward";

  // The same lookup into a caller's buffer: a strided column window of a larger view holding
  // garbage, which the lookup must overwrite (and whose other columns it must not touch).
  Kokkos::View<Out**, Kokkos::LayoutRight, MemSpace> buffer(
      "lookup_buffer", static_cast<std::size_t>(n), static_cast<std::size_t>(hidden + 2));
  Kokkos::deep_copy(buffer, Out(-7));
  const auto window =
      Kokkos::subview(buffer, Kokkos::ALL, std::make_pair(std::size_t{1}, std::size_t(hidden + 1)));
  kshard::vocab_parallel_lookup(table, device_ids, window, TpDim{tp}, scale);
  const auto held = to_host(buffer);
  ok = true;
  for (std::size_t i = 0; i < held.extent(0); ++i)
    for (std::size_t j = 0; j < held.extent(1); ++j)
      ok = ok && (j == 0 || j == held.extent(1) - 1 ? held(i, j) == Out(-7)
                                                    : held(i, j) == got(i, j - 1));
  EXPECT_TRUE(all_ranks(ok)) << "lookup into a strided buffer";

  // Backward: adds into a gradient that already holds values; sends nothing.
  const auto prior = reference_matrix<T>(vocab, hidden, seed + 1);
  const auto grad_table = make(mesh, layout, prior);
  const auto grad_out_host = reference_matrix<Out>(n, hidden, seed + 2);
  const auto grad_out = to_device(grad_out_host);
  kshard::reset_comm_stats();
  kshard::vocab_parallel_lookup_backward(grad_table, device_ids, grad_out, TpDim{tp}, scale,
                                         padding);
  ok = kshard::comm_stats().collectives == 0 && kshard::comm_stats().bytes_sent == 0;
  EXPECT_TRUE(all_ranks(ok)) << "the backward communicated";
  const auto grad = kshard::gather(grad_table);
  const double tol = sizeof(T) == 2 ? 1e-2 : 1e-6;  // bf16, f16: sums rounded differently
  ok = true;
  for (index_t v = 0; v < vocab; ++v)
    for (index_t j = 0; j < hidden; ++j) {
      const auto sv = static_cast<std::size_t>(v);
      const auto sj = static_cast<std::size_t>(j);
      Out sum = 0;
      bool hit = false;
      for (index_t i = 0; i < n; ++i)
        if (ids[static_cast<std::size_t>(i)] == v && padding != v) {
          sum += static_cast<Out>(scale) * grad_out_host(static_cast<std::size_t>(i), sj);
          hit = true;
        }
      const double want =
          hit ? static_cast<double>(static_cast<T>(static_cast<Out>(prior(sv, sj)) + sum))
              : static_cast<double>(prior(sv, sj));
      ok = ok && close(static_cast<double>(grad(sv, sj)), want, tol);
    }
  EXPECT_TRUE(all_ranks(ok)) << "backward";
}

std::vector<index_t> random_ids(std::size_t n, index_t vocab, std::uint64_t seed) {
  auto rng = kshard::test::shared_rng(seed);
  std::uniform_int_distribution<index_t> id(0, vocab - 1);
  std::vector<index_t> ids(n);
  for (auto& i : ids) i = id(rng);
  return ids;
}

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

// ---------------------------------------------------------------------------------------------
// Reduce from / copy to the tensor-parallel region

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

// ---------------------------------------------------------------------------------------------
// Row- and column-parallel linear layers

// Serial reference: the whole layer in double.
struct LinearReference {
  HostMatrix<double> w, x, b, gy, gw, gb;  // weight, input, bias, output grad, prior grads
  index_t n, out, in;

  LinearReference(index_t n_, index_t out_, index_t in_, std::uint64_t seed)
      : w(reference_matrix<double>(out_, in_, seed)),
        x(reference_matrix<double>(n_, in_, seed + 1)),
        b(reference_matrix<double>(1, out_, seed + 2)),
        gy(reference_matrix<double>(n_, out_, seed + 3)),
        gw(reference_matrix<double>(out_, in_, seed + 4)),
        gb(reference_matrix<double>(1, out_, seed + 5)),
        n(n_),
        out(out_),
        in(in_) {}
  static std::size_t u(index_t i) { return static_cast<std::size_t>(i); }
  double y(index_t i, index_t o, bool bias) const {
    double s = bias ? b(0, u(o)) : 0.0;
    for (index_t k = 0; k < in; ++k) s += x(u(i), u(k)) * w(u(o), u(k));
    return s;
  }
  double gx(index_t i, index_t k) const {
    double s = 0;
    for (index_t o = 0; o < out; ++o) s += gy(u(i), u(o)) * w(u(o), u(k));
    return s;
  }
  double gw_after(index_t o, index_t k) const {
    double s = gw(u(o), u(k));
    for (index_t i = 0; i < n; ++i) s += gy(u(i), u(o)) * x(u(i), u(k));
    return s;
  }
  double gb_after(index_t o) const {
    double s = gb(0, u(o));
    for (index_t i = 0; i < n; ++i) s += gy(u(i), u(o));
    return s;
  }
};

template <class T>
HostMatrix<T> cast(const HostMatrix<double>& m) {
  HostMatrix<T> c("cast", m.extent(0), m.extent(1));
  for (std::size_t i = 0; i < m.extent(0); ++i)
    for (std::size_t j = 0; j < m.extent(1); ++j) c(i, j) = static_cast<T>(m(i, j));
  return c;
}

template <class T>
DeviceVector<T> row_vector(const HostMatrix<double>& m) {
  std::vector<double> v(m.extent(1));
  for (std::size_t j = 0; j < v.size(); ++j) v[j] = m(0, j);
  return to_device<T>(v);
}

template <class T>
double tolerance(index_t terms) {
  return (std::is_same_v<T, float> ? 1e-6 : 1e-14) * static_cast<double>(terms + 1);
}

template <class T, class L>
void check_row_parallel(const kshard::Mesh<2>& mesh, std::size_t tp, const L& layout, index_t n,
                        index_t out, index_t in, bool with_bias, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << fmt::format("row-parallel {} on {}, tp = {}: N = {}, {} x {}", layout, mesh, tp,
                              n, out, in));
  const LinearReference ref(n, out, in, seed);
  const bool reduces = mesh.extent(tp) > 1;
  const auto weight = make(mesh, layout, cast<T>(ref.w));
  const auto grad_weight = make(mesh, layout, cast<T>(ref.gw));
  const auto& cols = weight.mapping().cols;
  const auto x_local = to_device(local_cols(cast<T>(ref.x), cols));
  const auto bias = row_vector<T>(ref.b);
  const auto grad_bias = row_vector<T>(ref.gb);
  const auto grad_y = to_device(cast<T>(ref.gy));

  kshard::reset_comm_stats();
  const auto y = with_bias
                     ? kshard::row_parallel_linear(weight, x_local, bias, TpDim{tp})
                     : kshard::row_parallel_linear(weight, x_local, kshard::no_bias, TpDim{tp});
  bool ok =
      kshard::comm_stats().collectives == (reduces ? 1 : 0) &&
      kshard::comm_stats().agreements == tp_agreements(mesh, tp) &&
      kshard::comm_stats().bytes_sent == (reduces ? n * out * static_cast<index_t>(sizeof(T)) : 0);
  EXPECT_TRUE(all_ranks(ok)) << "forward collectives " << kshard::comm_stats().collectives;
  const auto y_host = to_host(y);
  ok = static_cast<index_t>(y_host.extent(0)) == n && static_cast<index_t>(y_host.extent(1)) == out;
  for (index_t i = 0; ok && i < n; ++i)
    for (index_t o = 0; o < out; ++o)
      ok = ok && close(y_host(ref.u(i), ref.u(o)), ref.y(i, o, with_bias), tolerance<T>(in));
  EXPECT_TRUE(all_ranks(ok)) << "forward";

  kshard::reset_comm_stats();
  const auto grad_x = with_bias
                          ? kshard::row_parallel_linear_backward(weight, x_local, grad_y,
                                                                 grad_weight, grad_bias, TpDim{tp})
                          : kshard::row_parallel_linear_backward(
                                weight, x_local, grad_y, grad_weight, kshard::no_bias, TpDim{tp});
  ok = kshard::comm_stats().collectives == 0;
  EXPECT_TRUE(all_ranks(ok)) << "the backward communicated";
  const auto gx = to_host(grad_x);
  ok = static_cast<index_t>(gx.extent(0)) == n &&
       static_cast<index_t>(gx.extent(1)) == cols.local_extent();
  for (index_t i = 0; ok && i < n; ++i)
    for (index_t c = 0; c < cols.local_extent(); ++c)
      ok = ok && close(gx(ref.u(i), ref.u(c)), ref.gx(i, cols.to_global(c)), tolerance<T>(out));
  const auto gw = kshard::gather(grad_weight);
  for (index_t o = 0; o < out; ++o)
    for (index_t k = 0; k < in; ++k)
      ok = ok && close(gw(ref.u(o), ref.u(k)), ref.gw_after(o, k), tolerance<T>(n));
  const auto gb = to_host(grad_bias);
  for (index_t o = 0; o < out; ++o)
    ok = ok &&
         close(gb(ref.u(o)), with_bias ? ref.gb_after(o) : ref.gb(0, ref.u(o)), tolerance<T>(n));
  EXPECT_TRUE(all_ranks(ok)) << "backward";
}

template <class T, class L>
void check_column_parallel(const kshard::Mesh<2>& mesh, std::size_t tp, const L& layout, index_t n,
                           index_t out, index_t in, bool with_bias, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << fmt::format("column-parallel {} on {}, tp = {}: N = {}, {} x {}", layout, mesh,
                              tp, n, out, in));
  const LinearReference ref(n, out, in, seed);
  const bool reduces = mesh.extent(tp) > 1;
  const auto weight = make(mesh, layout, cast<T>(ref.w));
  const auto grad_weight = make(mesh, layout, cast<T>(ref.gw));
  const auto& rows = weight.mapping().rows;
  const auto x = to_device(cast<T>(ref.x));
  const auto bias_local = to_device(local_cols(cast<T>(ref.b), rows));
  const auto grad_bias_local = to_device(local_cols(cast<T>(ref.gb), rows));
  const auto grad_y_local = to_device(local_cols(cast<T>(ref.gy), rows));
  const auto bias_1d = Kokkos::subview(bias_local, 0, Kokkos::ALL);
  const auto grad_bias_1d = Kokkos::subview(grad_bias_local, 0, Kokkos::ALL);

  kshard::reset_comm_stats();
  const auto y = with_bias ? kshard::column_parallel_linear(weight, x, bias_1d, TpDim{tp})
                           : kshard::column_parallel_linear(weight, x, kshard::no_bias, TpDim{tp});
  bool ok = kshard::comm_stats().collectives == 0;
  EXPECT_TRUE(all_ranks(ok)) << "the forward communicated";
  const auto y_host = to_host(y);
  ok = static_cast<index_t>(y_host.extent(0)) == n &&
       static_cast<index_t>(y_host.extent(1)) == rows.local_extent();
  for (index_t i = 0; ok && i < n; ++i)
    for (index_t r = 0; r < rows.local_extent(); ++r)
      ok = ok && close(y_host(ref.u(i), ref.u(r)), ref.y(i, rows.to_global(r), with_bias),
                       tolerance<T>(in));
  EXPECT_TRUE(all_ranks(ok)) << "forward";

  kshard::reset_comm_stats();
  const auto grad_x = with_bias
                          ? kshard::column_parallel_linear_backward(
                                weight, x, grad_y_local, grad_weight, grad_bias_1d, TpDim{tp})
                          : kshard::column_parallel_linear_backward(
                                weight, x, grad_y_local, grad_weight, kshard::no_bias, TpDim{tp});
  ok = kshard::comm_stats().collectives == (reduces ? 1 : 0) &&
       kshard::comm_stats().agreements == tp_agreements(mesh, tp) &&
       kshard::comm_stats().bytes_sent == (reduces ? n * in * static_cast<index_t>(sizeof(T)) : 0);
  EXPECT_TRUE(all_ranks(ok)) << "backward collectives " << kshard::comm_stats().collectives;
  const auto gx = to_host(grad_x);
  ok = static_cast<index_t>(gx.extent(0)) == n && static_cast<index_t>(gx.extent(1)) == in;
  for (index_t i = 0; ok && i < n; ++i)
    for (index_t k = 0; k < in; ++k)
      ok = ok && close(gx(ref.u(i), ref.u(k)), ref.gx(i, k), tolerance<T>(out));
  const auto gw = kshard::gather(grad_weight);
  for (index_t o = 0; o < out; ++o)
    for (index_t k = 0; k < in; ++k)
      ok = ok && close(gw(ref.u(o), ref.u(k)), ref.gw_after(o, k), tolerance<T>(n));
  const auto gb = to_host(grad_bias_local);
  for (index_t r = 0; r < rows.local_extent(); ++r) {
    const index_t o = rows.to_global(r);
    ok = ok &&
         close(gb(0, ref.u(r)), with_bias ? ref.gb_after(o) : ref.gb(0, ref.u(o)), tolerance<T>(n));
  }
  EXPECT_TRUE(all_ranks(ok)) << "backward";
}

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

// ---------------------------------------------------------------------------------------------
// Execution-space instances

template <class V>
bool same_vector(const V& a, const V& b) {
  const auto ha = to_host(a);
  const auto hb = to_host(b);
  bool same = ha.extent(0) == hb.extent(0);
  for (std::size_t i = 0; same && i < ha.extent(0); ++i) same = ha(i) == hb(i);
  return same;
}

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

// ---------------------------------------------------------------------------------------------
// tp_dim inferred from the layout, and biases distributed like their weight's rows

// Row 0 of `m` as a rank-1 host view.
auto first_row(const HostMatrix<double>& m) { return Kokkos::subview(m, 0, Kokkos::ALL); }

// The local rows of a distributed bias against a hand-sliced vector, bit for bit.
template <class B, class V>
bool same_local_bias(const B& bias, const V& vector) {
  const auto column = to_host(bias.local());
  const auto values = to_host(vector);
  bool same = column.extent(0) == values.extent(0);
  for (std::size_t i = 0; same && i < values.extent(0); ++i) same = column(i, 0) == values(i);
  return same;
}

// Element o of a gathered `out x 1` bias against `want(o)`.
template <class B, class Want>
bool bias_close(const B& bias, index_t out, Want&& want) {
  const auto full = kshard::gather(bias);
  bool ok = static_cast<index_t>(full.extent(0)) == out && full.extent(1) == 1;
  for (index_t o = 0; ok && o < out; ++o)
    ok = close(full(static_cast<std::size_t>(o), 0), want(o), tolerance<double>(out));
  return ok;
}

// Column-parallel with a distributed bias and no tp_dim against the explicit form with the
// bias sliced by hand, bit for bit, and against the serial reference.
template <class L>
void check_inferred_column(const kshard::Mesh<2>& mesh, std::size_t tp, const L& layout,
                           const LinearReference& ref) {
  SCOPED_TRACE(::testing::Message() << fmt::format("column-parallel {}", layout));
  const auto weight = make(mesh, layout, ref.w);
  const auto& rows = weight.mapping().rows;
  const auto x = to_device(ref.x);
  const auto bias = kshard::distribute_bias(weight, first_row(ref.b));
  const auto sliced = to_device(local_cols(ref.b, rows));
  const auto y = kshard::column_parallel_linear(weight, x, bias);
  bool ok = same_bits(y, kshard::column_parallel_linear(
                             weight, x, Kokkos::subview(sliced, 0, Kokkos::ALL), TpDim{tp})) &&
            same_bits(kshard::column_parallel_linear(other_instance(), weight, x, bias), y) &&
            same_bits(kshard::column_parallel_linear(weight, x),
                      kshard::column_parallel_linear(weight, x, kshard::no_bias, TpDim{tp}));
  const auto y_host = to_host(y);
  for (index_t i = 0; ok && i < ref.n; ++i)
    for (index_t r = 0; r < rows.local_extent(); ++r)
      ok = ok && close(y_host(ref.u(i), ref.u(r)), ref.y(i, rows.to_global(r), true),
                       tolerance<double>(ref.in));
  EXPECT_TRUE(all_ranks(ok)) << "forward";

  const auto grad_y_local = to_device(local_cols(ref.gy, rows));
  const auto grad_weight = make(mesh, layout, ref.gw);
  const auto grad_weight_explicit = make(mesh, layout, ref.gw);
  const auto grad_bias = kshard::distribute_bias(weight, first_row(ref.gb));
  const auto grad_bias_sliced = to_device(local_cols(ref.gb, rows));
  const auto grad_x =
      kshard::column_parallel_linear_backward(weight, x, grad_y_local, grad_weight, grad_bias);
  ok = same_bits(grad_x, kshard::column_parallel_linear_backward(
                             weight, x, grad_y_local, grad_weight_explicit,
                             Kokkos::subview(grad_bias_sliced, 0, Kokkos::ALL), TpDim{tp})) &&
       same_bits(kshard::gather(grad_weight), kshard::gather(grad_weight_explicit)) &&
       same_local_bias(grad_bias, Kokkos::subview(grad_bias_sliced, 0, Kokkos::ALL)) &&
       bias_close(grad_bias, ref.out, [&](index_t o) { return ref.gb_after(o); });
  EXPECT_TRUE(all_ranks(ok)) << "backward";
}

// Row-parallel with a replicated distributed bias and no tp_dim, likewise.
template <class L>
void check_inferred_row(const kshard::Mesh<2>& mesh, std::size_t tp, const L& layout,
                        const LinearReference& ref) {
  SCOPED_TRACE(::testing::Message() << fmt::format("row-parallel {}", layout));
  const auto weight = make(mesh, layout, ref.w);
  const auto& cols = weight.mapping().cols;
  const auto x_local = to_device(local_cols(ref.x, cols));
  const auto bias = kshard::distribute_bias(weight, first_row(ref.b));
  const auto y = kshard::row_parallel_linear(weight, x_local, bias);
  bool ok = same_bits(y, kshard::row_parallel_linear(weight, x_local, row_vector<double>(ref.b),
                                                     TpDim{tp})) &&
            same_bits(kshard::row_parallel_linear(other_instance(), weight, x_local, bias), y) &&
            same_bits(kshard::row_parallel_linear(weight, x_local),
                      kshard::row_parallel_linear(weight, x_local, kshard::no_bias, TpDim{tp}));
  const auto y_host = to_host(y);
  for (index_t i = 0; ok && i < ref.n; ++i)
    for (index_t o = 0; o < ref.out; ++o)
      ok = ok && close(y_host(ref.u(i), ref.u(o)), ref.y(i, o, true), tolerance<double>(ref.in));
  EXPECT_TRUE(all_ranks(ok)) << "forward";

  const auto grad_y = to_device(ref.gy);
  const auto grad_weight = make(mesh, layout, ref.gw);
  const auto grad_weight_explicit = make(mesh, layout, ref.gw);
  const auto grad_bias = kshard::distribute_bias(weight, first_row(ref.gb));
  const auto grad_bias_view = row_vector<double>(ref.gb);
  const auto grad_x =
      kshard::row_parallel_linear_backward(weight, x_local, grad_y, grad_weight, grad_bias);
  ok = same_bits(grad_x,
                 kshard::row_parallel_linear_backward(weight, x_local, grad_y, grad_weight_explicit,
                                                      grad_bias_view, TpDim{tp})) &&
       same_bits(kshard::gather(grad_weight), kshard::gather(grad_weight_explicit)) &&
       same_local_bias(grad_bias, grad_bias_view) &&
       bias_close(grad_bias, ref.out, [&](index_t o) { return ref.gb_after(o); });
  EXPECT_TRUE(all_ranks(ok)) << "backward";
}

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

// ---------------------------------------------------------------------------------------------
// The deprecated spellings, kept for one release: a bare integer for tp_dim (and, for a layer
// without a bias, in the bias's place). Each gives the bits of its TpDim form.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

TEST(TensorParallelDeprecated, LookupAndRegionTakeABareInteger) {
  const ExecSpace space = other_instance();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, world_size()}, {"dp", "tp"});
  const int tp = 1;
  const Layout layout(Replicate{}, Shard<0>{});
  const auto table = make(mesh, layout, reference_matrix<float>(7, 3, 9920));
  const auto ids = to_device<std::int32_t>(std::vector<index_t>{6, 0, 2, 6});
  const auto want = kshard::vocab_parallel_lookup(table, ids, TpDim{tp}, 2.0);
  DeviceMatrix<float> into("into", 4, 3);
  DeviceMatrix<float> into_on_space("into_on_space", 4, 3);
  kshard::vocab_parallel_lookup(table, ids, into, tp, 2.0);
  kshard::vocab_parallel_lookup(space, table, ids, into_on_space, tp, 2.0);
  bool ok = same_bits(want, kshard::vocab_parallel_lookup(table, ids, tp, 2.0)) &&
            same_bits(want, kshard::vocab_parallel_lookup(space, table, ids, tp, 2.0)) &&
            same_bits(want, into) && same_bits(want, into_on_space);
  EXPECT_TRUE(all_ranks(ok)) << "lookup";

  const auto grad_out = to_device(reference_matrix<float>(4, 3, 9921));
  const HostMatrix<float> zero("zero", 7, 3);
  const auto grad = make(mesh, layout, zero);
  const auto grad_old = make(mesh, layout, zero);
  const auto grad_old_on_space = make(mesh, layout, zero);
  kshard::vocab_parallel_lookup_backward(grad, ids, grad_out, TpDim{tp}, 0.5, index_t{0});
  kshard::vocab_parallel_lookup_backward(grad_old, ids, grad_out, tp, 0.5, index_t{0});
  kshard::vocab_parallel_lookup_backward(space, grad_old_on_space, ids, grad_out, tp, 0.5,
                                         index_t{0});
  const auto want_grad = kshard::gather(grad);
  ok = same_bits(want_grad, kshard::gather(grad_old)) &&
       same_bits(want_grad, kshard::gather(grad_old_on_space));
  EXPECT_TRUE(all_ranks(ok)) << "lookup backward";

  const auto host = reference_matrix<double>(3, 2, 9922);
  const auto reduced = to_device(host);
  kshard::reduce_from_tp(mesh, TpDim{tp}, reduced);
  const std::vector<DeviceMatrix<double>> old{to_device(host), to_device(host), to_device(host),
                                              to_device(host)};
  kshard::reduce_from_tp(mesh, tp, old[0]);
  kshard::reduce_from_tp(space, mesh, tp, old[1]);
  kshard::copy_to_tp_backward(mesh, tp, old[2]);
  kshard::copy_to_tp_backward(space, mesh, tp, old[3]);
  ok = true;
  for (const auto& values : old) ok = ok && same_bits(reduced, values);
  EXPECT_TRUE(all_ranks(ok)) << "region";
}

TEST(TensorParallelDeprecated, LinearLayersTakeABareInteger) {
  const ExecSpace space = other_instance();
  kshard::Mesh<2> mesh(MPI_COMM_WORLD, {1, world_size()}, {"dp", "tp"});
  const int tp = 1;
  const LinearReference ref(4, 6, 5, 9930);
  const auto x = to_device(cast<float>(ref.x));
  const auto grad_y = to_device(cast<float>(ref.gy));
  const auto bias = row_vector<float>(ref.b);
  const auto grad_bias = row_vector<float>(ref.gb);

  const Layout row_layout(Replicate{}, Shard<1>{});
  const auto row_weight = make(mesh, row_layout, cast<float>(ref.w));
  const auto row_grad = make(mesh, row_layout, cast<float>(ref.gw));
  const auto x_local = to_device(local_cols(cast<float>(ref.x), row_weight.mapping().cols));
  const auto y = kshard::row_parallel_linear(row_weight, x_local, bias, TpDim{tp});
  const auto y_unbiased =
      kshard::row_parallel_linear(row_weight, x_local, kshard::no_bias, TpDim{tp});
  const auto gx_local = kshard::row_parallel_linear_backward(row_weight, x_local, grad_y, row_grad,
                                                             kshard::no_bias, TpDim{tp});
  bool ok = same_bits(y, kshard::row_parallel_linear(row_weight, x_local, bias, tp)) &&
            same_bits(y, kshard::row_parallel_linear(space, row_weight, x_local, bias, tp)) &&
            same_bits(y_unbiased, kshard::row_parallel_linear(row_weight, x_local, tp)) &&
            same_bits(y_unbiased, kshard::row_parallel_linear(space, row_weight, x_local, tp)) &&
            same_bits(gx_local, kshard::row_parallel_linear_backward(row_weight, x_local, grad_y,
                                                                     row_grad, grad_bias, tp)) &&
            same_bits(gx_local, kshard::row_parallel_linear_backward(
                                    space, row_weight, x_local, grad_y, row_grad, grad_bias, tp)) &&
            same_bits(gx_local, kshard::row_parallel_linear_backward(row_weight, x_local, grad_y,
                                                                     row_grad, tp)) &&
            same_bits(gx_local, kshard::row_parallel_linear_backward(space, row_weight, x_local,
                                                                     grad_y, row_grad, tp));
  EXPECT_TRUE(all_ranks(ok)) << "row-parallel";

  const Layout column_layout(Replicate{}, Shard<0>{});
  const auto column_weight = make(mesh, column_layout, cast<float>(ref.w));
  const auto column_grad = make(mesh, column_layout, cast<float>(ref.gw));
  const auto& rows = column_weight.mapping().rows;
  const auto bias_local = row_vector<float>(local_cols(ref.b, rows));
  const auto grad_bias_local = row_vector<float>(local_cols(ref.gb, rows));
  const auto grad_y_local = to_device(local_cols(cast<float>(ref.gy), rows));
  const auto y_local = kshard::column_parallel_linear(column_weight, x, bias_local, TpDim{tp});
  const auto y_local_unbiased =
      kshard::column_parallel_linear(column_weight, x, kshard::no_bias, TpDim{tp});
  const auto gx = kshard::column_parallel_linear_backward(column_weight, x, grad_y_local,
                                                          column_grad, kshard::no_bias, TpDim{tp});
  ok =
      same_bits(y_local, kshard::column_parallel_linear(column_weight, x, bias_local, tp)) &&
      same_bits(y_local, kshard::column_parallel_linear(space, column_weight, x, bias_local, tp)) &&
      same_bits(y_local_unbiased, kshard::column_parallel_linear(column_weight, x, tp)) &&
      same_bits(y_local_unbiased, kshard::column_parallel_linear(space, column_weight, x, tp)) &&
      same_bits(gx, kshard::column_parallel_linear_backward(column_weight, x, grad_y_local,
                                                            column_grad, grad_bias_local, tp)) &&
      same_bits(gx, kshard::column_parallel_linear_backward(space, column_weight, x, grad_y_local,
                                                            column_grad, grad_bias_local, tp)) &&
      same_bits(gx, kshard::column_parallel_linear_backward(column_weight, x, grad_y_local,
                                                            column_grad, tp)) &&
      same_bits(gx, kshard::column_parallel_linear_backward(space, column_weight, x, grad_y_local,
                                                            column_grad, tp));
  EXPECT_TRUE(all_ranks(ok)) << "column-parallel";
}

#pragma GCC diagnostic pop

}  // namespace
