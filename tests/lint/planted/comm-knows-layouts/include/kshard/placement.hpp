#pragma once
#include "kshard/comm/reduce_op.hpp"
