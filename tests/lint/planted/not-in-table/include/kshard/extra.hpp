// planted: not-in-table
#pragma once
#include "kshard/index.hpp"
