// repair_embedding_rows: the spec's reference case on every rank count and many layouts, a
// randomised comparison against a serial transcription of the spec, every refusal, and the
// number of passes and collectives per call.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kshard/comm/stats.hpp"
#include "kshard/distribute.hpp"
#include "kshard/repair.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::RepairConfig;
using kshard::RepairStrategy;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using kshard::test::all_ranks;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::MemSpace;
using kshard::test::other_instance;
using kshard::test::same_bits;
using kshard::test::world_size;

template <class T>
kshard::HostMatrix<T> host_matrix(const std::vector<std::vector<double>>& rows) {
  kshard::HostMatrix<T> m("m", rows.size(), rows.empty() ? 0 : rows[0].size());
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (std::size_t c = 0; c < rows[r].size(); ++c) m(r, c) = static_cast<T>(rows[r][c]);
  return m;
}

template <class T, class L, std::size_t M>
auto make(const kshard::Mesh<M>& mesh, const L& layout, const kshard::HostMatrix<T>& full) {
  return kshard::distribute<ExecSpace, MemSpace>(mesh, layout, kshard::HostMatrix<const T>(full));
}

// The spec's reference case (section 3).
const std::vector<std::vector<double>> spec_input{{1, 0, 0, 0},    {0, 0, 0, 0}, {0, 2, 0, 0},
                                                  {1e-8, 0, 0, 0}, {0, 0, 3, 0}, {0, 0, 0, 4}};
const std::vector<std::vector<double>> spec_output{{1, 1, 0, 0}, {1, 2, 3, 4}, {0, 1, 1, 0},
                                                   {4, 3, 2, 1}, {1, 0, 1, 0}, {0, 1, 0, 1}};

template <class T, class L, std::size_t M>
void check_spec_case(const kshard::Mesh<M>& mesh, const L& layout, RepairStrategy strategy) {
  SCOPED_TRACE(fmt::format("{} on {}", layout, mesh));
  const auto input_full = host_matrix<T>(spec_input);
  const auto output_full = host_matrix<T>(spec_output);
  const RepairConfig config(true, 1e-4, 256, strategy);
  {
    auto input = make(mesh, layout, input_full);
    const auto output = make(mesh, layout, output_full);
    const auto report = kshard::repair_embedding_rows(input, output, config);
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->repaired_row_ids, (std::vector<index_t>{1, 3}));
    EXPECT_EQ(report->min_norm_before, 0.0);
    ASSERT_TRUE(report->target_norm.has_value());
    EXPECT_NEAR(*report->target_norm, std::sqrt(7.5), 1e-12);
    EXPECT_EQ(report->output_name, strategy == RepairStrategy::output_direction
                                       ? std::optional<std::string>("lm_head")
                                       : std::nullopt);
    // Both strategies give these rows on this case (the mean direction is [1, 2, 3, 4] / 4).
    auto expected = host_matrix<T>(spec_input);
    const double row1[] = {0.5, 1, 1.5, 2};
    const double row3[] = {2, 1.5, 1, 0.5};
    for (std::size_t c = 0; c < 4; ++c) {
      expected(1, c) = static_cast<T>(row1[c]);
      expected(3, c) =
          static_cast<T>(strategy == RepairStrategy::output_direction ? row3[c] : row1[c]);
    }
    const auto after = kshard::gather(input);
    bool ok = true;
    for (std::size_t r = 0; r < 6; ++r)
      for (std::size_t c = 0; c < 4; ++c) {
        const double got = static_cast<double>(static_cast<float>(after(r, c)));
        const double want = static_cast<double>(static_cast<float>(expected(r, c)));
        ok = ok && (r == 1 || r == 3 ? std::abs(got - want) <= 1e-6 : got == want);
      }
    EXPECT_TRUE(all_ranks(ok));
    EXPECT_TRUE(all_ranks(same_bits(kshard::gather(output), output_full)));
  }
  {  // The padding row, zeroed on purpose first (README order), is kept: never repaired.
    auto input = make(mesh, layout, input_full);
    const auto output = make(mesh, layout, output_full);
    (void)kshard::zero_row(input, -2);  // row 4, healthy until now
    const auto report = kshard::repair_embedding_rows(input, output, config.keep_rows({-2, 4}));
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->repaired_row_ids, (std::vector<index_t>{1, 3}));
    EXPECT_EQ(report->kept_row_ids, (std::vector<index_t>{4}));
    EXPECT_EQ(report->min_norm_before, 0.0);
    ASSERT_TRUE(report->target_norm.has_value());
    EXPECT_NEAR(*report->target_norm, std::sqrt(7.0), 1e-12);  // rows 0, 2, 5: norms 1, 2, 4
    EXPECT_NE(fmt::format("{}", *report).find("; kept row(s) [4] as they were"), std::string::npos);
    const auto after = kshard::gather(input);
    bool ok = true;
    for (std::size_t r = 0; r < 6; ++r) {
      double norm = 0;
      for (std::size_t c = 0; c < 4; ++c) {
        const auto v = static_cast<double>(static_cast<float>(after(r, c)));
        norm += v * v;
        if (r != 1 && r != 3)
          ok =
              ok && v == (r == 4 ? 0.0 : static_cast<double>(static_cast<float>(input_full(r, c))));
      }
      if (r == 1 || r == 3) ok = ok && std::abs(std::sqrt(norm) - std::sqrt(7.0)) <= 1e-2;
    }
    EXPECT_TRUE(all_ranks(ok));
  }
  {  // max_rows = 1: refused, nothing changed
    auto input = make(mesh, layout, input_full);
    const auto output = make(mesh, layout, output_full);
    const auto message = collective_error([&] {
      (void)kshard::repair_embedding_rows(input, output, RepairConfig(true, 1e-4, 1, strategy));
    });
    EXPECT_NE(message.find("2 rows of 'embed_tokens' are damaged, more than max_rows = 1"),
              std::string::npos)
        << message;
    EXPECT_TRUE(all_ranks(same_bits(kshard::gather(input), input_full)));
  }
  if (strategy == RepairStrategy::output_direction) {  // output row 1 zeroed: refused, names 1
    auto damaged_output = host_matrix<T>(spec_output);
    for (std::size_t c = 0; c < 4; ++c) damaged_output(1, c) = T(0.0f);
    auto input = make(mesh, layout, input_full);
    const auto output = make(mesh, layout, damaged_output);
    const auto message =
        collective_error([&] { (void)kshard::repair_embedding_rows(input, output, config); });
    EXPECT_NE(message.find("rows [1] of 'lm_head' are damaged too"), std::string::npos) << message;
    EXPECT_TRUE(all_ranks(same_bits(kshard::gather(input), input_full)));
  }
}

TEST(Repair, SpecCaseOnEveryLayout) {
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  const auto grid = kshard::test::dp_tp_mesh();
  for (auto strategy : {RepairStrategy::output_direction, RepairStrategy::mean_direction}) {
    check_spec_case<float>(line, Layout(Replicate{}), strategy);
    check_spec_case<float>(line, Layout(Shard<0>{}), strategy);
    check_spec_case<double>(line, Layout(Shard<1>{}), strategy);
    check_spec_case<float>(grid, Layout(StridedShard<0>{2}, Shard<0>{}), strategy);
    check_spec_case<double>(grid, Layout(Shard<0>{}, Shard<1>{}), strategy);
    check_spec_case<kshard::bf16>(grid, Layout(Replicate{}, Shard<0>{}), strategy);
    check_spec_case<kshard::bf16>(grid, Layout(Shard<0>{}, StridedShard<0>{2}), strategy);
    check_spec_case<kshard::f16>(grid, Layout(StridedShard<0>{2}, Shard<1>{}), strategy);
  }
}

// ---- Randomised comparison with a serial transcription of spec section 3 ----

struct Reference {
  std::optional<std::string> refusal;  // a phrase the error must contain
  std::vector<index_t> ids;
  double min_before = 0;
  double target = 0;
  std::vector<std::vector<double>> after;  // the input after the repair
};

template <class T>
double row_norm(const kshard::HostMatrix<T>& m, std::size_t r) {
  double sum = 0;
  for (std::size_t c = 0; c < m.extent(1); ++c) {
    const auto v = static_cast<double>(static_cast<kshard::compute_type_t<T>>(m(r, c)));
    sum += v * v;
  }
  return std::sqrt(sum);
}

template <class T>
Reference serial_repair(const kshard::HostMatrix<T>& in, const kshard::HostMatrix<T>& out,
                        const RepairConfig& config) {
  Reference ref;
  const std::size_t rows = in.extent(0);
  const std::size_t cols = in.extent(1);
  ref.after.assign(rows, std::vector<double>(cols));
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) ref.after[r][c] = static_cast<float>(in(r, c));
  auto bad = [&](double n) { return !std::isfinite(n) || n <= config.min_norm(); };
  ref.min_before = std::numeric_limits<double>::infinity();
  double healthy_sum = 0;
  double healthy = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const double n = row_norm(in, r);
    if (!std::isnan(n)) ref.min_before = std::min(ref.min_before, n);
    if (bad(n))
      ref.ids.push_back(static_cast<index_t>(r));
    else {
      healthy_sum += n * n;
      healthy += 1;
    }
  }
  if (ref.ids.empty()) return ref;
  if (static_cast<index_t>(ref.ids.size()) > config.max_rows()) {
    ref.refusal = "more than max_rows";
    return ref;
  }
  for (index_t id : ref.ids)
    if (bad(row_norm(out, static_cast<std::size_t>(id)))) ref.refusal = "are damaged too";
  if (ref.refusal) return ref;
  if (healthy == 0) {
    ref.refusal = "has no healthy rows";
    return ref;
  }
  ref.target = std::sqrt(healthy_sum / healthy);
  for (index_t id : ref.ids) {
    const auto r = static_cast<std::size_t>(id);
    const double scale = ref.target / row_norm(out, r);
    for (std::size_t c = 0; c < cols; ++c)
      ref.after[r][c] = static_cast<float>(static_cast<T>(
          static_cast<double>(static_cast<kshard::compute_type_t<T>>(out(r, c))) * scale));
  }
  return ref;
}

template <class T>
void damage(kshard::HostMatrix<T>& m, std::mt19937_64& rng, int max_damaged) {
  if (m.extent(0) == 0) return;
  const int count = std::uniform_int_distribution<int>(0, max_damaged)(rng);
  std::uniform_int_distribution<std::size_t> row(0, m.extent(0) - 1);
  std::uniform_int_distribution<int> kind(0, 3);
  for (int k = 0; k < count; ++k) {
    const std::size_t r = row(rng);
    const int what = kind(rng);
    for (std::size_t c = 0; c < m.extent(1); ++c)
      m(r, c) = static_cast<T>(what == 0 ? 0.0 : what == 1 ? 1e-9 : 0.0);
    if (m.extent(1) > 0 && what >= 2) {
      const std::size_t c = std::uniform_int_distribution<std::size_t>(0, m.extent(1) - 1)(rng);
      m(r, c) = static_cast<T>(what == 2 ? std::numeric_limits<double>::quiet_NaN()
                                         : std::numeric_limits<double>::infinity());
    }
  }
}

template <class T, class L, std::size_t M>
void check_random_case(const kshard::Mesh<M>& mesh, const L& layout, std::uint64_t seed) {
  auto rng = kshard::test::shared_rng(seed);
  const auto rows = std::uniform_int_distribution<index_t>(0, 24)(rng);
  const auto cols = std::uniform_int_distribution<index_t>(1, 9)(rng);
  auto input_full = kshard::test::reference_matrix<T>(rows, cols, seed);
  auto output_full = kshard::test::reference_matrix<T>(rows, cols, seed + 7);
  damage(input_full, rng, 4);
  damage(output_full, rng, 1);
  const RepairConfig config(true, 1e-6, std::uniform_int_distribution<index_t>(1, 4)(rng));
  SCOPED_TRACE(fmt::format("seed {}: {} x {} {} on {}", seed, rows, cols, layout, mesh));
  const auto ref = serial_repair(input_full, output_full, config);

  auto input = make(mesh, layout, input_full);
  const auto output = make(mesh, layout, output_full);
  std::optional<kshard::RepairReport> report;
  const auto message =
      collective_error([&] { report = kshard::repair_embedding_rows(input, output, config); });
  const auto after = kshard::gather(input);
  if (ref.refusal) {
    EXPECT_NE(message.find(*ref.refusal), std::string::npos) << message;
    EXPECT_TRUE(all_ranks(same_bits(after, input_full)));
    return;
  }
  ASSERT_TRUE(all_ranks(message.empty() && report.has_value())) << message;
  EXPECT_EQ(report->repaired_row_ids, ref.ids);
  const auto close = [](double got, double want, double tolerance) {
    return got == want || std::abs(got - want) <= tolerance * std::abs(want);
  };
  EXPECT_TRUE(close(report->min_norm_before, ref.min_before, 1e-12))
      << report->min_norm_before << " vs " << ref.min_before;
  EXPECT_EQ(report->target_norm.has_value(), !ref.ids.empty());
  if (report->target_norm) {
    EXPECT_TRUE(close(*report->target_norm, ref.target, 1e-12));
  }
  // Repaired rows within the element type's rounding (the scale may differ in its last bit);
  // every other row bit for bit.
  const double tolerance = std::is_same_v<T, double>  ? 1e-12
                           : std::is_same_v<T, float> ? 1e-6
                                                      : 1e-2;
  bool ok = true;
  for (index_t r = 0; r < rows; ++r) {
    const bool repaired = std::find(ref.ids.begin(), ref.ids.end(), r) != ref.ids.end();
    for (index_t c = 0; c < cols; ++c) {
      const auto i = static_cast<std::size_t>(r);
      const auto j = static_cast<std::size_t>(c);
      if (repaired)
        ok = ok && close(static_cast<double>(static_cast<float>(after(i, j))), ref.after[i][j],
                         tolerance);
      else
        ok = ok && std::memcmp(&after(i, j), &input_full(i, j), sizeof(T)) == 0;
    }
  }
  EXPECT_TRUE(all_ranks(ok));
}

TEST(Repair, RandomCasesAgainstSerialReference) {
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  const auto grid = kshard::test::dp_tp_mesh();
  std::uint64_t seed = 5000;
  for (int round = 0; round < 4; ++round)
    kshard::test::for_each_layout(
        seed,
        [&](const auto& layout) {
          check_random_case<float>(line, layout, seed);
          check_random_case<double>(line, layout, seed + 1);
          check_random_case<kshard::bf16>(line, layout, seed + 2);
          check_random_case<kshard::f16>(line, layout, seed + 3);
        },
        [&](const auto& layout) {
          if (round < 2) check_random_case<float>(grid, layout, seed);
        });
}

// Determinism: the same input on the same layout gives the same bits, run after run.
TEST(Repair, RepeatedRunsAreBitIdentical) {
  const auto grid = kshard::test::dp_tp_mesh();
  Layout layout(StridedShard<0>{2}, Shard<1>{});
  auto rng = kshard::test::shared_rng(77);
  auto input_full = kshard::test::reference_matrix<float>(40, 12, 77);
  const auto output_full = kshard::test::reference_matrix<float>(40, 12, 78);
  damage(input_full, rng, 4);
  std::vector<kshard::HostMatrix<float>> results;
  std::vector<std::string> reports;
  for (int run = 0; run < 3; ++run) {
    auto input = make(grid, layout, input_full);
    const auto output = make(grid, layout, output_full);
    const auto report = kshard::repair_embedding_rows(input, output, RepairConfig(true, 1e-6, 8));
    reports.push_back(fmt::format("{}", *report));
    results.push_back(kshard::gather(input));
  }
  bool same = true;
  for (int run = 1; run < 3; ++run)
    same = same && same_bits(results[0], results[run]) && reports[0] == reports[run];
  EXPECT_TRUE(all_ranks(same));
}

// ---- Refusals: the same error on every rank, nothing changed ----

template <class Matrix, class Call>
void expect_refusal(const Matrix& input,
                    const kshard::HostMatrix<typename Matrix::value_type>& before,
                    const std::string& phrase, Call&& call) {
  const auto message = collective_error(call);
  EXPECT_NE(message.find(phrase), std::string::npos)
      << "expected '" << phrase << "', got '" << message << "'";
  EXPECT_TRUE(all_ranks(same_bits(kshard::gather(input), before)));
}

TEST(Repair, RefusalsChangeNothing) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  const auto input_full = host_matrix<float>(spec_input);
  const auto output_full = host_matrix<float>(spec_output);
  const RepairConfig config(true, 1e-4, 256);
  auto input = make(line, Layout(Shard<0>{}), input_full);
  const auto output = make(line, Layout(Shard<0>{}), output_full);

  expect_refusal(input, input_full, "layouts differ", [&] {
    (void)kshard::repair_embedding_rows(input, make(line, Layout(Replicate{}), output_full),
                                        config);
  });
  auto strided_input = make(line, Layout(StridedShard<0>{2}), input_full);
  expect_refusal(strided_input, input_full, "layouts differ", [&] {
    (void)kshard::repair_embedding_rows(
        strided_input, make(line, Layout(StridedShard<0>{3}), output_full), config);
  });
  const auto wide = host_matrix<float>({{1, 1, 1, 1, 1},
                                        {1, 1, 1, 1, 1},
                                        {1, 1, 1, 1, 1},
                                        {1, 1, 1, 1, 1},
                                        {1, 1, 1, 1, 1},
                                        {1, 1, 1, 1, 1}});
  expect_refusal(input, input_full, "is 6 x 5 but input embedding 'embed_tokens' is 6 x 4", [&] {
    (void)kshard::repair_embedding_rows(input, make(line, Layout(Shard<0>{}), wide), config);
  });
  expect_refusal(input, input_full, "(tied weights)",
                 [&] { (void)kshard::repair_embedding_rows(input, input, config); });
  expect_refusal(input, input_full, "needs an output embedding",
                 [&] { (void)kshard::repair_embedding_rows(input, config); });
  expect_refusal(input, input_full, "more than max_rows = 1", [&] {
    (void)kshard::repair_embedding_rows(input, output, RepairConfig(true, 1e-4, 1));
  });
  expect_refusal(input, input_full, "has no healthy rows", [&] {
    (void)kshard::repair_embedding_rows(
        input, RepairConfig(true, 10.0, 256, RepairStrategy::mean_direction));
  });
  if (size > 1) {
    expect_refusal(input, input_full, "differs between ranks", [&] {
      const double min_norm = line.my_rank() == size - 1 ? 1e-3 : 1e-4;  // one rank only
      (void)kshard::repair_embedding_rows(input, output, RepairConfig(true, min_norm, 256));
    });
    kshard::Mesh<2> rows_mesh(MPI_COMM_WORLD, {size, 1});
    kshard::Mesh<2> cols_mesh(MPI_COMM_WORLD, {1, size});
    auto on_rows = make(rows_mesh, Layout(Shard<0>{}, Replicate{}), input_full);
    expect_refusal(on_rows, input_full, "not the same mesh", [&] {
      (void)kshard::repair_embedding_rows(
          on_rows, make(cols_mesh, Layout(Shard<0>{}, Replicate{}), output_full), config);
    });
  }
  // Disabled: no report, only the agreement on the arguments, nothing changed.
  kshard::reset_comm_stats();
  EXPECT_FALSE(kshard::repair_embedding_rows(input, output, RepairConfig(false, 1e-4, 256)));
  EXPECT_EQ(kshard::comm_stats().collectives, 0);
  EXPECT_EQ(kshard::comm_stats().agreements, 1);
  EXPECT_TRUE(all_ranks(same_bits(kshard::gather(input), input_full)));
  // Tied storage is fine for the mean direction.
  const auto report = kshard::repair_embedding_rows(
      input, input, RepairConfig(true, 1e-4, 256, RepairStrategy::mean_direction));
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->repaired_row_ids, (std::vector<index_t>{1, 3}));
}

TEST(Repair, ConfigIsValidatedAtConstruction) {
  const auto message = [](auto&& make_config) {
    try {
      make_config();
    } catch (const kshard::error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message([] { RepairConfig(true, std::nan(""), 1); }).find("min_norm is nan"),
            std::string::npos);
  EXPECT_NE(message([] { RepairConfig(true, INFINITY, 1); }).find("min_norm is inf"),
            std::string::npos);
  EXPECT_NE(message([] { RepairConfig(true, -1.0, 1); }).find("min_norm is -1"), std::string::npos);
  EXPECT_NE(message([] { RepairConfig(true, 0.0, 0); }).find("max_rows is 0; it must be > 0"),
            std::string::npos);
  EXPECT_EQ(message([] { RepairConfig(true, 0.0, 1); }), "");
}

// ---- Cost: one full pass over the input, a constant number of collectives ----

std::map<std::string, int>* kernel_counts = nullptr;

void count_kernel(const char* name, std::uint32_t, std::uint64_t*) {
  if (kernel_counts != nullptr && std::string(name).rfind("kshard::", 0) == 0)
    ++(*kernel_counts)[name];
}

struct RepairCost {
  std::map<std::string, int> kernels;
  std::int64_t collectives = 0;
  std::int64_t agreements = 0;
};

template <class L, std::size_t M>
RepairCost measure(const kshard::Mesh<M>& mesh, const L& layout, index_t rows, bool with_damage,
                   RepairStrategy strategy) {
  auto full = kshard::test::reference_matrix<float>(rows, 16, 42);
  if (with_damage)
    for (std::size_t c = 0; c < 16; ++c) full(3, c) = 0.0f;
  auto input = make(mesh, layout, full);
  const auto output = make(mesh, layout, kshard::test::reference_matrix<float>(rows, 16, 43));
  RepairCost cost;
  kernel_counts = &cost.kernels;
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(count_kernel);
  Kokkos::Tools::Experimental::set_begin_parallel_reduce_callback(count_kernel);
  kshard::reset_comm_stats();
  (void)kshard::repair_embedding_rows(input, output, RepairConfig(true, 1e-6, 8, strategy));
  cost.collectives = kshard::comm_stats().collectives;
  cost.agreements = kshard::comm_stats().agreements;
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
  Kokkos::Tools::Experimental::set_begin_parallel_reduce_callback(nullptr);
  kernel_counts = nullptr;
  return cost;
}

TEST(Repair, OnePassAndConstantCollectives) {
  const auto grid = kshard::test::dp_tp_mesh();
  Layout layout(Shard<0>{}, Shard<1>{});
  const int column_dims = grid.extent(1) > 1 ? 1 : 0;  // mesh dims splitting the hidden axis
  for (index_t rows : {64, 4096}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows);
    const auto clean = measure(grid, layout, rows, false, RepairStrategy::output_direction);
    EXPECT_EQ(clean.kernels, (std::map<std::string, int>{{"kshard::row_norms", 1}}));
    EXPECT_EQ(clean.collectives, 2 + column_dims);
    EXPECT_EQ(clean.agreements, 1);
    const auto repaired = measure(grid, layout, rows, true, RepairStrategy::output_direction);
    EXPECT_EQ(repaired.kernels.at("kshard::row_norms"), 1);  // the only full pass
    for (const auto& [name, count] : repaired.kernels) {
      EXPECT_TRUE(name == "kshard::row_norms" || name.rfind("kshard::repair::", 0) == 0) << name;
      EXPECT_EQ(count, 1) << name;
    }
    EXPECT_EQ(repaired.kernels.count("kshard::repair::write"), 1u);
    EXPECT_EQ(repaired.collectives, 6 + column_dims);
    EXPECT_EQ(repaired.agreements, 1);
    const auto mean = measure(grid, layout, rows, true, RepairStrategy::mean_direction);
    EXPECT_EQ(mean.collectives, 6 + column_dims);
  }
}

// Silent by default (an HPC library prints nothing unless asked); with a handler set, rank 0
// sends the report as one line.
TEST(Repair, RankZeroLogsOneLineWhenAsked) {
  std::vector<std::string> lines;
  const auto previous =
      kshard::set_log_handler([&](std::string_view line) { lines.emplace_back(line); });
  EXPECT_FALSE(previous) << "kshard has a log handler although none was set";
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  auto input = make(line, Layout(Shard<0>{}), host_matrix<float>(spec_input));
  const auto output = make(line, Layout(Shard<0>{}), host_matrix<float>(spec_output));
  const auto report = kshard::repair_embedding_rows(input, output, RepairConfig(true, 1e-4, 256));
  kshard::set_log_handler(previous);
  EXPECT_EQ(lines.size(), line.my_rank() == 0 ? 1u : 0u);
  EXPECT_EQ(fmt::format("{}", *report),
            "embed_tokens: repaired 2 row(s) [1, 3] with lm_head directions; min norm before 0, "
            "target norm 2.73861; norms before [0, 1e-08]");
  if (!lines.empty()) {
    EXPECT_EQ(lines[0], fmt::format("{}", *report));
  }
}

// ---- Execution-space instances ----

// repair_embedding_rows (both strategies, with and without an output embedding) and
// find_damaged_rows with an instance first: the same report and the same bits as the default
// forms.
TEST(Repair, InstanceOverloadsMatchDefaultForms) {
  const ExecSpace space = other_instance();
  const auto grid = kshard::test::dp_tp_mesh();
  const Layout layout(StridedShard<0>{2}, Shard<1>{});
  auto rng = kshard::test::shared_rng(91);
  auto input_full = kshard::test::reference_matrix<float>(40, 12, 91);
  const auto output_full = kshard::test::reference_matrix<float>(40, 12, 92);
  damage(input_full, rng, 4);
  const auto config = RepairConfig(true, 1e-6, 40).keep_rows({0}).relative_threshold(0.5);
  const auto mean = RepairConfig(true, 1e-6, 40, RepairStrategy::mean_direction).keep_rows({0});
  bool same = true;
  {
    auto by_default = make(grid, layout, input_full);
    auto by_instance = make(grid, layout, input_full);
    const auto output = make(grid, layout, output_full);
    const auto want = kshard::repair_embedding_rows(by_default, output, config);
    const auto got = kshard::repair_embedding_rows(space, by_instance, output, config);
    same = same && want && got && fmt::format("{}", *want) == fmt::format("{}", *got) &&
           same_bits(kshard::gather(by_default), kshard::gather(by_instance));
  }
  {
    auto by_default = make(grid, layout, input_full);
    auto by_instance = make(grid, layout, input_full);
    const auto want = kshard::repair_embedding_rows(by_default, mean);
    const auto got = kshard::repair_embedding_rows(space, by_instance, mean);
    same = same && want && got && fmt::format("{}", *want) == fmt::format("{}", *got) &&
           same_bits(kshard::gather(by_default), kshard::gather(by_instance));
  }
  {
    const auto input = make(grid, layout, input_full);
    const auto want = kshard::find_damaged_rows(input, config);
    const auto got = kshard::find_damaged_rows(space, input, config);
    same = same && want && got && fmt::format("{}", *want) == fmt::format("{}", *got) &&
           want->repaired_row_ids == got->repaired_row_ids &&
           same_bits(kshard::gather(input), input_full);
  }
  EXPECT_TRUE(all_ranks(same));
}

}  // namespace
