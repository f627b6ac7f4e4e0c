#pragma once

// Deprecated path, kept for one release: include "kshard/tensor_parallel/region.hpp".
#include "kshard/tensor_parallel/region.hpp"
