#pragma once
// comm/ moves bytes and agrees on values; what a layout is belongs to the layers above it.
#include "kshard/comm/reduce_op.hpp"
#include "kshard/placement.hpp"  // planted: comm-knows-layouts
