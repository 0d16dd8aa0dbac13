// SPDX-License-Identifier: Apache-2.0
/// @file
/// Sharding rules of roll, shift and pad, and the plan of pad's exchange.
///
/// | op | operand when the kernel runs | output | op's own collective |
/// |---|---|---|---|
/// | roll / shift along `dim` | unchanged | the operand's sharding; partial kept | over the axes of `dim` (blocks shift, wrapping for roll) |
/// | pad | unchanged | the operand's sharding (blocks of the padded shape); partial kept | over the axes of the split dims that are padded |
///
/// Each of them moves cells and writes constants, so a partial operand stays partial: a constant
/// (shift's fill, a zero or Dirichlet pad) goes to the first coordinate of a partial-sum group
/// only (the others write 0), and to every device of a partial max/min group. Along a split dim
/// a device receives exactly the cells it now holds that another device held.
///
/// pad's plan: for each device and each dim, the output block's range mapped back through the
/// boundary (halo::detail::segments: numpy's constant, wrap, symmetric and edge modes, here for
/// any width: wider than the extent wraps or mirrors again) cuts into per-dim segments; every
/// combination of one segment per dim is one box of one source block, or a constant box.
///
/// Pure rules: the rule functions are constexpr and answer bad input with a status; the plan
/// allocates nothing but itself.
#pragma once

#include <shardlib/detail/array_ref.hpp>
#include <shardlib/sharding/halo.hpp>
#include <shardlib/sharding/layout.hpp>
#include <shardlib/sharding/rule.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardlib {

/// The rule of roll and shift along `dim`: a slice's (sharding/layout.hpp): operand and output
/// keep the operand's sharding, partial included; along a split dim cells move between the
/// devices of the dim's group (`comm`: the axes of `dim`). dim_out_of_range for a bad dim.
constexpr OpRule roll_rule(const Sharding& in, int dim) { return slice_rule(in, dim); }

/// The rule of pad: operand and output keep the operand's sharding, partial included (the
/// output's blocks are those of the padded shape). `comm`: the axes of every split dim (the
/// op communicates over those of the dims it pads).
constexpr OpRule pad_rule(const Sharding& in) {
  using namespace detail::layout_rules;
  OpRule r;
  r.count = 1;
  r.in[0] = in;
  r.out = as_output(in);
  for (int d = 0; d < in.rank; ++d) r.comm = with(r.comm, in.dims[static_cast<std::size_t>(d)]);
  return r;
}

namespace detail::pad_rules {
/// The segments of the input cells that global range [a, b) of a padded dim reads (a and b in
/// the input's indices: output index minus the low width), for an input extent `n` > 0 cut into
/// `parts` blocks (or any n for constant boundaries). Unlike the ghost planner, any width:
/// periodic and reflect go round again past one extent (numpy's wrap and symmetric).
inline void segments(std::vector<halo::detail::Segment>& out, std::int64_t a, std::int64_t b, std::int64_t n, int parts,
                     const Boundary& bnd) {
  const std::array<Boundary, 2> bc{bnd, bnd};
  const bool wraps = bnd.kind == Boundary::Kind::periodic || bnd.kind == Boundary::Kind::reflect;
  if (!wraps) {
    halo::detail::segments(out, a, b, n, parts, bc);
    return;
  }
  const std::array<Boundary, 2> mirror{Boundary::reflect(), Boundary::reflect()};
  for (std::int64_t x = a; x < b;) {
    const std::int64_t k = x >= 0 ? x / n : -((-x + n - 1) / n);  // floor(x / n)
    const std::int64_t y = b < (k + 1) * n ? b : (k + 1) * n;
    const std::int64_t jx = x - k * n, jy = y - k * n;  // inside [0, n]
    const std::size_t first = out.size();
    if (bnd.kind == Boundary::Kind::periodic || k % 2 == 0) halo::detail::segments(out, jx, jy, n, parts, bc);  // inside
    else halo::detail::segments(out, jx - n, jy - n, n, parts, mirror);  // j -> n - 1 - j, read backwards
    for (std::size_t i = first; i < out.size(); ++i) out[i].dst_lo += x - a;
    x = y;
  }
}
}  // namespace detail::pad_rules

/// Checks pad's arguments for a tensor of `shape`: widths (`lo`, `hi`, one per dim) not negative,
/// and a periodic, reflect or edge boundary only on dims with cells. Throws std::invalid_argument
/// naming the dim and `what` (the op and the tensor).
inline void check_pad(detail::ArrayRef<std::int64_t> shape, detail::ArrayRef<std::int64_t> lo, detail::ArrayRef<std::int64_t> hi,
                      const Boundary& b, const std::string& what) {
  using detail::to_text;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (lo[d] < 0 || hi[d] < 0)
      throw std::invalid_argument("shardlib: pad of " + what + ": width (" + to_text(lo[d]) + ", " + to_text(hi[d]) +
                                  ") on dim " + to_text(d) + " is negative (pad only adds cells: slice to remove them)");
    const bool copies = b.kind == Boundary::Kind::periodic || b.kind == Boundary::Kind::reflect || b.kind == Boundary::Kind::edge;
    if (copies && shape[d] == 0 && lo[d] + hi[d] > 0)
      throw std::invalid_argument("shardlib: pad of " + what + ": dim " + to_text(d) + " is empty, so a " + b.to_string() +
                                  " boundary has no cell to copy (use a zero or dirichlet boundary)");
  }
}

/// Device `device`'s part of pad's exchange: a tensor of `in_shape` distributed by `sharding` on
/// `mesh`, padded by `lo` cells before and to `out_shape` with boundary `b` on both sides of
/// every dim (checked: check_pad). Copies and fills are boxes in the output block (`Plan::block`,
/// region 0); sends are grouped by receiver, receives in each sender's order of sending.
inline halo::Plan pad_plan(const Sharding& sharding, const MeshShape& mesh, detail::ArrayRef<std::int64_t> in_shape,
                           detail::ArrayRef<std::int64_t> lo, detail::ArrayRef<std::int64_t> out_shape, const Boundary& b,
                           int device) {
  const int R = sharding.rank;
  halo::Plan out;
  out.rank = R;
  out.block = shard_box(sharding, mesh, out_shape, device);
  std::array<int, max_tensor_rank> parts{};
  for (int d = 0; d < R; ++d) parts[static_cast<std::size_t>(d)] = mesh.group_size(sharding.dims[static_cast<std::size_t>(d)]);
  std::array<std::vector<halo::detail::Segment>, max_tensor_rank> seg{};
  for (int dst = 0; dst < mesh.num_devices(); ++dst) {
    const ShardBox box = shard_box(sharding, mesh, out_shape, dst);
    if (box.num_elements() == 0) continue;
    bool empty = false;
    for (int d = 0; d < R && !empty; ++d) {
      const auto u = static_cast<std::size_t>(d);
      seg[u].clear();
      detail::pad_rules::segments(seg[u], box.offset[u] - lo[u], box.offset[u] + box.extent[u] - lo[u], in_shape[u], parts[u], b);
      empty = seg[u].empty();
    }
    if (empty) continue;
    halo::detail::emit(seg, R, sharding, mesh, mesh.coords(dst), dst, device, 0, out);
  }
  return out;
}

}  // namespace shardlib
