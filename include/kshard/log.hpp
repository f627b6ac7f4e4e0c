#pragma once

/// \file
/// Where kshard's one-line informational messages go (rank 0 of the mesh sends them):
/// nowhere unless asked, as an HPC library should; `set_log_handler(kshard::log_to_stderr)`
/// prints them (the `kshard-repair` tool does).

#include <cstdio>
#include <functional>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace kshard {

/// Receives one line of text, without a trailing newline.
using LogHandler = std::function<void(std::string_view)>;

/// The handler that prints each line to stderr, prefixed with "[kshard] ".
inline void log_to_stderr(std::string_view line) { fmt::print(stderr, "[kshard] {}\n", line); }

namespace detail {
inline LogHandler& log_handler() {
  static LogHandler handler;  // silent until a handler is set
  return handler;
}

// Whether a handler listens: a line that takes work to format is made only then.
inline bool logging() { return static_cast<bool>(log_handler()); }
}  // namespace detail

/// Replaces the log handler (by default none: kshard prints nothing); returns the previous
/// one. Pass an empty handler to silence kshard again.
inline LogHandler set_log_handler(LogHandler handler) {
  return std::exchange(detail::log_handler(), std::move(handler));
}

/// Sends `line` to the current handler.
inline void log_line(std::string_view line) {
  if (const auto& handler = detail::log_handler()) handler(line);
}

}  // namespace kshard
