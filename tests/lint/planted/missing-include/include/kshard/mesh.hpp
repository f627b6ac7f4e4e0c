#pragma once
#include "kshard/comm/grup.hpp"  // planted: missing-include
#include "kshard/error.hpp"
