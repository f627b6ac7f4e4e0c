// tp_dim cannot be inferred when two mesh dimensions shard the weight's output features: the
// column-parallel layer without a kshard::TpDim must not compile (nor with one: a tensor-parallel
// layer needs exactly one splitting mesh dimension, so a TpDim cannot settle it).
#include <kshard/kshard.hpp>

#ifdef KSHARD_COMPILE_FAIL
using L = kshard::Layout<kshard::Shard<0>, kshard::Shard<0>>;
#else
using L = kshard::Layout<kshard::Replicate, kshard::Shard<0>>;
#endif
using Weight = kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace>;
using Input = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

void forward(const Weight& weight, const Input& x) {
  (void)kshard::column_parallel_linear(weight, x);
}

int main() {
  void (*const instantiate)(const Weight&, const Input&) = &forward;
  (void)instantiate;
  return 0;
}
