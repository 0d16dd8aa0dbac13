// SPDX-License-Identifier: Apache-2.0
// Runs a test body on every configuration this test executable covers: threads runtimes of
// several device counts, or, when the executable runs under mpirun (main.cpp), once on the MPI
// runtime.
#pragma once

#include <shardlib/runtime/runtime.hpp>

#include <functional>
#include <initializer_list>
#include <vector>

namespace shardlib::test {

/// Set by the test main under mpirun: then bodies run once, on it.
inline Runtime*& mpi_runtime() {
  static Runtime* rt = nullptr;
  return rt;
}

/// Runs `body` on threads runtimes of each device count (or once under MPI).
inline void for_each_run(const std::function<void(Context&)>& body,
                         std::initializer_list<int> device_counts = {1, 2, 3, 4, 5, 6, 7, 8}) {
  if (Runtime* rt = mpi_runtime()) {
    rt->spmd(body);
    return;
  }
  for (int n : device_counts) Runtime::threads(n).spmd(body);
}

}  // namespace shardlib::test
