// The tensor-parallel headers through their paths in the tensor_parallel/ folder.
#include <kshard/distribute.hpp>
#include <kshard/tensor_parallel/bias.hpp>
#include <kshard/tensor_parallel/embedding.hpp>
#include <kshard/tensor_parallel/linear.hpp>
#include <kshard/tensor_parallel/region.hpp>
#include <kshard/tensor_parallel/tp_dim.hpp>

#include "tensor_parallel_calls.hpp"

bool tensor_parallel_through_new_paths(const kshard::Mesh<1>& mesh) {
  return tensor_parallel_calls(mesh);
}
