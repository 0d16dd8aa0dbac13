// SPDX-License-Identifier: Apache-2.0
// The one doctest main. Kokkos is initialised here, once per process, by the library's own
// entry point (KokkosScope), never by a test.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <shardlib/runtime/kokkos_scope.hpp>

int main(int argc, char** argv) {
  shardlib::KokkosScope kokkos(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}
