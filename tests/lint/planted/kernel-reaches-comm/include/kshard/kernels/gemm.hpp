#pragma once
#include "kshard/comm/group.hpp"  // planted: kernel-reaches-comm
#include "kshard/index.hpp"
