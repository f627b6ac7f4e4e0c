// FNV-1a 64 over raw bytes, for check_repair.py (through ctypes): run.sh builds it into its
// scratch folder, and the Python fallback is used without it. Independent of kshard's own.
#include <cstddef>
#include <cstdint>

extern "C" std::uint64_t kshard_realdata_fnv1a64(const unsigned char* data, std::size_t size,
                                                 std::uint64_t hash) {
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 1099511628211ull;
  return hash;
}
