// A bare integer after the ids is never the lookup's scale: it is the deprecated spelling of a
// tp_dim (an error here, where deprecations are), and once that goes, no call at all. The scale
// is a floating-point number, the mesh dimension a kshard::TpDim.
#include <kshard/kshard.hpp>

#pragma GCC diagnostic error "-Wdeprecated-declarations"

using L = kshard::Layout<kshard::Replicate, kshard::Shard<0>>;
using Table = kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace>;
using Ids = Kokkos::View<int*, Kokkos::HostSpace>;

void forward(const Table& table, const Ids& ids) {
#ifdef KSHARD_COMPILE_FAIL
  (void)kshard::vocab_parallel_lookup(table, ids, 2);
#else
  (void)kshard::vocab_parallel_lookup(table, ids, 2.0);
  (void)kshard::vocab_parallel_lookup(table, ids, kshard::TpDim{1}, 2);
#endif
}

int main() {
  void (*const instantiate)(const Table&, const Ids&) = &forward;
  (void)instantiate;
  return 0;
}
