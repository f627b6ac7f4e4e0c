#pragma once

// Deprecated path, kept for one release: include "kshard/comm/stats.hpp".
#include "kshard/comm/stats.hpp"
