#pragma once

/// \file
/// An opt-in watchdog for stuck collectives. A rank that never reaches a collective (a bug in
/// rank-dependent code, a crashed or stuck rank, a cut link) otherwise leaves every other rank
/// waiting forever. With a timeout set, a rank that has waited that long in one of kshard's
/// collectives prints one line to stderr, naming its rank, the kshard operation, the MPI
/// collective and the mesh dimension, and ends the job with `MPI_Abort`.
///
/// Set it for a whole job with the environment variable `KSHARD_COLLECTIVE_TIMEOUT` (seconds,
/// read once per process; unset, empty or 0: off), or with set_collective_timeout(). Off, it
/// costs one branch per collective; on, a thread per process watches the collective in flight
/// (docs/design.md, section 9).

#include <cmath>

#include <fmt/format.h>

#include "kshard/comm/mpi.hpp"
#include "kshard/error.hpp"

namespace kshard {

/// Sets the watchdog's timeout for every later kshard collective of this process, overriding
/// `KSHARD_COLLECTIVE_TIMEOUT`: `seconds` > 0 turns it on, 0 off. Set the same on every rank.
/// Throws `kshard::error`, naming the value, when `seconds` is negative or not finite.
inline void set_collective_timeout(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    throw error(fmt::format(
        "kshard::set_collective_timeout: {} is not a valid timeout; pass a positive number of "
        "seconds, or 0 for no timeout",
        seconds));
  detail::watchdog_setting = {seconds, {}};
}

/// The watchdog's timeout in seconds (0: off), from set_collective_timeout() or else from
/// `KSHARD_COLLECTIVE_TIMEOUT`. Throws `kshard::error`, naming the variable and its value, when
/// that variable is in force and is not a valid timeout (kshard's collectives throw the same).
inline double collective_timeout() { return detail::watchdog_timeout(); }

}  // namespace kshard
