// SPDX-License-Identifier: Apache-2.0
/// @file
/// Kokkos initialisation, once per process, owned by shardlib's runtime entry point.
///
/// Kokkos may be initialised once per process only. The runtime entry point (and the test
/// main) holds a `KokkosScope`: the first scope initialises Kokkos, and it finalises Kokkos
/// when it ends; a scope created while Kokkos is already running (the user initialised it, or
/// an outer scope did) leaves it alone. Works with Kokkos 3.4 to 5.x.
#pragma once

#include <Kokkos_Core.hpp>

#include <string>

namespace shardlib {

/// RAII owner of the process's Kokkos initialisation (see the file comment).
class KokkosScope {
 public:
  /// Initialises Kokkos with the program's arguments (it consumes its own `--kokkos-*` ones).
  KokkosScope(int& argc, char** argv) {
    if (!Kokkos::is_initialized()) {
      Kokkos::initialize(argc, argv);
      owns_ = true;
    }
  }
  KokkosScope() {
    if (!Kokkos::is_initialized()) {
      int argc = 0;
      Kokkos::initialize(argc, nullptr);
      owns_ = true;
    }
  }
  KokkosScope(const KokkosScope&) = delete;
  KokkosScope& operator=(const KokkosScope&) = delete;
  ~KokkosScope() {
    if (owns_) Kokkos::finalize();
  }

  /// Whether this scope initialised Kokkos (and so will finalise it).
  bool owns_kokkos() const noexcept { return owns_; }
  /// Name of Kokkos's default execution space ("Serial", "OpenMP", "Cuda", ...).
  static std::string execution_space_name() { return Kokkos::DefaultExecutionSpace::name(); }

 private:
  bool owns_ = false;
};

}  // namespace shardlib
