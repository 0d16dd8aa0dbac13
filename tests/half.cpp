// SPDX-License-Identifier: Apache-2.0
// The 16-bit element types (half.hpp): conversions against the compiler's own _Float16 where it
// has one (every f16 value, 2^22 random floats), bfloat16 against its definition (float's top 16
// bits, rounded to nearest even), and the arithmetic semantics the docs promise.
#include <doctest/doctest.h>
#include <shardlib/half.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

namespace sl = shardlib;

namespace {
std::uint32_t next(std::uint64_t& z) {  // xorshift64: any float bit pattern, NaNs and subnormals included
  z ^= z << 13;
  z ^= z >> 7;
  z ^= z << 17;
  return static_cast<std::uint32_t>(z >> 16);
}
/// bfloat16 by its definition: the float rounded to 8 significant bits, ties to even, in double.
std::uint16_t bf16_reference(float f) {
  if (std::isnan(f)) return 0x7fc0;
  if (std::isinf(f)) return std::bit_cast<std::uint32_t>(f) >> 16;
  const double d = f;
  if (d == 0) return std::bit_cast<std::uint32_t>(f) >> 16;
  int e;
  std::frexp(d, &e);  // d = m 2^e, 0.5 <= |m| < 1
  const int lsb_exp = std::max(e - 8, -133);  // bf16's last bit (subnormals: 2^-133)
  const double q = std::nearbyint(std::ldexp(d, -lsb_exp));  // the FPU's default: ties to even
  const double r = std::ldexp(q, lsb_exp);
  if (std::abs(r) > 3.3895313892515355e38) return f < 0 ? 0xff80 : 0x7f80;  // past bf16's max: inf
  return std::bit_cast<std::uint32_t>(static_cast<float>(r)) >> 16;
}
}  // namespace

TEST_SUITE("half") {
  TEST_CASE("f16: exact on every value; float -> f16 rounds to nearest even") {
    int bad = 0;
    for (unsigned u = 0; u < 65536; ++u) {
      const auto h = static_cast<std::uint16_t>(u);
      const float f = sl::f16_to_float(h);
      if (f == f && sl::float_to_f16(f) != h) ++bad;  // every value round-trips
#if defined(__FLT16_MAX__)
      _Float16 ref;
      std::memcpy(&ref, &h, 2);
      if (f == f && static_cast<float>(ref) != f) ++bad;
      if (f != f && static_cast<float>(ref) == static_cast<float>(ref)) ++bad;
#endif
    }
    CHECK(bad == 0);
#if defined(__FLT16_MAX__)
    std::uint64_t z = 88172645463325252ull;
    for (int i = 0; i < (1 << 22); ++i) {
      const float f = std::bit_cast<float>(next(z));
      const std::uint16_t got = sl::float_to_f16(f);
      if (f != f) {
        bad += (got & 0x7c00) != 0x7c00 || (got & 0x3ff) == 0;  // a NaN stays a NaN
        continue;
      }
      const auto ref = static_cast<_Float16>(f);
      bad += std::bit_cast<std::uint16_t>(ref) != got;
    }
    CHECK(bad == 0);
#endif
    CHECK(sl::float_to_f16(1.0f + 1.0f / 2048) == 0x3c00);  // tie: to even (1.0)
    CHECK(sl::float_to_f16(1.0f + 3.0f / 2048) == 0x3c02);  // tie: to even (up)
    CHECK(sl::float_to_f16(65520.0f) == 0x7c00);            // overflows to inf
    CHECK(sl::float_to_f16(65519.0f) == 0x7bff);            // rounds down to 65504
    CHECK(sl::float_to_f16(5.96e-8f) == 0x0001);            // smallest subnormal
    CHECK(sl::float_to_f16(2.9803e-8f) == 0x0001);          // just above half of it: up
    CHECK(sl::float_to_f16(2.9802322e-8f) == 0x0000);       // exactly half of it: to even (0)
    CHECK(sl::float_to_f16(-0.0f) == 0x8000);
  }

  TEST_CASE("bf16: float's top bits, rounded to nearest even") {
    int bad = 0;
    std::uint64_t z = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < (1 << 22); ++i) {
      const float f = std::bit_cast<float>(next(z));
      const std::uint16_t got = sl::float_to_bf16(f);
      if (f != f) bad += (got & 0x7f80) != 0x7f80 || (got & 0x7f) == 0;
      else bad += got != bf16_reference(f);
      if (f == f) bad += sl::float_to_bf16(sl::bf16_to_float(got)) != got;
    }
    CHECK(bad == 0);
    CHECK(sl::float_to_bf16(1.0f + 1.0f / 256) == 0x3f80);  // tie: to even
    CHECK(sl::float_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
    CHECK(sl::bf16_to_float(0x4049) == 3.140625f);
    CHECK(sl::float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past bf16's max
  }

  TEST_CASE("values convert implicitly; arithmetic is float arithmetic, rounded where stored") {
    sl::bf16 a = 1.5f, b = 2;
    sl::f16 h = 0.1;
    static_assert(std::is_same_v<decltype(a + b), float>);
    static_assert(std::is_same_v<decltype(a * 2.0), double>);
    static_assert(std::is_same_v<decltype(-h), float>);
    static_assert(sl::is_half_v<const sl::f16> && !sl::is_half_v<float> && sl::is_floating_v<sl::bf16>);
    static_assert(std::is_same_v<sl::compute_t<sl::bf16>, float> && std::is_same_v<sl::compute_t<int>, int>);
    CHECK(a + b == 3.5f);
    CHECK(static_cast<float>(h) == 0.0999755859375f);  // 0.1 rounded to 11 bits
    a += 1;
    CHECK(a == 2.5f);
    sl::bf16 c = 1.0f;
    c += 1.0f / 512;  // below half of bf16's step at 1: rounds back to 1
    CHECK(c == 1.0f);
    CHECK(std::sqrt(sl::bf16(4)) == 2.0f);
    CHECK(sl::bf16::from_bits(0x3f80) == 1.0f);
    CHECK(sl::f16(65504).bits() == 0x7bff);
    CHECK(std::isinf(static_cast<float>(sl::f16(1e5f))));
    CHECK(std::isnan(static_cast<float>(sl::bf16(std::nanf("")))));
    CHECK(std::string(sl::element_name<sl::bf16>()) == "bf16");
    CHECK(std::string(sl::element_name<std::int64_t>()) == "i64");
  }

  TEST_CASE("numeric_limits") {
    using F = std::numeric_limits<sl::f16>;
    using B = std::numeric_limits<sl::bf16>;
    CHECK(static_cast<float>(F::max()) == 65504.0f);
    CHECK(static_cast<float>(F::lowest()) == -65504.0f);
    CHECK(static_cast<float>(F::min()) == std::ldexp(1.0f, -14));
    CHECK(static_cast<float>(F::epsilon()) == std::ldexp(1.0f, -10));
    CHECK(static_cast<float>(F::denorm_min()) == std::ldexp(1.0f, -24));
    CHECK(static_cast<float>(B::max()) == 3.3895313892515355e38f);
    CHECK(static_cast<float>(B::min()) == std::numeric_limits<float>::min());
    CHECK(static_cast<float>(B::epsilon()) == std::ldexp(1.0f, -7));
    CHECK(std::isinf(static_cast<float>(B::infinity())));
    CHECK(std::isnan(static_cast<float>(F::quiet_NaN())));
    CHECK(F::digits == 11);
    CHECK(B::digits == 8);
  }
}
