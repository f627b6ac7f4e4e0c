#pragma once
// index.hpp is in the values layer; mesh.hpp in the matrix layer above it.
#include "kshard/mesh.hpp"  // planted: upward-include
