#pragma once
#include "kshard/redistribute.hpp"
#include "kshard/redistribute/plan.hpp"  // planted: wing-internal
