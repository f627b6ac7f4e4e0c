#pragma once
// Deprecated path: a forwarding header.
#include "kshard/comm/stats.hpp"
