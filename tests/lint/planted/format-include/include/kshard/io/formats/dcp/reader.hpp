#pragma once
// Its own folder is fine.
#include "kshard/io/formats/dcp/metadata.hpp"
