// SPDX-License-Identifier: Apache-2.0
/// @file
/// Whole-array neighbour ops: `roll` (numpy.roll along one dim), `shift` (roll without
/// wrap-around, vacated cells filled), `pad` (numpy.pad: constant, wrap, symmetric, edge) and
/// `where` (elementwise select).
///
/// Rules: sharding/shift.hpp (roll, shift, pad keep the operand's spec) and
/// sharding/elementwise.hpp (where: the elementwise rule over three operands). Along a split dim
/// roll and shift move only the cells that change device, in one exchange over the dim's group
/// (a neighbour exchange, or further when the shift is longer than a block); along an unsplit
/// dim they copy locally. pad's output blocks follow the padded shape's distribution: one
/// exchange over the devices moves exactly the cells that change device (the boundary's copies
/// included). A stencil written with roll moves each block's shifted part; stencil_for over a
/// ghosted view (stencil/) moves only the ghost cells and is the cheaper form for stencils.
///
/// A separate header from ops/layout.hpp (slice, concat, ...): these ops share pad's planner
/// (sharding/halo.hpp's Boundary and segments) and where's elementwise machinery, which the
/// layout ops do not need; roll and shift reuse layout.hpp's `detail::shift_blocks`.
#pragma once

#include <shardlib/kernels/layout.hpp>
#include <shardlib/ops/common.hpp>
#include <shardlib/ops/elementwise.hpp>
#include <shardlib/ops/layout.hpp>
#include <shardlib/sharding/halo.hpp>
#include <shardlib/sharding/shift.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlib {

namespace error {
/// where's condition holds addends of a pending reduction, not truth values: reshard it first.
template <class CondSpec>
struct where_condition_has_a_pending_reduction_reshard_it_first;
/// where's condition must hold integer elements (nonzero is true).
template <class T>
struct where_condition_needs_integer_elements;
/// where's two value operands must have one element type.
template <class A, class B>
struct where_values_need_one_element_type;
}  // namespace error

/// The widths pad adds before (`lo`) and after (`hi`) one dim.
struct PadWidth {
  std::int64_t lo = 0, hi = 0;
};

namespace detail {

[[noreturn]] SHARDLIB_COLD inline void throw_dim_out_of_range(const char* op, int dim, const OperandInfo& a) {
  throw std::invalid_argument(std::string("shardlib: ") + op + " along dim " + std::to_string(dim) + " of " + operand_text(a) +
                              ": the dim is outside [0, " + std::to_string(a.shape.size()) + ")");
}

/// A row-major box of `extent` inside a buffer laid out as row-major `layout` extents, from `lo`.
inline kernels::detail::StridedView box_in(int rank, const std::int64_t* layout, const std::int64_t* lo, const std::int64_t* extent) {
  kernels::detail::StridedView v;
  v.rank = rank;
  std::int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    v.extent[d] = extent[d];
    v.stride[d] = s;
    v.offset += lo[d] * s;
    s *= layout[d];
  }
  return v;
}

/// Writes `value` into box `part` (global indices) of a row-major block in `Mem` laid out as `layout`.
template <class T, class Mem>
void fill_box(Context& ctx, T* dst, const ShardBox& layout, const ShardBox& part, T value) {
  if (part.num_elements() == 0) return;
  std::array<std::int64_t, max_tensor_rank> lo{};
  for (int d = 0; d < part.rank; ++d) lo[static_cast<std::size_t>(d)] = part.offset[static_cast<std::size_t>(d)] - layout.offset[static_cast<std::size_t>(d)];
  auto guard = kernel_guard(ctx, false);
  kernels::fill_strided(ctx.exec_for<Mem>(), "shardlib::fill_box", value, dst,
                        box_in(part.rank, layout.extent.data(), lo.data(), part.extent.data()));
}

/// roll's runtime part (compiled once per element type): the block `src` (box `box`, the output's
/// box too) rolled by `shift` along dim `d` of extent `n` into `out`. Local when the dim is not
/// split (`axes` empty); else one exchange over the group, in which each device receives the
/// cells it now holds that another device held. Both blocks in `Mem`.
template <class T, class Mem>
SHARDLIB_NOINLINE void roll_blocks(Context& ctx, const MeshShape& mesh, const AxisList& axes, int d, const T* src,
                                   const ShardBox& box, std::int64_t n, std::int64_t shift, T* out) {
  const auto u = static_cast<std::size_t>(d);
  const std::int64_t s = n == 0 ? 0 : ((shift % n) + n) % n;
  auto moved = [&](ShardBox b, std::int64_t by) {
    b.offset[u] += by;
    return b;
  };
  if (axes.empty() || mesh.group_size(axes) == 1) {
    for (const std::int64_t by : {s, s - n}) {
      const ShardBox from = moved(box, by);
      copy_box<Mem>(ctx, src, from, out, box, intersect(from, box));
    }
    return;
  }
  const int parts = mesh.group_size(axes);
  std::vector<coll::Region> send(static_cast<std::size_t>(parts)), recv(send.size());
  for (int r = 0; r < parts; ++r) {  // group rank r holds part r of dim d
    ShardBox peer = box;
    const BlockRange br = block_of(n, parts, r);
    peer.offset[u] = br.offset;
    peer.extent[u] = br.size;
    // With two parts or more, a block meets another's rolled block in one piece at most: either
    // the piece rolled by s or the one that wrapped round (by s - n).
    for (const std::int64_t by : {s, s - n}) {
      const ShardBox mine = moved(box, by), theirs = moved(peer, by);
      const ShardBox to_peer = intersect(mine, peer), from_peer = intersect(theirs, box);
      if (to_peer.num_elements() > 0) send[static_cast<std::size_t>(r)] = region_in(mine, to_peer);
      if (from_peer.num_elements() > 0) recv[static_cast<std::size_t>(r)] = region_in(box, from_peer);
    }
  }
  exchange_in<Mem>(ctx, &mesh, axes, src, box.num_elements(), send, out, box.num_elements(), recv);
}

/// shift's vacated cells of dim `d` (extent `n`) in the output block `box`: [0, shift) or
/// [n + shift, n), clipped to the dim.
inline ShardBox vacated(const ShardBox& box, int d, std::int64_t n, std::int64_t shift) {
  const auto u = static_cast<std::size_t>(d);
  ShardBox v = box;
  const std::int64_t lo = shift >= 0 ? 0 : std::max<std::int64_t>(n + shift, 0);
  const std::int64_t hi = shift >= 0 ? std::min<std::int64_t>(shift, n) : n;
  v.offset[u] = lo;
  v.extent[u] = hi - lo;
  return intersect(v, box);
}

/// Whether this device writes a constant cell as 0: a partial-sum output holds the constant on
/// the first coordinate of its group only (the addends sum to it); partial max/min everywhere.
inline bool constant_is_zero_here(const Context& ctx, const MeshShape& mesh, const Sharding& s) {
  return s.is_partial() && s.op == ReduceOp::sum && off_first_coordinate(mesh, ctx.device(), s.partial);
}

/// pad's runtime part (compiled once per element type and memory space): plans this device's
/// part (sharding/shift.hpp pad_plan), fills the constant boxes, copies its own cells, and runs
/// one exchange over the world when `exchange` (some split dim is padded).
template <class T, class Mem>
SHARDLIB_NOINLINE void pad_run(Context& ctx, const MeshShape& mesh, const Sharding& sharding, ArrayRef<std::int64_t> in_shape,
                               const T* src, const ShardBox& in_box, ArrayRef<std::int64_t> lo, ArrayRef<std::int64_t> out_shape,
                               const Boundary& b, T* out, bool exchange) {
  halo::Plan plan = pad_plan(sharding, mesh, in_shape, lo, out_shape, b, ctx.device());
  const auto& exec = ctx.exec_for<Mem>();
  const int R = plan.rank;
  const ShardBox& ob = plan.block;
  // The source box of copy c in a block of `extent`, walked in the output's order (mirrors read
  // backwards, an edge cell repeated).
  auto stepped = [R](kernels::detail::StridedView v, const halo::Copy& c) {
    for (int d = 0; d < R; ++d) {
      const auto k = static_cast<std::size_t>(d);
      if (c.step[k] < 0) {
        v.offset += (c.src_extent[k] - 1) * v.stride[d];
        v.stride[d] = -v.stride[d];
      } else if (c.step[k] == 0) {
        v.stride[d] = 0;
      }
      v.extent[d] = c.extent[k];
    }
    return v;
  };
  auto dst_view = [&](const halo::Copy& c) { return box_in(R, ob.extent.data(), c.dst_lo.data(), c.extent.data()); };
  const std::array<std::int64_t, max_tensor_rank> zero{};
  {
    const bool zeros = constant_is_zero_here(ctx, mesh, sharding);
    auto guard = kernel_guard(ctx, false);
    for (const auto& f : plan.fills) {
      const T value = zeros ? T{} : static_cast<T>(f.value);
      kernels::fill_strided(exec, "shardlib::pad::fill", value, out, box_in(R, ob.extent.data(), f.lo.data(), f.extent.data()));
    }
    for (const auto& c : plan.local)
      kernels::copy_strided(exec, "shardlib::pad::local", src,
                            stepped(box_in(R, in_box.extent.data(), c.src_lo.data(), c.src_extent.data()), c), out, dst_view(c));
  }
  if (!exchange) return;
  // Pieces laid out by peer, each peer's contiguous, in plan order (receives: in the sender's order).
  std::stable_sort(plan.receives.begin(), plan.receives.end(), [](const halo::Copy& x, const halo::Copy& y) { return x.src < y.src; });
  const auto n = static_cast<std::size_t>(ctx.num_devices());
  std::vector<coll::Region> send_regions(n), recv_regions(n);
  std::vector<std::int64_t> send_at, recv_at;
  auto stage = [R](const std::vector<halo::Copy>& pieces, bool sends, std::vector<std::int64_t>& at, std::vector<coll::Region>& regions) {
    std::int64_t off = 0;
    for (std::size_t i = 0; i < pieces.size();) {
      const int p = sends ? pieces[i].dst : pieces[i].src;
      const std::int64_t first = off;
      for (; i < pieces.size() && (sends ? pieces[i].dst : pieces[i].src) == p; ++i) {
        at.push_back(off);
        off += pieces[i].src_cells(R);
      }
      regions[static_cast<std::size_t>(p)] = coll::Region::contiguous(static_cast<std::size_t>(first), static_cast<std::size_t>(off - first));
    }
    return off;
  };
  // The staging buffers from the block cache (no allocation, so no device synchronisation, in
  // steady state).
  const std::int64_t n_send = stage(plan.sends, true, send_at, send_regions);
  const std::int64_t n_recv = stage(plan.receives, false, recv_at, recv_regions);
  auto& cache = block_cache<Mem>(ctx);
  const std::shared_ptr<void> send_keep = cache.allocate(static_cast<std::size_t>(n_send) * sizeof(T));
  const std::shared_ptr<void> recv_keep = cache.allocate(static_cast<std::size_t>(n_recv) * sizeof(T));
  T* const send_buf = static_cast<T*>(send_keep.get());
  T* const recv_buf = static_cast<T*>(recv_keep.get());
  {
    auto guard = kernel_guard(ctx, false);
    for (std::size_t i = 0; i < plan.sends.size(); ++i) {
      const auto& c = plan.sends[i];
      const auto packed = box_in(R, c.src_extent.data(), zero.data(), c.src_extent.data());
      kernels::copy_strided(exec, "shardlib::pad::pack", src, box_in(R, in_box.extent.data(), c.src_lo.data(), c.src_extent.data()),
                            send_buf + send_at[i], packed);
    }
  }
  exchange_in<Mem>(ctx, nullptr, AxisList{}, send_buf, n_send, send_regions,
                   recv_buf, n_recv, recv_regions);
  auto guard = kernel_guard(ctx, false);
  for (std::size_t i = 0; i < plan.receives.size(); ++i) {
    const auto& c = plan.receives[i];
    kernels::copy_strided(exec, "shardlib::pad::unpack", recv_buf + recv_at[i],
                          stepped(box_in(R, c.src_extent.data(), zero.data(), c.src_extent.data()), c), out, dst_view(c));
  }
}

/// The result type of roll, shift and pad of an `A`: the operand's spec (its partial clause in
/// mesh order, as every rule writes it).
template <class A>
struct shift_result {
  static constexpr OpRule rule = pad_rule(A::sharding);
  using type = DistributedTensor<typename A::value_type, typename A::mesh_type,
                                 spec_from_t<typename A::mesh_type, decltype([] { return rule.out; })>, typename A::memory_space>;
};
template <class A>
using shift_result_t = typename shift_result<std::remove_cvref_t<A>>::type;

template <class A>
shift_result_t<A> roll_op(const A& a, std::int64_t shift, int dim) {
  const OpRule rule = roll_rule(A::sharding, dim);
  if (rule.status != OpRule::ok) throw_dim_out_of_range("roll", dim, info(a));
  shift_result_t<A> out(a.mesh(), a.shape());
  roll_blocks<typename A::value_type, typename A::memory_space>(out.context(), a.mesh().shape(), rule.comm, dim, a.local().data(), a.block(),
                                      a.shape()[static_cast<std::size_t>(dim)], shift, out.local().data());
  return out;
}

template <class A>
shift_result_t<A> shift_op(const A& a, std::int64_t shift, int dim, typename A::value_type fill) {
  using T = typename A::value_type;
  using Mem = typename A::memory_space;
  const OpRule rule = roll_rule(A::sharding, dim);
  if (rule.status != OpRule::ok) throw_dim_out_of_range("shift", dim, info(a));
  const std::int64_t n = a.shape()[static_cast<std::size_t>(dim)];
  shift_result_t<A> out(a.mesh(), a.shape());
  Context& ctx = out.context();
  // Past the extent nothing stays: clamp (the exchange then moves nothing).
  const std::int64_t s = shift > n ? n : shift < -n ? -n : shift;
  shift_blocks<T, Mem>(ctx, a.mesh().shape(), rule.comm, dim, a.local().data(), a.block(), n, s, out.local().data(), out.block(), n);
  fill_box<T, Mem>(ctx, out.local().data(), out.block(), vacated(out.block(), dim, n, s),
              constant_is_zero_here(ctx, a.mesh().shape(), A::sharding) ? T{} : fill);
  return out;
}

}  // namespace detail

/// numpy.roll along dim `dim`: out[i] = a[(i - shift) mod n] (any shift, negative or longer than
/// the dim), same shape and spec; a partial operand stays partial. Along a split dim the cells
/// that change device travel in one exchange over the dim's group (from the neighbours, or from
/// further when the shift is longer than a block); along an unsplit dim a local copy. Throws
/// std::invalid_argument naming the op, dim, shape and spec for a dim outside the rank.
template <TensorType A>
detail::shift_result_t<A> roll(const A& a, std::int64_t by, int dim) {
  return detail::roll_op(a, by, dim);
}
/// roll along `Dim`, checked at compile time.
template <int Dim, TensorType A>
detail::shift_result_t<A> roll(const A& a, std::int64_t by) {
  static constexpr OpRule rule = roll_rule(A::sharding, Dim);
  SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: roll: the dim is outside the tensor's rank",
                          error::op_has_no_sharding_rule_for_these_specs<"roll", rule.status, typename A::spec_type>);
  return detail::roll_op(a, by, Dim);
}

/// roll without wrap-around: out[i] = a[i - shift] where 0 <= i - shift < n, else `fill` (the
/// vacated cells). Same shape and spec, and the same exchange as roll; a partial operand stays
/// partial (on a partial-sum tensor the fill counts once: the first device of the group writes
/// it, the others 0). Throws as roll does.
template <TensorType A>
detail::shift_result_t<A> shift(const A& a, std::int64_t by, int dim, typename std::remove_cvref_t<A>::value_type fill = {}) {
  return detail::shift_op(a, by, dim, fill);
}
/// shift along `Dim`, checked at compile time.
template <int Dim, TensorType A>
detail::shift_result_t<A> shift(const A& a, std::int64_t by, typename std::remove_cvref_t<A>::value_type fill = {}) {
  static constexpr OpRule rule = roll_rule(A::sharding, Dim);
  SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: shift: the dim is outside the tensor's rank",
                          error::op_has_no_sharding_rule_for_these_specs<"shift", rule.status, typename A::spec_type>);
  return detail::shift_op(a, by, Dim, fill);
}

/// numpy.pad: `widths[d] = {lo, hi}` cells added before and after dim d (one entry per dim), the
/// output's extent n + lo + hi; out[i] = a[i - lo] inside, and outside what `boundary` says:
/// zero (numpy's constant 0), dirichlet(v) (constant v), periodic (numpy's wrap), reflect
/// (numpy's symmetric: the edge cell repeated, as the ghost cells of stencil/), edge (numpy's
/// edge). Widths may exceed the extent (wrap and symmetric go round again). The output has the
/// operand's spec, its blocks those of the padded shape: one exchange over the devices moves
/// exactly the cells that change device. A partial operand stays partial (a constant counts once
/// in a partial sum). Throws std::invalid_argument for a negative width or a copying boundary on
/// an empty dim, naming the op, dim, shape and spec.
template <TensorType A, std::size_t N>
detail::shift_result_t<A> pad(const A& a, const PadWidth (&widths)[N], Boundary boundary = Boundary::zero()) {
  using Ten = std::remove_cvref_t<A>;
  using T = typename Ten::value_type;
  static_assert(N == Ten::rank, "shardlib: pad needs one {lo, hi} width per dim of the tensor");
  static constexpr OpRule rule = pad_rule(Ten::sharding);
  typename Ten::Shape lo{}, hi{}, shape{};
  bool exchange = false;
  for (std::size_t d = 0; d < N; ++d) {
    lo[d] = widths[d].lo;
    hi[d] = widths[d].hi;
    shape[d] = a.shape()[d] + lo[d] + hi[d];
    exchange = exchange || ((lo[d] != 0 || hi[d] != 0) && !Ten::sharding.dims[d].empty());
  }
  check_pad(a.shape(), lo, hi, boundary, detail::operand_text(a));
  detail::shift_result_t<A> out(a.mesh(), shape);
  detail::pad_run<T, typename Ten::memory_space>(out.context(), a.mesh().shape(), rule.in[0], a.shape(), a.local().data(),
                                                 a.block(), lo, shape, boundary, out.local().data(), exchange);
  return out;
}

namespace fn {
/// `c ? a : b`.
struct select {
  template <class C, class V>
  KOKKOS_INLINE_FUNCTION constexpr V operator()(const C& c, const V& a, const V& b) const { return c ? a : b; }
};
}  // namespace fn

/// Elementwise select: `cond ? a : b` (numpy.where), `cond` of integer elements (nonzero is true;
/// bool is no tensor element type: use int8), `a` and `b` of one element type. Broadcasting and the output spec follow the
/// elementwise rule over the three operands (each dim keeps the operand with the most axes on
/// it, ties to the leftmost; no communication when the specs agree). A partial `a` or `b` is
/// reduced first (select is not linear in one of them alone); a partial `cond` does not compile.
template <TensorType C, TensorType A, TensorType B>
auto where(const C& cond, const A& a, const B& b) {
  using CT = typename C::value_type;
  SHARDLIB_STATIC_REQUIRE((std::is_integral_v<CT>), "shardlib: where needs a condition of integer elements",
                          error::where_condition_needs_integer_elements<CT>);
  SHARDLIB_STATIC_REQUIRE((std::is_same_v<typename A::value_type, typename B::value_type>),
                          "shardlib: where needs values of one element type",
                          error::where_values_need_one_element_type<typename A::value_type, typename B::value_type>);
  SHARDLIB_STATIC_REQUIRE((!C::sharding.is_partial()),
                          "shardlib: where's condition holds addends of a pending reduction; reshard it first",
                          error::where_condition_has_a_pending_reduction_reshard_it_first<typename C::spec_type>);
  return detail::elementwise_op<"where", Linearity::nonlinear>(fn::select{}, cond, a, b);
}

}  // namespace shardlib
