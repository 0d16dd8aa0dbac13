// SPDX-License-Identifier: Apache-2.0
/// @file
/// Element types and reduction operations of the collectives layer.
///
/// The collectives know nothing of tensors or Kokkos: a buffer is a pointer, an element count
/// and a `DType`. f16 and bf16 are the 16-bit storage formats of half.hpp (IEEE binary16 and
/// bfloat16); backends that reduce them on the host convert to float and back.
#pragma once

#include <shardlib/half.hpp>
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

/// The DType of a C++ element type: arithmetic types, shardlib::f16 and shardlib::bf16 (half.hpp).
/// (Kokkos' half_t / bhalf_t map here in collectives/views.hpp, where the Kokkos in use has them.)
template <class T>
constexpr DType dtype_of() noexcept {
  using U = std::remove_cv_t<T>;
  static_assert(std::is_arithmetic_v<U> || is_half_v<U>,
                "shardlib::coll::dtype_of: collectives move arithmetic types, f16 and bf16 only");
  if constexpr (std::is_same_v<U, f16>) return DType::f16;
  else if constexpr (std::is_same_v<U, bf16>) return DType::bf16;
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

}  // namespace shardlib::coll
