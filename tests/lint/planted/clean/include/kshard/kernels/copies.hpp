#pragma once
#include "kshard/detail/macros.hpp"
#include "kshard/index.hpp"

namespace kshard::kernels {

template <class T>
struct Scale {
  T factor{1};
  int counts[2] = {0, 1};
  Scale() : factor{2}, counts{1, 2} {}
  explicit Scale(T f) : factor(f) {}
  Scale& operator=(const Scale&) = default;
  KSHARD_INLINE T operator()(T x) const noexcept { return factor * x; }
  bool operator==(const Scale& other) const { return factor == other.factor; }
  explicit operator bool() const { return factor != T{}; }
};

enum class Kind : int { a = 1, b = 2 };

inline const auto twice = [](int x) { return 2 * x; };

// 55 lines, a 20-line lambda among them: the lambda counts once, in its function.
template <class T>
auto long_but_ok(T first) -> T {
  T total = first;
  auto add = [&](T x) {
    total += 0;
    total += 1;
    total += 2;
    total += 3;
    total += 4;
    total += 5;
    total += 6;
    total += 7;
    total += 8;
    total += 9;
    total += 10;
    total += 11;
    total += 12;
    total += 13;
    total += 14;
    total += 15;
    total += 16;
    total += 17;
    return x;
  };
  total += 0;
  total += 1;
  total += 2;
  total += 3;
  total += 4;
  total += 5;
  total += 6;
  total += 7;
  total += 8;
  total += 9;
  total += 10;
  total += 11;
  total += 12;
  total += 13;
  total += 14;
  total += 15;
  total += 16;
  total += 17;
  total += 18;
  total += 19;
  total += 20;
  total += 21;
  total += 22;
  total += 23;
  total += 24;
  total += 25;
  total += 26;
  total += 27;
  total += 28;
  total += 29;
  return add(total);
}

}  // namespace kshard::kernels

extern "C" {
inline int kshard_c_entry() { return 0; }
}
