#pragma once
// The face of redistribute/.
#include "kshard/mesh.hpp"
#include "kshard/redistribute/plan.hpp"
