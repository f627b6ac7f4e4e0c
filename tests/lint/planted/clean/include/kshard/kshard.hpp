#pragma once
/// The whole of kshard: `#include <kshard/kshard.hpp>`.
#include "kshard/error.hpp"
#include "kshard/index.hpp"
#include "kshard/mesh.hpp"
#include "kshard/redistribute.hpp"
#include "kshard/rowwise.hpp"
#include "kshard/tensor_parallel.hpp"
