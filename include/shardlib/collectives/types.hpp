// SPDX-License-Identifier: Apache-2.0
/// @file
/// Element types and reduction operations of the collectives layer.
///
/// The collectives know nothing of tensors or Kokkos: a buffer is a pointer, an element count
/// and a `DType`. f16 and bf16 are 16-bit storage formats here (IEEE binary16 and bfloat16);
/// backends that reduce them convert to float and back.
#pragma once

#include <shardlib/reduce_op.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace shardlib::coll {

/// Element type of a collective's buffers.
enum class DType : std::uint8_t { i8, u8, i16, u16, i32, u32, i64, u64, f16, bf16, f32, f64 };

/// How a reduction combines elements: the library's one reduction enum, `shardlib::ReduceOp`
/// (reduce_op.hpp) under its collectives name; `coll::Op::max` is `ReduceOp::max`.
using Op = ::shardlib::ReduceOp;

constexpr std::size_t size_of(DType t) noexcept {
  switch (t) {
    case DType::i8: case DType::u8: return 1;
    case DType::i16: case DType::u16: case DType::f16: case DType::bf16: return 2;
    case DType::i32: case DType::u32: case DType::f32: return 4;
    case DType::i64: case DType::u64: case DType::f64: return 8;
  }
  return 0;
}

constexpr std::string_view name(DType t) noexcept {
  switch (t) {
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i16: return "i16";
    case DType::u16: return "u16";
    case DType::i32: return "i32";
    case DType::u32: return "u32";
    case DType::i64: return "i64";
    case DType::u64: return "u64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
  }
  return "?";
}

constexpr std::string_view name(Op op) noexcept { return ::shardlib::to_string(op); }

/// 16-bit IEEE binary16 storage (what f16 buffers hold).
struct f16_bits {
  std::uint16_t bits;
};
/// 16-bit bfloat16 storage (what bf16 buffers hold).
struct bf16_bits {
  std::uint16_t bits;
};

/// The DType of a C++ element type: arithmetic types, f16_bits and bf16_bits.
/// (Kokkos' half_t / bhalf_t map here in collectives/views.hpp, where the Kokkos in use has them.)
template <class T>
constexpr DType dtype_of() noexcept {
  using U = std::remove_cv_t<T>;
  static_assert(std::is_arithmetic_v<U> || std::is_same_v<U, f16_bits> || std::is_same_v<U, bf16_bits>,
                "shardlib::coll::dtype_of: collectives move arithmetic types, f16 and bf16 only");
  if constexpr (std::is_same_v<U, f16_bits>) return DType::f16;
  else if constexpr (std::is_same_v<U, bf16_bits>) return DType::bf16;
  else if constexpr (std::is_same_v<U, bool>) return DType::u8;
  else if constexpr (std::is_floating_point_v<U>) {
    static_assert(sizeof(U) == 4 || sizeof(U) == 8, "shardlib::coll: long double is not supported");
    return sizeof(U) == 4 ? DType::f32 : DType::f64;
  } else if constexpr (std::is_signed_v<U>) {
    return sizeof(U) == 1 ? DType::i8 : sizeof(U) == 2 ? DType::i16 : sizeof(U) == 4 ? DType::i32 : DType::i64;
  } else {
    return sizeof(U) == 1 ? DType::u8 : sizeof(U) == 2 ? DType::u16 : sizeof(U) == 4 ? DType::u32 : DType::u64;
  }
}

/// IEEE binary16 <-> float (round to nearest even), for backends that reduce f16 on the host.
inline float f16_to_float(std::uint16_t h) noexcept {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
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
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline std::uint16_t float_to_f16(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (absx < 0x38800000u) {  // below half's smallest normal: a multiple of 2^-24, rounded to even
    float a;
    std::memcpy(&a, &absx, 4);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  std::uint32_t e = ((absx >> 23) - 127 + 15) << 10;
  std::uint32_t m = (absx >> 13) & 0x3ffu;
  std::uint32_t rest = absx & 0x1fffu;
  std::uint32_t h = e | m;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}
/// bfloat16 <-> float (round to nearest even; NaN stays NaN).
inline float bf16_to_float(std::uint16_t b) noexcept {
  std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline std::uint16_t float_to_bf16(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

}  // namespace shardlib::coll
