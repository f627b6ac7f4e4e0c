#include "kshard/io/detail/paths.hpp"  // planted: tools-detail
#include "kshard/io/safetensors.hpp"
#include "kshard/kshard.hpp"

namespace detail {
inline int own() { return 1; }  // a tool's own detail namespace is its own business
}  // namespace detail

int main() {
  const auto path = kshard::io::detail::partial_path("x");  // planted: tools-detail
  using namespace kshard;
  return io::detail::is_temporary(path) + detail::own();  // planted: tools-detail
}
