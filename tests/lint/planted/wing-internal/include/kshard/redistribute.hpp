#pragma once
#include "kshard/redistribute/plan.hpp"
