// Zeroing the padding token's embedding row on whatever layout the table has.
//
// zero_row touches only the local shard (no communication) and tells each rank whether it held
// part of the row: every replica and every column shard of the owner. It is right on
// non-contiguous StridedShard layouts too, where "offset + local row" arithmetic is wrong.
//
//   mpiexec -n 4 ./zero_padding_row

#include <kshard/kshard.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (moved here in fmt 11)

#include <string>
#include <vector>

namespace {

constexpr kshard::index_t vocab = 12;
constexpr kshard::index_t hidden = 4;
constexpr kshard::index_t padding_id = -3;  // counts from the end: token 9

template <class L, std::size_t N>
bool zero_padding(const kshard::Mesh<N>& mesh, const L& layout) {
  kshard::HostMatrix<double> ones("ones", vocab, hidden);
  Kokkos::deep_copy(ones, 1.0);
  auto table = kshard::distribute(mesh, layout, kshard::HostMatrix<const double>(ones));
  const bool held = kshard::zero_row(table, padding_id);

  // Who held it, gathered for printing on rank 0.
  const int mine = held ? 1 : 0;
  std::vector<int> all(static_cast<std::size_t>(mesh.size()));
  MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, mesh.comm());
  std::vector<std::string> holders;
  for (int r = 0; r < mesh.size(); ++r)
    if (all[static_cast<std::size_t>(r)] != 0)
      holders.push_back(fmt::format("({})", fmt::join(mesh.coords_of(r), ",")));

  const auto full = kshard::gather(table);
  bool ok = true;
  for (kshard::index_t t = 0; t < vocab; ++t)
    for (kshard::index_t h = 0; h < hidden; ++h)
      ok = ok && full(t, h) == (t == vocab + padding_id ? 0.0 : 1.0);
  if (mesh.my_rank() == 0)
    fmt::print("{:<36} row {} held by {:<28} {}\n", fmt::format("{}", layout), vocab + padding_id,
               fmt::format("{}", fmt::join(holders, " ")), ok ? "ok" : "WRONG");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 1;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int dp = size % 2 == 0 ? 2 : 1;
    const kshard::Mesh mesh(MPI_COMM_WORLD, {dp, size / dp}, {"dp", "tp"});
    if (mesh.my_rank() == 0)
      fmt::print("zeroing padding id {} of a {} x {} table on {}\n", padding_id, vocab, hidden,
                 mesh);
    using namespace kshard;
    bool ok = zero_padding(mesh, Layout(Replicate{}, Shard<0>{}));
    ok &= zero_padding(mesh, Layout(Shard<0>{}, Shard<0>{}));
    ok &= zero_padding(mesh, Layout(StridedShard<0>{mesh.extent(1)}, Shard<0>{}));
    ok &= zero_padding(mesh, Layout(Shard<0>{}, StridedShard<0>{2}));
    ok &= zero_padding(mesh, Layout(Shard<0>{}, Shard<1>{}));
    ok &= zero_padding(mesh, Layout(Replicate{}, Replicate{}));
    if (mesh.my_rank() == 0)
      fmt::print("{}\n", ok ? "padding row is zero on every layout" : "MISMATCH");
    status = ok ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
