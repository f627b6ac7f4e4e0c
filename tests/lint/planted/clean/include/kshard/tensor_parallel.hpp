#pragma once
#include "kshard/tensor_parallel/linear.hpp"
