#pragma once
// A higher layer may include a wing's internals.
#include "kshard/redistribute/plan.hpp"
