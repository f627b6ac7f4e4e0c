// The execution-space instance overloads and the communication layer's Kokkos Tools regions:
// results on a non-default instance equal the default forms', no operation fences globally
// (where Kokkos reports fences to tools), and every collective opens a region named after the
// kshard operation.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kshard/distribute.hpp"
#include "kshard/redistribute.hpp"
#include "kshard/repair.hpp"
#include "kshard/rowwise.hpp"
#include "kshard/tensor_parallel.hpp"
#include "kshard_test.hpp"

namespace {

using kshard::index_t;
using kshard::Layout;
using kshard::test::all_ranks;
using kshard::test::ExecSpace;
using kshard::test::MemSpace;
using kshard::test::other_instance;
using kshard::test::reference_matrix;
using kshard::test::world_size;

// The names of the Kokkos Tools regions pushed while it lives.
class RegionLog {
 public:
  RegionLog() {
    names().clear();
    Kokkos::Tools::Experimental::set_push_region_callback(
        [](const char* name) { names().emplace_back(name); });
  }
  ~RegionLog() { Kokkos::Tools::Experimental::set_push_region_callback(nullptr); }
  RegionLog(const RegionLog&) = delete;
  RegionLog& operator=(const RegionLog&) = delete;
  [[nodiscard]] bool saw(const std::string& name) const {
    return std::find(names().begin(), names().end(), name) != names().end();
  }

 private:
  static std::vector<std::string>& names() {
    static std::vector<std::string> log;
    return log;
  }
};

TEST(Instance, RowwiseAndGatherMatchTheDefaultForms) {
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const auto full = reference_matrix<float>(13, 7, 71);
  const Layout<kshard::Shard<0>, kshard::Shard<1>> layout;
  const auto space = other_instance();
  auto a =
      kshard::distribute<ExecSpace, MemSpace>(mesh, layout, kshard::HostMatrix<const float>(full));
  auto b = kshard::distribute<ExecSpace, MemSpace>(space, mesh, layout,
                                                   kshard::HostMatrix<const float>(full));
  kshard::zero_row(a, 5);
  kshard::zero_row(space, b, 5);
  const auto norms_a =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::row_squared_norms(a));
  const auto norms_b =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::row_squared_norms(space, b));
  bool ok = norms_a.extent(0) == norms_b.extent(0);
  for (std::size_t i = 0; ok && i < norms_a.extent(0); ++i) ok = norms_a(i) == norms_b(i);
  const auto whole_a = kshard::gather(a);
  const auto whole_b = kshard::gather(space, b);
  const auto root_b = kshard::gather(space, b, kshard::Root{world_size() - 1});
  for (index_t r = 0; r < 13; ++r)
    for (index_t c = 0; c < 7; ++c) {
      ok = ok && whole_a(r, c) == (r == 5 ? 0.0f : full(r, c)) && whole_b(r, c) == whole_a(r, c);
      if (kshard::test::world_rank() == world_size() - 1) ok = ok && root_b(r, c) == whole_a(r, c);
    }
  auto scattered = kshard::distribute<ExecSpace, MemSpace>(
      space, mesh, layout, kshard::HostMatrix<const float>(full), kshard::Root{0});
  const auto whole_s = kshard::gather(space, scattered);
  for (index_t r = 0; r < 13; ++r)
    for (index_t c = 0; c < 7; ++c) ok = ok && whole_s(r, c) == full(r, c);
  EXPECT_TRUE(all_ranks(ok));
}

TEST(Tools, EveryCollectiveOpensARegionNamedAfterTheOperation) {
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const auto full = reference_matrix<double>(9, 6, 72);
  auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      mesh, Layout<kshard::Shard<0>, kshard::Shard<1>>(), kshard::HostMatrix<const double>(full));
  const RegionLog log;
  (void)kshard::row_squared_norms(matrix);
  (void)kshard::gather(matrix);
  (void)kshard::gather(matrix, kshard::Root{0});
  bool ok = log.saw("kshard::gather::allgatherv") && log.saw("kshard::gather::gatherv") &&
            log.saw("kshard::gather::allreduce");  // the agreement
  // The norms agree on the matrix on every layout (an all-reduce) where there is more than one
  // rank, then reduce over the column shards where there are several.
  ok = ok && log.saw("kshard::row_squared_norms::allreduce") == (mesh.size() > 1);
  EXPECT_TRUE(all_ranks(ok));
}

#if KOKKOS_VERSION >= 30700
// Kokkos reports fences to tools with the instance they wait for; a global fence (every
// instance of the device) has instance id 0. The names say who fenced when a test fails.
// Kokkos 4 and later also fence globally whenever they free HostSpace memory: kshard's host
// copies avoid that (kernels/host_copy.hpp), but on a host backend the matrix's own memory
// space is HostSpace, and the scratch an operation frees there fences in Kokkos itself.
class GlobalFences {
 public:
  GlobalFences() {
    names().clear();
    Kokkos::Tools::Experimental::set_begin_fence_callback(
        [](const char* name, std::uint32_t device, std::uint64_t* handle) {
          *handle = 0;
          if (Kokkos::Tools::Experimental::identifier_from_devid(device).instance_id == 0 &&
              !(std::is_same_v<MemSpace, Kokkos::HostSpace> && is_host_space_free(name)))
            names().emplace_back(name);
        });
  }
  ~GlobalFences() { Kokkos::Tools::Experimental::set_begin_fence_callback(nullptr); }
  GlobalFences(const GlobalFences&) = delete;
  GlobalFences& operator=(const GlobalFences&) = delete;
  static bool is_host_space_free(std::string_view name) {
    return name.ends_with("HostSpace::impl_deallocate before free");  // spelled so since 4.6
  }
  static std::vector<std::string>& names() {
    static std::vector<std::string> seen;
    return seen;
  }
  static std::string list() {
    std::string text;
    for (const auto& name : names()) text += "\n  " + name;
    return text;
  }
};

TEST(Instance, RowNormsFenceNothingGlobally) {
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const auto full = reference_matrix<float>(11, 8, 73);
  const auto space = other_instance();
  auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      space, mesh, Layout<kshard::Replicate, kshard::Shard<1>>(),
      kshard::HostMatrix<const float>(full));
  const GlobalFences fences;
  kshard::zero_row(space, matrix, 3);
  // Kept until counted: freeing device memory may fence, and that is the test's doing.
  const auto norms = kshard::row_squared_norms(space, matrix);
  EXPECT_TRUE(all_ranks(GlobalFences::names().empty())) << GlobalFences::list();
}

TEST(Instance, RedistributeFencesNothingGlobally) {
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const auto full = reference_matrix<float>(12, 10, 74);
  const auto space = other_instance();
  auto matrix = kshard::distribute<ExecSpace, MemSpace>(
      space, mesh, Layout<kshard::Shard<0>, kshard::Shard<1>>(),
      kshard::HostMatrix<const float>(full));
  auto target = kshard::redistribute(space, matrix, Layout<kshard::Shard<1>, kshard::Replicate>());
  auto plan = kshard::plan_redistribute(space, matrix, target);
  const GlobalFences fences;
  kshard::redistribute_into(space, matrix, target);
  plan.apply(space, matrix, target);
  EXPECT_TRUE(all_ranks(GlobalFences::names().empty())) << GlobalFences::list();
}

TEST(Instance, LookupAndRepairFenceNothingGlobally) {
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const auto space = other_instance();
  auto full = reference_matrix<float>(16, 6, 75);
  for (index_t c = 0; c < 6; ++c) full(5, c) = 0.0f;  // a damaged row for the repair
  auto table = kshard::distribute<ExecSpace, MemSpace>(
      space, mesh, Layout<kshard::Replicate, kshard::Shard<0>>(),
      kshard::HostMatrix<const float>(full));
  const Kokkos::View<std::int64_t*, MemSpace> ids("ids", 4);
  Kokkos::deep_copy(space, ids, std::int64_t{5});
  kshard::detail::fence(space, "test: the ids are set");
  // One table, no LM head: its own healthy rows' mean direction.
  const kshard::RepairConfig config(true, 1e-6, 16, kshard::RepairStrategy::mean_direction);
  const GlobalFences fences;
  const auto looked_up = kshard::vocab_parallel_lookup(space, table, ids, kshard::TpDim{1});
  const auto report = kshard::repair_embedding_rows(space, table, config);
  EXPECT_TRUE(all_ranks(report && report->repaired_row_ids == std::vector<index_t>{5}));
  EXPECT_TRUE(all_ranks(GlobalFences::names().empty())) << GlobalFences::list();
}

// kshard's own fences (labels "kshard: ..."), counted while it lives: Kokkos's internal
// fences, which kshard does not choose, are left out.
class KshardFences {
 public:
  KshardFences() {
    count() = 0;
    Kokkos::Tools::Experimental::set_begin_fence_callback(
        [](const char* name, std::uint32_t, std::uint64_t* handle) {
          *handle = 0;
          if (std::string_view(name).starts_with("kshard: ")) ++count();
        });
  }
  ~KshardFences() { Kokkos::Tools::Experimental::set_begin_fence_callback(nullptr); }
  KshardFences(const KshardFences&) = delete;
  KshardFences& operator=(const KshardFences&) = delete;
  static int& count() {
    static int fences = 0;
    return fences;
  }
};

// The four collectives that read one view and write another, over the whole mesh, each checked
// against the values every rank sent (rank r sends 100 r + i at i); returns the fences of kshard
// each took.
std::vector<int> fences_per_collective(const kshard::comm::Group& group, const ExecSpace& space) {
  using View = Kokkos::View<double*, MemSpace>;
  const int n = group.size();
  const int me = group.rank();
  const View send("send", n);
  const View own("own", 1);
  const View all("all", n);
  const View one("one", 1);
  Kokkos::deep_copy(space, own, 100.0 * me);
  const auto host_send = Kokkos::create_mirror_view(send);
  for (int i = 0; i < n; ++i) host_send(i) = 100.0 * me + i;
  Kokkos::deep_copy(space, send, host_send);
  const std::vector<int> ones(n, 1);
  std::vector<int> displs(n);
  for (int r = 0; r < n; ++r) displs[r] = r;
  const double rank_sum = 100.0 * n * (n - 1) / 2;  // sum over r of 100 r

  std::vector<int> fences;
  bool ok = true;
  const auto run = [&](auto&& collective, const View& out, auto&& expected) {
    const KshardFences counted;
    collective();
    fences.push_back(KshardFences::count());
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    for (int i = 0; i < static_cast<int>(out.extent(0)); ++i) ok = ok && host(i) == expected(i);
  };
  run([&] { group.allreduce(space, send, all, kshard::ReduceOp::sum); }, all,
      [&](int i) { return rank_sum + n * i; });
  run([&] { group.allgatherv(space, own, all, ones.data(), displs.data()); }, all,
      [&](int r) { return 100.0 * r; });
  run(
      [&] {
        group.alltoallv(space, send, ones.data(), displs.data(), all, ones.data(), displs.data());
      },
      all, [&](int r) { return 100.0 * r + me; });
  run([&] { group.reduce_scatter(space, send, one, ones.data(), kshard::ReduceOp::sum); }, one,
      [&](int) { return rank_sum + n * me; });
  EXPECT_TRUE(all_ranks(ok)) << "a collective's result differs from the values sent";
  return fences;
}

// A GPU fence is a stream synchronisation. Handed to MPI directly, the buffers of a collective
// cost one fence of their instance, not one per view; staged, a fence after the copy in and
// one after the copy out, none before (the copies run on the instance, after its work).
TEST(Instance, ACollectiveFencesItsInstanceOnce) {
  const kshard::Mesh<2> mesh = kshard::test::dp_tp_mesh();
  const auto space = other_instance();
  using View = Kokkos::View<double*, MemSpace>;
  const int direct_each = kshard::detail::mpi_uses_view_memory<View>() ? 1 : 2;
  const auto direct = fences_per_collective(mesh.group(), space);
  EXPECT_TRUE(all_ranks(direct == std::vector<int>(4, direct_each)))
      << testing::PrintToString(direct);
  const kshard::test::ForcedStaging force;
  const auto staged = fences_per_collective(mesh.group(), space);
  EXPECT_TRUE(all_ranks(staged == std::vector<int>(4, 2))) << testing::PrintToString(staged);
}
#endif

}  // namespace
