// SPDX-License-Identifier: Apache-2.0
// random_bits.cpp's reference: the random values as a build without FMA makes them (this file is
// compiled without -mfma, so nothing here can be fused).
#include <shardlib/execute/block.hpp>

#include <cstdint>

float plain_random_float(std::int64_t k, float lo, float hi) { return shardlib::detail::random_value<float>(7, k, lo, hi); }
double plain_random_double(std::int64_t k, double lo, double hi) {
  return shardlib::detail::random_value<double>(7, k, lo, hi);
}
