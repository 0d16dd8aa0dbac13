// SPDX-License-Identifier: Apache-2.0
/// @file
/// Host reduction kernels for backends that reduce in shared memory (threads).
#pragma once

#include <shardlib/collectives/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace shardlib::coll::detail {

template <class T>
inline void combine(T* out, const T* in, std::size_t n, Op op) noexcept {
  switch (op) {
    case Op::sum: for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(out[i] + in[i]); break;
    case Op::prod: for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(out[i] * in[i]); break;
    case Op::max: for (std::size_t i = 0; i < n; ++i) out[i] = in[i] > out[i] ? in[i] : out[i]; break;
    case Op::min: for (std::size_t i = 0; i < n; ++i) out[i] = in[i] < out[i] ? in[i] : out[i]; break;
  }
}

/// out[i] = op over k of in[k][i], for `inputs` arrays of `n` elements. `out` may alias in[0]
/// (only in[0]). Works in cache-sized chunks so each output chunk is combined while hot.
template <class T>
inline void reduce_arrays(T* out, const T* const* in, int inputs, std::size_t n, Op op) noexcept {
  constexpr std::size_t chunk = 4096 / sizeof(T) > 0 ? 4096 / sizeof(T) : 1;
  for (std::size_t b = 0; b < n; b += chunk) {
    std::size_t m = std::min(chunk, n - b);
    if (out + b != in[0] + b) std::memcpy(out + b, in[0] + b, m * sizeof(T));
    for (int k = 1; k < inputs; ++k) combine(out + b, in[k] + b, m, op);
  }
}

/// 16-bit float formats reduce through float, one chunk at a time.
template <float (*to_float)(std::uint16_t), std::uint16_t (*from_float)(float)>
inline void reduce_16(std::uint16_t* out, const std::uint16_t* const* in, int inputs, std::size_t n, Op op) noexcept {
  constexpr std::size_t chunk = 1024;
  float acc[chunk], x[chunk];
  for (std::size_t b = 0; b < n; b += chunk) {
    std::size_t m = std::min(chunk, n - b);
    for (std::size_t i = 0; i < m; ++i) acc[i] = to_float(in[0][b + i]);
    for (int k = 1; k < inputs; ++k) {
      for (std::size_t i = 0; i < m; ++i) x[i] = to_float(in[k][b + i]);
      combine(acc, x, m, op);
    }
    for (std::size_t i = 0; i < m; ++i) out[b + i] = from_float(acc[i]);
  }
}

/// Type-erased reduction of `inputs` arrays of `n` elements of type `t` into `out`.
inline void reduce(void* out, const void* const* in, int inputs, std::size_t n, DType t, Op op) {
  auto run = [&](auto* typed_out) {
    using T = std::remove_pointer_t<decltype(typed_out)>;
    reduce_arrays<T>(typed_out, reinterpret_cast<const T* const*>(in), inputs, n, op);
  };
  switch (t) {
    case DType::i8: run(static_cast<std::int8_t*>(out)); break;
    case DType::u8: run(static_cast<std::uint8_t*>(out)); break;
    case DType::i16: run(static_cast<std::int16_t*>(out)); break;
    case DType::u16: run(static_cast<std::uint16_t*>(out)); break;
    case DType::i32: run(static_cast<std::int32_t*>(out)); break;
    case DType::u32: run(static_cast<std::uint32_t*>(out)); break;
    case DType::i64: run(static_cast<std::int64_t*>(out)); break;
    case DType::u64: run(static_cast<std::uint64_t*>(out)); break;
    case DType::f32: run(static_cast<float*>(out)); break;
    case DType::f64: run(static_cast<double*>(out)); break;
    case DType::f16:
      reduce_16<f16_to_float, float_to_f16>(static_cast<std::uint16_t*>(out),
                                            reinterpret_cast<const std::uint16_t* const*>(in), inputs, n, op);
      break;
    case DType::bf16:
      reduce_16<bf16_to_float, float_to_bf16>(static_cast<std::uint16_t*>(out),
                                              reinterpret_cast<const std::uint16_t* const*>(in), inputs, n, op);
      break;
  }
}

}  // namespace shardlib::coll::detail
