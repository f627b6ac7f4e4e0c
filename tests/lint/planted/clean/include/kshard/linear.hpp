#pragma once
// Deprecated path: a forwarding header is a face of its wing.
#include "kshard/tensor_parallel/linear.hpp"
