// SPDX-License-Identifier: Apache-2.0
/// @file
/// Ring attention (Liu et al. 2023; the blockwise form of flash attention, passed around a ring):
/// the context-parallel form of `sl::attention` that `AttentionOptions::context =
/// ContextParallel::ring` selects when q's sequence is split. Each device keeps its block of
/// queries and of the output; the blocks of keys and values travel around the ring of the
/// sequence's axes (p - 1 permutes of k and of v, each to the next device of the ring, started
/// before the block in hand is computed and completed after it: the mpi backend leaves them to
/// MPI meanwhile), and each device folds every block into an online softmax (a running maximum, sum and output per query:
/// kernels/attention_rows.hpp) with two GEMMs per block. It keeps the rows' log-sum-exp, so its
/// backward recomputes each block's probabilities: the ring again, k and v travelling with their
/// gradients' partial sums (p - 1 permutes of k and v, p of dk and dv, the last bringing each
/// home). The scores live one tile at a time, [batch, heads, t, t] per device with t at most S/p
/// (attention_block: 16 MiB of them unless AttentionOptions::block says) — the memory the
/// all-to-all form's unfused kernel spends on [batch, heads / p, S, S]. A ring of one device is
/// the host's fused kernel (AttentionKernel::fused): flash attention's blockwise form, the tiles of
/// one device's scores folded into the same online softmax.
///
/// Under `causal` a block of keys that lies wholly after the queries is not computed (it still
/// travels on). With the sequence cut in order (`ContextParallel::ring`) the last device then
/// computes p blocks and the first one. `ContextParallel::ring_zigzag` balances it (the zig-zag
/// order of Megatron-LM's context parallelism and ring-flash-attention): the sequence is cut into
/// 2p runs and ring rank j holds runs j and 2p - 1 - j, an early one and a late one, so that every
/// device computes the same number of (run, run) blocks. The operands keep their in-order layout
/// outside the op: q, k and v (and, backward, the output and its gradient) are moved into the
/// zig-zag runs on entry and the results moved back on exit, each by two exchanges over the ring's
/// group (one per run), which send (p - 1)/p of a block on average. Uneven blocks (a sequence that
/// the ring does not divide) are exchanged at their sizes.
///
/// Accumulation: the output and the softmax state in float (16-bit types) or T; the gradients'
/// partial sums in T (GEMMs accumulating into them). GEMMs: the host BLAS (float, double) or
/// cuBLAS in GPU memory.
#pragma once

#include <shardlib/autodiff.hpp>
#include <shardlib/kernels/attention_rows.hpp>
#include <shardlib/kernels/gemm.hpp>
#include <shardlib/sharding/attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib::detail {

/// C = A B (+ C when `accumulate`) over a batch, on blocks in `Mem`: the host GEMM (float and
/// double) or cuBLAS.
template <class T, class Mem>
void ring_gemm(Context& ctx, std::int64_t batch, const kernels::MatrixBatch<const T>& a, const kernels::MatrixBatch<const T>& b,
               const kernels::MatrixBatch<T>& c, bool accumulate) {
  if constexpr (host_memory_v<Mem>) {
    if constexpr (std::is_arithmetic_v<T>) {
      kernels::gemm<Kokkos::DefaultHostExecutionSpace, T>(ctx.exec_for<Mem>(), batch, a, b, c, T(1), accumulate ? T(1) : T(0));
    } else {
      (void)ctx, (void)batch, (void)a, (void)b, (void)c, (void)accumulate;
      throw std::invalid_argument(std::string("shardlib: attention: ring attention on the host takes float or double, not ") +
                                  element_name<T>() + " (ContextParallel::all_to_all takes it)");
    }
  } else {
    device_gemm<T, Mem>(ctx, batch, a, b, c, accumulate);
  }
}

/// One step of the ring: `send` (send_count elements) to group rank `dest` of the ring (the
/// group of `axes` on `mesh`), `recv` (recv_count) from rank `source`. In host memory on the host
/// group; in device memory on the device group where the backend has one (nccl), else through
/// host buffers.
template <class Mem, class T>
void ring_pass(Context& ctx, const MeshShape& mesh, const AxisList& axes, const T* send, std::int64_t send_count, int dest,
               T* recv, std::int64_t recv_count, int source) {
  const coll::DType dt = coll::dtype_of<T>();
  const auto ns = static_cast<std::size_t>(send_count), nr = static_cast<std::size_t>(recv_count);
  if (host_memory_v<Mem> || reshards_on_device<Mem>(ctx)) {
    coll::Communicator& g = host_memory_v<Mem> ? ctx.group(mesh, axes) : ctx.device_group(mesh, axes);
    g.permute(send, ns, dest, recv, nr, source, dt);
    return;
  }
  auto& host_cache = block_cache<Kokkos::HostSpace>(ctx);
  const std::shared_ptr<void> hs = host_cache.allocate(std::max<std::size_t>(ns, 1) * sizeof(T));
  const std::shared_ptr<void> hr = host_cache.allocate(std::max<std::size_t>(nr, 1) * sizeof(T));
  download<Mem>(ctx, send, static_cast<T*>(hs.get()), send_count);
  ctx.group(mesh, axes).permute(hs.get(), ns, dest, hr.get(), nr, source, dt);
  upload<Mem>(ctx, static_cast<const T*>(hr.get()), recv, recv_count);
}

/// A ring pass in flight: the block to the next device of the ring, the previous one's arriving,
/// while this device computes. On the host group it is an exchange started (one region each way,
/// counted as a permute) and completed by wait(): the mpi backend leaves it in flight (MPI_Isend
/// and MPI_Irecv), the threads backend completes it at once (its devices copy from each other's
/// memory themselves). In device memory the pass runs at once (nccl orders it on the device's
/// stream; elsewhere it goes through host buffers).
struct RingFlight {
  std::vector<coll::Region> send, recv;  // (alive while in flight)
  std::unique_ptr<coll::PendingExchange> pending;
  void wait() {
    if (pending) pending->wait(), pending.reset();
  }
};

/// The runs of the sequence one ring rank holds, in the order its ring buffers store them: one
/// (its block, in order) or two (zig-zag); each run a [batch, size, heads, d] array, the second
/// after the first.
struct RingRuns {
  int n = 0;
  BlockRange run[2];
  /// The positions held, over the runs.
  std::int64_t rows() const { return n == 2 ? run[0].size + run[1].size : n == 1 ? run[0].size : 0; }
  /// The positions stored before run c (its row in a buffer of these runs, per batch index).
  std::int64_t before(int c) const { return c == 0 ? 0 : run[0].size; }
};

/// The part of the sequence's [a.offset, a.offset + a.size) inside b's.
inline BlockRange overlap(const BlockRange& a, const BlockRange& b) {
  const std::int64_t lo = std::max(a.offset, b.offset), hi = std::min(a.offset + a.size, b.offset + b.size);
  return {lo, std::max<std::int64_t>(hi - lo, 0)};
}

/// The geometry of a ring: the devices of the sequence's axes, this one's rank among them, the
/// local batch, heads and head dims, the lengths of the queries' and keys' sequences, and the runs
/// of them each rank holds (in order, or zig-zag).
struct RingShape {
  MeshShape mesh;
  AxisList axes;
  int p = 1, rank = 0;
  std::int64_t batch = 0, heads = 0, dk = 0, dv = 0;
  std::int64_t all_queries = 0, all_keys = 0;
  bool causal = false, zigzag = false;
  /// The most queries and keys of a tile: each (run, run) block is computed in tiles of at most
  /// block x block scores (attention_block).
  std::int64_t block = 1;

  /// The runs of a sequence of n positions that ring rank j holds: its block of the in-order cut,
  /// or (zig-zag) runs j and 2p - 1 - j of the sequence cut into 2p.
  RingRuns runs(std::int64_t n, int j) const {
    j = ((j % p) + p) % p;
    if (!zigzag) return {1, {block_of(n, p, j), {}}};
    return {2, {block_of(n, 2 * p, j), block_of(n, 2 * p, 2 * p - 1 - j)}};
  }
  /// This device's queries.
  RingRuns queries() const { return runs(all_queries, rank); }
  /// The keys ring rank j holds.
  RingRuns keys_of(int j) const { return runs(all_keys, j); }
  /// The keys this device holds at step s (they came from rank - s).
  RingRuns keys_at(int s) const { return keys_of(rank - s); }
  /// The most keys a rank holds.
  std::int64_t max_keys() const {
    std::int64_t m = 0;
    for (int j = 0; j < p; ++j) m = std::max(m, keys_of(j).rows());
    return m;
  }
  /// The longest run of a sequence of n positions (torch.chunk: the first is the largest).
  std::int64_t max_run(std::int64_t n) const { return block_of(n, zigzag ? 2 * p : p, 0).size; }
  /// The longest tile of a sequence of n positions.
  std::int64_t max_tile(std::int64_t n) const { return std::min(block, max_run(n)); }
  /// The attention of one tile of queries on one tile of keys (global positions).
  kernels::AttentionBlock tile(const BlockRange& qs, const BlockRange& ks) const {
    return {batch, heads, qs.size, ks.size, qs.offset, ks.offset, all_keys, causal};
  }
  /// f(a, first, n) for each tile [first, first + n) of each run a of `held` (first counted from
  /// the run's start).
  template <class F>
  void for_each_query_tile(const RingRuns& held, F&& f) const {
    if (batch == 0 || heads == 0) return;  // no matrices: the blocks have no storage (null) to offset
    for (int a = 0; a < held.n; ++a)
      for (std::int64_t first = 0; first < held.run[a].size; first += block) f(a, first, std::min(block, held.run[a].size - first));
  }
  /// f(a, qfirst, c, kfirst, tile) for each tile of queries of `qr`'s run a against each tile of
  /// keys of `kr`'s run c that some query sees (under `causal` the tiles wholly after the queries
  /// are skipped).
  template <class F>
  void for_each_tile(const RingRuns& qr, const RingRuns& kr, F&& f) const {
    for_each_query_tile(qr, [&](int a, std::int64_t qf, std::int64_t nq) {
      for (int c = 0; c < kr.n; ++c)
        for (std::int64_t kf = 0; kf < kr.run[c].size; kf += block) {
          const kernels::AttentionBlock t =
              tile({qr.run[a].offset + qf, nq}, {kr.run[c].offset + kf, std::min(block, kr.run[c].size - kf)});
          if (!t.hidden()) f(a, qf, c, kf, t);
        }
    });
  }
  /// Calls f(b) for each batch index b: f runs the products of one sequence of a tile. On shapes
  /// alone (shape_only()) it calls f(0) only and counts what it counted (kernels::flop_count)
  /// `batch` times, as the loop would: a plan of thousands of sequences on a device spends no
  /// host time per sequence and tile.
  template <class F>
  void for_each_batch(F&& f) const {
    if (!shardlib::shape_only() || batch <= 1) {
      for (std::int64_t b = 0; b < batch; ++b) f(b);
      return;
    }
    const kernels::FlopCount before = kernels::flop_count();
    f(std::int64_t{0});
    kernels::FlopCount& now = kernels::flop_count();
    now.add(now - before, static_cast<std::uint64_t>(batch - 1));
  }
  int next() const { return (rank + 1) % p; }
  int previous() const { return (rank + p - 1) % p; }

  /// Run c of a ring buffer of `held` runs whose rows are `d` wide per head.
  template <class T>
  T* run_of(T* data, const RingRuns& held, int c, std::int64_t d) const {
    return data + batch * held.before(c) * heads * d;
  }
  /// A [batch, seq, heads, d] run's matrices of batch index b, one per head: rows seq, cols d.
  template <class T>
  kernels::MatrixBatch<T> rows_of(T* data, std::int64_t b, std::int64_t seq, std::int64_t d) const {
    return {data + b * seq * heads * d, seq, d, heads * d, 1, d};
  }
  /// Rows [first, first + n) of a [batch, seq, heads, d] run's matrices of batch index b.
  template <class T>
  kernels::MatrixBatch<T> rows_in(T* data, std::int64_t b, std::int64_t seq, std::int64_t first, std::int64_t n,
                                  std::int64_t d) const {
    return {data + (b * seq + first) * heads * d, n, d, heads * d, 1, d};
  }
  /// A [batch, heads, queries, keys] block of scores' matrices of batch index b.
  template <class T>
  kernels::MatrixBatch<T> scores_of(T* data, std::int64_t b, std::int64_t queries, std::int64_t keys) const {
    return {data + b * heads * queries * keys, queries, keys, keys, 1, queries * keys};
  }
};

/// The bytes of scores a tile of the blockwise kernels holds, by default (attention_block).
inline constexpr double attention_tile_bytes = 16.0 * 1024 * 1024;

/// The side of the tiles of scores the blockwise kernels compute at a time: `requested` when it is
/// positive, else the most whose [batch, heads, tile, tile] block of `element` bytes fits in 16 MiB
/// (at least 64): the scores' memory bounded whatever the sequence, the GEMMs still large.
inline std::int64_t attention_block(std::int64_t requested, std::int64_t batch, std::int64_t heads, std::size_t element) {
  if (requested > 0) return requested;
  const double per = static_cast<double>(std::max<std::int64_t>(batch * heads, 1)) * static_cast<double>(element);
  return std::max<std::int64_t>(static_cast<std::int64_t>(std::sqrt(attention_tile_bytes / per)), 64);
}

template <class QT>
RingShape ring_shape(const QT& q, const QT& k, const QT& v, const AxisList& axes, bool causal, bool zigzag,
                     std::int64_t block) {
  RingShape r;
  r.mesh = q.mesh().shape();
  r.axes = axes;
  const int device = q.context().device();
  r.p = r.mesh.group_size(axes);
  r.rank = r.mesh.group_rank(device, axes);
  const ShardBox& qb = q.block();
  r.batch = qb.extent[0], r.heads = qb.extent[2];
  r.dk = qb.extent[3], r.dv = v.block().extent[3];
  r.all_queries = q.shape()[1], r.all_keys = k.shape()[1];
  r.causal = causal;
  r.zigzag = zigzag && r.p > 1;  // (a ring of one: the in-order run is the whole sequence)
  r.block = attention_block(block, r.batch, r.heads, sizeof(typename QT::value_type));
  return r;
}

/// Starts a ring pass (see RingFlight): `send` (send_count elements) to the next device,
/// `recv` (recv_count) from the previous one.
template <class Mem, class T>
std::unique_ptr<RingFlight> ring_start(Context& ctx, const RingShape& r, const T* send, std::int64_t send_count, T* recv,
                                       std::int64_t recv_count) {
  auto f = std::make_unique<RingFlight>();
  if constexpr (!host_memory_v<Mem>) {
    ring_pass<Mem>(ctx, r.mesh, r.axes, send, send_count, r.next(), recv, recv_count, r.previous());
  } else {
    f->send.assign(static_cast<std::size_t>(r.p), coll::Region{});
    f->recv.assign(static_cast<std::size_t>(r.p), coll::Region{});
    f->send[static_cast<std::size_t>(r.next())] = coll::Region::contiguous(0, static_cast<std::size_t>(send_count));
    f->recv[static_cast<std::size_t>(r.previous())] = coll::Region::contiguous(0, static_cast<std::size_t>(recv_count));
    f->pending = ctx.group(r.mesh, r.axes).start_exchange(send, f->send, recv, f->recv, coll::dtype_of<T>(), coll::Kind::permute);
  }
  return f;
}

/// Moves a block of the in-order cut of a sequence of n positions ([batch, S/p, heads, d] on each
/// ring rank) into the zig-zag runs of the ring (`to_runs`; this rank's runs one after the other),
/// or back: two exchanges over the ring's group, one per run.
template <class Mem, class T>
void zigzag_move(Context& ctx, const RingShape& r, std::int64_t n, std::int64_t d, const T* from, T* to, bool to_runs) {
  RingShape in_order = r;
  in_order.zigzag = false;
  const auto width = static_cast<std::size_t>(r.heads * d), batch = static_cast<std::size_t>(r.batch);
  const RingRuns mine = r.runs(n, r.rank);
  const BlockRange own = in_order.runs(n, r.rank).run[0];
  // The region of a buffer that holds positions `seg` of `run`, a [batch, run.size, heads * d]
  // array at row `before` (per batch index) of its buffer.
  auto region = [&](const BlockRange& seg, const BlockRange& run, std::int64_t before) {
    if (seg.size == 0) return coll::Region{};
    return coll::Region::strided((batch * static_cast<std::size_t>(before) + static_cast<std::size_t>(seg.offset - run.offset)) * width,
                                 {batch, static_cast<std::size_t>(seg.size), width},
                                 {static_cast<std::size_t>(run.size) * width, width, 1});
  };
  std::vector<coll::Region> in_order_side(static_cast<std::size_t>(r.p)), runs_side(static_cast<std::size_t>(r.p));
  for (int c = 0; c < 2; ++c) {
    for (int j = 0; j < r.p; ++j) {
      // This rank's in-order block against rank j's run c; rank j's in-order block against this rank's run c.
      in_order_side[static_cast<std::size_t>(j)] = region(overlap(own, r.runs(n, j).run[c]), own, 0);
      runs_side[static_cast<std::size_t>(j)] = region(overlap(in_order.runs(n, j).run[0], mine.run[c]), mine.run[c], mine.before(c));
    }
    const std::int64_t n_in_order = r.batch * own.size * r.heads * d, n_runs = r.batch * mine.rows() * r.heads * d;
    if (to_runs) exchange_in<Mem>(ctx, &r.mesh, r.axes, from, n_in_order, in_order_side, to, n_runs, runs_side);
    else exchange_in<Mem>(ctx, &r.mesh, r.axes, from, n_runs, runs_side, to, n_in_order, in_order_side);
  }
}

/// A buffer of `n` (at least one) elements of `size` bytes from this device's block cache in `Mem`.
template <class Mem>
std::shared_ptr<void> ring_buffer(Context& ctx, std::int64_t n, std::size_t size) {
  return block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * size);
}

/// An operand in the ring's layout: the local block itself (in order), or its copy moved into the
/// zig-zag runs (held by `keep`).
template <class Mem, class T>
const T* ring_operand(Context& ctx, const RingShape& r, std::int64_t n, std::int64_t d, const T* local, std::shared_ptr<void>& keep) {
  if (!r.zigzag) return local;
  keep = ring_buffer<Mem>(ctx, r.batch * r.runs(n, r.rank).rows() * r.heads * d, sizeof(T));
  zigzag_move<Mem>(ctx, r, n, d, local, static_cast<T*>(keep.get()), true);
  return static_cast<const T*>(keep.get());
}

/// Ring attention's forward on the local blocks (see the file comment): writes o, returns the
/// rows' log-sum-exp (compute_t<T>, [batch, heads, tile] per tile of this device's queries, the
/// tiles of each run one after the other) for the backward. q, k, v and o are the local blocks
/// ([batch, seq, heads, d]), `mask` null or the replicated [all queries, all keys] mask.
template <class T, class Mem>
std::shared_ptr<void> ring_attention_forward(Context& ctx, const RingShape& r, const T* q, const T* k, const T* v,
                                             const T* mask, double scale, T* o) {
  using A = compute_t<T>;
  const auto& exec = ctx.exec_for<Mem>();
  auto alloc = [&ctx](std::int64_t n, std::size_t size) { return ring_buffer<Mem>(ctx, n, size); };
  const RingRuns qr = r.queries();
  const std::int64_t rows = r.batch * r.heads * qr.rows(), out_n = r.batch * qr.rows() * r.heads * r.dv;
  const std::int64_t kmax = r.max_keys(), qtile = r.max_tile(r.all_queries), ktile = r.max_tile(r.all_keys);
  std::shared_ptr<void> qz, kz, vz;
  const T* qd = ring_operand<Mem>(ctx, r, r.all_queries, r.dk, q, qz);
  const T* kc = ring_operand<Mem>(ctx, r, r.all_keys, r.dk, k, kz);
  const T* vc = ring_operand<Mem>(ctx, r, r.all_keys, r.dv, v, vz);
  std::shared_ptr<void> kbuf[2], vbuf[2];
  if (r.p > 1)
    for (int i = 0; i < 2; ++i)
      kbuf[i] = alloc(r.batch * kmax * r.heads * r.dk, sizeof(T)), vbuf[i] = alloc(r.batch * kmax * r.heads * r.dv, sizeof(T));
  const auto scores = alloc(r.batch * r.heads * qtile * ktile, sizeof(T)), pv = alloc(r.batch * qtile * r.heads * r.dv, sizeof(T));
  const auto acc = alloc(out_n, sizeof(A)), l = alloc(rows, sizeof(A)), alpha = alloc(rows, sizeof(A));
  std::shared_ptr<void> lse = alloc(rows, sizeof(A));  // the running maximum, then the lse
  const std::shared_ptr<void> oz = r.zigzag ? alloc(out_n, sizeof(T)) : nullptr;
  T* const od = r.zigzag ? static_cast<T*>(oz.get()) : o;
  T* const s = static_cast<T*>(scores.get());
  A* const accd = static_cast<A*>(acc.get());
  // The softmax state (m, l, alpha: [batch, heads, tile]) of the tile of run a that starts at its
  // query `first`.
  auto state = [&](const std::shared_ptr<void>& buf, int a, std::int64_t first) {
    return static_cast<A*>(buf.get()) + r.batch * r.heads * (qr.before(a) + first);
  };
  {
    auto guard = kernel_guard_for<Mem>(ctx, false);
    kernels::attention_start(exec, accd, out_n, static_cast<A*>(lse.get()), static_cast<A*>(l.get()), rows);
  }
  for (int step = 0; step < r.p; ++step) {
    const RingRuns kr = r.keys_at(step);
    // The next block travels from the previous device while this one's attention runs.
    std::unique_ptr<RingFlight> kf, vf;
    T* kn = r.p > 1 ? static_cast<T*>(kbuf[step % 2].get()) : nullptr;
    T* vn = r.p > 1 ? static_cast<T*>(vbuf[step % 2].get()) : nullptr;
    if (step + 1 < r.p) {
      const std::int64_t now = r.batch * kr.rows() * r.heads, next = r.batch * r.keys_at(step + 1).rows() * r.heads;
      kf = ring_start<Mem>(ctx, r, kc, now * r.dk, kn, next * r.dk);
      vf = ring_start<Mem>(ctx, r, vc, now * r.dv, vn, next * r.dv);
    }
    r.for_each_tile(qr, kr, [&](int a, std::int64_t qf, int c, std::int64_t kf0, const kernels::AttentionBlock& blk) {
      const std::int64_t nq = blk.queries, nk = blk.keys, qs = qr.run[a].size, ks = kr.run[c].size;
      const T* qa = r.run_of(qd, qr, a, r.dk);
      const T* kb = r.run_of(kc, kr, c, r.dk);
      const T* vb = r.run_of(vc, kr, c, r.dv);
      r.for_each_batch([&](std::int64_t b) {  // s = q k^T, one product per head
        ring_gemm<T, Mem>(ctx, r.heads, r.rows_in(qa, b, qs, qf, nq, r.dk), r.rows_in(kb, b, ks, kf0, nk, r.dk).transposed(),
                          r.scores_of(s, b, nq, nk), false);
      });
      {
        auto guard = kernel_guard_for<Mem>(ctx, false);
        kernels::attention_online_softmax(exec, s, mask, state(lse, a, qf), state(l, a, qf), state(alpha, a, qf), blk,
                                          static_cast<A>(scale));
      }
      r.for_each_batch([&](std::int64_t b) {  // pv = p v
        ring_gemm<T, Mem>(ctx, r.heads, r.scores_of(static_cast<const T*>(s), b, nq, nk), r.rows_in(vb, b, ks, kf0, nk, r.dv),
                          r.rows_of(static_cast<T*>(pv.get()), b, nq, r.dv), false);
      });
      auto guard = kernel_guard_for<Mem>(ctx, false);
      kernels::attention_merge(exec, r.run_of(accd, qr, a, r.dv) + qf * r.heads * r.dv, static_cast<const T*>(pv.get()),
                               static_cast<const A*>(state(alpha, a, qf)), r.batch, nq, qs, r.heads, r.dv);
    });
    if (kf) {  // the next block has arrived
      kf->wait(), vf->wait();
      kc = kn, vc = vn;
    }
  }
  {
    auto guard = kernel_guard_for<Mem>(ctx, false);
    r.for_each_query_tile(qr, [&](int a, std::int64_t qf, std::int64_t nq) {
      const std::int64_t at = qf * r.heads * r.dv;
      kernels::attention_finish(exec, r.run_of(od, qr, a, r.dv) + at, r.run_of(static_cast<const A*>(accd), qr, a, r.dv) + at,
                                state(lse, a, qf), static_cast<const A*>(state(l, a, qf)), r.batch, nq, qr.run[a].size, r.heads,
                                r.dv);
    });
  }
  if (r.zigzag) zigzag_move<Mem>(ctx, r, r.all_queries, r.dv, static_cast<const T*>(od), o, false);
  return lse;
}

/// Ring attention's backward on the local blocks: dq, dk, dv from the output's gradient `g`, the
/// output and the forward's log-sum-exp (see the file comment; the blocks as the forward's).
template <class T, class Mem>
void ring_attention_backward(Context& ctx, const RingShape& r, const T* q, const T* k, const T* v, const T* mask,
                             double scale, const T* o, const T* g, const void* lse_block, T* dq, T* dk, T* dv) {
  using A = compute_t<T>;
  const auto& exec = ctx.exec_for<Mem>();
  auto alloc = [&ctx](std::int64_t n, std::size_t size) { return ring_buffer<Mem>(ctx, n, size); };
  const RingRuns qr = r.queries(), own = r.keys_of(r.rank);
  const std::int64_t rows = r.batch * r.heads * qr.rows(), kmax = r.max_keys();
  const std::int64_t qtile = r.max_tile(r.all_queries), ktile = r.max_tile(r.all_keys);
  const std::int64_t kn_max = r.batch * kmax * r.heads * r.dk, vn_max = r.batch * kmax * r.heads * r.dv;
  std::shared_ptr<void> qz, kz, vz, oz, gz;
  const T* qd = ring_operand<Mem>(ctx, r, r.all_queries, r.dk, q, qz);
  const T* kc = ring_operand<Mem>(ctx, r, r.all_keys, r.dk, k, kz);
  const T* vc = ring_operand<Mem>(ctx, r, r.all_keys, r.dv, v, vz);
  const T* od = ring_operand<Mem>(ctx, r, r.all_queries, r.dv, o, oz);
  const T* gd = ring_operand<Mem>(ctx, r, r.all_queries, r.dv, g, gz);
  std::shared_ptr<void> kbuf[2], vbuf[2], dkbuf[2], dvbuf[2];
  if (r.p > 1)
    for (int i = 0; i < 2; ++i)
      kbuf[i] = alloc(kn_max, sizeof(T)), vbuf[i] = alloc(vn_max, sizeof(T)), dkbuf[i] = alloc(kn_max, sizeof(T)),
      dvbuf[i] = alloc(vn_max, sizeof(T));
  const auto pbuf = alloc(r.batch * r.heads * qtile * ktile, sizeof(T)), dpbuf = alloc(r.batch * r.heads * qtile * ktile, sizeof(T));
  const auto delta = alloc(rows, sizeof(A));
  // The results in the ring's layout: dq, and the home blocks dk and dv arrive at (zig-zag: moved
  // back to the in-order blocks at the end).
  std::shared_ptr<void> dqz, dkz, dvz;
  if (r.zigzag)
    dqz = alloc(r.batch * qr.rows() * r.heads * r.dk, sizeof(T)), dkz = alloc(r.batch * own.rows() * r.heads * r.dk, sizeof(T)),
    dvz = alloc(r.batch * own.rows() * r.heads * r.dv, sizeof(T));
  T* const dqd = r.zigzag ? static_cast<T*>(dqz.get()) : dq;
  T* const dk_home = r.zigzag ? static_cast<T*>(dkz.get()) : dk;
  T* const dv_home = r.zigzag ? static_cast<T*>(dvz.get()) : dv;
  T* const p = static_cast<T*>(pbuf.get());
  T* const dp = static_cast<T*>(dpbuf.get());
  // The row state of the tile of run a that starts at its query `first` (as the forward's).
  auto row_state = [&](auto* base, int a, std::int64_t first) { return base + r.batch * r.heads * (qr.before(a) + first); };
  const A* const lse = static_cast<const A*>(lse_block);
  A* const deltad = static_cast<A*>(delta.get());
  // With one device in the ring, the travelling sums are dk and dv themselves.
  T* dkc = r.p == 1 ? dk_home : static_cast<T*>(dkbuf[0].get());
  T* dvc = r.p == 1 ? dv_home : static_cast<T*>(dvbuf[0].get());
  {
    auto guard = kernel_guard_for<Mem>(ctx, false);
    kernels::attention_fill(exec, dqd, r.batch * qr.rows() * r.heads * r.dk, T(0));
    kernels::attention_fill(exec, dkc, r.batch * own.rows() * r.heads * r.dk, T(0));
    kernels::attention_fill(exec, dvc, r.batch * own.rows() * r.heads * r.dv, T(0));
    r.for_each_query_tile(qr, [&](int a, std::int64_t qf, std::int64_t nq) {
      const std::int64_t at = qf * r.heads * r.dv;
      kernels::attention_delta(exec, row_state(deltad, a, qf), r.run_of(gd, qr, a, r.dv) + at, r.run_of(od, qr, a, r.dv) + at,
                               r.batch, nq, qr.run[a].size, r.heads, r.dv);
    });
  }
  for (int step = 0; step < r.p; ++step) {
    const RingRuns kr = r.keys_at(step);
    // k and v move on to the next device (not after the last step) while this step runs; dk and
    // dv after it, with this step's sums in them, the last pass bringing each block's sums home.
    const std::int64_t now = r.batch * kr.rows() * r.heads, next = r.batch * r.keys_at(step + 1).rows() * r.heads;
    const bool last = step + 1 == r.p;
    std::unique_ptr<RingFlight> kf, vf;
    T* kn = r.p > 1 ? static_cast<T*>(kbuf[step % 2].get()) : nullptr;
    T* vn = r.p > 1 ? static_cast<T*>(vbuf[step % 2].get()) : nullptr;
    if (r.p > 1 && !last) {
      kf = ring_start<Mem>(ctx, r, kc, now * r.dk, kn, next * r.dk);
      vf = ring_start<Mem>(ctx, r, vc, now * r.dv, vn, next * r.dv);
    }
    r.for_each_tile(qr, kr, [&](int a, std::int64_t qf, int c, std::int64_t kf0, const kernels::AttentionBlock& blk) {
      const std::int64_t nq = blk.queries, nk = blk.keys, qs = qr.run[a].size, ks = kr.run[c].size;
      const T* qa = r.run_of(qd, qr, a, r.dk);
      const T* ga = r.run_of(gd, qr, a, r.dv);
      T* dqa = r.run_of(dqd, qr, a, r.dk);
      const T* kb = r.run_of(kc, kr, c, r.dk);
      const T* vb = r.run_of(vc, kr, c, r.dv);
      T* dkb = r.run_of(dkc, kr, c, r.dk);
      T* dvb = r.run_of(dvc, kr, c, r.dv);
      r.for_each_batch([&](std::int64_t b) {  // s = q k^T
        ring_gemm<T, Mem>(ctx, r.heads, r.rows_in(qa, b, qs, qf, nq, r.dk), r.rows_in(kb, b, ks, kf0, nk, r.dk).transposed(),
                          r.scores_of(p, b, nq, nk), false);
      });
      {
        auto guard = kernel_guard_for<Mem>(ctx, false);
        kernels::attention_probabilities(exec, p, mask, row_state(lse, a, qf), blk, static_cast<A>(scale));
      }
      r.for_each_batch([&](std::int64_t b) {
        const auto pm = r.scores_of(static_cast<const T*>(p), b, nq, nk);
        // dv += p^T g;  dp = g v^T
        ring_gemm<T, Mem>(ctx, r.heads, pm.transposed(), r.rows_in(ga, b, qs, qf, nq, r.dv), r.rows_in(dvb, b, ks, kf0, nk, r.dv), true);
        ring_gemm<T, Mem>(ctx, r.heads, r.rows_in(ga, b, qs, qf, nq, r.dv), r.rows_in(vb, b, ks, kf0, nk, r.dv).transposed(),
                          r.scores_of(dp, b, nq, nk), false);
      });
      {
        auto guard = kernel_guard_for<Mem>(ctx, false);
        kernels::attention_score_gradient(exec, dp, static_cast<const T*>(p), row_state(static_cast<const A*>(deltad), a, qf), blk,
                                          static_cast<A>(scale));
      }
      r.for_each_batch([&](std::int64_t b) {
        const auto ds = r.scores_of(static_cast<const T*>(dp), b, nq, nk);
        // dq += ds k;  dk += ds^T q
        ring_gemm<T, Mem>(ctx, r.heads, ds, r.rows_in(kb, b, ks, kf0, nk, r.dk), r.rows_in(dqa, b, qs, qf, nq, r.dk), true);
        ring_gemm<T, Mem>(ctx, r.heads, ds.transposed(), r.rows_in(qa, b, qs, qf, nq, r.dk), r.rows_in(dkb, b, ks, kf0, nk, r.dk), true);
      });
    });
    if (r.p == 1) break;
    T* dkn = last ? dk_home : static_cast<T*>(dkbuf[(step + 1) % 2].get());
    T* dvn = last ? dv_home : static_cast<T*>(dvbuf[(step + 1) % 2].get());
    if (kf) {
      kf->wait(), vf->wait();
      kc = kn, vc = vn;
    }
    ring_pass<Mem>(ctx, r.mesh, r.axes, static_cast<const T*>(dkc), now * r.dk, r.next(), dkn, next * r.dk, r.previous());
    ring_pass<Mem>(ctx, r.mesh, r.axes, static_cast<const T*>(dvc), now * r.dv, r.next(), dvn, next * r.dv, r.previous());
    dkc = dkn, dvc = dvn;
  }
  if (r.zigzag) {
    zigzag_move<Mem>(ctx, r, r.all_queries, r.dk, static_cast<const T*>(dqd), dq, false);
    zigzag_move<Mem>(ctx, r, r.all_keys, r.dk, static_cast<const T*>(dk_home), dk, false);
    zigzag_move<Mem>(ctx, r, r.all_keys, r.dv, static_cast<const T*>(dv_home), dv, false);
  }
}

}  // namespace shardlib::detail
