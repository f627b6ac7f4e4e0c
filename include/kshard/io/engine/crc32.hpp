#pragma once

// The CRC-32 of ZIP archives (zlib's): torch.save archives record it for each entry, and the
// byte mover computes it of the bytes it writes into one.

#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace kshard::detail {

// The CRC-32 of `bytes` continuing `crc` (zlib's, as ZIP uses), fed to zlib 1 GiB at a time.
inline std::uint32_t zip_crc32(std::span<const std::byte> bytes, std::uint32_t crc = 0) {
  constexpr std::size_t step = std::size_t{1} << 30;
  uLong value = crc;
  for (std::size_t at = 0; at < bytes.size(); at += step) {
    const std::size_t count = std::min(step, bytes.size() - at);
    value =
        ::crc32(value, reinterpret_cast<const Bytef*>(bytes.data() + at), static_cast<uInt>(count));
  }
  return static_cast<std::uint32_t>(value);
}

// The CRC-32 of two byte ranges one after the other from the CRC of each (so that ranks, or
// pieces read one at a time, can check an entry together).
inline std::uint32_t zip_crc32_combine(std::uint32_t first, std::uint32_t second,
                                       std::uint64_t second_size) {
  return static_cast<std::uint32_t>(
      ::crc32_combine(first, second, static_cast<z_off_t>(second_size)));
}

}  // namespace kshard::detail
