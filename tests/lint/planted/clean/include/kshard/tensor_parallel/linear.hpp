#pragma once
#include "kshard/mesh.hpp"
