// SPDX-License-Identifier: Apache-2.0
// Compile-time benchmark: the umbrella header alone, nothing instantiated.
#include <shardlib/shardlib.hpp>

int main() { return 0; }
