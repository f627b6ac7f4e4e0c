// A rowwise algorithm reads values: a Partial matrix (values pending a reduction) must not
// compile.
#include <kshard/kshard.hpp>

#ifdef KSHARD_COMPILE_FAIL
using L = kshard::Layout<kshard::Partial<>>;
#else
using L = kshard::Layout<kshard::Shard<0>>;
#endif
using Matrix = kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace>;

auto norms(const Matrix& m) { return kshard::row_squared_norms(m); }

int main() { return 0; }
