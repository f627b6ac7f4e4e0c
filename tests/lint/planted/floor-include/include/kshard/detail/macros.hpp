#pragma once
#include <kshard/index.hpp>  // planted: floor-include
#include "kshard/detail/int_limit.hpp"
#include "kshard/error.hpp"
