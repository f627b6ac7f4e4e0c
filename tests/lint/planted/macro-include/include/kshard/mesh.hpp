#pragma once
#include KSHARD_COMM_BACKEND_HEADER  // planted: macro-include
