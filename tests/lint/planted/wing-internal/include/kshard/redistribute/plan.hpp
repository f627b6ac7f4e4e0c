#pragma once
#include "kshard/redistribute/moves.hpp"
