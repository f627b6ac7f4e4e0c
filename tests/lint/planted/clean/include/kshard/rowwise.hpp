#pragma once
// Same layer as redistribute/, through its face.
#include "kshard/redistribute.hpp"
