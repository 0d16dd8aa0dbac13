// SPDX-License-Identifier: Apache-2.0
/// @file
/// Ghost cells, planned: which cells of which device's block fill each ghost layer.
///
/// A device's block, widened by `width[d]` cells on both sides of every dim d, is cut into 3^R
/// regions: along each dim the low ghost layer, the block's own range, the high ghost layer. The
/// centre region is the block itself; the others (faces, edges, corners) are its ghost regions.
/// Each ghost cell has a global index; inside the domain it is some device's cell (a neighbour,
/// or a block further away when blocks are thinner than the width); outside the domain the dim's
/// `Boundary` on that side says what it holds: a constant, or a cell inside (periodic wrap,
/// mirror image, edge cell). Because the rule works per dim, each ghost region maps to a product
/// of per-dim ranges, cut where source blocks end: every piece is one box of one source block,
/// sent once. Replicas (mesh axes that split no dim) exchange among their own copy.
///
/// Pure rules: no Kokkos, no communicator, nothing but the plan allocated. Every device computes the same plan for all devices
/// in the same order, so the k-th piece it sends to a peer is the k-th that peer expects.
#pragma once

#include <shardlib/sharding/block.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace shardlib {

/// What the ghost cells beyond one side of the global domain hold.
struct Boundary {
  enum class Kind : std::uint8_t {
    unset,     ///< not given: zero
    zero,      ///< 0
    value,     ///< a fixed value (Dirichlet)
    periodic,  ///< the cells at the other end (both sides of the dim must be periodic)
    reflect,   ///< mirror image: ghost -1-k holds cell k (zero gradient at the face: Neumann)
    edge,      ///< every ghost holds the edge cell (copy)
  };
  Kind kind = Kind::unset;
  double value = 0;

  static constexpr Boundary zero() noexcept { return {Kind::zero, 0}; }
  /// A fixed value (Dirichlet), converted to the element type.
  static constexpr Boundary dirichlet(double v) noexcept { return {Kind::value, v}; }
  static constexpr Boundary periodic() noexcept { return {Kind::periodic, 0}; }
  static constexpr Boundary reflect() noexcept { return {Kind::reflect, 0}; }
  static constexpr Boundary edge() noexcept { return {Kind::edge, 0}; }

  std::string to_string() const {
    switch (kind) {
      case Kind::unset: return "unset (zero)";
      case Kind::zero: return "zero";
      case Kind::value: {
        std::string v = std::to_string(value);  // "%f": trim the zeros
        while (v.size() > 1 && v.back() == '0') v.pop_back();
        if (!v.empty() && v.back() == '.') v.pop_back();
        return "dirichlet(" + v + ")";
      }
      case Kind::periodic: return "periodic";
      case Kind::reflect: return "reflect";
      case Kind::edge: return "edge";
    }
    return "?";
  }
  friend constexpr bool operator==(const Boundary&, const Boundary&) = default;
};

/// Ghost widths and boundaries of a tensor of `rank` dims (entries past rank unused).
struct HaloSpec {
  int rank = 0;
  std::array<int, max_tensor_rank> width{};
  /// [dim][0] is the low side (below index 0), [dim][1] the high side (at and past the extent).
  std::array<std::array<Boundary, 2>, max_tensor_rank> boundary{};
};

namespace halo {

/// Cells of one source block that land in one ghost region of one device: for every index i of
/// `extent` (row-major), ghost cell dst_lo + i of `region` gets source cell src_lo + j with
/// j_d = i_d (step +1), src_extent_d - 1 - i_d (step -1: a mirror), or 0 (step 0: the edge cell).
struct Copy {
  int src = 0;     ///< world device holding the source block
  int dst = 0;     ///< world device whose ghost region receives (== src: a copy inside one device)
  int region = 0;  ///< the receiver's ghost region (region_index)
  std::array<std::int64_t, max_tensor_rank> src_lo{}, src_extent{};  ///< box in the source block
  std::array<std::int64_t, max_tensor_rank> dst_lo{}, extent{};      ///< box in the ghost region
  std::array<std::int8_t, max_tensor_rank> step{};

  /// Ghost cells it fills.
  constexpr std::int64_t cells(int rank) const noexcept {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= extent[static_cast<std::size_t>(d)];
    return n;
  }
  /// Elements the source sends (a mirror sends as many; an edge cell once per dim).
  constexpr std::int64_t src_cells(int rank) const noexcept {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= src_extent[static_cast<std::size_t>(d)];
    return n;
  }
};

/// Ghost cells outside the domain that hold a constant.
struct Fill {
  int region = 0;
  std::array<std::int64_t, max_tensor_rank> lo{}, extent{};
  double value = 0;
};

/// One device's part of the ghost exchange.
struct Plan {
  int rank = 0;
  ShardBox block;                 ///< this device's block (global indices)
  std::vector<Copy> sends;        ///< src == this device, dst another, in plan order
  std::vector<Copy> receives;     ///< dst == this device, src another, in plan order
  std::vector<Copy> local;        ///< src == dst == this device (periodic wrap onto itself, mirrors)
  std::vector<Fill> fills;        ///< this device's constant ghost cells
};

/// Index of the region with codes c[d] (0 low ghost, 1 block, 2 high ghost), dim 0 major.
constexpr int region_index(const std::array<int, max_tensor_rank>& code, int rank) noexcept {
  int r = 0;
  for (int d = 0; d < rank; ++d) r = r * 3 + code[static_cast<std::size_t>(d)];
  return r;
}
/// Number of regions (3^rank), the centre included.
constexpr int region_count(int rank) noexcept {
  int n = 1;
  for (int d = 0; d < rank; ++d) n *= 3;
  return n;
}
/// The centre region (the block itself).
constexpr int centre_region(int rank) noexcept { return (region_count(rank) - 1) / 2; }
/// The code of dim d in region r.
constexpr int region_code(int r, int d, int rank) noexcept {
  for (int k = rank - 1; k > d; --k) r /= 3;
  return r % 3;
}
/// Extents of region r around a block of `extent` with ghost `width`.
constexpr std::array<std::int64_t, max_tensor_rank> region_extent(int r, int rank, const std::array<std::int64_t, max_tensor_rank>& extent,
                                                                  const std::array<int, max_tensor_rank>& width) noexcept {
  std::array<std::int64_t, max_tensor_rank> e{};
  for (int d = 0; d < rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    e[u] = region_code(r, d, rank) == 1 ? extent[u] : width[u];
  }
  return e;
}

namespace detail {
/// One piece of one dim of a ghost region: `len` cells from `dst_lo` (inside the region's range
/// of that dim) that hold a constant (part < 0) or cells of part `part` of the dim.
struct Segment {
  std::int64_t dst_lo = 0, len = 0;
  int part = -1;
  std::int64_t src_lo = 0, src_len = 0;  // in the part's block
  std::int8_t step = 1;
  double value = 0;
};

/// The segments of global range [a, b) of dim `d` (extent n, cut into `parts`), placed from
/// `dst0` in the region's range.
inline void segments(std::vector<Segment>& out, std::int64_t a, std::int64_t b, std::int64_t n, int parts,
                        const std::array<Boundary, 2>& bc) {
  // Source range [s0, s1) of the domain with `step`, for dst cells starting at dst_lo.
  auto split = [&](std::int64_t dst_lo, std::int64_t s0, std::int64_t s1, std::int8_t step) {
    for (int q = 0; q < parts; ++q) {
      const BlockRange br = block_of(n, parts, q);
      const std::int64_t lo = s0 > br.offset ? s0 : br.offset, hi = s1 < br.offset + br.size ? s1 : br.offset + br.size;
      if (lo >= hi) continue;
      Segment s;
      s.part = q;
      s.src_lo = lo - br.offset;
      s.src_len = hi - lo;
      s.len = hi - lo;
      s.step = step;
      // step +1: dst cell k <- source s0 + k; step -1: dst cell k <- source s1 - 1 - k.
      s.dst_lo = dst_lo + (step > 0 ? lo - s0 : s1 - hi);
      out.push_back(s);
    }
  };
  auto outside = [&](std::int64_t x, std::int64_t y, int side) {  // global [x, y) outside [0, n)
    if (x >= y) return;
    const Boundary& bnd = bc[static_cast<std::size_t>(side)];
    const std::int64_t dst_lo = x - a;
    switch (bnd.kind) {
      case Boundary::Kind::periodic:
        split(dst_lo, side == 0 ? x + n : x - n, side == 0 ? y + n : y - n, 1);
        return;
      case Boundary::Kind::reflect:  // low: g -> -1-g; high: g -> 2n-1-g
        split(dst_lo, side == 0 ? -y : 2 * n - y, side == 0 ? -x : 2 * n - x, -1);
        return;
      case Boundary::Kind::edge: {
        const std::int64_t e = side == 0 ? 0 : n - 1;
        for (int q = 0; q < parts; ++q) {
          const BlockRange br = block_of(n, parts, q);
          if (e < br.offset || e >= br.offset + br.size) continue;
          Segment s;
          s.part = q;
          s.src_lo = e - br.offset;
          s.src_len = 1;
          s.len = y - x;
          s.dst_lo = dst_lo;
          s.step = 0;
          out.push_back(s);
          return;
        }
        return;
      }
      default: {
        Segment s;
        s.dst_lo = dst_lo;
        s.len = y - x;
        s.value = bnd.kind == Boundary::Kind::value ? bnd.value : 0.0;
        out.push_back(s);
        return;
      }
    }
  };
  const std::int64_t lo_out_end = b < 0 ? b : 0, hi_out_begin = a > n ? a : n;
  outside(a, lo_out_end, 0);
  const std::int64_t in0 = a > 0 ? a : 0, in1 = b < n ? b : n;
  if (in0 < in1) split(in0 - a, in0, in1, 1);
  outside(hi_out_begin, b, 1);
}
/// The pieces of one box of device `dst` whose dims map onto `seg` (one list of segments per
/// dim): every combination of one segment per dim, dim 0 major. A combination with a constant
/// segment is a fill (the lowest such dim's value) if `dst` is `device`; otherwise a copy from the
/// device holding those parts (`dst`'s coordinates `coords` on the other axes), kept in `out`
/// when `device` sends or receives it. `region` tags the pieces.
inline void emit(const std::array<std::vector<Segment>, max_tensor_rank>& seg, int R, const Sharding& sharding,
                 const MeshShape& mesh, const std::array<int, max_mesh_rank>& coords, int dst, int device, int region,
                 Plan& out) {
  std::array<std::size_t, max_tensor_rank> pick{};
  for (;;) {
    int const_dim = -1;
    for (int d = 0; d < R && const_dim < 0; ++d)
      if (seg[static_cast<std::size_t>(d)][pick[static_cast<std::size_t>(d)]].part < 0) const_dim = d;
    if (const_dim >= 0) {
      if (dst == device) {
        Fill f;
        f.region = region;
        f.value = seg[static_cast<std::size_t>(const_dim)][pick[static_cast<std::size_t>(const_dim)]].value;
        for (int d = 0; d < R; ++d) {
          const auto& s = seg[static_cast<std::size_t>(d)][pick[static_cast<std::size_t>(d)]];
          f.lo[static_cast<std::size_t>(d)] = s.dst_lo;
          f.extent[static_cast<std::size_t>(d)] = s.len;
        }
        out.fills.push_back(f);
      }
    } else {
      auto c = coords;
      for (int d = 0; d < R; ++d) {  // part q of dim d -> coordinates on its axes (major first)
        const AxisList& axes = sharding.dims[static_cast<std::size_t>(d)];
        int q = seg[static_cast<std::size_t>(d)][pick[static_cast<std::size_t>(d)]].part;
        for (int k = axes.size() - 1; k >= 0; --k) {
          c[static_cast<std::size_t>(axes[k])] = q % mesh.size(axes[k]);
          q /= mesh.size(axes[k]);
        }
      }
      const int src = mesh.device_at(shardlib::detail::ArrayRef<int>(c.data(), static_cast<std::size_t>(mesh.rank())));
      if (src == device || dst == device) {
        Copy cp;
        cp.src = src;
        cp.dst = dst;
        cp.region = region;
        for (int d = 0; d < R; ++d) {
          const auto u = static_cast<std::size_t>(d);
          const auto& s = seg[u][pick[u]];
          cp.src_lo[u] = s.src_lo;
          cp.src_extent[u] = s.src_len;
          cp.dst_lo[u] = s.dst_lo;
          cp.extent[u] = s.len;
          cp.step[u] = s.step;
        }
        (src == dst ? out.local : src == device ? out.sends : out.receives).push_back(cp);
      }
    }
    int d = R - 1;
    for (; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      if (++pick[u] < seg[u].size()) break;
      pick[u] = 0;
    }
    if (d < 0) break;
  }
}

}  // namespace detail

/// Checks `h` against a tensor of `shape` distributed by `sharding`; throws std::invalid_argument
/// naming `what`, the dim, the width and the boundary.
inline void check(const HaloSpec& h, const Sharding& sharding, shardlib::detail::ArrayRef<std::int64_t> shape, std::string_view what) {
  using shardlib::detail::to_text;
  const std::string w(what);
  if (h.rank != sharding.rank || static_cast<int>(shape.size()) != sharding.rank)
    throw std::invalid_argument("shardlib: " + w + ": ghost widths for " + to_text(h.rank) + " dims on a tensor of rank " +
                                to_text(sharding.rank));
  if (sharding.is_partial())
    throw std::invalid_argument("shardlib: " + w + ": a tensor with a pending reduction has no cells to exchange; reshard it first");
  for (int d = 0; d < h.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const int wd = h.width[u];
    const auto& b = h.boundary[u];
    if (wd < 0)
      throw std::invalid_argument("shardlib: " + w + ": ghost width " + to_text(wd) + " on dim " + to_text(d) + " is negative");
    if (wd == 0) {
      for (int side = 0; side < 2; ++side)
        if (b[static_cast<std::size_t>(side)].kind != Boundary::Kind::unset)
          throw std::invalid_argument("shardlib: " + w + ": dim " + to_text(d) + " has ghost width 0, so its " +
                                      (side == 0 ? "low" : "high") + "-side boundary (" +
                                      b[static_cast<std::size_t>(side)].to_string() +
                                      ") has no ghost cells to fill; give the dim a width or drop the boundary");
      continue;
    }
    const bool p0 = b[0].kind == Boundary::Kind::periodic, p1 = b[1].kind == Boundary::Kind::periodic;
    if (p0 != p1)
      throw std::invalid_argument("shardlib: " + w + ": dim " + to_text(d) + " is periodic on its " + (p0 ? "low" : "high") +
                                  " side only (the other side: " + b[p0 ? 1 : 0].to_string() +
                                  "); a periodic dim wraps on both sides");
    const std::int64_t n = shape[u];
    for (int side = 0; side < 2; ++side) {
      const auto k = b[static_cast<std::size_t>(side)].kind;
      if ((k == Boundary::Kind::periodic || k == Boundary::Kind::reflect || k == Boundary::Kind::edge) && wd > n && n > 0)
        throw std::invalid_argument("shardlib: " + w + ": ghost width " + to_text(wd) + " on dim " + to_text(d) +
                                    " exceeds its extent " + to_text(n) + ": a " + b[static_cast<std::size_t>(side)].to_string() +
                                    " boundary maps each ghost cell to a cell of the dim, at most once round");
    }
  }
}

/// Device `device`'s part of the ghost exchange of a tensor of `shape` distributed by `sharding`
/// on `mesh`, with ghosts `h` (checked first, see check()).
inline Plan plan(const HaloSpec& h, const Sharding& sharding, const MeshShape& mesh, shardlib::detail::ArrayRef<std::int64_t> shape,
                    int device) {
  check(h, sharding, shape, "ghosted");
  const int R = sharding.rank;
  Plan out;
  out.rank = R;
  out.block = shard_box(sharding, mesh, shape, device);
  const int regions = region_count(R), centre = centre_region(R);
  std::array<int, max_tensor_rank> parts{};
  for (int d = 0; d < R; ++d) parts[static_cast<std::size_t>(d)] = mesh.group_size(sharding.dims[static_cast<std::size_t>(d)]);
  std::array<std::vector<detail::Segment>, max_tensor_rank> seg{};
  for (int dst = 0; dst < mesh.num_devices(); ++dst) {
    const ShardBox box = shard_box(sharding, mesh, shape, dst);
    if (box.num_elements() == 0) continue;  // an empty block has no neighbourhood
    const auto coords = mesh.coords(dst);
    for (int r = 0; r < regions; ++r) {
      if (r == centre) continue;
      bool empty = false;
      for (int d = 0; d < R && !empty; ++d) {
        const auto u = static_cast<std::size_t>(d);
        const int c = region_code(r, d, R);
        seg[u].clear();
        if (c != 1 && h.width[u] == 0) {
          empty = true;
          break;
        }
        const std::int64_t a = c == 0 ? box.offset[u] - h.width[u] : c == 1 ? box.offset[u] : box.offset[u] + box.extent[u];
        const std::int64_t b = c == 0 ? box.offset[u] : c == 1 ? box.offset[u] + box.extent[u] : a + h.width[u];
        detail::segments(seg[u], a, b, shape[u], parts[u], h.boundary[u]);
        empty = seg[u].empty();
      }
      if (empty) continue;
      detail::emit(seg, R, sharding, mesh, coords, dst, device, r, out);
    }
  }
  return out;
}

}  // namespace halo
}  // namespace shardlib
