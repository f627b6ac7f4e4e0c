// RepairConfig::relative_threshold and find_damaged_rows: rows far below the median norm (not
// tiny) found and repaired together with zero rows on every layout, the exact distributed median
// against a serial std::nth_element (odd and even counts, ties), the dry run changing nothing
// and agreeing with the repair, the agreement and validation refusals, and the number of
// collectives.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kshard/comm/stats.hpp"
#include "kshard/distribute.hpp"
#include "kshard/matrix_agreement.hpp"
#include "kshard/repair.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::RepairConfig;
using kshard::RepairReport;
using kshard::RepairStrategy;
using kshard::Replicate;
using kshard::Shard;
using kshard::StridedShard;
using kshard::test::all_ranks;
using kshard::test::checksum;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::MemSpace;
using kshard::test::world_size;

// The rows of the synthetic table (at least 12 rows): zero, NaN, scaled to 5/16 (about 0.3x,
// small but far from tiny) and the kept (zeroed padding) row; every other row is healthy.
struct Roles {
  std::vector<index_t> zero;
  std::vector<index_t> scaled;
  index_t nan_row = 6;
  index_t kept = 0;
};

Roles roles(index_t rows) { return {{1, rows - 3}, {4, 9, rows - 1}, 6, rows - 2}; }

// How the healthy norms are drawn: from few values (many ties), all equal, or all distinct.
enum class Norms { mixed, equal, distinct };

// Healthy entries are +-3 or +-4 (mixed), +-3 (equal: every unscaled norm the same), or +-3 with
// +-(3 + row / 16) in column 0 (distinct); the scaled rows hold 5/16 of +-3 or +-4. All have
// <= 8 significant bits (exact in bf16) and exact fp64 squares and sums, so every layout computes
// the serial norms bit for bit. The unscaled norms lie in [3, 4.5] x sqrt(cols), the scaled ones
// at or below 1.25 x sqrt(cols): with ratio 0.5 the relative test finds exactly the scaled rows.
template <class T>
kshard::HostMatrix<T> synthetic(index_t rows, index_t cols, Norms norms, std::uint64_t seed) {
  kshard::HostMatrix<T> m("synthetic", static_cast<std::size_t>(rows),
                          static_cast<std::size_t>(cols));
  auto rng = kshard::test::shared_rng(seed);
  std::uniform_int_distribution<int> magnitude(3, norms == Norms::equal ? 3 : 4);
  std::bernoulli_distribution negative(0.5);
  const Roles r = roles(rows);
  for (index_t i = 0; i < rows; ++i) {
    const bool scaled = std::find(r.scaled.begin(), r.scaled.end(), i) != r.scaled.end();
    const bool zero = std::find(r.zero.begin(), r.zero.end(), i) != r.zero.end() || i == r.kept;
    for (index_t j = 0; j < cols; ++j) {
      const double sign = negative(rng) ? -1.0 : 1.0;
      const double size = magnitude(rng);
      const double v = scaled                  ? sign * size * 5 / 16
                       : norms == Norms::mixed ? sign * size
                       : norms == Norms::distinct && j == 0
                           ? sign * (3 + static_cast<double>(i) / 16)
                           : sign * 3;
      m(static_cast<std::size_t>(i), static_cast<std::size_t>(j)) = static_cast<T>(zero ? 0.0 : v);
    }
  }
  m(static_cast<std::size_t>(r.nan_row), 0) =
      static_cast<T>(std::numeric_limits<double>::quiet_NaN());
  return m;
}

template <class T>
double row_norm(const kshard::HostMatrix<T>& m, std::size_t r) {
  double sum = 0;
  for (std::size_t c = 0; c < m.extent(1); ++c) {
    const auto v = static_cast<double>(static_cast<kshard::compute_type_t<T>>(m(r, c)));
    sum += v * v;
  }
  return std::sqrt(sum);
}

// A serial transcription of the detection: the median by std::nth_element at the lower middle.
struct Expected {
  std::vector<index_t> ids;
  std::vector<index_t> relative;
  std::vector<double> norms;
  std::optional<double> median;
  std::size_t healthy_before_relative = 0;
  double min_before = std::numeric_limits<double>::infinity();
  std::optional<double> target;
};

template <class T>
Expected serial_detection(const kshard::HostMatrix<T>& m, const RepairConfig& config) {
  Expected e;
  const auto rows = static_cast<index_t>(m.extent(0));
  const auto kept = [&](index_t r) {
    for (const index_t k : config.kept_rows())
      if ((k < 0 ? k + rows : k) == r) return true;
    return false;
  };
  const auto bad = [&](double n) { return !std::isfinite(n) || n <= config.min_norm(); };
  std::vector<double> healthy;
  for (index_t r = 0; r < rows; ++r)
    if (!kept(r) && !bad(row_norm(m, static_cast<std::size_t>(r))))
      healthy.push_back(row_norm(m, static_cast<std::size_t>(r)));
  e.healthy_before_relative = healthy.size();
  if (config.relative_threshold() && !healthy.empty()) {
    const auto middle = healthy.begin() + static_cast<std::ptrdiff_t>((healthy.size() - 1) / 2);
    std::nth_element(healthy.begin(), middle, healthy.end());
    e.median = *middle;
  }
  double sum = 0;
  double count = 0;
  for (index_t r = 0; r < rows; ++r) {
    if (kept(r)) continue;
    const double n = row_norm(m, static_cast<std::size_t>(r));
    if (!std::isnan(n)) e.min_before = std::min(e.min_before, n);
    const bool relative = !bad(n) && e.median && n < *config.relative_threshold() * *e.median;
    if (bad(n) || relative) {
      e.ids.push_back(r);
      e.norms.push_back(n);
      if (relative) e.relative.push_back(r);
    } else {
      sum += n * n;
      count += 1;
    }
  }
  if (!e.ids.empty() && count > 0) e.target = std::sqrt(sum / count);
  return e;
}

// NaN equals NaN; everything else bit for bit.
bool same_norms(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (!(std::isnan(a[k]) && std::isnan(b[k])) &&
        std::bit_cast<std::uint64_t>(a[k]) != std::bit_cast<std::uint64_t>(b[k]))
      return false;
  return true;
}

void expect_detection(const RepairReport& report, const Expected& e) {
  EXPECT_EQ(report.repaired_row_ids, e.ids);
  EXPECT_EQ(report.relative_row_ids, e.relative);
  EXPECT_TRUE(same_norms(report.repaired_norms_before, e.norms))
      << fmt::format("{} vs {}", report.repaired_norms_before, e.norms);
  EXPECT_EQ(report.median_norm, e.median);
  EXPECT_EQ(report.min_norm_before, e.min_before);
  ASSERT_EQ(report.target_norm.has_value(), e.target.has_value());
  if (e.target) {
    EXPECT_NEAR(*report.target_norm, *e.target, 1e-12 * *e.target);
  }
}

template <class T, class L, std::size_t M>
void check_case(const kshard::Mesh<M>& mesh, const L& layout, index_t rows, Norms norms,
                RepairStrategy strategy) {
  constexpr index_t cols = 6;
  SCOPED_TRACE(fmt::format("{} x {} {} on {}, {}{}", rows, cols, layout, mesh,
                           kshard::detail::render_type(kshard::detail::type_code<T>()),
                           norms == Norms::mixed   ? ", mixed norms"
                           : norms == Norms::equal ? ", equal norms"
                                                   : ", distinct norms"));
  const auto input_full = synthetic<T>(rows, cols, norms, 300 + static_cast<std::uint64_t>(rows));
  const Roles r = roles(rows);
  const auto config =
      RepairConfig(true, 1e-6, 64, strategy).relative_threshold(0.5).keep_rows({r.kept});
  const Expected e = serial_detection(input_full, config);
  // The test data are what they claim: the scaled rows are the relative ones, and the healthy
  // count (scaled rows included) is rows - 4, even for an even number of rows.
  ASSERT_EQ(e.relative, r.scaled);
  ASSERT_EQ(e.healthy_before_relative, static_cast<std::size_t>(rows - 4));

  auto input = kshard::distribute<ExecSpace, MemSpace>(mesh, layout,
                                                       kshard::HostMatrix<const T>(input_full));
  const auto output = kshard::distribute<ExecSpace, MemSpace>(
      mesh, layout,
      kshard::HostMatrix<const T>(kshard::test::reference_matrix<T>(rows, cols, 400)));
  const std::uint64_t before = checksum(input);
  const auto dry = kshard::find_damaged_rows(input, config);
  EXPECT_TRUE(all_ranks(checksum(input) == before));  // bit-identical after the dry run
  ASSERT_TRUE(dry.has_value());
  expect_detection(*dry, e);
  EXPECT_EQ(dry->kept_row_ids, std::vector<index_t>{r.kept});

  const auto report = strategy == RepairStrategy::output_direction
                          ? kshard::repair_embedding_rows(input, output, config)
                          : kshard::repair_embedding_rows(input, config);
  ASSERT_TRUE(report.has_value());
  expect_detection(*report, e);
  EXPECT_EQ(report->output_name, dry->output_name);
  EXPECT_EQ(fmt::format("{}", *report), fmt::format("{}", *dry));  // the same report

  const auto after = kshard::gather(input);
  const double tolerance = std::is_same_v<T, kshard::bf16> ? 1e-2 : 1e-6;
  bool ok = true;
  for (index_t i = 0; i < rows; ++i) {
    const auto row = static_cast<std::size_t>(i);
    if (std::find(e.ids.begin(), e.ids.end(), i) != e.ids.end())
      ok = ok && std::abs(row_norm(after, row) - *e.target) <= tolerance * *e.target;
    else
      for (std::size_t c = 0; c < static_cast<std::size_t>(cols); ++c)
        ok = ok && std::memcmp(&after(row, c), &input_full(row, c), sizeof(T)) == 0;
  }
  EXPECT_TRUE(all_ranks(ok));
}

template <class L, std::size_t M>
void check_layout(const kshard::Mesh<M>& mesh, const L& layout) {
  for (const index_t rows : {23, 24})  // 19 and 20 healthy rows: odd and even counts
    for (const Norms norms : {Norms::mixed, Norms::equal, Norms::distinct}) {
      check_case<float>(mesh, layout, rows, norms, RepairStrategy::output_direction);
      check_case<float>(mesh, layout, rows, norms, RepairStrategy::mean_direction);
      check_case<double>(mesh, layout, rows, norms, RepairStrategy::output_direction);
      check_case<kshard::bf16>(mesh, layout, rows, norms, RepairStrategy::output_direction);
    }
}

TEST(RepairRelative, FindsSmallRowsWithZeroRowsOnEveryLayout) {
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  const auto grid = kshard::test::dp_tp_mesh();
  check_layout(line, Layout(Shard<0>{}));
  check_layout(line, Layout(Shard<1>{}));  // columns split: the norms are full-row norms
  check_layout(line, Layout(Replicate{}));
  check_layout(grid, Layout(StridedShard<0>{2}, Shard<1>{}));
  check_layout(grid, Layout(Replicate{}, Shard<0>{}));
}

// The limit the detection compares squared norms with is, for every bound, the largest double
// whose rounded square root is at most the bound: bounds over the whole fp64 range (subnormals,
// 0, the largest double) and around perfect squares.
TEST(RepairRelative, SquareLimitsAreTheLargestSquaresWithRootsAtMost) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<double> bounds = {0.0,
                                std::numeric_limits<double>::denorm_min(),
                                std::numeric_limits<double>::min(),
                                std::numeric_limits<double>::max(),
                                1e154,
                                1.4e154,
                                1.0,
                                5.0};
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-1074, 1023);
  for (int k = 0; k < 20000; ++k) bounds.push_back(std::ldexp(mantissa(rng), exponent(rng)));
  for (int k = 1; k < 200; ++k) {
    bounds.push_back(std::nextafter(static_cast<double>(k), 0.0));
    bounds.push_back(std::nextafter(static_cast<double>(k), inf));
  }
  std::size_t wrong = 0;
  for (const double bound : bounds) {
    if (!std::isfinite(bound)) continue;  // ldexp past the range
    const double s = kshard::detail::largest_square_with_root_at_most(bound);
    const double next = std::nextafter(s, inf);
    if (!(std::sqrt(s) <= bound) || (std::isfinite(next) && std::sqrt(next) <= bound)) ++wrong;
  }
  EXPECT_EQ(wrong, 0U);
}

// Norms within a few ulps of both limits, in fp64 (whose squares round, so the norm is the
// rounded root of a rounded sum of squares): the detection compares squared norms with
// precomputed limits, and must decide exactly what `norm <= min_norm` and `norm < ratio x
// median` decide on the norms themselves (the serial transcription). Row i holds one value x,
// or two or three values whose norm is about x; most rows have norm 1, so the median is 1 and
// the relative bound is the ratio. At these limits comparing squares with the rounded square of
// the limit would misjudge some rows. Whole rows on every rank (the columns of a row summed in
// another order would round differently from the transcription).
TEST(RepairRelative, NormsAtTheLimitsDecideAsTheNormsDo) {
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  constexpr double min_norm = 0.215;
  constexpr double ratio = 0.35;
  std::vector<std::vector<double>> values;
  for (const double limit : {min_norm, ratio})
    for (int k = -40; k <= 40; ++k) {
      const double x = limit * (1 + k * std::ldexp(1.0, -52));
      values.push_back({x});
      values.push_back({0.6 * x, 0.8 * x});
      values.push_back({2 * x / 3, 2 * x / 3, x / 3});
    }
  const auto limits = values.size();
  for (std::size_t k = 0; k < 2 * limits; ++k) values.push_back({1.0});  // the median
  const auto rows = static_cast<index_t>(values.size());
  constexpr index_t cols = 3;
  kshard::HostMatrix<double> full("limits", static_cast<std::size_t>(rows),
                                  static_cast<std::size_t>(cols));
  for (std::size_t i = 0; i < values.size(); ++i)
    for (std::size_t j = 0; j < values[i].size(); ++j) full(i, j) = values[i][j];
  const auto config = RepairConfig(true, min_norm, rows).relative_threshold(ratio);
  const Expected e = serial_detection(full, config);
  // The data straddle both limits: some rows on each side of each (the first half of the
  // rows lies near min_norm, the second near ratio x median).
  ASSERT_TRUE(e.median == 1.0);
  const auto half = static_cast<index_t>(limits / 2);
  const auto absolute = static_cast<index_t>(e.ids.size() - e.relative.size());
  const auto relative_near_bound = std::count_if(
      e.relative.begin(), e.relative.end(), [&](index_t i) { return i >= half && i < 2 * half; });
  ASSERT_GT(absolute, 0);
  ASSERT_LT(absolute, half);
  ASSERT_GT(relative_near_bound, 0);
  ASSERT_LT(relative_near_bound, half);
  const kshard::HostMatrix<const double> input(full);
  const auto by_rows = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Shard<0>{}), input);
  const auto everywhere = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Replicate{}), input);
  for (const auto& found : {kshard::find_damaged_rows(by_rows, config),
                            kshard::find_damaged_rows(everywhere, config)}) {
    ASSERT_TRUE(found.has_value());
    expect_detection(*found, e);
  }
}

TEST(RepairRelative, OffByDefault) {
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  const Roles r = roles(23);
  const auto full = synthetic<float>(23, 6, Norms::mixed, 323);
  const auto input = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Shard<0>{}),
                                                             kshard::HostMatrix<const float>(full));
  const auto config = RepairConfig(true, 1e-6, 64).keep_rows({r.kept});
  EXPECT_FALSE(config.relative_threshold().has_value());
  const auto report = kshard::find_damaged_rows(input, config);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->repaired_row_ids, (std::vector<index_t>{1, 6, 20}));  // zero, NaN, zero
  EXPECT_TRUE(report->relative_row_ids.empty());
  EXPECT_FALSE(report->median_norm.has_value());
  ASSERT_EQ(report->repaired_norms_before.size(), 3u);
  EXPECT_EQ(report->repaired_norms_before[0], 0.0);
  EXPECT_TRUE(std::isnan(report->repaired_norms_before[1]));
  const std::string text = fmt::format("{}", *report);
  EXPECT_NE(text.find("norms before [0, nan, 0]"), std::string::npos) << text;
  EXPECT_EQ(text.find("median"), std::string::npos) << text;
  const auto relative = kshard::find_damaged_rows(input, config.relative_threshold(0.5));
  const std::string with = fmt::format("{}", *relative);
  EXPECT_NE(with.find(fmt::format("; median norm {:g}, relative row(s) [4, 9, 22]",
                                  *relative->median_norm)),
            std::string::npos)
      << with;
  // Disabled: no report, like the repair.
  EXPECT_FALSE(kshard::find_damaged_rows(input, RepairConfig(false, 1e-6, 64)).has_value());
}

TEST(RepairRelative, MaxRowsCountsRelativeRows) {
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  const Roles r = roles(23);
  const auto full = synthetic<float>(23, 6, Norms::mixed, 323);
  auto input = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Shard<0>{}),
                                                       kshard::HostMatrix<const float>(full));
  const auto output = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}),
      kshard::HostMatrix<const float>(kshard::test::reference_matrix<float>(23, 6, 400)));
  const auto config = RepairConfig(true, 1e-6, 5).keep_rows({r.kept});  // 3 damaged: fine
  EXPECT_EQ(kshard::find_damaged_rows(input, config)->repaired_row_ids.size(), 3u);
  const std::uint64_t before = checksum(input);
  const auto relative = config.relative_threshold(0.5);  // 6 damaged: refused
  for (const bool dry_run : {true, false}) {
    const auto message = collective_error([&] {
      if (dry_run)
        (void)kshard::find_damaged_rows(input, relative);
      else
        (void)kshard::repair_embedding_rows(input, output, relative);
    });
    EXPECT_NE(message.find(fmt::format(
                  "kshard::{}: 6 rows of 'embed_tokens' are damaged, more than max_rows = 5 (3 "
                  "of them below 0.5 x the median norm",
                  dry_run ? "find_damaged_rows" : "repair_embedding_rows")),
              std::string::npos)
        << message;
    EXPECT_TRUE(all_ranks(checksum(input) == before));
  }
}

TEST(RepairRelative, ThresholdIsAgreedOn) {
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  const auto full = synthetic<float>(23, 6, Norms::mixed, 323);
  auto input = kshard::distribute<ExecSpace, MemSpace>(line, Layout(Shard<0>{}),
                                                       kshard::HostMatrix<const float>(full));
  const auto output = kshard::distribute<ExecSpace, MemSpace>(
      line, Layout(Shard<0>{}),
      kshard::HostMatrix<const float>(kshard::test::reference_matrix<float>(23, 6, 400)));
  const auto base = RepairConfig(true, 1e-6, 64);
  const std::vector<kshard::test::Watched> watched{kshard::test::watch(input)};
  for (const bool dry_run : {true, false}) {
    const auto run = [&](const RepairConfig& config) {
      if (dry_run)
        (void)kshard::find_damaged_rows(input, config);
      else
        (void)kshard::repair_embedding_rows(input, output, config);
    };
    kshard::test::expect_collective_refusal(
        dry_run ? "find_damaged_rows, 0.4 on one rank" : "repair_embedding_rows, 0.4 on one rank",
        {"RepairConfig::relative_threshold() differs between ranks: 0.5 on rank 0, 0.4 on "
         "another"},
        [&](bool here) { run(base.relative_threshold(here ? 0.4 : 0.5)); }, watched, true);
    kshard::test::expect_collective_refusal(
        dry_run ? "find_damaged_rows, off on one rank" : "repair_embedding_rows, off on one rank",
        {"RepairConfig::relative_threshold() differs between ranks: 0.5 on rank 0, off on "
         "another"},
        [&](bool here) { run(here ? base : base.relative_threshold(0.5)); }, watched, true);
  }
}

TEST(RepairRelative, ThresholdIsValidatedLocally) {
  for (const double bad : {0.0, -0.5, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    kshard::test::expect_local_refusal(
        fmt::format("relative_threshold({})", bad),
        fmt::format("kshard::RepairConfig: relative_threshold is {}; it must be in (0, 1]", bad),
        [&](bool here) {
          if (here) (void)RepairConfig{}.relative_threshold(bad);
        });
  }
  EXPECT_EQ(RepairConfig{}.relative_threshold(1.0).relative_threshold(), 1.0);
  EXPECT_EQ(RepairConfig{}.relative_threshold(1e-300).relative_threshold(), 1e-300);
}

// A constant number of collectives whatever the vocabulary size: the relative test adds 8.
TEST(RepairRelative, ConstantCollectives) {
  const auto grid = kshard::test::dp_tp_mesh();
  const Layout layout(Shard<0>{}, Shard<1>{});
  const int column_dims = grid.extent(1) > 1 ? 1 : 0;  // mesh dims splitting the hidden axis
  for (const index_t rows : {64, 4096}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows);
    auto full = kshard::test::reference_matrix<float>(rows, 16, 42);
    for (std::size_t c = 0; c < 16; ++c) full(3, c) = 0.0f;
    const auto make = [&](const kshard::HostMatrix<float>& m) {
      return kshard::distribute<ExecSpace, MemSpace>(grid, layout,
                                                     kshard::HostMatrix<const float>(m));
    };
    auto input = make(full);
    const auto output = make(kshard::test::reference_matrix<float>(rows, 16, 43));
    const auto config = RepairConfig(true, 1e-6, rows).relative_threshold(0.5);
    kshard::reset_comm_stats();
    (void)kshard::find_damaged_rows(input, config);
    EXPECT_EQ(kshard::comm_stats().collectives, 12 + column_dims);
    EXPECT_EQ(kshard::comm_stats().agreements, 1);
    kshard::reset_comm_stats();
    (void)kshard::repair_embedding_rows(input, output, config);
    EXPECT_EQ(kshard::comm_stats().collectives, 14 + column_dims);
    EXPECT_EQ(kshard::comm_stats().agreements, 1);
  }
}

}  // namespace
