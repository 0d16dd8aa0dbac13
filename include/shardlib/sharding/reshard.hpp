// SPDX-License-Identifier: Apache-2.0
/// @file
/// Resharding rules: how a tensor moves from one sharding to another of the same mesh and rank,
/// with the fewest bytes.
///
/// A reshard runs at most four steps, in this order (shrink first, as Shardy orders them):
///  1. **reduce_scatter** over the partial axes that the target uses to split dims, when the
///     target appends them as the minor axes of dims (their blocks then tile the current block);
///  2. **all_reduce** over the partial axes left (the target replicates them, or step 1 did not fit);
///  3. **exchange** between the two layouts over the mesh axes whose role changes: every device
///     receives exactly the elements it needs and does not hold, each once, from the holder that
///     shares its coordinates on the replicated axes. Run as an all_gather when it is one (the
///     moved axes are the minor axes of dim 0 and only leave), as a local copy when nothing moves
///     (replicated to sharded is a slice), otherwise as one all-to-all of strided boxes. This one
///     step covers shard <-> replicate, dim i <-> dim j, several axes on one dim and their order,
///     and uneven shapes: blocks are compared exactly, so no padding is ever sent;
///  4. **mask**: axes that become partial-sum keep the value on coordinate 0 and zero elsewhere
///     (partial max/min need nothing: a replicated value already reduces to itself).
///
/// `plan_reshard` derives what depends only on the two shardings (a typed tensor evaluates it at
/// compile time); `schedule_reshard` adds what depends on the mesh sizes and the global shape
/// (whether blocks line up when extents do not divide evenly, whether anything moves at all).
/// `exchange_box` tells one device what to send to another. Pure rules: no Kokkos, no
/// communicator; every function is constexpr.
#pragma once

#include <shardlib/detail/array_ref.hpp>
#include <shardlib/detail/text.hpp>
#include <shardlib/mesh.hpp>
#include <shardlib/sharding/block.hpp>
#include <shardlib/spec.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace shardlib {

/// The spec of a sharding, with the names of `mesh` (the inverse of resolve()), for messages.
constexpr PartitionSpec to_spec(const Sharding& s, const MeshShape& mesh) {
  detail::check_sharding(s, mesh, "to_spec");
  std::array<SpecEntry, max_tensor_rank + 1> entries{};
  auto names = [&](const AxisList& l) {
    std::array<AxisName, max_mesh_rank> n{};
    for (int i = 0; i < l.size(); ++i) n[static_cast<std::size_t>(i)] = mesh.name(l[i]);
    return n;
  };
  std::size_t n = 0;
  for (int d = 0; d < s.rank; ++d) {
    const AxisList& l = s.dims[static_cast<std::size_t>(d)];
    const auto nm = names(l);
    entries[n++] = SpecEntry::split(detail::ArrayRef<AxisName>(nm.data(), static_cast<std::size_t>(l.size())));
  }
  if (s.is_partial()) {
    const auto nm = names(s.partial);
    entries[n++] = SpecEntry::pending(s.op, detail::ArrayRef<AxisName>(nm.data(), static_cast<std::size_t>(s.partial.size())));
  }
  return PartitionSpec(detail::ArrayRef<SpecEntry>(entries.data(), n));
}

/// The intersection of two boxes of the same rank (offset at the first box's corner when empty).
constexpr ShardBox intersect(const ShardBox& a, const ShardBox& b) {
  if (a.rank != b.rank)
    throw std::invalid_argument("shardlib: intersect: boxes of rank " + detail::to_text(a.rank) + " and " +
                                detail::to_text(b.rank));
  ShardBox r;
  r.rank = a.rank;
  for (int d = 0; d < a.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const std::int64_t lo = a.offset[u] > b.offset[u] ? a.offset[u] : b.offset[u];
    const std::int64_t ha = a.offset[u] + a.extent[u], hb = b.offset[u] + b.extent[u];
    const std::int64_t hi = ha < hb ? ha : hb;
    r.offset[u] = hi > lo ? lo : a.offset[u];
    r.extent[u] = hi > lo ? hi - lo : 0;
  }
  return r;
}

/// Whether every element of `inner` lies in `outer` (an empty `inner` always does).
constexpr bool covers(const ShardBox& outer, const ShardBox& inner) {
  if (inner.num_elements() == 0) return true;
  return intersect(outer, inner).num_elements() == inner.num_elements();
}

/// What depends only on the two shardings (see the file comment).
struct ReshardPlan {
  Sharding from;
  Sharding to;
  /// Partial axes of `from` that stay partial (same op in `to`): their addends are never combined.
  AxisList kept_partial;
  /// Partial axes of `from` whose addends are combined, with `reduce_op`.
  AxisList reduce;
  ReduceOp reduce_op = ReduceOp::sum;
  /// The part of `reduce` that a reduce_scatter can combine straight into the target's dims, in
  /// group order (by dim, then major to minor); empty when the target does not fit step 1.
  AxisList scatter;
  /// `from` after step 1 (when `scatter` is not empty): `scatter`'s axes appended to their dims.
  Sharding scattered;
  /// Axes that become partial in `to`; they are replicated until step 4 masks them.
  AxisList new_partial;
  /// `to` with `new_partial` replicated: the layout the exchange (step 3) aims at.
  Sharding target_layout;
  /// from == to: the reshard is a copy.
  bool identity = false;
};

namespace detail {
constexpr AxisList axes_minus(const AxisList& a, const AxisList& b) {
  AxisList r;
  for (int x : a)
    if (!b.contains(x)) r.push_back(x);
  return r;
}
constexpr AxisList axes_and(const AxisList& a, const AxisList& b) {
  AxisList r;
  for (int x : a)
    if (b.contains(x)) r.push_back(x);
  return r;
}
/// The op means nothing without partial axes: sum, so that equal layouts compare equal.
constexpr Sharding normalized(Sharding s) {
  if (s.partial.empty()) s.op = ReduceOp::sum;
  return s;
}
/// `s` with the partial axes in `drop` replicated.
constexpr Sharding without_partial(Sharding s, const AxisList& drop) {
  s.partial = axes_minus(s.partial, drop);
  return normalized(s);
}
}  // namespace detail

/// The plan from `from` to `to` (same rank; the mesh is not needed). Throws
/// std::invalid_argument when the ranks differ.
constexpr ReshardPlan plan_reshard(const Sharding& from_in, const Sharding& to_in) {
  const Sharding from = detail::normalized(from_in), to = detail::normalized(to_in);
  if (from.rank != to.rank)
    throw std::invalid_argument("shardlib: reshard between shardings of rank " + detail::to_text(from.rank) + " and " +
                                detail::to_text(to.rank) + "; a reshard keeps the rank");
  ReshardPlan p;
  p.from = from;
  p.to = to;
  p.identity = from == to;
  p.kept_partial = from.op == to.op ? detail::axes_and(from.partial, to.partial) : AxisList{};
  p.reduce = detail::axes_minus(from.partial, p.kept_partial);
  p.reduce_op = from.op;
  p.new_partial = detail::axes_minus(to.partial, p.kept_partial);
  p.target_layout = detail::without_partial(to, p.new_partial);

  // Step 1 fits when, dim by dim, the target is the source followed by reduced axes only.
  const Sharding base = detail::without_partial(from, p.reduce);
  bool fits = !p.reduce.empty();
  for (int d = 0; d < from.rank && fits; ++d) {
    const AxisList& f = base.dims[static_cast<std::size_t>(d)];
    const AxisList& t = to.dims[static_cast<std::size_t>(d)];
    if (t.size() < f.size()) {
      fits = false;
      break;
    }
    for (int i = 0; i < f.size() && fits; ++i) fits = f[i] == t[i];
    for (int i = f.size(); i < t.size() && fits; ++i) fits = p.reduce.contains(t[i]);
    for (int i = f.size(); i < t.size() && fits; ++i) p.scatter.push_back(t[i]);
  }
  if (!fits || p.scatter.empty()) {
    p.scatter = AxisList{};
    p.scattered = from;
  } else {
    p.scattered = base;
    for (int d = 0; d < from.rank; ++d) p.scattered.dims[static_cast<std::size_t>(d)] = to.dims[static_cast<std::size_t>(d)];
    p.scattered.partial = detail::axes_minus(from.partial, p.scatter);  // the other reduced axes wait for step 2
    p.scattered.op = from.op;
    p.scattered = detail::normalized(p.scattered);
  }
  return p;
}

namespace detail {
/// The blocks of `before` and `after` along dim `d` agree on the prefix of `prefix_len` axes:
/// for every index of the prefix axes, both cover the same range.
constexpr bool prefix_aligned(std::int64_t extent, const MeshShape& mesh, const AxisList& before,
                              const AxisList& after, int prefix_len) {
  if (prefix_len == 0) return true;
  int np = 1, na = 1, nb = 1;
  for (int i = 0; i < before.size(); ++i) (i < prefix_len ? np : na) *= mesh.size(before[i]);
  for (int i = prefix_len; i < after.size(); ++i) nb *= mesh.size(after[i]);
  auto ceil_div = [](std::int64_t x, std::int64_t y) { return x / y + (x % y != 0 ? 1 : 0); };
  const std::int64_t sa = na * ceil_div(extent, std::int64_t{np} * na);
  const std::int64_t sb = nb * ceil_div(extent, std::int64_t{np} * nb);
  if (sa == sb) return true;
  for (std::int64_t i = 1; i < np; ++i) {
    const std::int64_t ea = i * sa < extent ? i * sa : extent, eb = i * sb < extent ? i * sb : extent;
    if (ea != eb) return false;
  }
  return true;
}
}  // namespace detail

/// The mesh axes an exchange from `before` to `after` runs over: per dim, the axes outside the
/// longest common prefix of axis lists whose blocks line up (see detail::prefix_aligned), in mesh
/// order. Devices that differ only on these axes hold, between them, everything each of them needs.
constexpr AxisList exchange_axes(const Sharding& before, const Sharding& after, const MeshShape& mesh,
                                 detail::ArrayRef<std::int64_t> shape) {
  std::array<bool, max_mesh_rank> moved{};
  for (int d = 0; d < before.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const AxisList& a = before.dims[u];
    const AxisList& b = after.dims[u];
    int k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    while (k > 0 && !detail::prefix_aligned(shape[u], mesh, a, b, k)) --k;
    for (int i = k; i < a.size(); ++i) moved[a[i]] = true;
    for (int i = k; i < b.size(); ++i) moved[b[i]] = true;
  }
  AxisList r;
  for (int a = 0; a < mesh.rank(); ++a)
    if (moved[static_cast<std::size_t>(a)]) r.push_back(a);
  return r;
}

/// What device `src` sends to device `dst` in an exchange from `before` to `after` over `group`
/// (global indices): the part of dst's new block that src holds, when src is the holder dst takes
/// it from, else an empty box. For src == dst: what dst keeps from its own block (a local copy).
///
/// Holder rule: the devices of a group that split dims the same way hold the same block; dst takes
/// a block it does not hold from the one that shares dst's coordinates on the group axes that split
/// nothing in `before`. So every element dst needs and does not hold arrives once, and the sends of
/// replicas are spread evenly. Throws std::invalid_argument when src and dst are not in one group.
constexpr ShardBox exchange_box(const Sharding& before, const Sharding& after, const MeshShape& mesh,
                                detail::ArrayRef<std::int64_t> shape, const AxisList& group, int src, int dst) {
  const auto cs = mesh.coords(src), cd = mesh.coords(dst);
  bool same_block = true;
  for (int a = 0; a < mesh.rank(); ++a) {
    const auto u = static_cast<std::size_t>(a);
    if (cs[u] == cd[u]) continue;
    if (!group.contains(a))
      throw std::invalid_argument("shardlib: exchange_box: devices " + detail::to_text(src) + " and " +
                                  detail::to_text(dst) + " differ on mesh axis '" + mesh.name(a).str() +
                                  "', outside the exchange group");
    if (!before.shards_over(a)) {
      ShardBox empty;
      empty.rank = before.rank;
      return empty;  // not the holder dst takes from
    }
    same_block = false;
  }
  const ShardBox need = shard_box(after, mesh, shape, dst);
  if (src != dst && same_block) {
    ShardBox empty;
    empty.rank = before.rank;
    return empty;  // dst holds this block itself
  }
  return intersect(shard_box(before, mesh, shape, src), need);
}

/// Kinds of reshard step, as executed.
enum class ReshardStepKind : std::uint8_t {
  reduce_scatter,  ///< partial addends combined into the blocks of `after`
  all_reduce,      ///< partial addends combined, block unchanged
  all_gather,      ///< blocks of minor axes of dim 0 gathered, straight into the new block
  exchange,        ///< one all-to-all of strided boxes (see exchange_box)
  local_copy,      ///< the new block is part of the old one: a slice, no communication
  mask,            ///< new partial-sum axes: zero except at coordinate 0
};

constexpr std::string_view to_string(ReshardStepKind k) noexcept {
  switch (k) {
    case ReshardStepKind::reduce_scatter: return "reduce_scatter";
    case ReshardStepKind::all_reduce: return "all_reduce";
    case ReshardStepKind::all_gather: return "all_gather";
    case ReshardStepKind::exchange: return "all_to_all";
    case ReshardStepKind::local_copy: return "local slice";
    case ReshardStepKind::mask: return "mask";
  }
  return "?";
}

/// One step: its kind, the mesh axes of its group (in group-rank order), and the layouts before
/// and after it.
struct ReshardStep {
  ReshardStepKind kind{};
  AxisList group;
  Sharding before;
  Sharding after;
};

/// Whether an exchange step only gathers: each dim keeps a prefix of its axes and the partial
/// clause stays, so every device sends its whole block to each peer of the group, an all_gather
/// into strided places (along a dim other than the first, e.g. sequence parallelism's gather).
constexpr bool is_strided_gather(const ReshardStep& st) {
  if (st.kind != ReshardStepKind::exchange || !(st.before.partial == st.after.partial)) return false;
  for (int d = 0; d < st.before.rank; ++d) {
    const AxisList& a = st.before.dims[static_cast<std::size_t>(d)];
    const AxisList& b = st.after.dims[static_cast<std::size_t>(d)];
    if (b.size() > a.size()) return false;
    for (int i = 0; i < b.size(); ++i)
      if (a[i] != b[i]) return false;
  }
  return true;
}

/// The collective a step is, as described and counted: an exchange that only gathers is an
/// all_gather, any other an all_to_all.
constexpr std::string_view collective_name(const ReshardStep& st) noexcept {
  return is_strided_gather(st) ? "all_gather" : to_string(st.kind);
}

/// The steps of one reshard for a given mesh and global shape (empty: nothing to do, e.g. from ==
/// to or a reshard that only relabels).
struct ReshardSchedule {
  ReshardPlan plan;
  int num_steps = 0;
  std::array<ReshardStep, 4> steps{};

  constexpr void add(ReshardStepKind k, const AxisList& group, const Sharding& before, const Sharding& after) {
    steps[static_cast<std::size_t>(num_steps++)] = ReshardStep{k, group, before, after};
  }
};

namespace detail {
/// Whether the new block of some device is not inside its old one (then data must move).
constexpr bool anything_moves(const Sharding& before, const Sharding& after, const MeshShape& mesh,
                              ArrayRef<std::int64_t> shape) {
  for (int dev = 0; dev < mesh.num_devices(); ++dev)
    if (!covers(shard_box(before, mesh, shape, dev), shard_box(after, mesh, shape, dev))) return true;
  return false;
}

/// The exchange is an all_gather straight into the new block: only dim 0 changes, by dropping
/// minor axes that split nothing afterwards, and the prefix left lines up.
constexpr bool is_leading_gather(const Sharding& before, const Sharding& after, const AxisList& group) {
  if (before.rank == 0 || !(before.partial == after.partial)) return false;
  for (int d = 1; d < before.rank; ++d)
    if (!(before.dims[static_cast<std::size_t>(d)] == after.dims[static_cast<std::size_t>(d)])) return false;
  const AxisList& a = before.dims[0];
  const AxisList& b = after.dims[0];
  if (b.size() >= a.size()) return false;
  for (int i = 0; i < b.size(); ++i)
    if (a[i] != b[i]) return false;
  // The group must be exactly the dropped suffix (so the prefix lines up), in order.
  if (group.size() != a.size() - b.size()) return false;
  for (int i = b.size(); i < a.size(); ++i)
    if (!group.contains(a[i])) return false;
  return true;
}

/// The dropped suffix of dim 0 in `before`'s order (the group order of a leading gather).
constexpr AxisList dim0_suffix(const Sharding& before, const Sharding& after) {
  AxisList r;
  for (int i = after.dims[0].size(); i < before.dims[0].size(); ++i) r.push_back(before.dims[0][i]);
  return r;
}
}  // namespace detail

/// The steps from `plan.from` to `plan.to` on `mesh` for a tensor of `shape` (see the file
/// comment). Every device computes the same schedule. Throws std::invalid_argument when the
/// shape's rank differs from the shardings' or a sharding does not fit the mesh.
constexpr ReshardSchedule schedule_reshard(const ReshardPlan& plan, const MeshShape& mesh,
                                           detail::ArrayRef<std::int64_t> shape) {
  detail::check_sharding(plan.from, mesh, "reshard (source)");
  detail::check_sharding(plan.to, mesh, "reshard (target)");
  if (static_cast<int>(shape.size()) != plan.from.rank)
    throw std::invalid_argument("shardlib: reshard: a shape of rank " + detail::to_text(shape.size()) +
                                " for shardings of rank " + detail::to_text(plan.from.rank));
  ReshardSchedule s;
  s.plan = plan;
  if (plan.identity) return s;
  Sharding cur = plan.from;

  // Step 1: reduce_scatter when the scattered blocks tile the current block exactly.
  if (!plan.scatter.empty()) {
    // Only the scatter axes move when the new blocks line up with the old (see exchange_axes):
    // then the blocks of a reduce_scatter group tile the block they share.
    const Sharding base = detail::without_partial(cur, plan.scatter);
    if (detail::axes_minus(exchange_axes(base, plan.scattered, mesh, shape), plan.scatter).empty()) {
      s.add(mesh.group_size(plan.scatter) > 1 ? ReshardStepKind::reduce_scatter : ReshardStepKind::local_copy,
            plan.scatter, cur, plan.scattered);
      cur = plan.scattered;
    }
  }
  // Step 2: all_reduce over the reduced axes still partial.
  const AxisList left = detail::axes_and(cur.partial, plan.reduce);
  if (!left.empty()) {
    const Sharding next = detail::without_partial(cur, left);
    s.add(mesh.group_size(left) > 1 ? ReshardStepKind::all_reduce : ReshardStepKind::local_copy, left, cur, next);
    cur = next;
  }
  // Step 3: the exchange to the target layout.
  const Sharding& target = plan.target_layout;
  if (!(cur == target)) {
    const AxisList g = exchange_axes(cur, target, mesh, shape);
    if (detail::is_leading_gather(cur, target, g) && detail::anything_moves(cur, target, mesh, shape))
      s.add(ReshardStepKind::all_gather, detail::dim0_suffix(cur, target), cur, target);
    else if (!g.empty() && detail::anything_moves(cur, target, mesh, shape))
      s.add(ReshardStepKind::exchange, g, cur, target);
    else
      s.add(ReshardStepKind::local_copy, AxisList{}, cur, target);
    cur = target;
  }
  // Step 4: mask new partial axes.
  if (!plan.new_partial.empty()) s.add(ReshardStepKind::mask, plan.new_partial, cur, plan.to);
  return s;
}

/// Bytes `device` sends and receives in one step (the payload to and from other devices; the
/// same figures the collectives' counters report for the call the step makes).
struct StepBytes {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
};

/// See StepBytes. `element_size` in bytes.
constexpr StepBytes step_bytes(const ReshardStep& step, const MeshShape& mesh, detail::ArrayRef<std::int64_t> shape,
                               int device, std::size_t element_size) {
  const auto e = static_cast<std::uint64_t>(element_size);
  StepBytes b;
  switch (step.kind) {
    case ReshardStepKind::local_copy:
    case ReshardStepKind::mask: return b;
    case ReshardStepKind::all_reduce: {
      const std::uint64_t n = static_cast<std::uint64_t>(mesh.group_size(step.group));
      const std::uint64_t bytes = static_cast<std::uint64_t>(shard_box(step.before, mesh, shape, device).num_elements()) * e;
      b.sent = b.received = n > 1 ? 2 * bytes * (n - 1) / n : 0;
      return b;
    }
    case ReshardStepKind::reduce_scatter: {
      const std::uint64_t n = static_cast<std::uint64_t>(mesh.group_size(step.group));
      const std::uint64_t in = static_cast<std::uint64_t>(shard_box(step.before, mesh, shape, device).num_elements()) * e;
      const std::uint64_t own = static_cast<std::uint64_t>(shard_box(step.after, mesh, shape, device).num_elements()) * e;
      b.sent = in - own;
      b.received = own * (n - 1);
      return b;
    }
    case ReshardStepKind::all_gather:
    case ReshardStepKind::exchange: {
      const int n = mesh.group_size(step.group);
      for (int i = 0; i < n; ++i) {
        const int peer = mesh.group_member(device, step.group, i);
        if (peer == device) continue;
        b.sent += static_cast<std::uint64_t>(exchange_box(step.before, step.after, mesh, shape, step.group, device, peer).num_elements()) * e;
        b.received += static_cast<std::uint64_t>(exchange_box(step.before, step.after, mesh, shape, step.group, peer, device).num_elements()) * e;
      }
      if (step.kind == ReshardStepKind::all_gather) {  // all_gather sends its block to every peer
        const std::uint64_t own = static_cast<std::uint64_t>(shard_box(step.before, mesh, shape, device).num_elements()) * e;
        b.sent = own * static_cast<std::uint64_t>(n - 1);
      }
      return b;
    }
  }
  return b;
}

/// The schedule as text, with the bytes `device` moves in each step:
/// ```
/// reshard Spec<"x", none> -> Spec<none, none> on mesh {x: 4}, shape [8, 3]:
///   1. all_gather over {x}: Spec<"x", none> -> Spec<none, none>; device 0 sends 18 B, receives 54 B
/// ```
constexpr std::string describe(const ReshardSchedule& s, const MeshShape& mesh, detail::ArrayRef<std::int64_t> shape,
                               int device, std::size_t element_size) {
  std::string shape_text = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) shape_text += (d ? ", " : "") + detail::to_text(shape[d]);
  shape_text += "]";
  std::string out = "reshard " + to_spec(s.plan.from, mesh).to_string() + " -> " + to_spec(s.plan.to, mesh).to_string() +
                    " on mesh " + mesh.to_string() + ", shape " + shape_text + ":";
  if (s.num_steps == 0) return out + " nothing to do\n";
  out += "\n";
  for (int i = 0; i < s.num_steps; ++i) {
    const ReshardStep& st = s.steps[static_cast<std::size_t>(i)];
    std::string group;
    for (int k = 0; k < st.group.size(); ++k) group += (k ? ", " : "") + mesh.name(st.group[k]).str();
    const StepBytes b = step_bytes(st, mesh, shape, device, element_size);
    out += "  " + detail::to_text(i + 1) + ". " + std::string(collective_name(st));
    if (!st.group.empty()) out += " over {" + group + "}";
    out += ": " + to_spec(st.before, mesh).to_string() + " -> " + to_spec(st.after, mesh).to_string() + "; device " +
           detail::to_text(device) + " sends " + detail::to_text(b.sent) + " B, receives " + detail::to_text(b.received) +
           " B\n";
  }
  return out;
}

}  // namespace shardlib
