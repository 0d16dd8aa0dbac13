// SPDX-License-Identifier: Apache-2.0
/// @file
/// What stencil_for's kernels hand a stencil: `nb(o...)`, the input at a relative offset (a
/// pointer and strides in the interior, the last dim's ghost regions too near a row's ends, every
/// read checked against the ghost widths under Check::on), the block's geometry as the kernels
/// see it, and the wrapper that makes a GPU stencil's functor a device functor.
#pragma once

#include <shardlib/detail/attributes.hpp>
#include <shardlib/execute/block.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>

namespace shardlib::detail {

/// Where the first out-of-width read of a checked stencil went, as integers in the block's
/// memory space (zeroed when allocated, read back after the loop): whether one happened, its
/// offset and the point's global index (the ghosted view keeps them: Ghosted::reset_fault).
struct StencilFault {
  static constexpr std::size_t hit = 0, offset = 1, index = 1 + max_tensor_rank, size = 1 + 2 * max_tensor_rank;
};

/// What the kernels know of a ghosted input block (pointers into the block's memory space, but
/// `region_offset`, which the host reads when it launches them).
template <class T, std::size_t R>
struct StencilGeometry {
  const T* block = nullptr;
  const T* ghosts = nullptr;
  const std::int64_t* region_offset = nullptr;
  std::int64_t extent[R] = {}, stride[R] = {}, width[R] = {}, offset[R] = {};
  std::int64_t* fault = nullptr;  // Check::on: StencilFault::size integers

  /// Whether the block has fewer than 2^31 elements: the tile and plane kernels index it with
  /// 32-bit integers (one multiply-add an address).
  bool fits_int() const noexcept {
    std::int64_t elements = 1;
    for (std::size_t d = 0; d < R; ++d) elements *= extent[d] > 1 ? extent[d] : 1;
    return elements < std::numeric_limits<int>::max();
  }
};

/// The bytes a stencil launch over `points` points moves, for kernels::count_kernel (the cost
/// model's figure): each point read once (T) and written once (U), whatever the kernel.
template <class T, class U>
constexpr std::uint64_t stencil_bytes(std::int64_t points) noexcept {
  return static_cast<std::uint64_t>(points > 0 ? points : 0) * (sizeof(T) + sizeof(U));
}

/// Checked reads: whether offset `off` lies within the widths; if not, the first such read (over
/// all threads) is recorded with the point's global index `g.offset + li` (+ j along the last dim).
template <class T, std::size_t R>
KOKKOS_INLINE_FUNCTION bool checked_read(const StencilGeometry<T, R>& g, const std::int64_t (&off)[R], const std::int64_t* li,
                                         std::int64_t j) {
  bool ok = true;
  for (std::size_t d = 0; d < R; ++d) ok = ok && off[d] <= g.width[d] && -off[d] <= g.width[d];
  if (!ok && Kokkos::atomic_compare_exchange(g.fault + StencilFault::hit, std::int64_t{0}, std::int64_t{1}) == 0)
    for (std::size_t d = 0; d < R; ++d) {
      g.fault[StencilFault::offset + d] = off[d];
      g.fault[StencilFault::index + d] = g.offset[d] + li[d] + (d + 1 == R ? j : 0);
    }
  return ok;
}

/// nb(...): the input at a relative offset, through a pointer and strides (`Idx`: int in the
/// GPU's tile kernel, whose blocks have fewer than 2^31 elements: one multiply-add an address).
template <class T, std::size_t R, bool Checked, class Idx = std::int64_t>
struct Neighbors {
  const T* at;  // the point itself
  Idx s[R];
  template <class... O>
  KOKKOS_INLINE_FUNCTION T operator()(O... o) const {
    static_assert(sizeof...(O) == R, "shardlib: stencil_for: nb(...) takes one offset per dim of the tensor");
    const Idx off[R] = {static_cast<Idx>(o)...};
    Idx k = 0;
    for (std::size_t d = 0; d < R; ++d) k += off[d] * s[d];
    return at[k];
  }
};
/// The checked form: a read beyond the widths is recorded (the first one) and reads T{}.
template <class T, std::size_t R>
struct Neighbors<T, R, true, std::int64_t> {
  const T* at;
  std::int64_t s[R];
  const StencilGeometry<T, R>* g;
  std::int64_t li[R];  // the point's local index, for the message
  template <class... O>
  KOKKOS_INLINE_FUNCTION T operator()(O... o) const {
    static_assert(sizeof...(O) == R, "shardlib: stencil_for: nb(...) takes one offset per dim of the tensor");
    const std::int64_t off[R] = {static_cast<std::int64_t>(o)...};
    if (!checked_read(*g, off, li, 0)) return T{};
    std::int64_t k = 0;
    for (std::size_t d = 0; d < R; ++d) k += off[d] * s[d];
    return at[k];
  }
};

/// One row: out[j] = f(i + (0, ..., j), nb at in + j), j < len; restrict pointers so that the
/// compiler vectorises it as it would a plain loop.
template <class T, class U, std::size_t R, class F>
KOKKOS_INLINE_FUNCTION void stencil_row(const T* __restrict in, U* __restrict out, std::int64_t len, const std::int64_t (&s)[R],
                                        Index<R> gi, const F& f) {
  for (std::int64_t j = 0; j < len; ++j) {
    Neighbors<T, R, false> nb{in + j, {}};
    for (std::size_t d = 0; d < R; ++d) nb.s[d] = s[d];
    out[j] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
    ++gi.i[R - 1];
  }
}

/// The stencil functor of a tensor in GPU memory, called from the GPU kernels: under nvcc a
/// functor that calls host code is a compile error here (not nvcc's warning, which would leave a
/// kernel that fails when it runs). A stencil in GPU memory is a struct whose templated
/// `operator()(const Index<R>&, const Nb&)` is KOKKOS_INLINE_FUNCTION (nvcc has no generic
/// __host__ __device__ lambdas).
SHARDLIB_DEVICE_FUNCTORS_BEGIN
template <class F>
struct DeviceStencil {
  F f;
  template <class I, class Nb>
  KOKKOS_FORCEINLINE_FUNCTION auto operator()(const I& i, const Nb& nb) const {
    return f(i, nb);
  }
};
SHARDLIB_DEVICE_FUNCTORS_END

/// nb(...) for points near the ends of a row whose neighbours in the other dims are all in the
/// block: only the last dim can leave it, into the low or high ghost region of the last dim.
template <class T, std::size_t R, bool Checked>
struct EdgeNeighbors {
  const T* row;                // the block at (row, 0)
  const T* low;                // the last dim's low ghost region at (row, 0)
  const T* high;               // ... high ghost region
  const std::int64_t* s;       // block strides
  const std::int64_t* gs;      // the ghost regions' strides
  std::int64_t j, n, w;        // the point's position in the row, the row's length, the width
  const StencilGeometry<T, R>* g;
  const std::int64_t* li;      // the row's local index (Checked: for the message)
  template <class... O>
  KOKKOS_INLINE_FUNCTION T operator()(O... o) const {
    static_assert(sizeof...(O) == R, "shardlib: stencil_for: nb(...) takes one offset per dim of the tensor");
    const std::int64_t off[R] = {static_cast<std::int64_t>(o)...};
    if constexpr (Checked)
      if (!checked_read(*g, off, li, j)) return T{};
    std::int64_t k = 0, kg = 0;
    for (std::size_t d = 0; d + 1 < R; ++d) {
      k += off[d] * s[d];
      kg += off[d] * gs[d];
    }
    const std::int64_t p = j + off[R - 1];
    return p < 0 ? low[kg + p + w] : p < n ? row[k + p] : high[kg + p - n];
  }
};

}  // namespace shardlib::detail
