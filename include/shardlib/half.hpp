// SPDX-License-Identifier: Apache-2.0
/// @file
/// 16-bit floating-point element types: `shardlib::f16` (IEEE binary16) and `shardlib::bf16`
/// (bfloat16), for tensors, collectives and files.
///
/// They are storage formats, as on most hardware: a value converts implicitly to float, and
/// arithmetic on it is float arithmetic (`a + b` of two bf16 is a float, as `a + b` of two
/// `short` is an int); a float converts back implicitly, rounded to the nearest value (ties to
/// even; NaN stays NaN, overflow gives infinity). Compound assignment (`x += y`) computes in
/// float and rounds once. So generic code over floating-point types mostly compiles for them,
/// and code that cares about rounding says where it happens.
///
/// The conversions are exact bit manipulations (constexpr, no FPU mode involved), checked in
/// tests/half.cpp against the compiler's own `_Float16` over every f16 value and random floats.
/// They also run in GPU kernels (SHARDLIB_HOST_DEVICE; `__builtin_bit_cast`, which nvcc takes in
/// device code, where std::bit_cast would need --expt-relaxed-constexpr). Compiled for a GPU, the
/// conversions that are not a shift use its conversion instructions (`cvt.rn`, round to nearest
/// even: the same values; a NaN comes out as the canonical quiet NaN): the bit manipulation cost
/// bf16 `gelu` about 6 of its 37 instructions per element on an H200.
///
/// Knows nothing of tensors, collectives or Kokkos (the collectives map these types to their
/// DType, collectives/types.hpp).
#pragma once

#include <shardlib/detail/attributes.hpp>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace shardlib {

/// IEEE binary16 bits -> float (exact).
SHARDLIB_HOST_DEVICE constexpr float f16_to_float(std::uint16_t h) noexcept {
#if defined(__CUDA_ARCH__)
  if (!__builtin_is_constant_evaluated()) {  // the GPU's conversion instruction: the same value
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
#endif
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      bits = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return __builtin_bit_cast(float, bits);
}

/// float -> IEEE binary16 bits, rounded to nearest even (overflow to infinity, NaN kept quiet).
SHARDLIB_HOST_DEVICE constexpr std::uint16_t float_to_f16(float f) noexcept {
#if defined(__CUDA_ARCH__)
  if (!__builtin_is_constant_evaluated()) {  // one instruction, rounding to nearest even as below
    std::uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  }
#endif
  const std::uint32_t x = __builtin_bit_cast(std::uint32_t, f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504: inf
  if (absx < 0x38800000u) {  // below f16's smallest normal (2^-14): a multiple of 2^-24, ties to even
    const std::uint32_t e = absx >> 23;
    if (e < 102) return static_cast<std::uint16_t>(sign);  // below 2^-25: rounds to zero
    const std::uint32_t man = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // value * 2^24 = man * 2^(e - 126)
    std::uint32_t q = man >> shift;
    const std::uint32_t rest = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  const std::uint32_t e = ((absx >> 23) - 127 + 15) << 10;
  const std::uint32_t m = (absx >> 13) & 0x3ffu;
  const std::uint32_t rest = absx & 0x1fffu;
  std::uint32_t h = e | m;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | h);
}

/// bfloat16 bits -> float (exact).
SHARDLIB_HOST_DEVICE constexpr float bf16_to_float(std::uint16_t b) noexcept {
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(b) << 16);
}

/// float -> bfloat16 bits, rounded to nearest even (NaN kept quiet).
SHARDLIB_HOST_DEVICE constexpr std::uint16_t float_to_bf16(float f) noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (!__builtin_is_constant_evaluated()) {  // one instruction from Ampere on (the same rounding)
    std::uint16_t b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
  }
#endif
  std::uint32_t x = __builtin_bit_cast(std::uint32_t, f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

namespace detail {
/// The one implementation behind f16 and bf16: 16 bits, converted through float by `ToFloat`
/// and `FromFloat`.
template <class Self, float (*ToFloat)(std::uint16_t), std::uint16_t (*FromFloat)(float)>
class half_base {
 public:
  constexpr half_base() noexcept = default;
  SHARDLIB_HOST_DEVICE constexpr half_base(float f) noexcept : bits_(FromFloat(f)) {}  // NOLINT: implicit, rounds
  SHARDLIB_HOST_DEVICE constexpr half_base(double d) noexcept : bits_(FromFloat(static_cast<float>(d))) {}  // NOLINT
  template <class I>
    requires std::is_integral_v<I>
  SHARDLIB_HOST_DEVICE constexpr half_base(I i) noexcept : bits_(FromFloat(static_cast<float>(i))) {}  // NOLINT
  SHARDLIB_HOST_DEVICE constexpr operator float() const noexcept { return ToFloat(bits_); }  // NOLINT: implicit, exact

  /// The value with these bits.
  SHARDLIB_HOST_DEVICE static constexpr Self from_bits(std::uint16_t b) noexcept {
    Self s;
    s.bits_ = b;
    return s;
  }
  SHARDLIB_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  SHARDLIB_HOST_DEVICE constexpr Self& operator+=(float x) noexcept { return self() = Self(float(*this) + x); }
  SHARDLIB_HOST_DEVICE constexpr Self& operator-=(float x) noexcept { return self() = Self(float(*this) - x); }
  SHARDLIB_HOST_DEVICE constexpr Self& operator*=(float x) noexcept { return self() = Self(float(*this) * x); }
  SHARDLIB_HOST_DEVICE constexpr Self& operator/=(float x) noexcept { return self() = Self(float(*this) / x); }

 private:
  SHARDLIB_HOST_DEVICE constexpr Self& self() noexcept { return static_cast<Self&>(*this); }
  std::uint16_t bits_ = 0;
};
}  // namespace detail

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 fraction bits; largest finite 65504, smallest
/// normal 2^-14, 3.3 decimal digits. Gradients underflow in it without loss scaling.
struct f16 : detail::half_base<f16, f16_to_float, float_to_f16> {
  using half_base::half_base;
};
/// bfloat16: float's 8 exponent bits with 7 fraction bits: float's range, 2.4 decimal digits.
struct bf16 : detail::half_base<bf16, bf16_to_float, float_to_bf16> {
  using half_base::half_base;
};

static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2 && std::is_trivially_copyable_v<f16> &&
              std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);

/// Whether T is one of the 16-bit floating-point types.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<std::remove_cv_t<T>, f16> || std::is_same_v<std::remove_cv_t<T>, bf16>;

/// Whether T is a floating-point element type: float, double, f16, bf16.
template <class T>
inline constexpr bool is_floating_v = std::is_floating_point_v<T> || is_half_v<T>;

/// The type computations on T run in: float for the 16-bit types, T otherwise.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

/// Whether every floating-point type among Ts is H.
template <class H, class... Ts>
inline constexpr bool all_floating_are_v = ((!is_floating_v<Ts> || std::is_same_v<std::remove_cv_t<Ts>, H>) && ...);

/// The element type an elementwise result is stored in, when a functor computed `R` from
/// operands of element types `Ts` (16-bit ones reaching it as float): their 16-bit type when `R`
/// is float and every floating-point operand has that one 16-bit type (bf16 + bf16 is bf16, as
/// in PyTorch and JAX); `R` otherwise (bf16 + float is float).
template <class R, class... Ts>
using stored_t = std::conditional_t<
    std::is_same_v<R, float> && (is_half_v<Ts> || ...),
    std::conditional_t<all_floating_are_v<f16, Ts...>, f16, std::conditional_t<all_floating_are_v<bf16, Ts...>, bf16, R>>,
    R>;

/// The name of an element type as the library prints it ("f32", "bf16", "i64", ...).
template <class T>
constexpr const char* element_name() noexcept {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, f16>) return "f16";
  else if constexpr (std::is_same_v<U, bf16>) return "bf16";
  else if constexpr (std::is_same_v<U, float>) return "f32";
  else if constexpr (std::is_same_v<U, double>) return "f64";
  else if constexpr (std::is_integral_v<U>)
    return std::is_signed_v<U> ? (sizeof(U) == 1 ? "i8" : sizeof(U) == 2 ? "i16" : sizeof(U) == 4 ? "i32" : "i64")
                               : (sizeof(U) == 1 ? "u8" : sizeof(U) == 2 ? "u16" : sizeof(U) == 4 ? "u32" : "u64");
  else return "?";
}

}  // namespace shardlib

namespace shardlib::detail {
/// numeric_limits of a 16-bit type (the members generic numeric code asks for).
template <class H>
struct half_limits {
  static constexpr bool is_f16 = std::is_same_v<H, f16>;
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool is_iec559 = is_f16;
  static constexpr int radix = 2;
  static constexpr int digits = is_f16 ? 11 : 8;
  static constexpr int digits10 = is_f16 ? 3 : 2;
  static constexpr int max_digits10 = is_f16 ? 5 : 4;
  static constexpr int min_exponent = is_f16 ? -13 : -125;
  static constexpr int max_exponent = is_f16 ? 16 : 128;
  static constexpr H min() noexcept { return H::from_bits(is_f16 ? 0x0400 : 0x0080); }
  static constexpr H max() noexcept { return H::from_bits(is_f16 ? 0x7bff : 0x7f7f); }
  static constexpr H lowest() noexcept { return H::from_bits(is_f16 ? 0xfbff : 0xff7f); }
  static constexpr H epsilon() noexcept { return H::from_bits(is_f16 ? 0x1400 : 0x3c00); }
  static constexpr H infinity() noexcept { return H::from_bits(is_f16 ? 0x7c00 : 0x7f80); }
  static constexpr H quiet_NaN() noexcept { return H::from_bits(is_f16 ? 0x7e00 : 0x7fc0); }
  static constexpr H denorm_min() noexcept { return H::from_bits(1); }
};
}  // namespace shardlib::detail

template <>
class std::numeric_limits<shardlib::f16> : public shardlib::detail::half_limits<shardlib::f16> {};
template <>
class std::numeric_limits<shardlib::bf16> : public shardlib::detail::half_limits<shardlib::bf16> {};
