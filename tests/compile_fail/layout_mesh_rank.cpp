// A layout has one placement per mesh dimension: a 2-placement layout on a 1-D mesh must not
// compile.
#include <kshard/kshard.hpp>

using L = kshard::Layout<kshard::Shard<0>, kshard::Replicate>;
using Matrix = kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace>;

#ifdef KSHARD_COMPILE_FAIL
Matrix make(const kshard::Mesh<1>& mesh) { return Matrix(mesh, L{}, 4, 4); }
#else
Matrix make(const kshard::Mesh<2>& mesh) { return Matrix(mesh, L{}, 4, 4); }
#endif

int main() { return 0; }
