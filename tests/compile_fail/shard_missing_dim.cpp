// A matrix has tensor dimensions 0 and 1: Shard<2> must not compile.
#include <kshard/kshard.hpp>

#ifdef KSHARD_COMPILE_FAIL
using L = kshard::Layout<kshard::Shard<2>>;
#else
using L = kshard::Layout<kshard::Shard<1>>;
#endif

int main() {
  return sizeof(kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace>) > 0 ? 0 : 1;
}
