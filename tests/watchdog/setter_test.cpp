// kshard::set_collective_timeout and collective_timeout, and KSHARD_COLLECTIVE_TIMEOUT's
// parsing: bad values are refused naming the value, and collectives under the watchdog give the
// same results as without it. Its own MPI program, run at 1 and 2 ranks.

#include <kshard/kshard.hpp>

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

namespace {

// Restores the watchdog's setting and KSHARD_COLLECTIVE_TIMEOUT after each test.
class Watchdog : public testing::Test {
 protected:
  void TearDown() override {
    unsetenv(kshard::detail::timeout_variable);
    kshard::detail::watchdog_setting = saved_;
  }

  // The setting as if the process had started with KSHARD_COLLECTIVE_TIMEOUT=`text`.
  static void start_with_environment(const char* text) {
    setenv(kshard::detail::timeout_variable, text, 1);
    kshard::detail::watchdog_setting = kshard::detail::setting_from_environment();
  }

 private:
  kshard::detail::WatchdogSetting saved_ = kshard::detail::watchdog_setting;
};

// The message of the kshard::error `call` throws ("" when it throws none).
template <class Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const kshard::error& e) {
    return e.what();
  }
  return "";
}

kshard::HostMatrix<double> numbered(std::size_t rows, std::size_t cols) {
  kshard::HostMatrix<double> full("full", rows, cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) full(r, c) = static_cast<double>(100 * r + c);
  return full;
}

TEST_F(Watchdog, SetterRefusesBadValuesNamingThem) {
  kshard::set_collective_timeout(7);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_NE(error_of([] { kshard::set_collective_timeout(-3); }).find("-3 is not a valid"),
            std::string::npos);
  EXPECT_NE(error_of([&] { kshard::set_collective_timeout(inf); }).find("inf"), std::string::npos);
  EXPECT_NE(error_of([] { kshard::set_collective_timeout(std::nan("")); }).find("nan"),
            std::string::npos);
  EXPECT_EQ(kshard::collective_timeout(), 7);  // unchanged by the refused values
}

TEST_F(Watchdog, SetAndGetRoundTrip) {
  kshard::set_collective_timeout(2.5);
  EXPECT_EQ(kshard::collective_timeout(), 2.5);
  kshard::set_collective_timeout(0);
  EXPECT_EQ(kshard::collective_timeout(), 0);
  EXPECT_FALSE(kshard::detail::watchdog_on());
}

TEST_F(Watchdog, EnvironmentValues) {
  const std::pair<const char*, double> valid[] = {{"", 0}, {"0", 0}, {"5", 5}, {"0.25", 0.25}};
  for (const auto& [text, seconds] : valid) {
    start_with_environment(text);
    EXPECT_EQ(kshard::collective_timeout(), seconds) << "KSHARD_COLLECTIVE_TIMEOUT=" << text;
  }
  for (const char* text : {"abc", "-3", "5s", "5 ", "inf", "nan"}) {
    start_with_environment(text);
    const std::string message = error_of([] { (void)kshard::collective_timeout(); });
    EXPECT_NE(message.find(std::string("KSHARD_COLLECTIVE_TIMEOUT=") + text), std::string::npos)
        << message;
  }
  start_with_environment("abc");
  kshard::set_collective_timeout(3);  // the program's setting overrides the variable
  EXPECT_EQ(kshard::collective_timeout(), 3);
}

// Every rank sees the same environment, so every rank throws at the first collective.
TEST_F(Watchdog, InvalidEnvironmentThrowsAtTheFirstCollective) {
  const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {kshard::detail::comm_size(MPI_COMM_WORLD)});
  const auto full = numbered(6, 2);
  const auto matrix = kshard::distribute(mesh, kshard::Layout(kshard::Shard<0>{}),
                                         kshard::HostMatrix<const double>(full));
  start_with_environment("-3");
  const std::string message = error_of([&] { (void)kshard::gather(matrix); });
  EXPECT_NE(message.find("KSHARD_COLLECTIVE_TIMEOUT=-3 is not a valid timeout"), std::string::npos)
      << message;
}

TEST_F(Watchdog, GatherUnderTheWatchdogGivesTheSameMatrix) {
  const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {kshard::detail::comm_size(MPI_COMM_WORLD)});
  const auto full = numbered(7, 3);
  const auto matrix = kshard::distribute(mesh, kshard::Layout(kshard::Shard<0>{}),
                                         kshard::HostMatrix<const double>(full));
  kshard::set_collective_timeout(60);
  auto& watchdog = kshard::detail::Watchdog::instance();
  const auto watched_before = watchdog.completed();
  const auto back = kshard::gather(matrix);
  EXPECT_GT(watchdog.completed(), watched_before);  // watched by the watchdog thread
  for (std::size_t r = 0; r < full.extent(0); ++r)
    for (std::size_t c = 0; c < full.extent(1); ++c) EXPECT_EQ(back(r, c), full(r, c));
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    testing::InitGoogleTest(&argc, argv);
    const int mine = RUN_ALL_TESTS();
    MPI_Allreduce(&mine, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return status;
}
