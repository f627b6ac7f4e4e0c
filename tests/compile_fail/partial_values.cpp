// The values of a Partial matrix are pending a reduction: gathering them must not compile.
#include <kshard/kshard.hpp>

#ifdef KSHARD_COMPILE_FAIL
using L = kshard::Layout<kshard::Partial<>>;
#else
using L = kshard::Layout<kshard::Replicate>;
#endif
using Matrix = kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace>;

kshard::HostMatrix<float> values(const Matrix& m) { return kshard::gather(m); }

int main() { return 0; }
