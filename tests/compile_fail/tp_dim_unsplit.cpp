// tp_dim cannot be inferred when no mesh dimension shards the table's rows (a row-parallel
// weight's layout): the lookup without a kshard::TpDim must not compile.
#include <kshard/kshard.hpp>

#ifdef KSHARD_COMPILE_FAIL
using L = kshard::Layout<kshard::Replicate, kshard::Shard<1>>;
#else
using L = kshard::Layout<kshard::Replicate, kshard::Shard<0>>;
#endif
using Table = kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace>;
using Ids = Kokkos::View<int*, Kokkos::HostSpace>;

void forward(const Table& table, const Ids& ids) {
  (void)kshard::vocab_parallel_lookup(table, ids);
}

int main() {
  void (*const instantiate)(const Table&, const Ids&) = &forward;
  (void)instantiate;
  return 0;
}
