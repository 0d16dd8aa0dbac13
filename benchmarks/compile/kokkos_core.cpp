// SPDX-License-Identifier: Apache-2.0
// Compile-time benchmark, the baseline: what including Kokkos alone costs a translation unit.
#include <Kokkos_Core.hpp>

int main() { return 0; }
