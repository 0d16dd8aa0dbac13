// SPDX-License-Identifier: Apache-2.0
// Random tensors have the same bits wherever they are generated. nvcc fuses `a * b + c` into one
// rounding on a GPU, and g++ does on the host where the target has FMA: random_value keeps the
// product's rounding (detail::lerp_unfused). tests/meson.build compiles this file with -mfma
// -ffp-contract=fast at -O2, so that an unguarded multiply-add in random_value would be fused
// here, and random_bits_plain.cpp without them, as the reference. (On a GPU, tensor_memory_space
// compares random tensors in GPU memory with the same tensors in host memory.)
#include <doctest/doctest.h>
#include <shardlib/execute/block.hpp>

#include <cmath>
#include <cstdint>

float plain_random_float(std::int64_t k, float lo, float hi);
double plain_random_double(std::int64_t k, double lo, double hi);

TEST_SUITE("random_bits") {
  TEST_CASE("random values round the product before the sum where the compiler may fuse the two") {
    if (!__builtin_cpu_supports("fma")) {
      MESSAGE("this CPU has no FMA: there is nothing to fuse");
      return;
    }
    using shardlib::detail::mix64;
    using shardlib::detail::random_value;
    // The bounds are read at run time, as from a tensor's creation call, not folded into constants.
    volatile float lo_in = -3.0f, hi_in = 3.0f;
    const float lo = lo_in, hi = hi_in;
    int wrong_float = 0, wrong_double = 0, fusing_changes = 0;
    for (std::int64_t k = 0; k < 20000; ++k) {
      const float want = plain_random_float(k, lo, hi);
      wrong_float += random_value<float>(7, k, lo, hi) != want;
      wrong_double += random_value<double>(7, k, lo, hi) != plain_random_double(k, lo, hi);
      const float u = static_cast<float>(mix64(static_cast<std::uint64_t>(k) ^ mix64(7)) >> 40) * (1.0f / 16777216.0f);
      fusing_changes += std::fma(hi - lo, u, lo) != want;
    }
    CHECK_MESSAGE(wrong_float == 0, wrong_float << " of 20000 float values differ from the unfused build's");
    CHECK_MESSAGE(wrong_double == 0, wrong_double << " of 20000 double values differ from the unfused build's");
    CHECK(fusing_changes > 0);  // fusing changes some of these values: the checks above can fail
  }
}
