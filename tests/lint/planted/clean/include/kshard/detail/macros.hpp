#pragma once
#define KSHARD_BRACE_OPEN {
#define KSHARD_INLINE inline
