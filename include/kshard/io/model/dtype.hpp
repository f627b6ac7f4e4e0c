#pragma once

/// \file
/// The element types of stored tensors (`Dtype`, spelled as safetensors headers spell them, the
/// names every checkpoint format maps its own to), their sizes, and the overflow-checked
/// element and byte counts of a shape.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "kshard/error.hpp"
#include "kshard/io/model/messages.hpp"

namespace kshard::io {

/// Element types of a safetensors file, spelled as in its header.
enum class Dtype : std::uint8_t {
  BOOL,     ///< boolean, one byte
  U8,       ///< unsigned 8-bit integer
  I8,       ///< signed 8-bit integer
  F8_E5M2,  ///< 8-bit float, 5 exponent and 2 mantissa bits
  F8_E4M3,  ///< 8-bit float, 4 exponent and 3 mantissa bits
  I16,      ///< signed 16-bit integer
  U16,      ///< unsigned 16-bit integer
  F16,      ///< IEEE half precision
  BF16,     ///< bfloat16
  I32,      ///< signed 32-bit integer
  U32,      ///< unsigned 32-bit integer
  F32,      ///< IEEE single precision
  F64,      ///< IEEE double precision
  I64,      ///< signed 64-bit integer
  U64,      ///< unsigned 64-bit integer
  F8_E8M0,  ///< 8-bit scale, 8 exponent bits and no mantissa (MX formats)
};

/// `shape` as messages show it, "[2, 3]": at most its first 8 entries, then ", ...".
[[nodiscard]] inline std::string shape_text(std::span<const std::int64_t> shape) {
  constexpr std::size_t shown = 8;
  std::string out = "[";
  for (std::size_t d = 0; d < std::min(shape.size(), shown); ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(shape[d]);
  }
  out += shape.size() > shown ? ", ...]" : "]";
  return out;
}

}  // namespace kshard::io

namespace kshard::detail {

/// A dtype with its header spelling and element size.
struct DtypeInfo {
  io::Dtype dtype;
  std::string_view name;
  std::uint64_t size;
};

/// Every dtype, in enum order.
inline constexpr std::array<DtypeInfo, 16> dtype_table{{
    {io::Dtype::BOOL, "BOOL", 1},
    {io::Dtype::U8, "U8", 1},
    {io::Dtype::I8, "I8", 1},
    {io::Dtype::F8_E5M2, "F8_E5M2", 1},
    {io::Dtype::F8_E4M3, "F8_E4M3", 1},
    {io::Dtype::I16, "I16", 2},
    {io::Dtype::U16, "U16", 2},
    {io::Dtype::F16, "F16", 2},
    {io::Dtype::BF16, "BF16", 2},
    {io::Dtype::I32, "I32", 4},
    {io::Dtype::U32, "U32", 4},
    {io::Dtype::F32, "F32", 4},
    {io::Dtype::F64, "F64", 8},
    {io::Dtype::I64, "I64", 8},
    {io::Dtype::U64, "U64", 8},
    {io::Dtype::F8_E8M0, "F8_E8M0", 1},
}};

/// The entry at `dtype`'s position in dtype_table; a value outside the enum is refused.
inline const DtypeInfo& dtype_info(io::Dtype dtype) {
  const auto index = static_cast<std::size_t>(dtype);
  if (index >= dtype_table.size())
    throw_io_error("dtype value ", index, " is not a safetensors dtype");
  return dtype_table[index];
}

/// The product of `shape`, refusing negative entries and any partial product past INT64_MAX
/// (checked left to right, as the reference does, so a later 0 does not excuse an overflow).
inline std::int64_t element_count(std::string_view name, std::span<const std::int64_t> shape) {
  constexpr auto max = std::numeric_limits<std::int64_t>::max();
  std::int64_t count = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0)
      throw_io_error("tensor ", in_quotes(name), " has shape entry ", shape[d], " at dimension ", d,
                     "; shape entries must not be negative");
    if (shape[d] != 0 && count > max / shape[d])
      throw_io_error("tensor ", in_quotes(name), " has shape ", io::shape_text(shape), " (rank ",
                     shape.size(), ") whose element count passes INT64_MAX = ", max,
                     " at dimension ", d);
    count *= shape[d];
  }
  return count;
}

/// element_count times the dtype size, refusing a product past UINT64_MAX.
inline std::uint64_t byte_count(std::string_view name, io::Dtype dtype,
                                std::span<const std::int64_t> shape) {
  const auto elements = static_cast<std::uint64_t>(element_count(name, shape));
  const DtypeInfo& info = dtype_info(dtype);
  if (elements > std::numeric_limits<std::uint64_t>::max() / info.size)
    throw_io_error("tensor ", in_quotes(name), " has ", elements, " elements of ", info.name,
                   ", more bytes than a 64-bit size holds");
  return elements * info.size;
}

/// The dtype spelled `name`, or nullptr.
inline const DtypeInfo* find_dtype(std::string_view name) {
  const auto it = std::find_if(dtype_table.begin(), dtype_table.end(),
                               [name](const DtypeInfo& info) { return info.name == name; });
  return it == dtype_table.end() ? nullptr : &*it;
}

/// What is wrong with the dtype string `name`, listing the ones there are.
inline std::string unknown_dtype(std::string_view name) {
  std::string message = "unknown dtype " + in_quotes(name) + " (safetensors dtypes:";
  for (const auto& info : dtype_table) (message += ' ') += info.name;
  return message + ")";
}

}  // namespace kshard::detail

namespace kshard::io {

/// Bytes per element of `dtype` (1, 2, 4 or 8).
[[nodiscard]] inline std::uint64_t dtype_size(Dtype dtype) {
  return detail::dtype_info(dtype).size;
}

/// How `dtype` is spelled in a header ("F32", "BF16", ...).
[[nodiscard]] inline std::string_view to_string(Dtype dtype) {
  return detail::dtype_info(dtype).name;
}

/// The dtype a header spells `name`; throws kshard::error naming it for any other string.
[[nodiscard]] inline Dtype parse_dtype(std::string_view name) {
  const detail::DtypeInfo* info = detail::find_dtype(name);
  if (info == nullptr) detail::throw_io_error(detail::unknown_dtype(name));
  return info->dtype;
}

}  // namespace kshard::io
