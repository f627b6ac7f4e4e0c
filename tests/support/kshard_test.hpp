#pragma once

// Shared by the MPI tests: the backend under test and helpers that keep ranks in step.

#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kshard/comm/staging.hpp"
#include "kshard/distribute.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh.hpp"
#include "kshard/placement.hpp"

namespace kshard::test {

using kshard::index_t;

#ifdef KSHARD_TEST_EXECUTION_SPACE
// Set per test executable by CMake: the same tests are built once per Kokkos backend.
using ExecSpace = KSHARD_TEST_EXECUTION_SPACE;
using MemSpace = typename ExecSpace::memory_space;

// The distributed matrix the tests build: on the tested backend, in its default memory.
template <class T, class L>
using Matrix = kshard::DistMatrix<T, L, ExecSpace, MemSpace>;

// An instance of ExecSpace other than the default where Kokkos can make one (a partition,
// Kokkos 4 and later), else a separately constructed one: an operation given it must give the
// default form's results either way. The partition is made once and released when Kokkos
// finalizes (Kokkos 5 aborts when an instance outlives Kokkos::finalize).
inline ExecSpace other_instance() {
#if KOKKOS_VERSION >= 40000
  static std::optional<ExecSpace> instance;
  if (!instance) {
    instance = Kokkos::Experimental::partition_space(ExecSpace(), 1, 1)[1];
    Kokkos::push_finalize_hook([] { instance.reset(); });
  }
  return *instance;
#else
  return ExecSpace();
#endif
}
#endif

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// True on every rank when `ok` holds on every rank. Assert on its result, never on a
// rank-local condition before a collective, so no rank leaves the others waiting.
inline bool all_ranks(bool ok) {
  int mine = ok ? 1 : 0;
  int all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all == 1;
}

// Runs `make` on every rank and returns the kshard::error message it threw ("" if none),
// failing the test unless every rank threw exactly the same message.
template <class Make>
std::string collective_error(Make&& make) {
  std::string message;
  try {
    make();
  } catch (const kshard::error& e) {
    message = e.what();
  }
  const int length = static_cast<int>(message.size());
  int min_length = 0;
  int max_length = 0;
  MPI_Allreduce(&length, &min_length, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&length, &max_length, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(min_length, max_length) << "ranks threw different messages: " << message;
  std::string root = message;
  MPI_Bcast(&max_length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  root.resize(static_cast<std::size_t>(max_length));
  MPI_Bcast(root.data(), max_length, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_TRUE(all_ranks(root == message)) << "this rank: " << message << " rank 0: " << root;
  return message;
}

// Every way to write `size` as an ordered product of N extents >= 1.
template <std::size_t N>
std::vector<std::array<int, N>> mesh_shapes(int size) {
  std::vector<std::array<int, N>> shapes;
  std::array<int, N> shape{};
  auto fill = [&](auto& self, std::size_t m, int left) -> void {
    if (m + 1 == N) {
      shape[m] = left;
      shapes.push_back(shape);
      return;
    }
    for (int e = 1; e <= left; ++e)
      if (left % e == 0) {
        shape[m] = e;
        self(self, m + 1, left / e);
      }
  };
  fill(fill, 0, size);
  return shapes;
}

// The base of every random case: KSHARD_TEST_SEED replays (or varies) the whole set; the test
// main prints it, and each randomised check traces its own salt.
inline std::uint64_t base_seed() {
  static const std::uint64_t seed = [] {
    const char* text = std::getenv("KSHARD_TEST_SEED");
    return text != nullptr ? std::strtoull(text, nullptr, 0) : std::uint64_t{0x5eed};
  }();
  return seed;
}

// The same pseudo-random stream on every rank (tests need rank-independent global data).
inline std::mt19937_64 shared_rng(std::uint64_t salt) {
  return std::mt19937_64(base_seed() + salt);
}

// The placements every test enumerates layouts from.
using AnyPlacement = std::tuple<kshard::Replicate, kshard::Shard<0>, kshard::Shard<1>,
                                kshard::StridedShard<0>, kshard::StridedShard<1>>;

template <class P>
P make_placement(std::mt19937_64& rng) {
  if constexpr (P::kind == kshard::PlacementKind::strided_shard)
    return P{std::uniform_int_distribution<index_t>(1, 3)(rng)};
  else
    return P{};
}

// Forces staging through host buffers for its lifetime, even if the body throws: a host build
// then runs the path a GPU takes with an MPI that cannot read device memory.
class ForcedStaging {
 public:
  ForcedStaging() { kshard::detail::force_host_staging() = true; }
  ~ForcedStaging() { kshard::detail::force_host_staging() = false; }
  ForcedStaging(const ForcedStaging&) = delete;
  ForcedStaging& operator=(const ForcedStaging&) = delete;
};

// A full matrix with a distinct, rank-independent value in every element.
template <class T>
kshard::HostMatrix<T> reference_matrix(index_t rows, index_t cols, std::uint64_t seed) {
  kshard::HostMatrix<T> full("reference", static_cast<std::size_t>(rows),
                             static_cast<std::size_t>(cols));
  auto rng = kshard::test::shared_rng(seed);
  std::uniform_real_distribution<double> value(-1.0, 1.0);
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) full(r, c) = static_cast<T>(value(rng));
  return full;
}

// Whether two rank-2 views (host or device, LayoutRight) have the same extents and the same
// bytes: exact equality, NaN and -0 included.
template <class A, class B>
bool same_bits(const A& a, const B& b) {
  static_assert(std::is_same_v<typename A::non_const_value_type, typename B::non_const_value_type>);
  const auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  const auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  return ha.extent(0) == hb.extent(0) && ha.extent(1) == hb.extent(1) &&
         std::memcmp(ha.data(), hb.data(), ha.span() * sizeof(typename A::value_type)) == 0;
}

template <std::size_t... I, class F>
void for_each_placement(std::index_sequence<I...>, F&& f) {
  (f(std::tuple_element_t<I, AnyPlacement>{}), ...);
}

template <class F>
void for_each_placement(F&& f) {
  for_each_placement(std::make_index_sequence<std::tuple_size_v<AnyPlacement>>{}, f);
}

// Calls `one(layout)` for every layout of one placement and `two(layout)` for every layout of
// two, with split factors drawn from `seed` (advanced once per layout).
template <class One, class Two>
void for_each_layout(std::uint64_t& seed, One&& one, Two&& two) {
  for_each_placement([&](auto p) {
    auto rng = shared_rng(seed++);
    one(kshard::Layout(make_placement<decltype(p)>(rng)));
    for_each_placement([&](auto q) {
      auto rng2 = shared_rng(seed++);
      two(kshard::Layout(make_placement<decltype(p)>(rng2), make_placement<decltype(q)>(rng2)));
    });
  });
}

// The (dp, tp) mesh most tests use: (2, n / 2) on an even world size, else (1, n).
inline kshard::Mesh<2> dp_tp_mesh() {
  const int size = world_size();
  const int dp = size % 2 == 0 ? 2 : 1;
  return kshard::Mesh<2>(MPI_COMM_WORLD, {dp, size / dp}, {"dp", "tp"});
}

// FNV-1a over the local shard's bytes: identical before and after a refusal.
template <class M>
std::uint64_t checksum(const M& matrix) {
  const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), matrix.local());
  std::uint64_t hash = 0xcbf29ce484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(local.data());
  for (std::size_t i = 0; i < local.span() * sizeof(typename M::value_type); ++i)
    hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

// A matrix whose checksum a refusal must not change.
using Watched = std::function<std::uint64_t()>;
template <class M>
Watched watch(const M& matrix) {
  return [&matrix] { return checksum(matrix); };
}

// `bad(here)`: the operation with a bad argument where `here` is true. Runs it bad on every
// rank, then bad on the last rank only; each time every rank must throw a message containing
// one of `phrases`, the same everywhere, and `watched` must not change.
inline void expect_collective_refusal(const std::string& name,
                                      const std::vector<std::string>& phrases,
                                      const std::function<void(bool)>& bad,
                                      const std::vector<Watched>& watched = {},
                                      bool one_rank_only = false) {
  for (const bool everywhere : {true, false}) {
    if (one_rank_only && (everywhere || world_size() == 1)) continue;
    SCOPED_TRACE(fmt::format("{}: bad on {}", name, everywhere ? "every rank" : "the last rank"));
    std::vector<std::uint64_t> before;
    for (const Watched& sum : watched) before.push_back(sum());
    const bool here = everywhere || world_rank() == world_size() - 1;
    const std::string message = collective_error([&] { bad(here); });
    bool named = false;
    for (const auto& phrase : phrases) named = named || message.find(phrase) != std::string::npos;
    EXPECT_TRUE(named) << "'" << message << "'";
    std::vector<std::uint64_t> after;
    for (const Watched& sum : watched) after.push_back(sum());
    EXPECT_TRUE(all_ranks(before == after)) << "a refusal changed a matrix";
  }
  EXPECT_TRUE(all_ranks(true));  // the next collective still runs
}

// A local check: exactly the ranks given a bad value throw, the others carry on.
inline void expect_local_refusal(const std::string& name, const std::string& phrase,
                                 const std::function<void(bool)>& bad) {
  for (const bool everywhere : {true, false}) {
    SCOPED_TRACE(fmt::format("{}: bad on {}", name, everywhere ? "every rank" : "the last rank"));
    const bool here = everywhere || world_rank() == world_size() - 1;
    std::string message;
    try {
      bad(here);
    } catch (const kshard::error& e) {
      message = e.what();
    }
    EXPECT_TRUE(all_ranks(here ? message.find(phrase) != std::string::npos : message.empty()))
        << message;
  }
}

}  // namespace kshard::test
