// SPDX-License-Identifier: Apache-2.0
// Runs a test body on every configuration this test executable covers: threads runtimes of
// several device counts, or, when the executable runs under mpirun (main.cpp), once on the MPI
// runtime.
#pragma once

#include <shardlib/runtime/runtime.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string>
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

/// for_each_run for the suites over a memory space `Mem` (tensor_memory_space,
/// autodiff_memory_space): on 1 to 8 virtual devices in device memory (on one GPU: issue 14's
/// target), on 1 to 5 and 7 in host memory (CI, and the sanitizers: the odd counts give empty
/// blocks, which 1 to 4 did not, so a stencil check that failed on 5 and 7 GPU devices went unseen
/// in CI). SHARDLIB_TEST_DEVICES=5,7 picks the counts (to look into one count on a GPU).
template <class Mem>
void for_each_run_in(const std::function<void(Context&)>& body) {
  if (const char* env = std::getenv("SHARDLIB_TEST_DEVICES")) {
    const std::string list = env;
    for (std::size_t at = 0; at < list.size();) {
      const std::size_t end = std::min(list.find(',', at), list.size());
      for_each_run(body, {std::stoi(list.substr(at, end - at))});
      at = end + 1;
    }
  } else if constexpr (detail::host_memory_v<Mem>) {
    for_each_run(body, {1, 2, 3, 4, 5, 7});
  } else {
    for_each_run(body, {1, 2, 3, 4, 5, 6, 7, 8});
  }
}

}  // namespace shardlib::test
