#pragma once
#include "kshard/comm/group.hpp"
