#pragma once
// A sibling in the wing.
#include "kshard/redistribute/moves.hpp"
