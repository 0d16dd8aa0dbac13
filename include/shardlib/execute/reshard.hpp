// SPDX-License-Identifier: Apache-2.0
/// @file
/// Running a reshard schedule (sharding/reshard.hpp) on this device: `compile_reshard` turns the
/// schedule into what each step calls (communicators, block counts, regions), cached per
/// Context by `compiled_reshard`; `run_reshard` runs it on a block, allocating the intermediate
/// and final blocks through callbacks; `gather_block` brings a whole tensor to one device.
///
/// `run_reshard_in` runs it on a block in any memory space: blocks in device memory run on the
/// device world's communicators where the backend has them (nccl), else through host memory.
///
/// Part of the layer that executes plans (execute/): it knows blocks, collectives and Contexts,
/// not tensors; tensor.hpp and the ops call it.
#pragma once

#include <shardlib/collectives/communicator.hpp>
#include <shardlib/detail/array_ref.hpp>
#include <shardlib/detail/attributes.hpp>
#include <shardlib/detail/function_ref.hpp>
#include <shardlib/execute/block.hpp>
#include <shardlib/memory.hpp>
#include <shardlib/mesh.hpp>
#include <shardlib/runtime/runtime.hpp>
#include <shardlib/sharding/block.hpp>
#include <shardlib/sharding/reshard.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlib::detail {

/// Whether this device holds only zeros of a partial-sum tensor's value: its coordinate is not 0
/// on some of `axes` (creating a partial-sum tensor puts the value on coordinate 0).
inline bool off_first_coordinate(const MeshShape& mesh, int device, const AxisList& axes) {
  const auto c = mesh.coords(device);
  for (int a : axes)
    if (c[static_cast<std::size_t>(a)] != 0) return true;
  return false;
}

/// The global tensor of `shape` with sharding `s` (whose blocks live at `block` on each device)
/// on device `root`; an empty vector elsewhere (collective: one exchange).
template <class T>
SHARDLIB_NOINLINE std::vector<T> gather_block(Context& ctx, const MeshShape& mesh, const Sharding& s,
                                              ArrayRef<std::int64_t> shape, const T* block, int root) {
  coll::Communicator& world = ctx.world();
  const auto n = static_cast<std::size_t>(world.size());
  std::vector<coll::Region> send(n), recv(n);
  ShardBox all;
  all.rank = static_cast<int>(shape.size());
  std::int64_t size = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) size *= all.extent[d] = shape[d];
  const ShardBox mine = shard_box(s, mesh, shape, ctx.device());
  if (is_primary(s, mesh, ctx.device())) send[static_cast<std::size_t>(root)] = region_in(mine, mine);
  std::vector<T> out;
  if (ctx.device() == root) {
    out.resize(static_cast<std::size_t>(size));
    for (int d = 0; d < world.size(); ++d)
      if (is_primary(s, mesh, d)) recv[static_cast<std::size_t>(d)] = region_in(all, shard_box(s, mesh, shape, d));
  }
  world.exchange(block, send, out.data(), recv, coll::dtype_of<T>());
  return out;
}

/// A reshard schedule turned into what each step calls on this device: communicators, block
/// counts and regions, computed once per (shardings, mesh, shape) and cached in the Context, so
/// a repeated reshard costs a lookup, the collectives and the copies.
struct CompiledStep {
  ReshardStepKind kind{};
  coll::Communicator* comm = nullptr;
  ReduceOp op = ReduceOp::sum;
  ShardBox in_box, out_box;
  bool zero = false;                 // mask: this device holds zeros
  bool in_order = true;              // reduce_scatter: blocks already contiguous in group order
  bool uniform = false;              // all_gather, reduce_scatter: every block the same size (the plain call)
  bool gathers = false;              // exchange: only gathers (counted as all_gather)
  std::vector<std::size_t> counts;   // all_gather, reduce_scatter
  std::vector<ShardBox> boxes;       // reduce_scatter: each member's block, to pack
  std::vector<coll::Region> send, recv;  // exchange
};
struct CompiledReshard {
  bool on_device = false;  // the steps' communicators are the device world's groups (device memory)
  Sharding from, to;
  MeshShape mesh;
  std::vector<std::int64_t> shape;
  ReshardSchedule schedule;
  std::vector<CompiledStep> steps;
};
struct ReshardCache {
  std::vector<std::unique_ptr<CompiledReshard>> entries;  // most recent last
  static constexpr std::size_t capacity = 64;
};

inline CompiledReshard compile_reshard(Context& ctx, const MeshShape& mesh, const ReshardSchedule& sched,
                                       ArrayRef<std::int64_t> shape, bool on_device = false) {
  const int me = ctx.device();
  CompiledReshard c;
  c.on_device = on_device;
  c.from = sched.plan.from;
  c.to = sched.plan.to;
  c.mesh = mesh;
  c.shape.assign(shape.begin(), shape.end());
  c.schedule = sched;
  ShardBox cur = shard_box(sched.plan.from, mesh, shape, me);
  for (int i = 0; i < sched.num_steps; ++i) {
    const ReshardStep& st = sched.steps[static_cast<std::size_t>(i)];
    CompiledStep k;
    k.kind = st.kind;
    k.in_box = cur;
    k.out_box = shard_box(st.after, mesh, shape, me);
    k.op = st.before.op;
    const bool collective = st.kind == ReshardStepKind::all_reduce || st.kind == ReshardStepKind::all_gather ||
                            st.kind == ReshardStepKind::reduce_scatter || st.kind == ReshardStepKind::exchange;
    if (collective) k.comm = on_device ? &ctx.device_group(mesh, st.group) : &ctx.group(mesh, st.group);
    const int g = collective ? k.comm->size() : 0;
    auto member = [&](int r) { return mesh.group_member(me, st.group, r); };
    switch (st.kind) {
      case ReshardStepKind::mask:
        k.zero = st.after.op == ReduceOp::sum && off_first_coordinate(mesh, me, st.group);
        break;
      case ReshardStepKind::all_gather: {
        std::size_t total = 0;
        for (int r = 0; r < g; ++r)
          total += k.counts.emplace_back(static_cast<std::size_t>(shard_box(st.before, mesh, shape, member(r)).num_elements()));
        if (total != static_cast<std::size_t>(k.out_box.num_elements()))
          throw std::logic_error("shardlib: internal error: all_gather blocks of " + std::to_string(total) +
                                 " elements for a block of " + std::to_string(k.out_box.num_elements()));
        break;
      }
      case ReshardStepKind::reduce_scatter: {
        std::size_t at = 0;
        for (int r = 0; r < g; ++r) {
          const ShardBox b = k.boxes.emplace_back(shard_box(st.after, mesh, shape, member(r)));
          const std::size_t n = k.counts.emplace_back(static_cast<std::size_t>(b.num_elements()));
          const coll::Region reg = region_in(cur, b);
          k.in_order = k.in_order && (n == 0 || (reg.offset == at && is_contiguous(reg)));
          at += n;
        }
        break;
      }
      case ReshardStepKind::exchange:
        k.gathers = is_strided_gather(st);
        for (int r = 0; r < g; ++r) {
          const int peer = member(r);
          k.send.push_back(region_in(cur, exchange_box(st.before, st.after, mesh, shape, st.group, me, peer)));
          k.recv.push_back(region_in(k.out_box, exchange_box(st.before, st.after, mesh, shape, st.group, peer, me)));
        }
        break;
      default: break;
    }
    k.uniform = !k.counts.empty() && std::all_of(k.counts.begin(), k.counts.end(),
                                                  [&](std::size_t n) { return n == k.counts[0]; });
    c.steps.push_back(std::move(k));
    cur = c.steps.back().out_box;
  }
  return c;
}

/// Whether reshards of blocks in `Mem` run on device collectives: device memory under a backend
/// with a device world (nccl). Otherwise blocks in device memory go through host memory.
template <class Mem>
bool reshards_on_device(Context& ctx) noexcept {
  return !host_memory_v<Mem> && ctx.device_world() != nullptr;
}

/// The compiled reshard from `from` to `to` for this device, from the Context's cache (computing
/// the schedule on a miss; `plan` is the plan when the caller has it, e.g. from the types), on
/// the device world's groups when `on_device`.
inline const CompiledReshard& compiled_reshard(Context& ctx, const MeshShape& mesh, const Sharding& from,
                                               const Sharding& to, ArrayRef<std::int64_t> shape,
                                               const ReshardPlan* plan = nullptr, bool on_device = false) {
  auto& cache = ctx.state<ReshardCache>().entries;
  for (std::size_t i = cache.size(); i-- > 0;) {
    const CompiledReshard& e = *cache[i];
    if (e.on_device == on_device && e.from == from && e.to == to && e.mesh == mesh && e.shape.size() == shape.size() &&
        std::equal(e.shape.begin(), e.shape.end(), shape.begin()))
      return e;
  }
  const ReshardSchedule s = schedule_reshard(plan ? *plan : plan_reshard(from, to), mesh, shape);
  auto entry = std::make_unique<CompiledReshard>(compile_reshard(ctx, mesh, s, shape, on_device));
  entry->from = from;  // the key as asked (plan_reshard normalises the op of non-partial shardings)
  entry->to = to;
  if (cache.size() >= ReshardCache::capacity) cache.erase(cache.begin());
  cache.push_back(std::move(entry));
  return *cache.back();
}

/// Whether step `k` moves nothing between devices: a local copy or mask, or a collective over a
/// group of one device (a mesh axis of size 1: a partial sum over it is already the sum, a gather
/// over it is the block itself). run_reshard makes such collectives local copies.
inline bool step_is_local(const CompiledStep& k) noexcept {
  switch (k.kind) {
    case ReshardStepKind::local_copy:
    case ReshardStepKind::mask: return true;
    case ReshardStepKind::all_reduce:
    case ReshardStepKind::all_gather:
    case ReshardStepKind::reduce_scatter: return k.comm && k.comm->size() == 1;
    case ReshardStepKind::exchange: return false;
  }
  return false;
}

/// `n` elements from `src` to `dst`, both in `Mem` (on the device's instance there).
template <class Mem, class T>
void copy_flat(const Context& ctx, const T* src, T* dst, std::int64_t n) {
  ShardBox b;
  b.rank = 1;
  b.extent[0] = n;
  copy_box<Mem>(ctx, src, b, dst, b, b);
}

/// Runs a compiled reshard on this device: reads the block `src`, writes the new block into
/// `alloc_final(elements)` (not called when there are no steps). Intermediate blocks come from
/// `alloc(elements)` (shared_ptr<void> owners). Throws what the collectives throw; `src` is
/// never written. Compiled once per element type and memory space `Mem` of the blocks (the
/// callbacks are FunctionRefs); the communicators must take that memory.
template <class T, class Mem = Kokkos::HostSpace>
void run_reshard(const Context& ctx, const CompiledReshard& c, const T* src,
                 FunctionRef<std::shared_ptr<void>(std::size_t)> alloc,
                 std::type_identity_t<FunctionRef<T*(std::size_t)>> alloc_final) {
  const coll::DType dt = coll::dtype_of<T>();
  const T* cur = src;
  std::shared_ptr<void> keep[2];  // the last two intermediate blocks (a step reads one, writes the other)
  for (std::size_t i = 0; i < c.steps.size(); ++i) {
    const CompiledStep& k = c.steps[i];
    const auto n_out = static_cast<std::size_t>(k.out_box.num_elements());
    T* out;
    if (i + 1 == c.steps.size()) {
      out = alloc_final(n_out);
    } else {
      keep[i % 2] = alloc(n_out);
      out = static_cast<T*>(keep[i % 2].get());
    }
    const bool collective = k.kind == ReshardStepKind::all_reduce || k.kind == ReshardStepKind::all_gather ||
                            k.kind == ReshardStepKind::reduce_scatter;
    if (collective && step_is_local(k)) {  // over a group of one: the block itself
      if (k.kind == ReshardStepKind::reduce_scatter && !k.in_order) copy_box<Mem>(ctx, cur, k.in_box, out, k.boxes[0], k.boxes[0]);
      else copy_flat<Mem>(ctx, cur, out, static_cast<std::int64_t>(n_out));
      cur = out;
      continue;
    }
    switch (k.kind) {
      case ReshardStepKind::local_copy: copy_box<Mem>(ctx, cur, k.in_box, out, k.out_box, k.out_box); break;
      case ReshardStepKind::mask:
        if (k.zero) fill<Mem>(ctx, out, static_cast<std::int64_t>(n_out), T{});
        else copy_box<Mem>(ctx, cur, k.in_box, out, k.out_box, k.out_box);
        break;
      case ReshardStepKind::all_reduce: k.comm->all_reduce(cur, out, n_out, dt, k.op); break;
      case ReshardStepKind::all_gather:  // equal blocks: the plain form (MPI_Allgather, not ...v)
        if (k.uniform) k.comm->all_gather(cur, out, k.counts[0], dt);
        else k.comm->all_gather(cur, out, k.counts, dt);
        break;
      case ReshardStepKind::reduce_scatter:
        if (k.in_order && k.uniform) {
          k.comm->reduce_scatter(cur, out, k.counts[0], dt, k.op);
        } else if (k.in_order) {
          k.comm->reduce_scatter(cur, out, k.counts, dt, k.op);
        } else {  // pack the members' blocks in group order first
          std::size_t total = 0;
          for (std::size_t n : k.counts) total += n;
          std::shared_ptr<void> packed = alloc(total);
          T* p = static_cast<T*>(packed.get());
          for (std::size_t r = 0; r < k.counts.size(); ++r) {
            copy_box<Mem>(ctx, cur, k.in_box, p, k.boxes[r], k.boxes[r]);
            p += k.counts[r];
          }
          if (k.uniform) k.comm->reduce_scatter(packed.get(), out, k.counts[0], dt, k.op);
          else k.comm->reduce_scatter(packed.get(), out, k.counts, dt, k.op);
        }
        break;
      case ReshardStepKind::exchange:
        k.comm->exchange(cur, k.send, out, k.recv, dt, k.gathers ? coll::Kind::all_gather : coll::Kind::all_to_all);
        break;
    }
    cur = out;
  }
}

/// run_reshard on a block in `Mem`, the intermediate blocks from the device's block caches: in
/// host memory, and in device memory when `c` runs on the device world (`c.on_device`, compiled
/// for reshards_on_device<Mem>: the nccl backend) or moves nothing between devices (every step
/// local: step_is_local), run_reshard itself, ordered by the device's stream; otherwise, in device
/// memory, through host memory (the block is downloaded, resharded
/// by the collectives on host buffers, and the result uploaded into `alloc_final(elements)`),
/// waiting for the upload. `src` is never written.
template <class Mem, class T>
void run_reshard_in(Context& ctx, const CompiledReshard& c, const T* src,
                    std::type_identity_t<FunctionRef<T*(std::size_t)>> alloc_final) {
  // Steps that move nothing between devices run where the block is, in device memory too.
  if (host_memory_v<Mem> || c.on_device || std::all_of(c.steps.begin(), c.steps.end(), step_is_local)) {
    auto& cache = block_cache<Mem>(ctx);
    run_reshard<T, Mem>(ctx, c, src, [&](std::size_t n) { return cache.allocate(n * sizeof(T)); }, alloc_final);
  } else {
    if (c.steps.empty()) return;
    auto& host_cache = block_cache<Kokkos::HostSpace>(ctx);
    auto host_alloc = [&](std::size_t n) { return host_cache.allocate(n * sizeof(T)); };
    const std::int64_t n_in = c.steps.front().in_box.num_elements();
    std::shared_ptr<void> in = host_alloc(static_cast<std::size_t>(n_in)), out;
    download<Mem>(ctx, src, static_cast<T*>(in.get()), n_in);
    std::size_t n_out = 0;
    run_reshard<T>(ctx, c, static_cast<const T*>(in.get()), host_alloc, [&](std::size_t n) {
      out = host_alloc(n_out = n);
      return static_cast<T*>(out.get());
    });
    upload<Mem>(ctx, static_cast<const T*>(out.get()), alloc_final(n_out), static_cast<std::int64_t>(n_out));
  }
}

/// One exchange (coll::Communicator::exchange) of regions between blocks in `Mem`, over the group
/// of `axes` on `mesh` (the world when `mesh` is null): in host memory on the host group; in
/// device memory on the device world's group where the backend has one (nccl: on the device's
/// stream), else through host memory: `src` (n_src elements) and `out` (n_out elements, whose
/// cells the exchange does not write are kept) are downloaded, exchanged on host buffers, and
/// `out` uploaded, waiting for the upload. Collective over the group.
template <class Mem, class T>
void exchange_in(Context& ctx, const MeshShape* mesh, const AxisList& axes, const T* src, std::int64_t n_src,
                 const std::vector<coll::Region>& send, T* out, std::int64_t n_out, const std::vector<coll::Region>& recv) {
  const coll::DType dt = coll::dtype_of<T>();
  if (host_memory_v<Mem> || reshards_on_device<Mem>(ctx)) {
    coll::Communicator* world = host_memory_v<Mem> ? &ctx.world() : ctx.device_world();
    coll::Communicator& g = !mesh ? *world : host_memory_v<Mem> ? ctx.group(*mesh, axes) : ctx.device_group(*mesh, axes);
    g.exchange(src, send, out, recv, dt);
    return;
  }
  coll::Communicator& g = mesh ? ctx.group(*mesh, axes) : ctx.world();
  auto& host_cache = block_cache<Kokkos::HostSpace>(ctx);
  const std::shared_ptr<void> in = host_cache.allocate(static_cast<std::size_t>(n_src) * sizeof(T));
  const std::shared_ptr<void> res = host_cache.allocate(static_cast<std::size_t>(n_out) * sizeof(T));
  download<Mem>(ctx, src, static_cast<T*>(in.get()), n_src);
  download<Mem>(ctx, static_cast<const T*>(out), static_cast<T*>(res.get()), n_out);
  g.exchange(in.get(), send, res.get(), recv, dt);
  upload<Mem>(ctx, static_cast<const T*>(res.get()), out, n_out);
}

}  // namespace shardlib::detail
