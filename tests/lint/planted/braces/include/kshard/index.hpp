#pragma once
namespace kshard {  // planted: braces
inline int one() { return 1; }
