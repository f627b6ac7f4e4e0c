#pragma once

// Deprecated path, kept for one release: include "kshard/tensor_parallel/bias.hpp".
#include "kshard/tensor_parallel/bias.hpp"
