// Forward and backward of a scaled-down Gemma-style input block with vocabulary-parallel
// embeddings and a tensor-parallel MLP, checked against a serial computation.
//
// Two tables are vocabulary-sharded over the tp mesh dimension and replicated over dp: the
// token embedding [V, H] and the per-layer embedding table [V, L * H] (Gemma E2B/E4B keep one
// slice of it per layer; at full size it holds billions of parameters, so it must not be
// replicated on every tp rank). Each dp group looks up its own batch of token ids:
//
//   e  = lookup(tokens, ids) * sqrt(H)                     [N, H]      one all-reduce over tp
//   p  = lookup(per_layer, ids) * sqrt(H)                  [N, L * H]  one all-reduce over tp
//   h0 = e + p[:, 0:H]
//   u  = column_parallel(W_up [F, H], h0) + b_up           [N, F/tp]   no communication
//   y  = row_parallel(W_down [H, F], u) + b_down           [N, H]      one all-reduce over tp
//   h1 = h0 + y + p[:, H:2H],   loss = sum(h1 * R)
//
// The backward runs the chain by hand (lookup backward with padding id 0 on the token table),
// then sums every parameter gradient over dp (data-parallel gradient sync, the same SUM
// all-reduce as reduce_from_tp, over the dp dimension). Outputs and all gradients are compared
// with a double-precision serial computation on the whole matrices.
//
//   mpiexec -n 4 ./tp_embedding      # (dp=2, tp=2); 2 ranks: (dp=1, tp=2); others (1, n)

#include <kshard/kshard.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <random>
#include <vector>

namespace {

using kshard::index_t;
using Matrix = kshard::HostMatrix<double>;
using Device =
    Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space>;

constexpr index_t vocab = 37;  // odd: the two tp shards hold 19 and 18 rows
constexpr index_t hidden = 8;
constexpr index_t layers = 2;
constexpr index_t ffn = 12;
constexpr index_t tokens = 6;  // per dp group
constexpr index_t padding_id = 0;

std::size_t u(index_t i) { return static_cast<std::size_t>(i); }

Matrix random_matrix(index_t rows, index_t cols, std::uint64_t seed) {
  Matrix m("random", u(rows), u(cols));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> value(-1.0, 1.0);
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) m(u(r), u(c)) = static_cast<float>(value(rng));
  return m;  // values representable in float, so both sides start from the same numbers
}

// The token ids of dp group `dp` (the same on every tp rank of the group); includes the
// padding id and repeats.
std::vector<std::int32_t> batch(int dp) {
  std::mt19937_64 rng(100 + static_cast<std::uint64_t>(dp));
  std::uniform_int_distribution<std::int32_t> id(0, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> ids(u(tokens));
  for (auto& i : ids) i = id(rng);
  ids[0] = padding_id;
  ids[3] = ids[1];
  return ids;
}

kshard::HostMatrix<const float> to_float(const Matrix& m) {
  kshard::HostMatrix<float> f("float", m.extent(0), m.extent(1));
  for (std::size_t i = 0; i < m.extent(0); ++i)
    for (std::size_t j = 0; j < m.extent(1); ++j) f(i, j) = static_cast<float>(m(i, j));
  return f;
}

// Row 0 of a 1 x n matrix, in float: a whole bias.
Kokkos::View<const float*, Kokkos::HostSpace> whole_row(const Matrix& row) {
  return Kokkos::subview(to_float(row), 0, Kokkos::ALL);
}

// The parameters and their gradients, on one rank, in double: the serial model.
struct Serial {
  Matrix tok, per_layer, w_up, b_up, w_down, b_down, r;
  Matrix g_tok, g_per_layer, g_w_up, g_b_up, g_w_down, g_b_down;
  explicit Serial(const Matrix& r_)
      : tok(random_matrix(vocab, hidden, 1)),
        per_layer(random_matrix(vocab, layers * hidden, 2)),
        w_up(random_matrix(ffn, hidden, 3)),
        b_up(random_matrix(1, ffn, 4)),
        w_down(random_matrix(hidden, ffn, 5)),
        b_down(random_matrix(1, hidden, 6)),
        r(r_),
        g_tok("g", u(vocab), u(hidden)),
        g_per_layer("g", u(vocab), u(layers * hidden)),
        g_w_up("g", u(ffn), u(hidden)),
        g_b_up("g", 1, u(ffn)),
        g_w_down("g", u(hidden), u(ffn)),
        g_b_down("g", 1, u(hidden)) {}

  // Forward for one batch (returns h1) and its gradients added into g_*.
  Matrix step(const std::vector<std::int32_t>& ids) {
    const double s = std::sqrt(static_cast<double>(hidden));
    Matrix h0("h0", u(tokens), u(hidden)), h1("h1", u(tokens), u(hidden));
    Matrix act("u", u(tokens), u(ffn));
    for (index_t n = 0; n < tokens; ++n) {
      const auto id = u(ids[u(n)]);
      for (index_t j = 0; j < hidden; ++j)
        h0(u(n), u(j)) = tok(id, u(j)) * s + per_layer(id, u(j)) * s;
      for (index_t f = 0; f < ffn; ++f) {
        double sum = b_up(0, u(f));
        for (index_t j = 0; j < hidden; ++j) sum += h0(u(n), u(j)) * w_up(u(f), u(j));
        act(u(n), u(f)) = sum;
      }
      for (index_t j = 0; j < hidden; ++j) {
        double y = b_down(0, u(j));
        for (index_t f = 0; f < ffn; ++f) y += act(u(n), u(f)) * w_down(u(j), u(f));
        h1(u(n), u(j)) = h0(u(n), u(j)) + y + per_layer(id, u(hidden + j)) * s;
      }
    }
    // Backward of loss = sum(h1 * r).
    for (index_t n = 0; n < tokens; ++n) {
      const auto id = u(ids[u(n)]);
      std::vector<double> g_act(u(ffn), 0.0), g_h0(u(hidden), 0.0);
      for (index_t j = 0; j < hidden; ++j) {
        const double g = r(u(n), u(j));
        g_b_down(0, u(j)) += g;
        for (index_t f = 0; f < ffn; ++f) {
          g_w_down(u(j), u(f)) += g * act(u(n), u(f));
          g_act[u(f)] += g * w_down(u(j), u(f));
        }
        g_h0[u(j)] += g;
        g_per_layer(id, u(hidden + j)) += g * s;
      }
      for (index_t f = 0; f < ffn; ++f) {
        g_b_up(0, u(f)) += g_act[u(f)];
        for (index_t j = 0; j < hidden; ++j) {
          g_w_up(u(f), u(j)) += g_act[u(f)] * h0(u(n), u(j));
          g_h0[u(j)] += g_act[u(f)] * w_up(u(f), u(j));
        }
      }
      for (index_t j = 0; j < hidden; ++j) {
        if (static_cast<index_t>(id) != padding_id) g_tok(id, u(j)) += g_h0[u(j)] * s;
        g_per_layer(id, u(j)) += g_h0[u(j)] * s;
      }
    }
    return h1;
  }
};

double worst_difference(const kshard::HostMatrix<float>& got, const Matrix& want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.extent(0); ++i)
    for (std::size_t j = 0; j < want.extent(1); ++j)
      worst = std::max(worst, std::abs(static_cast<double>(got(i, j)) - want(i, j)) /
                                  (1.0 + std::abs(want(i, j))));
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 1;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int dp = size == 4 ? 2 : 1;
    const kshard::Mesh mesh(MPI_COMM_WORLD, {dp, size / dp}, {"dp", "tp"});
    const std::size_t dp_dim = mesh.dim("dp");
    const std::size_t tp_dim = mesh.dim("tp");
    const bool root = mesh.my_rank() == 0;
    const double scale = std::sqrt(static_cast<double>(hidden));

    // Vocabulary and output features sharded over tp, input features of the down projection
    // sharded over tp, everything replicated over dp.
    const kshard::Layout by_rows(kshard::Replicate{}, kshard::Shard<0>{});
    const kshard::Layout by_cols(kshard::Replicate{}, kshard::Shard<1>{});
    const Matrix r = random_matrix(tokens, hidden, 7);
    Serial serial(r);
    auto tok = kshard::distribute(mesh, by_rows, to_float(serial.tok));
    auto per_layer = kshard::distribute(mesh, by_rows, to_float(serial.per_layer));
    auto w_up = kshard::distribute(mesh, by_rows, to_float(serial.w_up));
    auto w_down = kshard::distribute(mesh, by_cols, to_float(serial.w_down));
    // Biases split like their weight's rows: b_up sharded over tp as W_up's output features,
    // b_down replicated.
    auto b_up = kshard::distribute_bias(w_up, whole_row(serial.b_up));
    auto b_down = kshard::distribute_bias(w_down, whole_row(serial.b_down));
    decltype(tok) g_tok(mesh, by_rows, vocab, hidden);
    decltype(per_layer) g_per_layer(mesh, by_rows, vocab, layers * hidden);
    decltype(w_up) g_w_up(mesh, by_rows, ffn, hidden);
    decltype(w_down) g_w_down(mesh, by_cols, hidden, ffn);
    decltype(b_up) g_b_up(mesh, kshard::bias_layout(by_rows), ffn, 1);
    decltype(b_down) g_b_down(mesh, kshard::bias_layout(by_cols), hidden, 1);

    // ---- forward (this dp group's batch)
    const auto host_ids = batch(mesh.coords()[dp_dim]);
    Kokkos::View<std::int32_t*> ids("ids", host_ids.size());
    Kokkos::deep_copy(ids,
                      Kokkos::View<const std::int32_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                          host_ids.data(), host_ids.size()));
    // Every kshard call below takes the execution-space instance its work runs on first (the
    // forms without one use a default instance); the example's own kernels run on it too.
    const Kokkos::DefaultExecutionSpace space;
    kshard::reset_comm_stats();
    // tp_dim is inferred: the one mesh dimension that splits the table's rows (or the weight's
    // input or output features); given, it is a kshard::TpDim, as for the second table.
    const auto e = kshard::vocab_parallel_lookup(space, tok, ids, scale);
    const auto p =
        kshard::vocab_parallel_lookup(space, per_layer, ids, kshard::TpDim{tp_dim}, scale);
    const auto lookup_stats = kshard::comm_stats();
    Device h0("h0", u(tokens), u(hidden));
    Kokkos::parallel_for(
        "h0",
        Kokkos::MDRangePolicy<Kokkos::Rank<2>, Kokkos::IndexType<index_t>>(space, {0, 0},
                                                                           {tokens, hidden}),
        KOKKOS_LAMBDA(const index_t n, const index_t j) { h0(n, j) = e(n, j) + p(n, j); });
    const auto act = kshard::column_parallel_linear(space, w_up, h0, b_up);
    const auto y = kshard::row_parallel_linear(space, w_down, act, b_down);
    Device h1("h1", u(tokens), u(hidden));
    Kokkos::parallel_for(
        "h1",
        Kokkos::MDRangePolicy<Kokkos::Rank<2>, Kokkos::IndexType<index_t>>(space, {0, 0},
                                                                           {tokens, hidden}),
        KOKKOS_LAMBDA(const index_t n, const index_t j) {
          h1(n, j) = h0(n, j) + y(n, j) + p(n, hidden + j);
        });

    // ---- backward of loss = sum(h1 * r)
    const Device g_h1("g_h1", u(tokens), u(hidden));
    Kokkos::deep_copy(g_h1, to_float(r));
    kshard::reset_comm_stats();
    const auto g_act =
        kshard::row_parallel_linear_backward(space, w_down, act, g_h1, g_w_down, g_b_down);
    const auto silent_row_backward =
        kshard::comm_stats().collectives == 0 && kshard::comm_stats().agreements == 0;
    const auto g_h0 =
        kshard::column_parallel_linear_backward(space, w_up, h0, g_act, g_w_up, g_b_up);
    Device g_p("g_p", u(tokens), u(layers * hidden));
    Kokkos::parallel_for(
        "g_h0",
        Kokkos::MDRangePolicy<Kokkos::Rank<2>, Kokkos::IndexType<index_t>>(space, {0, 0},
                                                                           {tokens, hidden}),
        KOKKOS_LAMBDA(const index_t n, const index_t j) {
          g_h0(n, j) += g_h1(n, j);  // the residual path
          g_p(n, j) = g_h0(n, j);
          g_p(n, hidden + j) = g_h1(n, j);
        });
    kshard::reset_comm_stats();
    kshard::vocab_parallel_lookup_backward(space, g_tok, ids, g_h0, scale, padding_id);
    kshard::vocab_parallel_lookup_backward(space, g_per_layer, ids, g_p, scale);
    const auto silent_lookup_backward =
        kshard::comm_stats().collectives == 0 && kshard::comm_stats().agreements == 0;
    // Data-parallel gradient sync: every gradient summed over dp (reduce_from_tp's SUM along
    // the mesh dimension it is given).
    const kshard::TpDim over_dp{dp_dim};
    kshard::reduce_from_tp(space, mesh, over_dp, g_tok.local());
    kshard::reduce_from_tp(space, mesh, over_dp, g_per_layer.local());
    kshard::reduce_from_tp(space, mesh, over_dp, g_w_up.local());
    kshard::reduce_from_tp(space, mesh, over_dp, g_w_down.local());
    kshard::reduce_from_tp(space, mesh, over_dp, g_b_up.local());
    kshard::reduce_from_tp(space, mesh, over_dp, g_b_down.local());

    // ---- serial reference: every dp group's batch, gradients summed
    Matrix want_h1;
    for (int group = 0; group < dp; ++group) {
      const Matrix h = serial.step(batch(group));
      if (group == mesh.coords()[dp_dim]) want_h1 = h;
    }
    // A gathered bias is out x 1; the serial one 1 x out.
    auto column_as_row = [](const kshard::HostMatrix<float>& column) {
      kshard::HostMatrix<float> row("row", 1, column.extent(0));
      for (std::size_t j = 0; j < column.extent(0); ++j) row(0, j) = column(j, 0);
      return row;
    };
    const auto h1_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), h1);
    const double errors[] = {
        worst_difference(h1_host, want_h1),
        worst_difference(kshard::gather(g_tok), serial.g_tok),
        worst_difference(kshard::gather(g_per_layer), serial.g_per_layer),
        worst_difference(kshard::gather(g_w_up), serial.g_w_up),
        worst_difference(kshard::gather(g_w_down), serial.g_w_down),
        worst_difference(column_as_row(kshard::gather(g_b_up)), serial.g_b_up),
        worst_difference(column_as_row(kshard::gather(g_b_down)), serial.g_b_down)};
    const char* names[] = {"output h1",   "grad tokens", "grad per-layer", "grad W_up",
                           "grad W_down", "grad b_up",   "grad b_down"};
    double worst = 0;
    for (double err : errors) worst = std::max(worst, err);
    const int tp_ranks = mesh.extent(tp_dim);
    const int per_lookup = tp_ranks > 1 ? 1 : 0;  // the all-reduce over tp
    // The arguments over the mesh, with the ids where the tp group is the whole mesh (or one
    // rank); else the ids within the tp group and its outcome over the mesh as well.
    const int agreements_per_lookup = tp_ranks > 1 && tp_ranks < size ? 3 : 1;
    const bool counts_ok = lookup_stats.collectives == 2 * per_lookup &&
                           lookup_stats.agreements == 2 * agreements_per_lookup &&
                           silent_row_backward && silent_lookup_backward;
    int ok = worst <= 1e-5 && counts_ok ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    double worst_all = worst;
    MPI_Allreduce(MPI_IN_PLACE, &worst_all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

    if (root) {
      fmt::print("{}\ntoken table {}\nper-layer table {}\n", mesh, tok, per_layer);
      fmt::print("{}\n", kshard::sharding_picture(per_layer));
      // Memory of the sharded tables per rank against every rank holding both whole tables.
      const double bytes = sizeof(float);
      const double replicated =
          static_cast<double>(vocab * hidden + vocab * layers * hidden) * bytes;
      for (int rank = 0; rank < size; ++rank) {
        const auto coords = mesh.coords_of(rank);
        const auto mine = static_cast<double>(tok.mapping_of(coords).local_size() +
                                              per_layer.mapping_of(coords).local_size()) *
                          bytes;
        fmt::print(
            "rank {} (dp={}, tp={}): embedding tables {:.0f} bytes sharded vs {:.0f} "
            "replicated ({:.0f}%)\n",
            rank, coords[0], coords[1], mine, replicated, 100.0 * mine / replicated);
      }
      fmt::print(
          "forward lookups: {} argument agreements (per lookup: the arguments over the mesh, "
          "then the ids within the tp group, in the same agreement where that group is the whole "
          "mesh), {} collectives, {} bytes sent by rank 0 (two all-reduces of N x H and N x L*H "
          "floats)\n",
          lookup_stats.agreements, lookup_stats.collectives, lookup_stats.bytes_sent);
      for (std::size_t k = 0; k < std::size(errors); ++k)
        fmt::print("  {:<15} largest relative difference on rank 0: {:.2g}\n", names[k], errors[k]);
      fmt::print("largest difference on any rank: {:.2g}\n", worst_all);
      fmt::print("{}\n",
                 ok ? "tp embedding forward and backward match the serial reference" : "MISMATCH");
    }
    status = ok ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
