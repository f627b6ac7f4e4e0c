// Kernels on an execution space must be able to read the matrix's memory space.
#include <kshard/kshard.hpp>

#include <cstddef>

// A memory space no host execution space can access (stands in for device memory on a
// host-only build).
struct RemoteSpace {
  using memory_space = RemoteSpace;
  using execution_space = Kokkos::DefaultHostExecutionSpace;
  using device_type = Kokkos::Device<execution_space, memory_space>;
  using size_type = std::size_t;
  static constexpr const char* name() { return "RemoteSpace"; }
};

#ifdef KSHARD_COMPILE_FAIL
using Space = RemoteSpace;
#else
using Space = Kokkos::HostSpace;
#endif

using L = kshard::Layout<kshard::Shard<0>>;

int main() {
  return sizeof(kshard::DistMatrix<float, L, Kokkos::DefaultHostExecutionSpace, Space>) > 0 ? 0 : 1;
}
