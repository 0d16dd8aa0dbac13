// SPDX-License-Identifier: Apache-2.0
/// @file
/// The watchdogs' timeouts from the environment (detail/nccl_watchdog.hpp, detail/mpi_watchdog.hpp).
#pragma once

#include <shardlib/collectives/communicator.hpp>

#include <cstdlib>
#include <string>

namespace shardlib::coll::detail {

/// The environment variable `variable` as seconds >= 0 (0: no timeout), 600 when it is unset or
/// empty. Throws CollectiveError naming `backend` and the value when it is not such a number.
inline double timeout_from_environment(const char* variable, const char* backend) {
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return 600.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(s >= 0))
    throw CollectiveError(std::string("shardlib: ") + backend + " backend: " + variable + "=\"" + v +
                          "\" is not a number of seconds >= 0 (0 turns the timeout off)");
  return s;
}

}  // namespace shardlib::coll::detail
