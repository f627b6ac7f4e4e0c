#pragma once
#include "kshard/io/detail/paths.hpp"
