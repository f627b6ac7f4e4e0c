// Helpers of the tensor-parallel tests (tests/mpi/tensor_parallel/): the meshes and layouts they
// sweep, the serial references (the whole matrices on every rank, in double) and comparisons.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
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

namespace kshard::test::tp {

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

inline bool close(double got, double want, double tol) {
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
inline int tp_agreements(const kshard::Mesh<2>& mesh, std::size_t tp) {
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

inline std::vector<index_t> random_ids(std::size_t n, index_t vocab, std::uint64_t seed) {
  auto rng = kshard::test::shared_rng(seed);
  std::uniform_int_distribution<index_t> id(0, vocab - 1);
  std::vector<index_t> ids(n);
  for (auto& i : ids) i = id(rng);
  return ids;
}

// ---------------------------------------------------------------------------------------------
// Reduce from / copy to the tensor-parallel region

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

// ---------------------------------------------------------------------------------------------
// tp_dim inferred from the layout, and biases distributed like their weight's rows

// Row 0 of `m` as a rank-1 host view.
inline auto first_row(const HostMatrix<double>& m) { return Kokkos::subview(m, 0, Kokkos::ALL); }

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

}  // namespace kshard::test::tp
