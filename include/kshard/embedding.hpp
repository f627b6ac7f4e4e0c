#pragma once

// Deprecated path, kept for one release: include "kshard/tensor_parallel/embedding.hpp".
#include "kshard/tensor_parallel/embedding.hpp"
