// The mesh rank is a compile-time constant: a shape from a std::vector must not compile.
#include <kshard/kshard.hpp>

#include <array>
#include <vector>

#ifdef KSHARD_COMPILE_FAIL
using Shape = std::vector<int>;
#else
using Shape = std::array<int, 2>;
#endif

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  { kshard::Mesh mesh(MPI_COMM_WORLD, Shape{1, 1}); }
  MPI_Finalize();
  return 0;
}
