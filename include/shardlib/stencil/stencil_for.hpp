// SPDX-License-Identifier: Apache-2.0
/// @file
/// Stencil loops: `stencil_for(out, in, f)` sets every element of `out` to `f(i, nb)`, where `i`
/// is its global index and `nb(dx, dy, ...)` reads the input at a relative offset — from the
/// block, or from the ghost layers of the ghosted view `in`.
///
/// The loop refreshes the ghosts itself, overlapping the exchange with work: it starts the
/// exchange, runs the interior (points whose reads all fall inside the block), finishes the
/// exchange, then the boundary shell: the two ends of each interior row (whose reads leave the
/// block along the last dim only), and the slabs of the other dims, each first gathered with its
/// neighbourhood (block and ghost cells) into a padded copy. The kernels (Kokkos, on the device's
/// execution-space instance) run one row (the contiguous last dim) per work item; in the interior
/// `nb` is a pointer and strides and the row a restrict loop, so a stencil written as a generic
/// lambda compiles to the plain loop one would write over the block.
///
/// `stencil_for<sl::Check::on>(...)` checks every read against the ghost widths and throws
/// std::out_of_range naming the offset, the index and the widths (after the loop, on the device
/// that read out of bounds).
#pragma once

#include <shardlib/kernels/exec.hpp>
#include <shardlib/stencil/ghosted.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlib {

/// Whether stencil_for checks each neighbour read against the ghost widths.
enum class Check : bool { off, on };

/// How stencil_for refreshes the input's ghost cells.
enum class GhostRefresh : std::uint8_t {
  overlap,   ///< start the exchange, interior, finish it, boundary shell (the default)
  blocking,  ///< exchange first, then the whole block (for comparison)
  none,      ///< the ghosts are current (an exchange() since the input last changed)
};

namespace error {
template <class Spec, class OtherSpec>
struct stencil_for_needs_output_and_input_of_one_mesh_and_spec;
}  // namespace error

namespace detail {

/// Where the first out-of-width read of a checked stencil went.
struct StencilFault {
  std::atomic<int> hit{0};
  std::int64_t offset[max_tensor_rank] = {};
  std::int64_t index[max_tensor_rank] = {};
};

/// What the kernels know of a ghosted input block.
template <class T, std::size_t R>
struct StencilGeometry {
  const T* block = nullptr;
  const T* ghosts = nullptr;
  const std::int64_t* region_offset = nullptr;
  std::int64_t extent[R] = {}, stride[R] = {}, width[R] = {}, offset[R] = {};
  StencilFault* fault = nullptr;
};

/// Checked reads: whether offset `off` lies within the widths; if not, the first such read (over
/// all threads) is recorded with the point's global index `g.offset + li` (+ j along the last dim).
template <class T, std::size_t R>
KOKKOS_INLINE_FUNCTION bool checked_read(const StencilGeometry<T, R>& g, const std::int64_t (&off)[R], const std::int64_t* li,
                                         std::int64_t j) {
  bool ok = true;
  for (std::size_t d = 0; d < R; ++d) ok = ok && off[d] <= g.width[d] && -off[d] <= g.width[d];
  if (!ok) {
    int expected = 0;
    if (g.fault->hit.compare_exchange_strong(expected, 1))
      for (std::size_t d = 0; d < R; ++d) {
        g.fault->offset[d] = off[d];
        g.fault->index[d] = g.offset[d] + li[d] + (d + 1 == R ? j : 0);
      }
  }
  return ok;
}

/// nb(...): the input at a relative offset, through a pointer and strides.
template <class T, std::size_t R, bool Checked>
struct Neighbors {
  const T* at;  // the point itself
  std::int64_t s[R];
  template <class... O>
  KOKKOS_INLINE_FUNCTION T operator()(O... o) const {
    static_assert(sizeof...(O) == R, "shardlib: stencil_for: nb(...) takes one offset per dim of the tensor");
    const std::int64_t off[R] = {static_cast<std::int64_t>(o)...};
    std::int64_t k = 0;
    for (std::size_t d = 0; d < R; ++d) k += off[d] * s[d];
    return at[k];
  }
};
/// The checked form: a read beyond the widths is recorded (the first one) and reads T{}.
template <class T, std::size_t R>
struct Neighbors<T, R, true> {
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

template <std::size_t R>
inline std::int64_t flat(const std::int64_t (&i)[R], const std::int64_t (&s)[R]) noexcept {
  std::int64_t k = 0;
  for (std::size_t d = 0; d < R; ++d) k += i[d] * s[d];
  return k;
}

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

/// out[box [lo, lo + ext) of the block] = f(global index, nb), one row per work item; `in` is the
/// input at the box's first point, with strides `is` (the block itself, or a padded copy). Rows
/// run along the last dim, or along the innermost long dim when the last is short (a slab of the
/// shell one cell thin in the last dim has rows of one point otherwise).
template <bool Checked, class T, class U, std::size_t R, class F>
void stencil_box(const Context& ctx, const StencilGeometry<T, R>& g, const std::int64_t (&lo)[R], const std::int64_t (&ext)[R],
                 const T* in, const std::int64_t (&is)[R], U* out, const F& f) {
  std::size_t rd = R - 1;
  while (rd > 0 && ext[rd] < 16 && ext[rd - 1] > ext[rd]) --rd;
  std::int64_t rows = 1;
  for (std::size_t d = 0; d < R; ++d)
    if (d != rd) rows *= ext[d];
  const std::int64_t len = ext[rd];
  if (rows <= 0 || len <= 0) return;
  struct Box {
    std::int64_t lo[R], ext[R], in_stride[R];
  } box{};
  for (std::size_t d = 0; d < R; ++d) {
    box.lo[d] = lo[d];
    box.ext[d] = ext[d];
    box.in_stride[d] = is[d];
  }
  const bool unit = rd == R - 1 && is[R - 1] == 1;
  auto guard = kernel_guard(ctx, false);
  Kokkos::parallel_for(
      "shardlib::stencil_for", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(ctx.exec(), 0, rows),
      [=](std::int64_t row) {
        std::int64_t li[R];  // local index of the row's first point
        std::int64_t rest = row, from = 0;
        for (std::size_t d = R; d-- > 0;) {
          if (d == rd) {
            li[d] = box.lo[d];
            continue;
          }
          const std::int64_t k = rest % box.ext[d];
          rest /= box.ext[d];
          li[d] = box.lo[d] + k;
          from += k * box.in_stride[d];
        }
        Index<R> gi;
        std::int64_t to = 0;
        for (std::size_t d = 0; d < R; ++d) {
          gi.i[d] = g.offset[d] + li[d];
          to += li[d] * g.stride[d];
        }
        if constexpr (!Checked) {
          if (unit) {
            stencil_row<T, U, R>(in + from, out + to, len, box.in_stride, gi, f);
            return;
          }
        }
        const std::int64_t si = box.in_stride[rd], so = g.stride[rd];
        for (std::int64_t j = 0; j < len; ++j) {
          if constexpr (Checked) {
            Neighbors<T, R, true> nb{in + from + j * si, {}, &g, {}};
            for (std::size_t d = 0; d < R; ++d) {
              nb.s[d] = box.in_stride[d];
              nb.li[d] = li[d] + (d == rd ? j : 0);
            }
            out[to + j * so] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
          } else {
            Neighbors<T, R, false> nb{in + from + j * si, {}};
            for (std::size_t d = 0; d < R; ++d) nb.s[d] = box.in_stride[d];
            out[to + j * so] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
          }
          ++gi.i[rd];
        }
      });
  kernels::fence(ctx.exec());
}

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

/// Which points of each row stencil_rows computes.
enum class RowPart : std::uint8_t { middle, ends, all };

/// The rows whose neighbours in dims < R-1 lie in the block (local indices [w, n - w) there):
/// their middle points ([w, n - w) of the last dim) read only the block; their end points read
/// the last dim's ghost regions too.
template <bool Checked, class T, class U, std::size_t R, class F>
void stencil_rows(const Context& ctx, const StencilGeometry<T, R>& g, RowPart part, U* out, const F& f) {
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < R; ++d) rows *= std::max<std::int64_t>(g.extent[d] - 2 * g.width[d], 0);
  const std::int64_t n = g.extent[R - 1], w = g.width[R - 1];
  if (rows <= 0 || n <= 0) return;
  // The last dim's ghost regions (codes 1, ..., 1, 0 and 1, ..., 1, 2) and their strides.
  struct Rows {
    std::int64_t gs[R];
    const T* low;
    const T* high;
  } r{};
  std::int64_t m = 1;
  for (std::size_t d = R; d-- > 0;) {
    r.gs[d] = m;
    m *= d + 1 == R ? w : g.extent[d];
  }
  const int centre = halo::centre_region(static_cast<int>(R));
  r.low = g.ghosts + g.region_offset[centre - 1];
  r.high = g.ghosts + g.region_offset[centre + 1];
  const std::int64_t mid0 = std::min(w, n), mid1 = std::max(n - w, mid0);
  auto guard = kernel_guard(ctx, false);
  Kokkos::parallel_for(
      "shardlib::stencil_for", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(ctx.exec(), 0, rows),
      [=](std::int64_t row) {
        std::int64_t li[R] = {};
        std::int64_t rest = row;
        for (std::size_t d = R - 1; d-- > 0;) {
          const std::int64_t e = g.extent[d] - 2 * g.width[d];
          li[d] = g.width[d] + rest % e;
          rest /= e;
        }
        Index<R> gi;
        std::int64_t at = 0, atg = 0;
        for (std::size_t d = 0; d < R; ++d) {
          gi.i[d] = g.offset[d] + li[d];
          at += li[d] * g.stride[d];
          atg += li[d] * r.gs[d];
        }
        auto end = [&](std::int64_t j) {
          const EdgeNeighbors<T, R, Checked> nb{g.block + at, r.low + atg, r.high + atg, g.stride, r.gs, j, n, w, &g, li};
          Index<R> gj = gi;
          gj.i[R - 1] = g.offset[R - 1] + j;
          out[at + j] = static_cast<U>(f(static_cast<const Index<R>&>(gj), nb));
        };
        if (part != RowPart::middle)
          for (std::int64_t j = 0; j < mid0; ++j) end(j);
        if (part != RowPart::ends) {
          Index<R> gm = gi;
          gm.i[R - 1] = g.offset[R - 1] + mid0;
          if constexpr (!Checked) {
            stencil_row<T, U, R>(g.block + at + mid0, out + at + mid0, mid1 - mid0, g.stride, gm, f);
          } else {
            for (std::int64_t j = mid0; j < mid1; ++j) {
              Neighbors<T, R, true> nb{g.block + at + j, {}, &g, {}};
              for (std::size_t d = 0; d < R; ++d) {
                nb.s[d] = g.stride[d];
                nb.li[d] = li[d] + (d + 1 == R ? j : 0);
              }
              out[at + j] = static_cast<U>(f(static_cast<const Index<R>&>(gm), nb));
              ++gm.i[R - 1];
            }
          }
        }
        if (part != RowPart::middle)
          for (std::int64_t j = mid1; j < n; ++j) end(j);
      });
  kernels::fence(ctx.exec());
}

/// The box [lo - w, lo + ext + w) around a box of the block, gathered from the block and the
/// ghost regions into `tmp` (row-major; its strides to `ts`).
template <class T, std::size_t R>
void gather_padded(const Context& ctx, const StencilGeometry<T, R>& g, const std::int64_t (&lo)[R], const std::int64_t (&ext)[R],
                   std::vector<T>& tmp, std::int64_t (&ts)[R]) {
  std::int64_t p0[R], pe[R], n = 1;
  for (std::size_t d = R; d-- > 0;) {
    p0[d] = lo[d] - g.width[d];
    pe[d] = ext[d] + 2 * g.width[d];
    ts[d] = n;
    n *= pe[d];
  }
  if (tmp.size() < static_cast<std::size_t>(n)) tmp.resize(static_cast<std::size_t>(n));
  const int rank = static_cast<int>(R), regions = halo::region_count(rank);
  auto guard = kernel_guard(ctx, false);
  for (int r = 0; r < regions; ++r) {
    kernels::detail::StridedView src, dst;
    src.rank = dst.rank = rank;
    const bool centre = r == halo::centre_region(rank);
    bool empty = false;
    std::int64_t rs = 1;  // the ghost region's strides (row-major in its extents)
    for (std::size_t d = R; d-- > 0 && !empty;) {
      const int code = halo::region_code(r, static_cast<int>(d), rank);
      const std::int64_t r0 = code == 0 ? -g.width[d] : code == 1 ? 0 : g.extent[d];
      const std::int64_t re = code == 1 ? g.extent[d] : g.width[d];
      const std::int64_t a = std::max(r0, p0[d]), b = std::min(r0 + re, p0[d] + pe[d]);
      empty = a >= b;
      src.extent[d] = dst.extent[d] = b - a;
      src.stride[d] = centre ? g.stride[d] : rs;
      src.offset += (a - r0) * src.stride[d];
      dst.stride[d] = ts[d];
      dst.offset += (a - p0[d]) * ts[d];
      rs *= re;
    }
    if (empty) continue;
    const T* from = centre ? g.block : g.ghosts + g.region_offset[r];
    kernels::copy_strided(ctx.exec(), "shardlib::stencil_for::gather", from, src, tmp.data(), dst);
  }
}

template <class T, class MeshT, class SpecT, class Mem>
StencilGeometry<T, SpecT::rank> stencil_geometry(const Ghosted<T, MeshT, SpecT, Mem>& in, StencilFault* fault) {
  constexpr std::size_t R = SpecT::rank;
  StencilGeometry<T, R> g;
  const ShardBox& b = in.tensor().block();
  g.block = in.tensor().local().data();
  g.ghosts = in.ghost_data();
  g.region_offset = in.region_offsets();
  std::int64_t s = 1;
  for (std::size_t d = R; d-- > 0;) {
    g.extent[d] = b.extent[d];
    g.stride[d] = s;
    s *= b.extent[d];
    g.width[d] = in.width(d);
    g.offset[d] = b.offset[d];
  }
  g.fault = fault;
  return g;
}

}  // namespace detail

/// Sets every element of `out` to `f(const Index<R>& i, const auto& nb)`, where `nb(o_0, ...,
/// o_{R-1})` is the input at global index i + o (|o_d| <= the ghost width of dim d). `out` has
/// the mesh, spec and shape of `in`'s tensor and is another tensor (a stencil reads the old
/// values while writing the new). The ghosts are refreshed as `refresh` says (collective unless
/// GhostRefresh::none). Throws std::invalid_argument for another shape or an output that is the
/// input; std::out_of_range for a read beyond the widths (Check::on).
template <Check C = Check::off, class U, class T, class MeshT, class SpecT, class OutSpec, class Mem, class F>
void stencil_for(DistributedTensor<U, MeshT, OutSpec, Mem>& out, Ghosted<T, MeshT, SpecT, Mem>& in, F f,
                 GhostRefresh refresh = GhostRefresh::overlap) {
  constexpr std::size_t R = SpecT::rank;
  SHARDLIB_STATIC_REQUIRE((std::is_same_v<OutSpec, SpecT>),
                          "shardlib: stencil_for: the output needs the input's spec (the same block on each device)",
                          error::stencil_for_needs_output_and_input_of_one_mesh_and_spec<OutSpec, SpecT>);
  constexpr bool Checked = C == Check::on;
  static_assert(std::is_invocable_v<const F&, const Index<R>&, const detail::Neighbors<T, R, Checked>&> &&
                    std::is_invocable_v<const F&, const Index<R>&, const detail::EdgeNeighbors<T, R, Checked>&>,
                "shardlib: stencil_for: the functor must be callable as f(const sl::Index<R>& i, const auto& nb), with "
                "nb(offsets...) reading a neighbour (a generic lambda)");
  const auto& t = in.tensor();
  if (out.shape() != t.shape())
    throw std::invalid_argument("shardlib: stencil_for: the output has shape " + detail::shape_text(out.shape()) +
                                ", the input is " + in.describe());
  if (static_cast<const void*>(out.local().data()) == static_cast<const void*>(t.local().data()) && t.block().num_elements() > 0)
    throw std::invalid_argument("shardlib: stencil_for: the output is the input (" + in.describe() +
                                "); a stencil reads old values while it writes new ones: write into another tensor "
                                "and swap them");
  if (in.in_flight())
    throw std::logic_error("shardlib: stencil_for: the input (" + in.describe() +
                           ") has an exchange in flight; finish() it first");
  detail::StencilFault fault;
  const auto g = detail::stencil_geometry(in, &fault);
  Context& ctx = t.context();
  U* o = out.local().data();
  // The rows whose neighbours in dims < R-1 are in the block: their middles while the ghosts
  // travel, their ends after; then the slabs of dims < R-1 (each gathered with its
  // neighbourhood into a padded copy, then run on pointers and strides as the rows are).
  if (refresh == GhostRefresh::overlap) {
    in.start();
    try {
      detail::stencil_rows<Checked>(ctx, g, detail::RowPart::middle, o, f);
    } catch (...) {
      in.finish();
      throw;
    }
    in.finish();
    detail::stencil_rows<Checked>(ctx, g, detail::RowPart::ends, o, f);
  } else {
    if (refresh == GhostRefresh::blocking) in.exchange();
    detail::stencil_rows<Checked>(ctx, g, detail::RowPart::all, o, f);
  }
  std::vector<T>& tmp = in.scratch();
  for (std::size_t d = 0; d + 1 < R; ++d) {
    for (int side = 0; side < 2; ++side) {
      std::int64_t a[R], e[R];
      for (std::size_t k = 0; k < R; ++k) {
        a[k] = k < d ? g.width[k] : 0;
        e[k] = k < d ? std::max<std::int64_t>(g.extent[k] - 2 * g.width[k], 0) : g.extent[k];
      }
      const std::int64_t low_end = std::min(g.width[d], g.extent[d]);
      a[d] = side == 0 ? 0 : std::max(g.extent[d] - g.width[d], low_end);
      e[d] = side == 0 ? low_end : g.extent[d] - a[d];
      std::int64_t cells = 1;
      for (std::size_t k = 0; k < R; ++k) cells *= e[k];
      if (cells == 0) continue;
      std::int64_t ts[R];
      detail::gather_padded(ctx, g, a, e, tmp, ts);
      std::int64_t first = 0;
      for (std::size_t k = 0; k < R; ++k) first += g.width[k] * ts[k];
      detail::stencil_box<Checked>(ctx, g, a, e, tmp.data() + first, ts, o, f);
    }
  }
  if (fault.hit.load()) {
    std::string off, idx, w;
    for (std::size_t d = 0; d < R; ++d) {
      off += (d ? ", " : "") + std::to_string(fault.offset[d]);
      idx += (d ? ", " : "") + std::to_string(fault.index[d]);
      w += (d ? ", " : "") + std::to_string(g.width[d]);
    }
    throw std::out_of_range("shardlib: stencil_for: nb(" + off + ") at global index (" + idx +
                            ") reads beyond the ghost widths (" + w + ") of the input (" + in.describe() +
                            "); read at most the width away, or make the ghosted view wider");
  }
}

}  // namespace shardlib
