// SPDX-License-Identifier: Apache-2.0
/// @file
/// Stencil loops: `stencil_for(out, in, f)` sets every element of `out` to `f(i, nb)`, where `i`
/// is its global index and `nb(dx, dy, ...)` reads the input at a relative offset — from the
/// block, or from the ghost layers of the ghosted view `in`.
///
/// The loop refreshes the ghosts itself, overlapping the exchange with work: it starts the
/// exchange, runs the interior (points whose reads all fall inside the block, where `nb` is a
/// pointer and strides), finishes the exchange, then runs the boundary shell (up to 2R slabs,
/// where `nb` finds the ghost region of each read). Both are Kokkos kernels on the device's
/// execution-space instance, one row (the contiguous last dim) per work item, so a stencil
/// written as a generic lambda compiles to a plain loop over the block in the interior.
///
/// `stencil_for<sl::Check::on>(...)` checks every read against the ghost widths and throws
/// std::out_of_range naming the offset, the index and the widths (after the loop, on the device
/// that read out of bounds).
#pragma once

#include <shardlib/stencil/ghosted.hpp>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

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

template <class T, std::size_t R, bool Checked>
KOKKOS_INLINE_FUNCTION bool stencil_read_ok(const StencilGeometry<T, R>& g, const std::int64_t (&o)[R],
                                            const std::int64_t (&li)[R]) {
  if constexpr (Checked) {
    bool ok = true;
    for (std::size_t d = 0; d < R; ++d) ok = ok && o[d] <= g.width[d] && -o[d] <= g.width[d];
    if (!ok) {
      int expected = 0;
      if (g.fault->hit.compare_exchange_strong(expected, 1)) {
        for (std::size_t d = 0; d < R; ++d) {
          g.fault->offset[d] = o[d];
          g.fault->index[d] = g.offset[d] + li[d];
        }
      }
    }
    return ok;
  } else {
    (void)g, (void)o, (void)li;
    return true;
  }
}

/// nb(...) for interior points: every read is inside the block.
template <class T, std::size_t R, bool Checked>
struct InteriorNeighbors {
  const T* at;  // the point itself
  const StencilGeometry<T, R>* g;
  std::int64_t li[R];
  template <class... O>
  KOKKOS_INLINE_FUNCTION T operator()(O... o) const {
    static_assert(sizeof...(O) == R, "shardlib: stencil_for: nb(...) takes one offset per dim of the tensor");
    const std::int64_t off[R] = {static_cast<std::int64_t>(o)...};
    if (!stencil_read_ok<T, R, Checked>(*g, off, li)) return T{};
    std::int64_t k = 0;
    for (std::size_t d = 0; d < R; ++d) k += off[d] * g->stride[d];
    return at[k];
  }
};

/// nb(...) for boundary points: a read may land in a ghost region.
template <class T, std::size_t R, bool Checked>
struct ShellNeighbors {
  const StencilGeometry<T, R>* g;
  std::int64_t li[R];
  template <class... O>
  KOKKOS_INLINE_FUNCTION T operator()(O... o) const {
    static_assert(sizeof...(O) == R, "shardlib: stencil_for: nb(...) takes one offset per dim of the tensor");
    const std::int64_t off[R] = {static_cast<std::int64_t>(o)...};
    if (!stencil_read_ok<T, R, Checked>(*g, off, li)) return T{};
    int region = 0;
    bool centre = true;
    std::int64_t k = 0;
    for (std::size_t d = 0; d < R; ++d) {
      const std::int64_t p = li[d] + off[d], n = g->extent[d], w = g->width[d];
      const int code = p < 0 ? 0 : p < n ? 1 : 2;
      centre = centre && code == 1;
      region = region * 3 + code;
      const std::int64_t e = code == 1 ? n : w;
      k = k * e + (code == 0 ? p + w : code == 1 ? p : p - n);
    }
    return centre ? g->block[k] : g->ghosts[g->region_offset[region] + k];
  }
};

/// out[box [lo, hi) of the block] = f(global index, nb), one row per work item.
template <bool Interior, bool Checked, class T, class U, std::size_t R, class F>
void stencil_box(const Context& ctx, const StencilGeometry<T, R>& g, const std::int64_t (&lo)[R], const std::int64_t (&hi)[R],
                 U* out, const F& f) {
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < R; ++d) rows *= hi[d] > lo[d] ? hi[d] - lo[d] : 0;
  const std::int64_t len = hi[R - 1] - lo[R - 1];
  if (rows <= 0 || len <= 0) return;
  std::int64_t box_lo[R], box_ext[R];
  for (std::size_t d = 0; d < R; ++d) {
    box_lo[d] = lo[d];
    box_ext[d] = hi[d] - lo[d];
  }
  auto guard = kernel_guard(ctx, false);
  Kokkos::parallel_for(
      "shardlib::stencil_for", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(ctx.exec(), 0, rows),
      [=](std::int64_t row) {
        std::int64_t li[R];
        std::int64_t rest = row;
        for (std::size_t d = R - 1; d-- > 0;) {
          li[d] = box_lo[d] + rest % box_ext[d];
          rest /= box_ext[d];
        }
        li[R - 1] = box_lo[R - 1];
        Index<R> gi;
        std::int64_t base = 0;
        for (std::size_t d = 0; d < R; ++d) {
          gi.i[d] = g.offset[d] + li[d];
          base += li[d] * g.stride[d];
        }
        for (std::int64_t j = 0; j < len; ++j) {
          if constexpr (Interior) {
            InteriorNeighbors<T, R, Checked> nb{g.block + base + j, &g, {}};
            if constexpr (Checked)
              for (std::size_t d = 0; d < R; ++d) nb.li[d] = li[d] + (d + 1 == R ? j : 0);
            out[base + j] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
          } else {
            ShellNeighbors<T, R, Checked> nb{&g, {}};
            for (std::size_t d = 0; d < R; ++d) nb.li[d] = li[d] + (d + 1 == R ? j : 0);
            out[base + j] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
          }
          ++gi.i[R - 1];
        }
      });
  ctx.exec().fence();
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
  static_assert(std::is_invocable_v<const F&, const Index<R>&, const detail::InteriorNeighbors<T, R, Checked>&> &&
                    std::is_invocable_v<const F&, const Index<R>&, const detail::ShellNeighbors<T, R, Checked>&>,
                "shardlib: stencil_for: the functor must be callable as f(const sl::Index<R>& i, const auto& nb), with "
                "nb(offsets...) reading a neighbour (a generic lambda: the interior and the boundary shell pass "
                "different accessors)");
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
  std::int64_t lo[R], hi[R];
  for (std::size_t d = 0; d < R; ++d) {  // interior: reads stay inside the block
    lo[d] = g.width[d];
    hi[d] = g.extent[d] - g.width[d];
    if (hi[d] < lo[d]) hi[d] = lo[d];
  }
  if (refresh == GhostRefresh::overlap) in.start();
  if (refresh == GhostRefresh::blocking) in.exchange();
  try {
    detail::stencil_box<true, Checked>(ctx, g, lo, hi, o, f);
  } catch (...) {
    if (in.in_flight()) in.finish();
    throw;
  }
  if (refresh == GhostRefresh::overlap) in.finish();
  // The shell, as up to 2R slabs: for dim d, the points interior in dims < d, outside in dim d.
  for (std::size_t d = 0; d < R; ++d) {
    std::int64_t a[R], b[R];
    for (std::size_t k = 0; k < R; ++k) {
      a[k] = k < d ? lo[k] : 0;
      b[k] = k < d ? hi[k] : g.extent[k];
    }
    const std::int64_t low_end = std::min(g.width[d], g.extent[d]);
    a[d] = 0;
    b[d] = low_end;
    detail::stencil_box<false, Checked>(ctx, g, a, b, o, f);
    a[d] = std::max(g.extent[d] - g.width[d], low_end);
    b[d] = g.extent[d];
    detail::stencil_box<false, Checked>(ctx, g, a, b, o, f);
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
