// SPDX-License-Identifier: Apache-2.0
/// @file
/// The checksum of a block of a checkpointed tensor, in a form that can be checked by devices
/// that read *other* blocks.
///
/// A block's checksum is the sum (mod 2^64) over its elements of h(k, bits): k the element's
/// global row-major index, bits its stored bytes. A sum splits over any partition of the
/// block, so a load onto another mesh checks every saved block without reading it whole: each
/// device sums h over the part of each saved block it read, one all_reduce adds the parts, and
/// the totals must equal the saved checksums. h is a bijective mix of bits + k·φ: a changed
/// element always changes the sum; several changed elements cancel with probability about
/// 2^-64 (a check against corruption, not against an adversary).
///
/// Pure code: no Kokkos, no communicator.
#pragma once
#include <shardlib/sharding/block.hpp>
#include <shardlib/sharding/reshard.hpp>

#include <cstdint>
#include <cstring>

namespace shardlib::io {

/// h(k, bits) of the file comment.
constexpr std::uint64_t element_hash(std::uint64_t k, std::uint64_t bits) noexcept {
  std::uint64_t x = bits + k * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 32);
}

namespace detail {
template <std::size_t Size>
std::uint64_t run_checksum(const unsigned char* p, std::int64_t n, std::uint64_t k) noexcept {
  // element_hash with k·φ stepped by additions, four independent sums (one multiply per element).
  constexpr std::uint64_t phi = 0x9E3779B97F4A7C15ull;
  auto h = [](const unsigned char* q, std::uint64_t kphi) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, q, Size);  // little-endian: the stored bytes, zero-extended
    std::uint64_t x = bits + kphi;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 32);
  };
  std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, kp = k * phi;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4, p += 4 * Size, kp += 4 * phi) {
    s0 += h(p, kp);
    s1 += h(p + Size, kp + phi);
    s2 += h(p + 2 * Size, kp + 2 * phi);
    s3 += h(p + 3 * Size, kp + 3 * phi);
  }
  for (; i < n; ++i, p += Size, kp += phi) s0 += h(p, kp);
  return (s0 + s1) + (s2 + s3);
}
}  // namespace detail

/// Sum of h over box `part` of a tensor of global `shape`, whose elements of `elem_size` bytes
/// are held row-major at `data` for box `layout` (`part` inside `layout`).
inline std::uint64_t box_checksum(const void* data, std::size_t elem_size, const ShardBox& layout, const ShardBox& part,
                                  shardlib::detail::ArrayRef<std::int64_t> shape) {
  const std::int64_t n = part.num_elements();
  if (n == 0) return 0;
  const int r = part.rank;
  const std::int64_t run = r == 0 ? 1 : part.extent[static_cast<std::size_t>(r - 1)];
  const std::int64_t rows = n / run;
  auto sum_run = [&](const unsigned char* p, std::int64_t k) -> std::uint64_t {
    switch (elem_size) {
      case 1: return detail::run_checksum<1>(p, run, static_cast<std::uint64_t>(k));
      case 2: return detail::run_checksum<2>(p, run, static_cast<std::uint64_t>(k));
      case 4: return detail::run_checksum<4>(p, run, static_cast<std::uint64_t>(k));
      default: return detail::run_checksum<8>(p, run, static_cast<std::uint64_t>(k));
    }
  };
  std::uint64_t sum = 0;
  std::int64_t idx[max_tensor_rank] = {};  // multi-index of the row inside `part`, dims 0..r-2
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t k = 0, off = 0;
    for (int d = 0; d < r; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const std::int64_t g = part.offset[u] + (d < r - 1 ? idx[d] : 0);
      k = k * shape[u] + g;
      off = off * layout.extent[u] + (g - layout.offset[u]);
    }
    sum += sum_run(static_cast<const unsigned char*>(data) + static_cast<std::size_t>(off) * elem_size, k);
    for (int d = r - 2; d >= 0; --d) {  // next row
      if (++idx[d] < part.extent[static_cast<std::size_t>(d)]) break;
      idx[d] = 0;
    }
  }
  return sum;
}

}  // namespace shardlib::io
