#pragma once

/// \file
/// The messages of kshard::io: an error built from pieces, and names and values from untrusted
/// files made printable, so that hostile input can neither flood nor garble a log.

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>

#include "kshard/error.hpp"

namespace kshard::detail {

/// Appends one piece of an error message.
inline void append_piece(std::string& out, std::string_view text) { out += text; }
/// Appends an integer of an error message in decimal.
template <std::integral T>
void append_piece(std::string& out, T value) {
  out += std::to_string(value);
}

/// Throws kshard::error with the pieces concatenated after "kshard::io: ".
template <class... Pieces>
[[noreturn]] void throw_io_error(const Pieces&... pieces) {
  std::string message = "kshard::io: ";
  (append_piece(message, pieces), ...);
  throw kshard::error(message);
}

/// `text` for an error message: printable ASCII as is, backslash and any other byte as \\xNN,
/// at most `limit` bytes of it and then "...", so that hostile input can neither flood nor
/// garble a log.
inline std::string printable(std::string_view text, std::size_t limit) {
  constexpr std::string_view hex = "0123456789abcdef";
  std::string out;
  for (const char c : text.substr(0, limit)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '\\') {
      out += c;
    } else {
      out += "\\x";
      out += hex[byte >> 4];
      out += hex[byte & 0xf];
    }
  }
  if (text.size() > limit) out += "...";
  return out;
}

/// A name or value in an error message: printable, in single quotes.
inline std::string in_quotes(std::string_view text, std::size_t limit = 64) {
  // Appended, not "'" + printable(...): g++ 12 -O3 warns of an overlap in that insert (PR 105329).
  std::string quoted = "'";
  quoted += printable(text, limit);
  quoted += '\'';
  return quoted;
}

}  // namespace kshard::detail
