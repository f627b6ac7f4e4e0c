#pragma once

// Deprecated path, kept for one release: include "kshard/tensor_parallel/linear.hpp".
#include "kshard/tensor_parallel/linear.hpp"
