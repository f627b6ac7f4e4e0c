#pragma once

// The element types kshard's matrices hold, in one table: the code ranks compare in an
// agreement, the name messages and the {fmt} formatter print, the safetensors dtype, the size,
// and whether MPI reduces it as a number (bf16 and f16 only move, as 16-bit integers). The
// MPI datatypes are chosen from the code in comm/mpi.hpp, the only layer that may name MPI.
//
// ElementOf<T> says which entry a type is: specialised here for the built-in types and beside
// bf16 and f16 (bfloat16.hpp, float16.hpp), which this floor cannot name.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace kshard::detail {

enum class ElementCode : std::int64_t { f32 = 1, f64 = 2, bf16 = 3, i32 = 4, i64 = 5, f16 = 6 };

struct ElementInfo {
  ElementCode code;
  std::string_view name;
  std::string_view safetensors_dtype;
  std::size_t size;
  bool reducible;  // MPI sums, takes the minimum of, ... it (a Partial's reduction)
};

// In code order: element_table[code - 1].
inline constexpr std::array<ElementInfo, 6> element_table{{
    {ElementCode::f32, "float", "F32", 4, true},
    {ElementCode::f64, "double", "F64", 8, true},
    {ElementCode::bf16, "bf16", "BF16", 2, false},
    {ElementCode::i32, "int32", "I32", 4, true},
    {ElementCode::i64, "int64", "I64", 8, true},
    {ElementCode::f16, "f16", "F16", 2, false},
}};

// The entry of `code`, or nullptr for a code outside the table.
constexpr const ElementInfo* find_element(std::int64_t code) {
  return code >= 1 && code <= static_cast<std::int64_t>(element_table.size())
             ? &element_table[static_cast<std::size_t>(code - 1)]
             : nullptr;
}

template <class T>
struct ElementOf {};  // not an element type of the table
template <>
struct ElementOf<float> {
  static constexpr ElementCode code = ElementCode::f32;
};
template <>
struct ElementOf<double> {
  static constexpr ElementCode code = ElementCode::f64;
};
template <>
struct ElementOf<std::int32_t> {
  static constexpr ElementCode code = ElementCode::i32;
};
template <>
struct ElementOf<std::int64_t> {
  static constexpr ElementCode code = ElementCode::i64;
};

// Whether `T` (const or not) is one of the table's element types.
template <class T>
concept TableElement = requires {
  ElementOf<std::remove_cv_t<T>>::code;
};

template <TableElement T>
constexpr const ElementInfo& element_info() {
  return *find_element(static_cast<std::int64_t>(ElementOf<std::remove_cv_t<T>>::code));
}

// Whether MPI reduces `T` as a number (a Partial source needs such an element type).
template <class T>
constexpr bool reducible_element() {
  if constexpr (TableElement<T>)
    return element_info<T>().reducible;
  else
    return false;
}

}  // namespace kshard::detail
