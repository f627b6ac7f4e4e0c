#pragma once
// A format may not build on another format: what they share lives in a lower floor.
#include "kshard/io/formats/dcp/reader.hpp"  // planted: format-include
