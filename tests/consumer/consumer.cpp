// Uses kshard as an application would: a mesh, a sharded matrix, a gather, and the
// tensor-parallel calls through their own headers (tensor_parallel_new_paths.cpp).
#include <kshard/kshard.hpp>

#include <fmt/format.h>

bool tensor_parallel_through_new_paths(const kshard::Mesh<1>& mesh);

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 1;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
    kshard::HostMatrix<double> full("full", 5, 3);
    for (std::size_t r = 0; r < 5; ++r)
      for (std::size_t c = 0; c < 3; ++c) full(r, c) = static_cast<double>(10 * r + c);
    const auto matrix = kshard::distribute(mesh, kshard::Layout(kshard::Shard<0>{}),
                                           kshard::HostMatrix<const double>(full));
    const auto back = kshard::gather(matrix);
    const bool ok =
        back(4, 2) == 42.0 && back(0, 1) == 1.0 && tensor_parallel_through_new_paths(mesh);
    fmt::print("consumer: {} -> {} (Kokkos {})\n", matrix, ok ? "ok" : "WRONG",
               Kokkos::DefaultExecutionSpace::name());
    status = ok ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
