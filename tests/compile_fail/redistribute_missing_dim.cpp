// Redistributing to a layout that shards a tensor dimension a matrix does not have must not
// compile.
#include <kshard/kshard.hpp>

using Source =
    kshard::DistMatrix<float, kshard::Layout<kshard::Shard<0>>, Kokkos::DefaultHostExecutionSpace>;
#ifdef KSHARD_COMPILE_FAIL
using Target = kshard::Layout<kshard::Shard<2>>;
#else
using Target = kshard::Layout<kshard::Shard<1>>;
#endif

auto move(const Source& m) { return kshard::redistribute(m, Target{}); }

int main() { return 0; }
