// A bare integer after the ids is no call at all: not the lookup's scale (a floating-point
// number) nor its tp_dim (a kshard::TpDim; the bare-integer spelling is gone, CHANGELOG.md).
#include <kshard/kshard.hpp>

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
