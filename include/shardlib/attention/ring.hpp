// SPDX-License-Identifier: Apache-2.0
/// @file
/// Ring attention (Liu et al. 2023; the blockwise form of flash attention, passed around a ring):
/// the context-parallel form of `sl::attention` that `AttentionOptions::context =
/// ContextParallel::ring` selects when q's sequence is split. Each device keeps its block of
/// queries and of the output; the blocks of keys and values travel around the ring of the
/// sequence's axes (p - 1 permutes of k and of v, each to the next device of the ring), and each
/// device folds every block into an online softmax (a running maximum, sum and output per query:
/// kernels/attention_rows.hpp) with two GEMMs per block. It keeps the rows' log-sum-exp, so its
/// backward recomputes each block's probabilities: the ring again, k and v travelling with their
/// gradients' partial sums (p - 1 permutes of k and v, p of dk and dv, the last bringing each
/// home). The scores live one block at a time, [batch, heads, S/p, S/p] per device — the memory
/// the all-to-all form spends on [batch, heads / p, S, S].
///
/// Under `causal` a block of keys that lies wholly after this device's queries is not computed
/// (it still travels on): with the sequence cut in order, the last device computes p blocks and
/// the first one — the imbalance the striped or zig-zag orders remove, which this form does not
/// do yet. Uneven blocks (a sequence that the ring does not divide) are exchanged at their sizes.
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
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

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

/// The geometry of a ring: the devices of the sequence's axes, this one's rank among them, the
/// local batch, heads and head dims, this device's queries, and the key block each rank holds.
struct RingShape {
  MeshShape mesh;
  AxisList axes;
  int p = 1, rank = 0;
  std::int64_t batch = 0, heads = 0, dk = 0, dv = 0;
  std::int64_t queries = 0, query_offset = 0, all_keys = 0;
  bool causal = false;

  /// The key block of ring rank `j` (its offset and size in the sequence).
  BlockRange keys_of(int j) const { return block_of(all_keys, p, ((j % p) + p) % p); }
  /// The key block this device holds at step s (it came from rank - s).
  BlockRange keys_at(int s) const { return keys_of(rank - s); }
  std::int64_t max_keys() const { return keys_of(0).size; }  // torch.chunk: the first is the largest
  kernels::AttentionBlock block(int s) const {
    const BlockRange kb = keys_at(s);
    return {batch, heads, queries, kb.size, query_offset, kb.offset, all_keys, causal};
  }
  int next() const { return (rank + 1) % p; }
  int previous() const { return (rank + p - 1) % p; }

  /// A [batch, S, heads, d] block's matrices of batch index b, one per head: rows S, cols d.
  template <class T>
  kernels::MatrixBatch<T> rows_of(T* data, std::int64_t b, std::int64_t seq, std::int64_t d) const {
    return {data + b * seq * heads * d, seq, d, heads * d, 1, d};
  }
  /// A [batch, heads, queries, keys] block of scores' matrices of batch index b.
  template <class T>
  kernels::MatrixBatch<T> scores_of(T* data, std::int64_t b, std::int64_t keys) const {
    return {data + b * heads * queries * keys, queries, keys, keys, 1, queries * keys};
  }
};

template <class QT>
RingShape ring_shape(const QT& q, const QT& k, const QT& v, const AxisList& axes, bool causal) {
  RingShape r;
  r.mesh = q.mesh().shape();
  r.axes = axes;
  const int device = q.context().device();
  r.p = r.mesh.group_size(axes);
  r.rank = r.mesh.group_rank(device, axes);
  const ShardBox& qb = q.block();
  r.batch = qb.extent[0], r.queries = qb.extent[1], r.query_offset = qb.offset[1], r.heads = qb.extent[2];
  r.dk = qb.extent[3], r.dv = v.block().extent[3];
  r.all_keys = k.shape()[1];
  r.causal = causal;
  return r;
}

/// A buffer of `n` (at least one) elements of `size` bytes from this device's block cache in `Mem`.
template <class Mem>
std::shared_ptr<void> ring_buffer(Context& ctx, std::int64_t n, std::size_t size) {
  return block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * size);
}

/// Ring attention's forward on the local blocks (see the file comment): writes o, returns the
/// rows' log-sum-exp (compute_t<T>, [batch, heads, queries]) for the backward.
template <class QT, class OT>
std::shared_ptr<void> ring_attention_forward(const QT& q, const QT& k, const QT& v, const typename QT::value_type* mask,
                                             const RingShape& r, double scale, OT& o) {
  using T = typename QT::value_type;
  using A = compute_t<T>;
  using Mem = typename QT::memory_space;
  Context& ctx = q.context();
  const auto& exec = ctx.exec_for<Mem>();
  auto alloc = [&ctx](std::int64_t n, std::size_t size) { return ring_buffer<Mem>(ctx, n, size); };
  const std::int64_t rows = r.batch * r.heads * r.queries, out_n = r.batch * r.queries * r.heads * r.dv;
  const std::int64_t kmax = r.max_keys();
  std::shared_ptr<void> kbuf[2] = {alloc(r.batch * kmax * r.heads * r.dk, sizeof(T)), alloc(r.batch * kmax * r.heads * r.dk, sizeof(T))};
  std::shared_ptr<void> vbuf[2] = {alloc(r.batch * kmax * r.heads * r.dv, sizeof(T)), alloc(r.batch * kmax * r.heads * r.dv, sizeof(T))};
  const auto scores = alloc(rows * kmax, sizeof(T)), pv = alloc(out_n, sizeof(T));
  const auto acc = alloc(out_n, sizeof(A)), l = alloc(rows, sizeof(A)), alpha = alloc(rows, sizeof(A));
  std::shared_ptr<void> lse = alloc(rows, sizeof(A));  // the running maximum, then the lse
  T* const s = static_cast<T*>(scores.get());
  A* const m = static_cast<A*>(lse.get());
  {
    auto guard = kernel_guard_for<Mem>(ctx, false);
    kernels::attention_start(exec, static_cast<A*>(acc.get()), out_n, m, static_cast<A*>(l.get()), rows);
  }
  const T* kc = k.local().data();
  const T* vc = v.local().data();
  for (int step = 0; step < r.p; ++step) {
    const kernels::AttentionBlock blk = r.block(step);
    if (!blk.hidden()) {
      for (std::int64_t b = 0; b < r.batch; ++b)  // s = q k^T, one product per head
        ring_gemm<T, Mem>(ctx, r.heads, r.rows_of(q.local().data(), b, r.queries, r.dk),
                          r.rows_of(kc, b, blk.keys, r.dk).transposed(), r.scores_of(s, b, blk.keys), false);
      {
        auto guard = kernel_guard_for<Mem>(ctx, false);
        kernels::attention_online_softmax(exec, s, mask, m, static_cast<A*>(l.get()), static_cast<A*>(alpha.get()), blk,
                                          static_cast<A>(scale));
      }
      for (std::int64_t b = 0; b < r.batch; ++b)  // pv = p v
        ring_gemm<T, Mem>(ctx, r.heads, r.scores_of(static_cast<const T*>(s), b, blk.keys), r.rows_of(vc, b, blk.keys, r.dv),
                          r.rows_of(static_cast<T*>(pv.get()), b, r.queries, r.dv), false);
      auto guard = kernel_guard_for<Mem>(ctx, false);
      kernels::attention_merge(exec, static_cast<A*>(acc.get()), static_cast<const T*>(pv.get()),
                               static_cast<const A*>(alpha.get()), r.batch, r.queries, r.heads, r.dv);
    }
    if (step + 1 < r.p) {  // the next block arrives from the previous device
      const std::int64_t now = r.keys_at(step).size, next = r.keys_at(step + 1).size;
      T* kn = static_cast<T*>(kbuf[step % 2].get());
      T* vn = static_cast<T*>(vbuf[step % 2].get());
      ring_pass<Mem>(ctx, r.mesh, r.axes, kc, r.batch * now * r.heads * r.dk, r.next(), kn, r.batch * next * r.heads * r.dk, r.previous());
      ring_pass<Mem>(ctx, r.mesh, r.axes, vc, r.batch * now * r.heads * r.dv, r.next(), vn, r.batch * next * r.heads * r.dv, r.previous());
      kc = kn, vc = vn;
    }
  }
  auto guard = kernel_guard_for<Mem>(ctx, false);
  kernels::attention_finish(exec, o.local().data(), static_cast<const A*>(acc.get()), m, static_cast<const A*>(l.get()), r.batch,
                            r.queries, r.heads, r.dv);
  return lse;
}

/// Ring attention's backward on the local blocks: dq, dk, dv from the output's gradient `g`, the
/// output and the forward's log-sum-exp (see the file comment).
template <class QT>
void ring_attention_backward(const QT& q, const QT& k, const QT& v, const typename QT::value_type* mask, const RingShape& r,
                             double scale, const QT& o, const QT& g, const void* lse_block, QT& dq, QT& dk, QT& dv) {
  using T = typename QT::value_type;
  using A = compute_t<T>;
  using Mem = typename QT::memory_space;
  Context& ctx = q.context();
  const auto& exec = ctx.exec_for<Mem>();
  auto alloc = [&ctx](std::int64_t n, std::size_t size) { return ring_buffer<Mem>(ctx, n, size); };
  const std::int64_t rows = r.batch * r.heads * r.queries, kmax = r.max_keys();
  const std::int64_t kn_max = r.batch * kmax * r.heads * r.dk, vn_max = r.batch * kmax * r.heads * r.dv;
  std::shared_ptr<void> kbuf[2] = {alloc(kn_max, sizeof(T)), alloc(kn_max, sizeof(T))};
  std::shared_ptr<void> vbuf[2] = {alloc(vn_max, sizeof(T)), alloc(vn_max, sizeof(T))};
  std::shared_ptr<void> dkbuf[2] = {alloc(kn_max, sizeof(T)), alloc(kn_max, sizeof(T))};
  std::shared_ptr<void> dvbuf[2] = {alloc(vn_max, sizeof(T)), alloc(vn_max, sizeof(T))};
  const auto pbuf = alloc(rows * kmax, sizeof(T)), dpbuf = alloc(rows * kmax, sizeof(T)), delta = alloc(rows, sizeof(A));
  T* const p = static_cast<T*>(pbuf.get());
  T* const dp = static_cast<T*>(dpbuf.get());
  const A* const lse = static_cast<const A*>(lse_block);
  const std::int64_t own_k = r.batch * r.keys_of(r.rank).size * r.heads;
  // With one device in the ring, the travelling sums are dk and dv themselves.
  T* dkc = r.p == 1 ? dk.local().data() : static_cast<T*>(dkbuf[0].get());
  T* dvc = r.p == 1 ? dv.local().data() : static_cast<T*>(dvbuf[0].get());
  {
    auto guard = kernel_guard_for<Mem>(ctx, false);
    kernels::attention_fill(exec, dq.local().data(), r.batch * r.queries * r.heads * r.dk, T(0));
    kernels::attention_fill(exec, dkc, own_k * r.dk, T(0));
    kernels::attention_fill(exec, dvc, own_k * r.dv, T(0));
    kernels::attention_delta(exec, static_cast<A*>(delta.get()), g.local().data(), o.local().data(), r.batch, r.queries, r.heads, r.dv);
  }
  const T* kc = k.local().data();
  const T* vc = v.local().data();
  const T* qd = q.local().data();
  const T* gd = g.local().data();
  for (int step = 0; step < r.p; ++step) {
    const kernels::AttentionBlock blk = r.block(step);
    const std::int64_t nk = blk.keys;
    if (!blk.hidden()) {
      for (std::int64_t b = 0; b < r.batch; ++b)  // s = q k^T
        ring_gemm<T, Mem>(ctx, r.heads, r.rows_of(qd, b, r.queries, r.dk), r.rows_of(kc, b, nk, r.dk).transposed(),
                          r.scores_of(p, b, nk), false);
      {
        auto guard = kernel_guard_for<Mem>(ctx, false);
        kernels::attention_probabilities(exec, p, mask, lse, blk, static_cast<A>(scale));
      }
      for (std::int64_t b = 0; b < r.batch; ++b) {
        const auto pm = r.scores_of(static_cast<const T*>(p), b, nk);
        // dv += p^T g;  dp = g v^T
        ring_gemm<T, Mem>(ctx, r.heads, pm.transposed(), r.rows_of(gd, b, r.queries, r.dv), r.rows_of(dvc, b, nk, r.dv), true);
        ring_gemm<T, Mem>(ctx, r.heads, r.rows_of(gd, b, r.queries, r.dv), r.rows_of(vc, b, nk, r.dv).transposed(),
                          r.scores_of(dp, b, nk), false);
      }
      {
        auto guard = kernel_guard_for<Mem>(ctx, false);
        kernels::attention_score_gradient(exec, dp, static_cast<const T*>(p), static_cast<const A*>(delta.get()), blk,
                                          static_cast<A>(scale));
      }
      for (std::int64_t b = 0; b < r.batch; ++b) {
        const auto ds = r.scores_of(static_cast<const T*>(dp), b, nk);
        // dq += ds k;  dk += ds^T q
        ring_gemm<T, Mem>(ctx, r.heads, ds, r.rows_of(kc, b, nk, r.dk), r.rows_of(dq.local().data(), b, r.queries, r.dk), true);
        ring_gemm<T, Mem>(ctx, r.heads, ds.transposed(), r.rows_of(qd, b, r.queries, r.dk), r.rows_of(dkc, b, nk, r.dk), true);
      }
    }
    if (r.p == 1) break;
    // k and v move on to the next device (not after the last step); dk and dv with them, the last
    // pass bringing each block's sums home.
    const std::int64_t now = r.batch * nk * r.heads, next = r.batch * r.keys_at(step + 1).size * r.heads;
    const bool last = step + 1 == r.p;
    T* dkn = last ? dk.local().data() : static_cast<T*>(dkbuf[(step + 1) % 2].get());
    T* dvn = last ? dv.local().data() : static_cast<T*>(dvbuf[(step + 1) % 2].get());
    if (!last) {
      T* kn = static_cast<T*>(kbuf[step % 2].get());
      T* vn = static_cast<T*>(vbuf[step % 2].get());
      ring_pass<Mem>(ctx, r.mesh, r.axes, kc, now * r.dk, r.next(), kn, next * r.dk, r.previous());
      ring_pass<Mem>(ctx, r.mesh, r.axes, vc, now * r.dv, r.next(), vn, next * r.dv, r.previous());
      kc = kn, vc = vn;
    }
    ring_pass<Mem>(ctx, r.mesh, r.axes, static_cast<const T*>(dkc), now * r.dk, r.next(), dkn, next * r.dk, r.previous());
    ring_pass<Mem>(ctx, r.mesh, r.axes, static_cast<const T*>(dvc), now * r.dv, r.next(), dvn, next * r.dv, r.previous());
    dkc = dkn, dvc = dvn;
  }
}

}  // namespace shardlib::detail
