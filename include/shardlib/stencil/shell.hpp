// SPDX-License-Identifier: Apache-2.0
/// @file
/// stencil_for's boundary shell in GPU memory as one kernel: the points whose reads may leave the
/// block (the slabs of dims before the last, and the interior rows' ends), a point a thread, each
/// read resolved to the block or to the ghost region it falls in (ShellNeighbors). On the host the
/// shell's slabs are gathered with their neighbourhood into a padded copy and run as rows
/// (stencil_for.hpp); in GPU memory that took a gather and a kernel per slab (8 launches of a 3-D
/// block's sweep, 4 of a 2-D one, 3 to 9 us each on an H100 where the whole sweep of 512^3 takes
/// about 400), and the rows' ends one more.
#pragma once

#include <shardlib/execute/block.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/sharding/halo.hpp>
#include <shardlib/stencil/neighbors.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace shardlib::detail {

/// A slab of the shell: dim d's low (side 0) or high (side 1) `width[d]` layers, over the points
/// of dims k < d whose neighbours there lie in the block ([w, extent - w)) and all of dims k > d;
/// the slabs of d = 0 to R-2 and the rows [w, extent - w) of dims < R-1 cover the block once. Its
/// box is [a, a + e); `ts` the strides of its padded copy (e + 2 w per dim, row-major), `padded`
/// that copy's size (0: the slab is empty).
template <std::size_t R>
struct StencilSlab {
  std::int64_t a[R], e[R], ts[R], padded = 0;
};
template <class T, std::size_t R>
StencilSlab<R> stencil_slab(const StencilGeometry<T, R>& g, std::size_t d, int side) {
  StencilSlab<R> sl;
  for (std::size_t k = 0; k < R; ++k) {
    sl.a[k] = k < d ? g.width[k] : 0;
    sl.e[k] = k < d ? std::max<std::int64_t>(g.extent[k] - 2 * g.width[k], 0) : g.extent[k];
  }
  const std::int64_t low_end = std::min(g.width[d], g.extent[d]);
  sl.a[d] = side == 0 ? 0 : std::max(g.extent[d] - g.width[d], low_end);
  sl.e[d] = side == 0 ? low_end : g.extent[d] - sl.a[d];
  std::int64_t cells = 1, padded = 1;
  for (std::size_t k = R; k-- > 0;) {
    cells *= sl.e[k];
    sl.ts[k] = padded;
    padded *= sl.e[k] + 2 * g.width[k];
  }
  if (cells > 0) sl.padded = padded;
  return sl;
}

/// The most dims the shell kernel takes (its functor carries the 3^R ghost regions' offsets).
inline constexpr std::size_t stencil_shell_most_dims = 4;

/// nb(...) for a point of the shell: the input at a relative offset, from the block or from the
/// ghost region the read falls in (regions indexed as halo::region_index, dim 0 major, each
/// row-major in its extents: the block's along dims it spans, the width along the others).
template <class T, std::size_t R, bool Checked>
struct ShellNeighbors {
  const StencilGeometry<T, R>* g;
  const std::int64_t* region_offset;  // the kernel's copy (StencilGeometry's is the host's)
  const std::int64_t* li;             // the point's local index
  template <class... O>
  KOKKOS_INLINE_FUNCTION T operator()(O... o) const {
    static_assert(sizeof...(O) == R, "shardlib: stencil_for: nb(...) takes one offset per dim of the tensor");
    const std::int64_t off[R] = {static_cast<std::int64_t>(o)...};
    if constexpr (Checked)
      if (!checked_read(*g, off, li, 0)) return T{};
    std::int64_t q[R];
    int code[R], region = 0;
    bool inside = true;
    for (std::size_t d = 0; d < R; ++d) {
      q[d] = li[d] + off[d];
      code[d] = q[d] < 0 ? 0 : q[d] < g->extent[d] ? 1 : 2;
      region = region * 3 + code[d];
      inside = inside && code[d] == 1;
    }
    std::int64_t k = 0;
    if (inside) {
      for (std::size_t d = 0; d < R; ++d) k += q[d] * g->stride[d];
      return g->block[k];
    }
    std::int64_t s = 1;
    for (std::size_t d = R; d-- > 0;) {
      const std::int64_t pos = code[d] == 0 ? q[d] + g->width[d] : code[d] == 1 ? q[d] : q[d] - g->extent[d];
      k += pos * s;
      s *= code[d] == 1 ? g->extent[d] : g->width[d];
    }
    return g->ghosts[region_offset[region] + k];
  }
};

/// The shell's points in boxes of the block (the slabs, and with the rows' ends two boxes more),
/// a point a work item (consecutive items, consecutive points of a box's last dim).
template <bool Checked, class T, class U, std::size_t R, class F>
struct StencilShellKernel {
  static_assert(R <= stencil_shell_most_dims, "shardlib: the stencil shell kernel takes at most 4 dims");
  static constexpr int most_boxes = 2 * static_cast<int>(R);
  StencilGeometry<T, R> g;
  std::int64_t region_offset[halo::region_count(static_cast<int>(R))];
  std::int64_t lo[most_boxes][R], ext[most_boxes][R], first[most_boxes + 1];  // first: the boxes' first items
  int boxes;
  U* out;
  F f;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    int b = 0;
    while (b + 1 < boxes && item >= first[b + 1]) ++b;
    std::int64_t rest = item - first[b], li[R], at = 0;
    for (std::size_t d = R; d-- > 0;) {
      const std::int64_t e = ext[b][d];
      li[d] = lo[b][d] + rest % e;
      rest /= e;
    }
    Index<R> gi;
    for (std::size_t d = 0; d < R; ++d) {
      gi.i[d] = g.offset[d] + li[d];
      at += li[d] * g.stride[d];
    }
    const ShellNeighbors<T, R, Checked> nb{&g, region_offset, li};
    out[at] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
  }
};

/// Runs the shell of the block `g` describes on `Mem`'s instance, one kernel: the slabs of dims
/// < R-1 and, with `ends`, the ends of the rows [w, extent - w) of dims < R-1 (the last dim's
/// [0, min(w, n)) and [max(n - w, that), n)). The ghosts must be current.
template <bool Checked, class Mem, class T, class U, std::size_t R, class F>
void stencil_shell(const Context& ctx, const StencilGeometry<T, R>& g, bool ends, U* out, const F& f) {
  StencilShellKernel<Checked, T, U, R, F> k{g, {}, {}, {}, {}, 0, out, f};
  for (int r = 0; r < halo::region_count(static_cast<int>(R)); ++r) k.region_offset[r] = g.region_offset[r];
  std::int64_t items = 0;
  auto add = [&](const std::int64_t (&a)[R], const std::int64_t (&e)[R]) {
    std::int64_t n = 1;
    for (std::size_t d = 0; d < R; ++d) n *= std::max<std::int64_t>(e[d], 0);
    if (n == 0) return;
    for (std::size_t d = 0; d < R; ++d) {
      k.lo[k.boxes][d] = a[d];
      k.ext[k.boxes][d] = e[d];
    }
    k.first[k.boxes++] = items;
    items += n;
  };
  for (std::size_t d = 0; d + 1 < R; ++d)
    for (int side = 0; side < 2; ++side) {
      const StencilSlab<R> sl = stencil_slab(g, d, side);
      add(sl.a, sl.e);
    }
  if (ends) {
    const std::int64_t n = g.extent[R - 1], w = g.width[R - 1], mid0 = std::min(w, n), mid1 = std::max(n - w, mid0);
    std::int64_t a[R], e[R];
    for (std::size_t d = 0; d + 1 < R; ++d) {
      a[d] = g.width[d];
      e[d] = g.extent[d] - 2 * g.width[d];
    }
    a[R - 1] = 0;
    e[R - 1] = mid0;
    add(a, e);
    a[R - 1] = mid1;
    e[R - 1] = n - mid1;
    add(a, e);
  }
  if (items == 0) return;
  k.first[k.boxes] = items;
  for_range<Mem>("shardlib::stencil_for(shell)", ctx, items, k,
                 stencil_bytes<T, U>(items));
}

}  // namespace shardlib::detail
