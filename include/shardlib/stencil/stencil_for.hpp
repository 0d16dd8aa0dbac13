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
/// neighbourhood (block and ghost cells) into a padded copy (one kernels::copy_pieces batch, made
/// once per view); in GPU memory the whole shell is one kernel instead (stencil/shell.hpp: each
/// read resolved to the block or its ghost region; blocks of up to 4 dims). The
/// kernels (Kokkos, on the device's execution-space instance) run one row (the contiguous last dim)
/// per work item on the host; in GPU memory a 1-D or 2-D block runs in tiles (a team takes a tile
/// of columns over several rows, a point a thread in each: the rows it reads again come from L1)
/// and a block of more dims a team of GPU threads per row (consecutive threads on consecutive
/// points, the row's index worked out once per team); in the interior `nb` is a pointer and strides
/// and the row a restrict loop, so a stencil written as a generic lambda compiles to the plain loop
/// one would write over the block. SHARDLIB_STENCIL_PLANES=1 runs a 2-D or 3-D block's interior in
/// GPU memory as planes in shared memory instead (stencil/planes.hpp; not the default yet).
///
/// `stencil_for<sl::Check::on>(...)` checks every read against the ghost widths and throws
/// std::out_of_range naming the offset, the index, the device and the widths (after the loop, on
/// every device: the first device that read out of bounds tells the others).
///
/// In shape-only mode (detail/shape_only.hpp) stencil_for refreshes the ghosts as it would (the
/// exchange is counted) and runs no kernel; Check::on finds no read out of bounds.
#pragma once

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/execute/block.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/stencil/ghosted.hpp>
#include <shardlib/stencil/neighbors.hpp>
#include <shardlib/stencil/planes.hpp>
#include <shardlib/stencil/shell.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <span>
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

/// out[box [lo, lo + ext) of the block] = f(global index, nb): `in` is the input at the box's
/// first point, with strides `in_stride` (the block itself, or a padded copy). Rows run along
/// dim `rd` (the last dim, or the innermost long one when the last is short: a slab of the shell
/// one cell thin in the last dim would have rows of one point). A work item is a row on the host
/// (PerPoint false: the row is a plain loop) and one point on a GPU (consecutive threads, points).
template <bool Checked, bool PerPoint, class T, class U, std::size_t R, class F>
struct StencilBoxKernel {
  StencilGeometry<T, R> g;
  std::int64_t lo[R], ext[R], in_stride[R];
  const T* in;
  U* out;
  std::size_t rd;
  std::int64_t len;
  bool unit;  // rows contiguous in the input
  F f;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    const std::int64_t row = PerPoint ? item / len : item;
    const std::int64_t j0 = PerPoint ? item % len : 0, j1 = PerPoint ? j0 + 1 : len;
    std::int64_t li[R];  // local index of the row's first point
    std::int64_t rest = row, from = 0;
    for (std::size_t d = R; d-- > 0;) {
      if (d == rd) {
        li[d] = lo[d];
        continue;
      }
      const std::int64_t k = rest % ext[d];
      rest /= ext[d];
      li[d] = lo[d] + k;
      from += k * in_stride[d];
    }
    Index<R> gi;
    std::int64_t to = 0;
    for (std::size_t d = 0; d < R; ++d) {
      gi.i[d] = g.offset[d] + li[d];
      to += li[d] * g.stride[d];
    }
    gi.i[rd] += j0;
    if constexpr (!Checked) {
      if (unit) {
        stencil_row<T, U, R>(in + from + j0, out + to + j0, j1 - j0, in_stride, gi, f);
        return;
      }
    }
    const std::int64_t si = in_stride[rd], so = g.stride[rd];
    for (std::int64_t j = j0; j < j1; ++j) {
      if constexpr (Checked) {
        Neighbors<T, R, true> nb{in + from + j * si, {}, &g, {}};
        for (std::size_t d = 0; d < R; ++d) {
          nb.s[d] = in_stride[d];
          nb.li[d] = li[d] + (d == rd ? j : 0);
        }
        out[to + j * so] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
      } else {
        Neighbors<T, R, false> nb{in + from + j * si, {}};
        for (std::size_t d = 0; d < R; ++d) nb.s[d] = in_stride[d];
        out[to + j * so] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
      }
      ++gi.i[rd];
    }
  }
};

template <bool Checked, bool PerPoint, class Mem, class T, class U, std::size_t R, class F>
void stencil_box(const Context& ctx, const StencilGeometry<T, R>& g, const std::int64_t (&lo)[R], const std::int64_t (&ext)[R],
                 const T* in, const std::int64_t (&is)[R], U* out, const F& f) {
  StencilBoxKernel<Checked, PerPoint, T, U, R, F> k{g, {}, {}, {}, in, out, R - 1, 0, false, f};
  while (k.rd > 0 && ext[k.rd] < 16 && ext[k.rd - 1] > ext[k.rd]) --k.rd;
  std::int64_t rows = 1;
  for (std::size_t d = 0; d < R; ++d) {
    if (d != k.rd) rows *= ext[d];
    k.lo[d] = lo[d];
    k.ext[d] = ext[d];
    k.in_stride[d] = is[d];
  }
  k.len = ext[k.rd];
  if (rows <= 0 || k.len <= 0) return;
  k.unit = k.rd == R - 1 && is[R - 1] == 1;
  for_range<Mem>("shardlib::stencil_for", ctx, PerPoint ? rows * k.len : rows, k,
                 static_cast<std::uint64_t>(rows * k.len) * (sizeof(T) + sizeof(U)));
}

/// Which points of each row stencil_rows computes.
enum class RowPart : std::uint8_t { middle, ends, all };

/// The rows whose neighbours in dims < R-1 lie in the block (local indices [w, n - w) there):
/// their middle points ([w, n - w) of the last dim) read only the block; their end points read
/// the last dim's ghost regions too. A work item is a row on the host (PerPoint false) and one
/// point of `part` on a GPU.
template <bool Checked, bool PerPoint, class T, class U, std::size_t R, class F>
struct StencilRowsKernel {
  StencilGeometry<T, R> g;
  std::int64_t gs[R];      // the last dim's ghost regions' strides
  const T* low;            // ... low region (codes 1, ..., 1, 0)
  const T* high;           // ... high region (codes 1, ..., 1, 2)
  U* out;
  std::int64_t n, w, mid0, mid1;
  std::int64_t per_row;    // PerPoint: the work items of `part` in a row
  RowPart part;
  F f;

  KOKKOS_INLINE_FUNCTION void end(const std::int64_t (&li)[R], std::int64_t at, std::int64_t atg, Index<R> gi,
                                  std::int64_t j) const {
    const EdgeNeighbors<T, R, Checked> nb{g.block + at, low + atg, high + atg, g.stride, gs, j, n, w, &g, li};
    gi.i[R - 1] = g.offset[R - 1] + j;
    out[at + j] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
  }
  /// Row `row`'s local index, global index and offsets in the block and the ghost regions.
  KOKKOS_INLINE_FUNCTION void row_start(std::int64_t row, std::int64_t (&li)[R], Index<R>& gi, std::int64_t& at,
                                        std::int64_t& atg) const {
    std::int64_t rest = row;
    li[R - 1] = 0;
    for (std::size_t d = R - 1; d-- > 0;) {
      const std::int64_t e = g.extent[d] - 2 * g.width[d];
      li[d] = g.width[d] + rest % e;
      rest /= e;
    }
    at = 0;
    atg = 0;
    for (std::size_t d = 0; d < R; ++d) {
      gi.i[d] = g.offset[d] + li[d];
      at += li[d] * g.stride[d];
      atg += li[d] * gs[d];
    }
  }
  /// The value of middle point j of a row that row_start described (its reads all in the block).
  KOKKOS_INLINE_FUNCTION U middle_value(const std::int64_t (&li)[R], std::int64_t at, Index<R>& gi, std::int64_t j) const {
    gi.i[R - 1] = g.offset[R - 1] + j;
    if constexpr (Checked) {
      Neighbors<T, R, true> nb{g.block + at + j, {}, &g, {}};
      for (std::size_t d = 0; d < R; ++d) {
        nb.s[d] = g.stride[d];
        nb.li[d] = li[d] + (d + 1 == R ? j : 0);
      }
      return static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
    } else {
      Neighbors<T, R, false> nb{g.block + at + j, {}};
      for (std::size_t d = 0; d < R; ++d) nb.s[d] = g.stride[d];
      return static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
    }
  }
  KOKKOS_INLINE_FUNCTION void middle(const std::int64_t (&li)[R], std::int64_t at, Index<R>& gi, std::int64_t j) const {
    out[at + j] = middle_value(li, at, gi, j);
  }
  /// Point j of a row that row_start described: an end (reads the last dim's ghost regions) or a
  /// middle point (reads the block only).
  KOKKOS_INLINE_FUNCTION void point(const std::int64_t (&li)[R], std::int64_t at, std::int64_t atg, Index<R> gi,
                                    std::int64_t j) const {
    if (j < mid0 || j >= mid1) end(li, at, atg, gi, j);
    else middle(li, at, gi, j);
  }
  /// The next row after the one row_start (or next_row) described: dims < R-1 counted up with a
  /// carry, over the rows whose neighbours there lie in the block (no division).
  KOKKOS_INLINE_FUNCTION void next_row(std::int64_t (&li)[R], Index<R>& gi, std::int64_t& at, std::int64_t& atg) const {
    for (std::size_t d = R - 1; d-- > 0;) {
      ++li[d];
      ++gi.i[d];
      at += g.stride[d];
      atg += gs[d];
      if (li[d] < g.extent[d] - g.width[d]) return;
      const std::int64_t e = g.extent[d] - 2 * g.width[d];
      li[d] -= e;
      gi.i[d] -= e;
      at -= e * g.stride[d];
      atg -= e * gs[d];
    }
  }
  /// The points of `part` in rows [r0, r0 + count) that one of `step` threads takes (`first`,
  /// first + step, ...): the GPU's team (StencilRowsTeam), consecutive threads on consecutive
  /// points, the first row's index worked out once and the next ones counted up.
  KOKKOS_INLINE_FUNCTION void team_rows(std::int64_t r0, std::int64_t count, std::int64_t first, std::int64_t step) const {
    std::int64_t li[R];
    Index<R> gi;
    std::int64_t at, atg;
    row_start(r0, li, gi, at, atg);
    for (std::int64_t c = 0; c < count; ++c) {
      if (c > 0) next_row(li, gi, at, atg);
      if (part != RowPart::middle)
        for (std::int64_t j = first; j < mid0; j += step) end(li, at, atg, gi, j);
      if (part != RowPart::ends)
        for (std::int64_t j = mid0 + first; j < mid1; j += step) middle(li, at, gi, j);
      if (part != RowPart::middle)
        for (std::int64_t j = mid1 + first; j < n; j += step) end(li, at, atg, gi, j);
    }
  }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    const std::int64_t row = PerPoint ? item / per_row : item;
    std::int64_t li[R];
    Index<R> gi;
    std::int64_t at, atg;
    row_start(row, li, gi, at, atg);
    if constexpr (PerPoint) {  // one point of `part` (the ends, or rows too many for a team each)
      const std::int64_t p = item % per_row;
      point(li, at, atg, gi, part == RowPart::middle ? mid0 + p : part == RowPart::ends && p >= mid0 ? mid1 + (p - mid0) : p);
      return;
    }
    // A whole row on the host: the ends one point at a time, the middle as one restrict loop.
    if (part != RowPart::middle)
      for (std::int64_t j = 0; j < mid0; ++j) end(li, at, atg, gi, j);
    if (part != RowPart::ends && mid0 < mid1) {
      if constexpr (!Checked) {
        Index<R> gm = gi;
        gm.i[R - 1] = g.offset[R - 1] + mid0;
        stencil_row<T, U, R>(g.block + at + mid0, out + at + mid0, mid1 - mid0, g.stride, gm, f);
      } else {
        for (std::int64_t j = mid0; j < mid1; ++j) point(li, at, atg, gi, j);
      }
    }
    if (part != RowPart::middle)
      for (std::int64_t j = mid1; j < n; ++j) end(li, at, atg, gi, j);
  }
};

/// StencilRowsKernel with a team per row (league rank: the row): the GPU form of the middle and
/// whole-row parts. A thread per point with the row decomposed per point spent most of its issue
/// slots on 64-bit divisions (an H100 at 0.3 of its copy bandwidth on a 5-point sweep).
template <class K>
struct StencilRowsTeam {
  K k;
  std::int64_t rows, per_team;  // rows in all, rows a team takes
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t r0 = static_cast<std::int64_t>(team.league_rank()) * per_team;
    k.team_rows(r0, rows - r0 < per_team ? rows - r0 : per_team, team.team_rank(), team.team_size());
  }
};

/// The points of a 1-D or 2-D block in GPU memory, in tiles: a team takes a tile of columns (a
/// point a thread in each row) over `ty` consecutive rows, four rows' values before their stores.
/// A row a thread reads as a neighbour was read by its team a step before, so the neighbours come
/// from L1 rather than L2 (a team per row read each row three times through L2); the middle
/// points' indices are 32-bit (the caller checks the block's size), so that an address is one
/// multiply-add. With `ends`, the columns are the whole row and the threads on a row's ends read
/// the last dim's ghost regions (EdgeNeighbors) in the same launch. Measured on an H100 (bench_gpu
/// --part stencil, 5-point sweep of 8192^2, issue 40): 222 us in the kernel, 0.70-0.72 of a copy
/// in all, against 259 us and 0.61 with a team per row. Blocks of 3 dims and more keep the team
/// per row (StencilRowsTeam): tiles over planes and rows measured slower there (0.34-0.42 of the
/// copy on a 7-point sweep of 512^3, against 0.46), and with the rows' ends in the tiles slower
/// still (a warp diverged on every row's ends). The host runs it too (a thread a team).
template <class T, class U, std::size_t R, class F>
struct StencilTileKernel {
  static_assert(R == 1 || R == 2, "shardlib: stencil tiles are for 1-D and 2-D blocks");
  StencilRowsKernel<false, true, T, U, R, F> rows;  // the block, the ghost regions, f
  int stride[R], lo[R], hi[R];  // the block's strides; the box of points taken [lo, hi)
  int tiles, ty, ny;            // column tiles; rows a team takes; row blocks
  int mid0, mid1;               // the row's middle points [mid0, mid1)
  KOKKOS_INLINE_FUNCTION U value(const int (&li)[R]) const {
    const auto& g = rows.g;
    Index<R> gi;
    for (std::size_t d = 0; d < R; ++d) gi.i[d] = g.offset[d] + li[d];
    const int j = li[R - 1];
    if (j >= mid0 && j < mid1) {
      Neighbors<T, R, false, int> nb{g.block + at_of(li), {}};
      for (std::size_t d = 0; d < R; ++d) nb.s[d] = stride[d];
      return static_cast<U>(rows.f(static_cast<const Index<R>&>(gi), nb));
    }
    std::int64_t l[R], at = 0, atg = 0;  // an end: the last dim's ghost regions too
    for (std::size_t d = 0; d < R; ++d) {
      l[d] = d + 1 == R ? 0 : li[d];
      at += l[d] * g.stride[d];
      atg += l[d] * rows.gs[d];
    }
    const EdgeNeighbors<T, R, false> nb{g.block + at, rows.low + atg, rows.high + atg, g.stride, rows.gs, j, rows.n, rows.w, &g, l};
    return static_cast<U>(rows.f(static_cast<const Index<R>&>(gi), nb));
  }
  KOKKOS_INLINE_FUNCTION int at_of(const int (&li)[R]) const {
    int at = 0;
    for (std::size_t d = 0; d < R; ++d) at += li[d] * stride[d];
    return at;
  }
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int t = team.league_rank();
    int li[R];
    li[R - 1] = lo[R - 1] + (t % tiles) * team.team_size() + team.team_rank();
    if (li[R - 1] >= hi[R - 1]) return;
    U* const o = rows.out;
    if constexpr (R == 1) {
      o[at_of(li)] = value(li);
    } else {
      const int y0 = lo[0] + (t / tiles) * ty, y1 = y0 + ty < hi[0] ? y0 + ty : hi[0];
      int y = y0;
      for (; y + 4 <= y1; y += 4) {
        U v[4];
        for (int u = 0; u < 4; ++u) {
          li[0] = y + u;
          v[u] = value(li);
        }
        for (int u = 0; u < 4; ++u) {
          li[0] = y + u;
          o[at_of(li)] = v[u];
        }
      }
      for (; y < y1; ++y) {
        li[0] = y;
        o[at_of(li)] = value(li);
      }
    }
  }
};

/// Runs stencil_rows' points of a 1-D or 2-D block with StencilTileKernel on `Mem`'s instance:
/// the middles, and with `ends` the rows' ends too (`k`: stencil_rows' kernel, its geometry set),
/// when the block has fewer than 2^31 elements; false (nothing run) else.
template <class Mem, class T, class U, std::size_t R, class F>
bool stencil_tiles(const Context& ctx, const StencilRowsKernel<false, true, T, U, R, F>& k, bool ends) {
  const auto& g = k.g;
  if (!g.fits_int()) return false;
  const auto& exec = ctx.exec_for<Mem>();
  using Exec = std::remove_cvref_t<decltype(exec)>;
  StencilTileKernel<T, U, R, F> t{k, {}, {}, {}, 0, 4, 1, static_cast<int>(k.mid0), static_cast<int>(k.mid1)};
  for (std::size_t d = 0; d < R; ++d) {
    t.stride[d] = static_cast<int>(g.stride[d]);
    t.lo[d] = static_cast<int>(d + 1 < R ? g.width[d] : ends ? 0 : k.mid0);
    t.hi[d] = static_cast<int>(d + 1 < R ? g.extent[d] - g.width[d] : ends ? k.n : k.mid1);
    if (t.hi[d] <= t.lo[d]) return true;  // no points
  }
  const int team = kernels::is_host_exec_v<Exec> ? 1 : 128;
  t.tiles = (t.hi[R - 1] - t.lo[R - 1] + team - 1) / team;
  if constexpr (R == 2) t.ny = (t.hi[0] - t.lo[0] + t.ty - 1) / t.ty;
  const std::int64_t league = static_cast<std::int64_t>(t.tiles) * t.ny;
  if (league >= std::numeric_limits<int>::max()) return false;
  [[maybe_unused]] const auto guard = kernel_guard_for<Mem>(ctx, false);
  std::int64_t points = 1;
  for (std::size_t d = 0; d < R; ++d) points *= t.hi[d] - t.lo[d];
  kernels::count_kernel(stencil_bytes<T, U>(points));
  Kokkos::parallel_for("shardlib::stencil_for(tiles)", Kokkos::TeamPolicy<Exec>(exec, static_cast<int>(league), team), t);
  if constexpr (kernels::is_host_exec_v<Exec>) kernels::fence(exec);
  return true;
}

template <bool Checked, bool PerPoint, class Mem, class T, class U, std::size_t R, class F>
bool stencil_rows(const Context& ctx, const StencilGeometry<T, R>& g, RowPart part, U* out, const F& f) {
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < R; ++d) rows *= std::max<std::int64_t>(g.extent[d] - 2 * g.width[d], 0);
  const std::int64_t n = g.extent[R - 1], w = g.width[R - 1];
  if (rows <= 0 || n <= 0) return true;
  StencilRowsKernel<Checked, PerPoint, T, U, R, F> k{g, {}, nullptr, nullptr, out, n, w, 0, 0, 0, part, f};
  std::int64_t m = 1;
  for (std::size_t d = R; d-- > 0;) {
    k.gs[d] = m;
    m *= d + 1 == R ? w : g.extent[d];
  }
  const int centre = halo::centre_region(static_cast<int>(R));
  k.low = g.ghosts + g.region_offset[centre - 1];
  k.high = g.ghosts + g.region_offset[centre + 1];
  k.mid0 = std::min(w, n);
  k.mid1 = std::max(n - w, k.mid0);
  k.per_row = part == RowPart::middle ? k.mid1 - k.mid0 : part == RowPart::ends ? k.mid0 + n - k.mid1 : n;
  if (PerPoint && k.per_row == 0) return true;
  if constexpr (PerPoint && !Checked && (R == 2 || R == 3)) {
    // The middles as planes in shared memory (StencilPlaneKernel), when selected: the ends are
    // left to the shell's kernel (stencil_shell).
    if (part != RowPart::ends && stencil_planes_selected() && run_stencil_planes<Mem>(ctx, k)) return false;
  }
  if constexpr (PerPoint && !Checked && R <= 2) {
    // Whole rows or their middles in tiles (StencilTileKernel); the ends alone a point a thread.
    if (part != RowPart::ends && stencil_tiles<Mem>(ctx, k, part == RowPart::all)) return part != RowPart::middle;
  }
  if constexpr (PerPoint) {
    // A team per row (consecutive threads, consecutive points) for the middles and whole rows;
    // the ends (a few points a row) a thread each.
    // A team takes several rows when they are short (3-D grids' rows of 512: 2 points a thread
    // left most of its time to the row's index), at least 8 points a thread. (Four points a thread
    // at a time, their values before their stores, and 16 points a thread measured 0.63 of the copy
    // on the 2-D sweep but 0.37 on the 3-D one, against 0.61 and 0.46 as here: H100, issue 40.)
    const auto& exec = ctx.exec_for<Mem>();
    using Exec = std::remove_cvref_t<decltype(exec)>;
    const int team = kernels::row_team_size<Exec>(k.per_row);
    const std::int64_t per_team = std::clamp<std::int64_t>((8 * team + k.per_row - 1) / k.per_row, 1, 64);
    const std::int64_t league = (rows + per_team - 1) / per_team;
    if (part != RowPart::ends && league <= std::numeric_limits<int>::max()) {
      [[maybe_unused]] const auto guard = kernel_guard_for<Mem>(ctx, false);
      kernels::count_kernel(stencil_bytes<T, U>(rows * k.per_row));
      Kokkos::parallel_for("shardlib::stencil_for(team)", Kokkos::TeamPolicy<Exec>(exec, static_cast<int>(league), team),
                           StencilRowsTeam<decltype(k)>{k, rows, per_team});
      if constexpr (kernels::is_host_exec_v<Exec>) kernels::fence(exec);
      return part != RowPart::middle;
    }
  }
  for_range<Mem>("shardlib::stencil_for", ctx, PerPoint ? rows * k.per_row : rows, k,
                 stencil_bytes<T, U>(rows * k.per_row));
  return part != RowPart::middle;
}

/// gather_padded's batch: sources 0 the block, 1 the ghost regions; destination 0 the copy.
template <class Mem, class T, std::size_t R>
void make_gather(const Context& ctx, const StencilGeometry<T, R>& g, const std::int64_t (&lo)[R], const std::int64_t (&ext)[R],
                 const std::int64_t (&ts)[R], CopyBatch<Mem>& batch) {
  const int rank = static_cast<int>(R), regions = halo::region_count(rank);
  batch.pieces.clear();  // (a batch whose making threw starts again)
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
      const std::int64_t p0 = lo[d] - g.width[d], pe = ext[d] + 2 * g.width[d];
      const std::int64_t a = std::max(r0, p0), b = std::min(r0 + re, p0 + pe);
      empty = a >= b;
      src.extent[d] = dst.extent[d] = b - a;
      src.stride[d] = centre ? g.stride[d] : rs;
      src.offset += (a - r0) * src.stride[d];
      dst.stride[d] = ts[d];
      dst.offset += (a - p0) * ts[d];
      rs *= re;
    }
    if (empty) continue;
    if (!centre) src.offset += g.region_offset[r];
    batch.add(src, centre ? 0 : 1, dst, 0);
  }
  batch.upload(ctx);
}
/// The box [lo - w, lo + ext + w) around a box of the block, gathered from the block and the
/// ghost regions into `tmp` (row-major, in the block's memory space; its strides to `ts`): one
/// copy_pieces batch (a piece per region it touches, up to 3^R; one kernel in GPU memory), made
/// into `batch` the first time and run from it after (the geometry of a view does not change).
template <class Mem, class T, std::size_t R>
void gather_padded(const Context& ctx, const StencilGeometry<T, R>& g, const std::int64_t (&lo)[R], const std::int64_t (&ext)[R],
                   T* tmp, const std::int64_t (&ts)[R], CopyBatch<Mem>& batch) {
  if (!batch.ready) make_gather(ctx, g, lo, ext, ts, batch);
  batch.run(ctx, "shardlib::stencil_for::gather", g.block, g.ghosts, tmp, static_cast<T*>(nullptr));
}

template <class T, class MeshT, class SpecT, class Mem>
StencilGeometry<T, SpecT::rank> stencil_geometry(const Ghosted<T, MeshT, SpecT, Mem>& in, std::int64_t* fault) {
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

/// stencil_for with its work items chosen: a row each (PerPoint false, host memory) or a point
/// each (true, GPU memory; the tests run it on host memory too).
template <Check C, bool PerPoint, class U, class T, class MeshT, class SpecT, class OutSpec, class Mem, class F>
void run_stencil(DistributedTensor<U, MeshT, OutSpec, Mem>& out, Ghosted<T, MeshT, SpecT, Mem>& in, const F& f,
                 GhostRefresh refresh) {
  constexpr std::size_t R = SpecT::rank;
  constexpr bool Checked = C == Check::on;
  const auto& t = in.tensor();
  in.check_shape();  // (refresh none exchanges nothing, which would check it)
  if (out.shape() != t.shape())
    throw std::invalid_argument("shardlib: stencil_for: the output has shape " + detail::shape_text(out.shape()) +
                                ", the input is " + in.describe());
  // The same tensor object on every device (a device whose block is empty has no data to compare,
  // and must throw as the others do), or another one sharing its blocks.
  if (static_cast<const void*>(&out) == static_cast<const void*>(&t) ||
      (static_cast<const void*>(out.local().data()) == static_cast<const void*>(t.local().data()) && t.block().num_elements() > 0))
    throw std::invalid_argument("shardlib: stencil_for: the output is the input (" + in.describe() +
                                "); a stencil reads old values while it writes new ones: write into another tensor "
                                "and swap them");
  if (in.in_flight())
    throw std::logic_error("shardlib: stencil_for: the input (" + in.describe() +
                           ") has an exchange in flight; finish() it first");
  if (shardlib::shape_only()) {  // the ghosts' exchange only: no kernel, no fault to read back
    if (refresh == GhostRefresh::overlap) {
      in.start();
      in.finish();
    } else if (refresh == GhostRefresh::blocking) {
      in.exchange();
    }
    return;
  }
  std::int64_t* fault = nullptr;
  if constexpr (Checked) fault = in.reset_fault(StencilFault::size);
  const auto g = stencil_geometry(in, fault);
  Context& ctx = t.context();
  U* o = out.local().data();
  // The rows whose neighbours in dims < R-1 are in the block: their middles while the ghosts
  // travel, their ends after; then the slabs of dims < R-1. In GPU memory (PerPoint) the rows'
  // ends and the slabs are one kernel (stencil_shell, blocks of up to 4 dims).
  constexpr bool shell = PerPoint && R <= stencil_shell_most_dims;
  bool ends_done = false;
  if (refresh == GhostRefresh::overlap) {
    in.start();
    try {
      stencil_rows<Checked, PerPoint, Mem>(ctx, g, RowPart::middle, o, f);
    } catch (...) {
      in.finish();
      throw;
    }
    in.finish();
  } else {
    if (refresh == GhostRefresh::blocking) in.exchange();
    ends_done = stencil_rows<Checked, PerPoint, Mem>(ctx, g, RowPart::all, o, f);
  }
  if constexpr (shell) {
    stencil_shell<Checked, Mem>(ctx, g, !ends_done, o, f);
  } else {
    if (!ends_done) stencil_rows<Checked, PerPoint, Mem>(ctx, g, RowPart::ends, o, f);
    // The slabs of the shell (dim d < R-1, low and high side), each gathered with its
    // neighbourhood into a padded copy, then run on pointers and strides as the rows are. One
    // scratch serves them all, sized for the largest first (kernels in GPU memory queue in order
    // on the device's stream, and the scratch must not be reallocated under them).
    std::int64_t most = 0;
    for (std::size_t d = 0; d + 1 < R; ++d)
      for (int side = 0; side < 2; ++side) most = std::max(most, stencil_slab(g, d, side).padded);
    T* tmp = most > 0 ? in.scratch(static_cast<std::size_t>(most)) : nullptr;
    for (std::size_t d = 0; d + 1 < R; ++d) {
      for (int side = 0; side < 2; ++side) {
        const StencilSlab<R> sl = stencil_slab(g, d, side);
        if (sl.padded == 0) continue;
        gather_padded<Mem>(ctx, g, sl.a, sl.e, tmp, sl.ts, in.gather_batch(2 * d + static_cast<std::size_t>(side)));
        std::int64_t first = 0;
        for (std::size_t k = 0; k < R; ++k) first += g.width[k] * sl.ts[k];
        stencil_box<Checked, PerPoint, Mem>(ctx, g, sl.a, sl.e, tmp + first, sl.ts, o, f);
      }
    }
  }
  if constexpr (Checked) {
    std::int64_t hit[StencilFault::size];
    download<Mem>(ctx, fault, hit, StencilFault::size);  // in GPU memory, waits for the kernels
    if (!hit[StencilFault::hit]) std::fill(hit, hit + StencilFault::size, std::int64_t{0});
    // Every device throws the first bad read of the first device that made one (a device whose
    // block has no point, or no bad read, would otherwise go on and leave the others waiting):
    // the devices compare what they found in one (uncounted) all_reduce.
    const std::vector<std::int64_t> all =
        ctx.world().mismatch(std::span<const std::int64_t>(hit, static_cast<std::size_t>(StencilFault::size)));
    const std::int64_t* bad = hit[StencilFault::hit] ? hit : nullptr;  // all alike: each its own (or none)
    int by = ctx.device();
    for (std::size_t d = 0; !all.empty() && d * StencilFault::size < all.size(); ++d)
      if (all[d * StencilFault::size + StencilFault::hit]) {
        bad = all.data() + d * StencilFault::size;
        by = static_cast<int>(d);
        break;
      }
    if (bad) {
      std::string off, idx, w;
      for (std::size_t d = 0; d < R; ++d) {
        off += (d ? ", " : "") + std::to_string(bad[StencilFault::offset + d]);
        idx += (d ? ", " : "") + std::to_string(bad[StencilFault::index + d]);
        w += (d ? ", " : "") + std::to_string(g.width[d]);
      }
      throw std::out_of_range("shardlib: stencil_for: nb(" + off + ") at global index (" + idx + ") on device " +
                              std::to_string(by) + " reads beyond the ghost widths (" + w + ") of the input (" +
                              in.describe() + "); read at most the width away, or make the ghosted view wider");
    }
  }
}

}  // namespace detail

/// Sets every element of `out` to `f(const Index<R>& i, const auto& nb)`, where `nb(o_0, ...,
/// o_{R-1})` is the input at global index i + o (|o_d| <= the ghost width of dim d). `out` has
/// the mesh, spec and shape of `in`'s tensor and is another tensor (a stencil reads the old
/// values while writing the new). The ghosts are refreshed as `refresh` says (collective unless
/// GhostRefresh::none). Throws std::invalid_argument for another shape or an output that is the
/// input; std::out_of_range for a read beyond the widths (Check::on).
///
/// In GPU memory the kernels run on the GPU (a 2-D block in tiles of rows, a team of threads a
/// row beyond), queued on the device's stream
/// (no host wait but Check::on's, which reads the fault back); `f` is then a struct with a
/// KOKKOS_INLINE_FUNCTION templated operator() (see docs/07).
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
                "nb(offsets...) reading a neighbour (a generic lambda, or in GPU memory a struct with a templated "
                "KOKKOS_INLINE_FUNCTION operator())");
  if constexpr (detail::host_memory_v<Mem>)
    detail::run_stencil<C, false>(out, in, f, refresh);
  else
    detail::run_stencil<C, true>(out, in, detail::DeviceStencil<F>{f}, refresh);
}

}  // namespace shardlib
