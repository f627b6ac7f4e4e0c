// zero_row and row_squared_norms on every layout of mesh rank 1 and 2, against serial
// computations on the gathered matrix.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kshard/comm/stats.hpp"
#include "kshard/distribute.hpp"
#include "kshard/format.hpp"
#include "kshard/repair.hpp"
#include "kshard/rowwise.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::test::all_ranks;
using kshard::test::collective_error;
using kshard::test::ExecSpace;
using kshard::test::MemSpace;
using kshard::test::reference_matrix;
using kshard::test::world_size;

template <class T, class L, std::size_t M>
void check_zero_row(const kshard::Mesh<M>& mesh, const L& layout, index_t rows, index_t cols,
                    std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << fmt::format("{} on {}: {} x {}", layout, mesh, rows, cols));
  const auto full = reference_matrix<T>(rows, cols, seed);
  for (index_t row = -rows; row < rows; ++row) {
    auto matrix =
        kshard::distribute<ExecSpace, MemSpace>(mesh, layout, kshard::HostMatrix<const T>(full));
    kshard::reset_comm_stats();
    const bool held = kshard::zero_row(matrix, row);
    const bool silent = kshard::comm_stats().collectives == 0;
    const auto after = kshard::gather(matrix);
    const index_t target = row < 0 ? row + rows : row;
    bool ok = silent;
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c)
        ok = ok && after(r, c) == (r == target ? T(0.0f) : full(r, c));
    // Held: this rank's rows include the target and its column shard is not empty.
    const auto& map = matrix.mapping();
    ok = ok && held == (map.rows.is_local(target) && map.cols.local_extent() > 0);
    EXPECT_TRUE(all_ranks(ok)) << "row " << row;
  }
  auto matrix =
      kshard::distribute<ExecSpace, MemSpace>(mesh, layout, kshard::HostMatrix<const T>(full));
  const auto message = collective_error([&] { kshard::zero_row(matrix, rows); });
  EXPECT_NE(message.find(fmt::format("row {} is out of range for a matrix of {} rows", rows, rows)),
            std::string::npos)
      << message;
  EXPECT_FALSE(collective_error([&] { kshard::zero_row(matrix, -rows - 1); }).empty());
}

TEST(ZeroRow, EveryLayoutAndRow) {
  std::uint64_t seed = 1000;
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  const auto grid = kshard::test::dp_tp_mesh();
  kshard::test::for_each_layout(
      seed,
      [&](const auto& layout) {
        check_zero_row<float>(line, layout, 7, 3, seed);
        check_zero_row<kshard::bf16>(line, layout, 2, 5, seed);  // fewer rows than ranks
        check_zero_row<kshard::f16>(line, layout, 5, 3, seed);
      },
      [&](const auto& layout) { check_zero_row<double>(grid, layout, 9, 4, seed); });
}

// Squares in fp32 (fp64 for double), sums in fp64, over the whole row: the spec, plainly.
template <class T>
std::vector<double> reference_norms(const kshard::HostMatrix<T>& full) {
  std::vector<double> norms(full.extent(0), 0.0);
  for (std::size_t r = 0; r < full.extent(0); ++r)
    for (std::size_t c = 0; c < full.extent(1); ++c) {
      const auto v = static_cast<double>(static_cast<kshard::compute_type_t<T>>(full(r, c)));
      norms[r] += v * v;
    }
  return norms;
}

template <class T, class L, std::size_t M>
void check_norms(const kshard::Mesh<M>& mesh, const L& layout, index_t rows, index_t cols,
                 std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << fmt::format("{} on {}: {} x {}", layout, mesh, rows, cols));
  const auto full = reference_matrix<T>(rows, cols, seed);
  const auto matrix =
      kshard::distribute<ExecSpace, MemSpace>(mesh, layout, kshard::HostMatrix<const T>(full));
  const auto expected = reference_norms(full);
  const auto norms =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::row_squared_norms(matrix));
  const auto& map = matrix.mapping().rows;
  bool ok = static_cast<index_t>(norms.extent(0)) == map.local_extent();
  for (index_t i = 0; ok && i < map.local_extent(); ++i) {
    const double want = expected[static_cast<std::size_t>(map.to_global(i))];
    ok = std::abs(norms(static_cast<std::size_t>(i)) - want) <= 1e-12 * want;
  }
  EXPECT_TRUE(all_ranks(ok));
}

TEST(RowSquaredNorms, EveryLayoutAgainstSerial) {
  std::uint64_t seed = 2000;
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  const auto grid = kshard::test::dp_tp_mesh();
  kshard::test::for_each_layout(
      seed,
      [&](const auto& layout) {
        check_norms<float>(line, layout, 13, 37, seed);  // 37: a 4-wide loop and a remainder
        check_norms<double>(line, layout, 3, 2, seed);
        check_norms<kshard::bf16>(line, layout, 0, 4, seed);
        check_norms<kshard::f16>(line, layout, 6, 11, seed);
      },
      [&](const auto& layout) { check_norms<float>(grid, layout, 11, 9, seed); });
}

// Norms are squared in fp64: fp32 entries near 2e19 square past FLT_MAX but their row is finite,
// so repair leaves it alone and repairs only the zero row.
TEST(RowSquaredNorms, LargeFiniteEntriesStayFinite) {
  kshard::Mesh<1> line(MPI_COMM_WORLD, {world_size()});
  kshard::HostMatrix<float> full("large", 5, 3);
  for (std::size_t r = 0; r < 5; ++r)
    for (std::size_t c = 0; c < 3; ++c)
      full(r, c) = r == 2 ? 0.0f : 2e19f * (1.0f + 0.1f * static_cast<float>(c));
  const auto table = kshard::distribute<ExecSpace, MemSpace>(line, Layout(kshard::Shard<1>{}),
                                                             kshard::HostMatrix<const float>(full));
  const auto norms =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::row_squared_norms(table));
  const auto expected = reference_norms(full);
  bool ok = true;
  for (std::size_t r = 0; r < 5; ++r)
    ok = ok && std::isfinite(norms(r)) && std::abs(norms(r) - expected[r]) <= 1e-12 * expected[r];
  EXPECT_TRUE(all_ranks(ok));
  const auto report = kshard::repair_embedding_rows(
      table, kshard::RepairConfig(true, 1e-6, 4, kshard::RepairStrategy::mean_direction));
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->repaired_row_ids, (std::vector<index_t>{2}));
}

// Only the mesh dimensions that split columns communicate, once each.
TEST(RowSquaredNorms, CommunicatesOnlyOverColumnShards) {
  const int size = world_size();
  kshard::Mesh<1> line(MPI_COMM_WORLD, {size});
  Layout rows_only(kshard::Shard<0>{});
  Layout cols_only(kshard::Shard<1>{});
  const auto full = reference_matrix<float>(8, 8, 3);
  const auto by_rows = kshard::distribute<ExecSpace, MemSpace>(
      line, rows_only, kshard::HostMatrix<const float>(full));
  const auto by_cols = kshard::distribute<ExecSpace, MemSpace>(
      line, cols_only, kshard::HostMatrix<const float>(full));
  kshard::reset_comm_stats();
  (void)kshard::row_squared_norms(by_rows);
  const auto after_rows = kshard::comm_stats().collectives;
  (void)kshard::row_squared_norms(by_cols);
  EXPECT_EQ(after_rows, 0);
  EXPECT_EQ(kshard::comm_stats().collectives, size > 1 ? 1 : 0);
}

TEST(Bfloat16, RoundsToNearestEven) {
  EXPECT_EQ(static_cast<float>(kshard::bfloat16(1.0f)), 1.0f);
  EXPECT_EQ(static_cast<float>(kshard::bfloat16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even neighbour, 1.
  EXPECT_EQ(static_cast<float>(kshard::bfloat16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(static_cast<float>(kshard::bfloat16(1.0f + 0x1.8p-8f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(static_cast<float>(kshard::bfloat16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(static_cast<float>(kshard::bfloat16(INFINITY))));
  EXPECT_EQ(kshard::bfloat16(3.0f).bits(), 0x4040);
}

}  // namespace
