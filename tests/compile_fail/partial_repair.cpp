// Repairing a Partial embedding (its values pending a reduction) must not compile.
#include <kshard/kshard.hpp>

#ifdef KSHARD_COMPILE_FAIL
using L = kshard::Layout<kshard::Partial<>>;
#else
using L = kshard::Layout<kshard::Shard<0>>;
#endif
using Matrix = kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace>;

auto repair(const Matrix& input, const Matrix& output) {
  return kshard::repair_embedding_rows(input, output);
}

int main() { return 0; }
