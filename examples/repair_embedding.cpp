// Repairing damaged token rows of a checkpoint's input embedding before training starts.
//
// A 2 x 2 (dp, tp) mesh holds the embedding in the FSDP2 x TP vocabulary layout
// (StridedShard, Shard). Some rows came out of the checkpoint zero, tiny, NaN or Inf; the first
// time such a token appears its gradient would blow up. repair_embedding_rows finds them with
// one pass over the local shard and rewrites each with its LM-head direction scaled to the RMS
// norm of the healthy rows. The result is checked against a serial computation on the
// gathered matrices.
//
//   mpiexec -n 4 ./repair_embedding      # other rank counts use a (1, n) mesh

#include <kshard/kshard.hpp>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr kshard::index_t vocab = 22;
constexpr kshard::index_t hidden = 8;

// A smooth synthetic embedding: row t is a different mix of sines.
kshard::HostMatrix<float> synthetic(double phase) {
  kshard::HostMatrix<float> m("synthetic", vocab, hidden);
  for (kshard::index_t t = 0; t < vocab; ++t)
    for (kshard::index_t h = 0; h < hidden; ++h)
      m(t, h) = static_cast<float>(std::sin(phase + 0.37 * static_cast<double>(t * hidden + h)));
  return m;
}

// Squared and summed in fp64, as kshard does.
double norm(const kshard::HostMatrix<float>& m, kshard::index_t row) {
  double sum = 0;
  for (kshard::index_t h = 0; h < hidden; ++h) {
    const auto v = static_cast<double>(m(row, h));
    sum += v * v;
  }
  return std::sqrt(sum);
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
    const bool root = mesh.my_rank() == 0;

    // The checkpoint, with damage injected: a zero row, a tiny one, a NaN and an Inf.
    auto input_full = synthetic(0.0);
    const auto output_full = synthetic(1.0);
    for (kshard::index_t h = 0; h < hidden; ++h) {
      input_full(3, h) = 0.0f;
      input_full(11, h) = 1e-9f;
    }
    input_full(14, 2) = std::numeric_limits<float>::quiet_NaN();
    input_full(20, 5) = std::numeric_limits<float>::infinity();

    kshard::Layout layout(kshard::StridedShard<0>{mesh.extent(1)}, kshard::Shard<0>{});
    auto input = kshard::distribute(mesh, layout, kshard::HostMatrix<const float>(input_full));
    const auto output =
        kshard::distribute(mesh, layout, kshard::HostMatrix<const float>(output_full));
    if (root) fmt::print("{}\n{}\n", input, kshard::sharding_picture(input));

    const auto report = kshard::repair_embedding_rows(input, output, kshard::RepairConfig{},
                                                      {"model.embed_tokens", "lm_head"});

    // Serial reference on the gathered matrices: RMS of the healthy norms, output directions.
    const auto repaired = kshard::gather(input);
    std::vector<kshard::index_t> damaged;
    double healthy_sum = 0;
    int healthy = 0;
    for (kshard::index_t t = 0; t < vocab; ++t) {
      const double n = norm(input_full, t);
      if (!std::isfinite(n) || n <= 1e-6) {
        damaged.push_back(t);
      } else {
        healthy_sum += n * n;
        ++healthy;
      }
    }
    const double target = std::sqrt(healthy_sum / healthy);
    double worst = 0;
    for (kshard::index_t t = 0; t < vocab; ++t) {
      const bool fixed = std::find(damaged.begin(), damaged.end(), t) != damaged.end();
      for (kshard::index_t h = 0; h < hidden; ++h) {
        const double want =
            fixed ? output_full(t, h) * (target / norm(output_full, t)) : input_full(t, h);
        worst = std::max(worst, std::abs(static_cast<double>(repaired(t, h)) - want));
      }
    }
    const bool ok = report && report->repaired_row_ids == damaged &&
                    std::abs(*report->target_norm - target) <= 1e-12 * target && worst <= 1e-6;
    if (root) {
      fmt::print("{}\n", *report);
      for (kshard::index_t t : damaged)
        fmt::print("  row {:2}: norm {:>8.3g} -> {:.6f}\n", t, norm(input_full, t),
                   norm(repaired, t));
      fmt::print("largest difference from the serial reference: {:.2g}\n", worst);
      fmt::print("{}\n", ok ? "repair matches the serial reference" : "MISMATCH");
    }
    status = ok ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
