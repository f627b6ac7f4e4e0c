#pragma once
#include "kshard/error.hpp"
