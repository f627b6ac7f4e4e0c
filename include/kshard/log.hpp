#pragma once

/// \file
/// Where kshard's one-line informational messages go (rank 0 of the mesh sends them).

#include <cstdio>
#include <functional>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace kshard {

/// Receives one line of text, without a trailing newline.
using LogHandler = std::function<void(std::string_view)>;

namespace detail {
inline LogHandler& log_handler() {
  static LogHandler handler = [](std::string_view line) {
    fmt::print(stderr, "[kshard] {}\n", line);
  };
  return handler;
}
}  // namespace detail

/// Replaces the log handler (by default, lines go to stderr prefixed with "[kshard] ");
/// returns the previous one. Pass an empty handler to silence kshard.
inline LogHandler set_log_handler(LogHandler handler) {
  return std::exchange(detail::log_handler(), std::move(handler));
}

/// Sends `line` to the current handler.
inline void log_line(std::string_view line) {
  if (const auto& handler = detail::log_handler()) handler(line);
}

}  // namespace kshard
