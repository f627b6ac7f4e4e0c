// The tensor-parallel headers through their paths before the tensor_parallel/ folder
// (forwarding headers, kept for one release).
#include <kshard/bias.hpp>
#include <kshard/distribute.hpp>
#include <kshard/embedding.hpp>
#include <kshard/linear.hpp>
#include <kshard/region.hpp>

#include "tensor_parallel_calls.hpp"

bool tensor_parallel_through_old_paths(const kshard::Mesh<1>& mesh) {
  return tensor_parallel_calls(mesh);
}
