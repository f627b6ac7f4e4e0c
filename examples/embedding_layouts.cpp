// A vocabulary embedding table under the layouts FSDP, TP and FSDP x TP give it.
//
// For each layout: the sharding picture, what every rank holds, and a check that a table
// filled shard by shard inside a Kokkos kernel (from the global row and column of each local
// element) gathers to exactly the table a serial code would build.
//
//   mpiexec -n 4 ./embedding_layouts        # a (dp=2, tp=2) mesh; other counts use (dp=1, tp=n)

#include <kshard/kshard.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr kshard::index_t vocab = 10;  // uneven on purpose: 10 rows over 4 ranks
constexpr kshard::index_t hidden = 6;

// The value a serial code would store at (token, feature).
KOKKOS_INLINE_FUNCTION float embedding_value(kshard::index_t token, kshard::index_t feature) {
  return static_cast<float>(token) + 0.1F * static_cast<float>(feature);
}

// Rank 0 prints one line per rank, in rank order.
void print_ordered(MPI_Comm comm, const std::string& line) {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int length = static_cast<int>(line.size());
  std::vector<int> lengths(static_cast<std::size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm);
  std::vector<int> offsets(static_cast<std::size_t>(size), 0);
  for (std::size_t r = 1; r < offsets.size(); ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(rank == 0 ? static_cast<std::size_t>(offsets.back() + lengths.back()) : 0, ' ');
  MPI_Gatherv(line.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
              0, comm);
  if (rank == 0) std::fputs(all.c_str(), stdout);
}

template <class L, std::size_t N>
bool show(const kshard::Mesh<N>& mesh, const L& layout, const char* who) {
  kshard::DistMatrix<float, L> table(mesh, layout, vocab, hidden);
  if (mesh.my_rank() == 0)
    fmt::print("\n== {} ({})\n{}\n{}", fmt::format("{}", layout), who, table,
               kshard::sharding_picture(table));

  // Fill the shard on the device from global indices: no communication, no full table.
  const auto map = table.mapping();
  const auto local = table.local();
  Kokkos::parallel_for(
      "fill",
      Kokkos::MDRangePolicy<Kokkos::Rank<2>>({0, 0},
                                             {map.rows.local_extent(), map.cols.local_extent()}),
      KOKKOS_LAMBDA(const kshard::index_t i, const kshard::index_t j) {
        local(i, j) = embedding_value(map.rows.to_global(i), map.cols.to_global(j));
      });

  std::vector<std::string> runs;
  for (const auto& run : map.rows.runs())
    runs.push_back(run.size == 1 ? fmt::format("{}", run.global_begin)
                                 : fmt::format("{}-{}", run.global_begin, run.global_end() - 1));
  print_ordered(
      mesh.comm(),
      fmt::format("  rank {} at ({}): local {} x {}, rows [{}]{}\n", mesh.my_rank(),
                  fmt::join(mesh.coords(), ","), map.rows.local_extent(), map.cols.local_extent(),
                  fmt::join(runs, " "), map.rows.is_contiguous() ? "" : " (non-contiguous)"));

  const auto full = kshard::gather(table);
  bool same = true;
  for (kshard::index_t t = 0; t < vocab; ++t)
    for (kshard::index_t f = 0; f < hidden; ++f) same = same && full(t, f) == embedding_value(t, f);
  if (mesh.my_rank() == 0)
    fmt::print("  gathered table == serial reference: {}\n", same ? "yes" : "NO");
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int dp = size % 2 == 0 && size > 2 ? 2 : 1;
    const kshard::Mesh mesh(MPI_COMM_WORLD, {dp, size / dp}, {"dp", "tp"});
    if (mesh.my_rank() == 0)
      fmt::print("kshard: {} x {} embedding table on {} ({} ranks, Kokkos {})\n", vocab, hidden,
                 mesh, size, Kokkos::DefaultExecutionSpace::name());
    using kshard::Layout, kshard::Replicate, kshard::Shard, kshard::StridedShard;
    bool ok = true;
    ok &= show(mesh, Layout(Replicate{}, Shard<0>{}), "vocabulary-parallel (TP)");
    ok &= show(mesh, Layout(Shard<0>{}, Shard<0>{}), "FSDP then TP, both on rows");
    ok &= show(mesh, Layout(StridedShard<0>{mesh.extent(1)}, Shard<0>{}),
               "FSDP2 x TP: TP chunk first, FSDP chunk inside it");
    ok &= show(mesh, Layout(Shard<0>{}, StridedShard<0>{2}), "non-contiguous rows");
    ok &= show(mesh, Layout(Shard<0>{}, Shard<1>{}), "rows over dp, hidden over tp");
    if (mesh.my_rank() == 0)
      fmt::print("\n{}\n", ok ? "all layouts match the serial reference" : "MISMATCH");
    status = ok ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
