// SPDX-License-Identifier: Apache-2.0
/// @file
/// Scaled dot-product attention over sharded tensors, forward and backward:
///
/// ```
/// auto o = sl::attention(q, k, v, {.causal = true});           // q, k, v: [B, S, H, K]
/// auto o = sl::attention(q, k, v, mask, {.scale = 0.125});      // mask: [Sq, Sk], added to the scores
/// ```
///
/// `o[b, i, h, :] = sum_j softmax_j(scale q[b, i, h, :] . k[b, j, h, :] + mask[i, j]) v[b, j, h, :]`,
/// with `scale` = 1 / sqrt(K) by default, and under `causal` query i attending keys j <= i only.
/// q, k, v are [batch, sequence, heads, head dim] (JAX's layout, what `einsum<"bsd,dhk->bshk">`
/// gives the projections); k and v have one length, q and k one head dim (v's may differ: the
/// output's). Its sharding rule (sharding/attention.hpp): batch and heads stay split, partial
/// operands are reduced, the head dim is gathered; a split sequence is context parallelism in
/// DeepSpeed-Ulysses' form: q, k and v move its axes onto the heads (one all-to-all each), the
/// kernel runs on whole sequences of 1/p of the heads, and the output moves back (one more): it
/// has q's layout. No other communication.
///
/// Kernels: on a GPU, for bf16 and f16, cuDNN's fused flash attention (forward and backward, no
/// [S, S] scores in memory; kernels/cudnn_attention.hpp), when the program is built with
/// SHARDLIB_HAVE_CUDNN and cuDNN 9 loads at run time. Otherwise — on the host, in float32, or when
/// cuDNN is missing or refuses a shape (then with a one-time warning naming why) — the same
/// function from the ops: `softmax<3>(einsum(q, k) + mask / scale, scale)` then an einsum with v, whose
/// gradients are those ops' rules. On the host (float, double) `AttentionKernel::fused` runs the
/// blockwise kernel instead (attention/ring.hpp on one device: the scores a tile at a time, no
/// [S, S] of them in memory, its own backward), and so does `automatic` where the ops' scores
/// on a device would be more than one of its 16 MiB tiles. `AttentionOptions::kernel` picks one.
/// `attention_stats(ctx)` counts which ran.
///
/// Operands are tensors or Vars (then the result is a Var whose backward gives q, k and v their
/// gradients); the mask is a tensor (a constant).
#pragma once

#include <shardlib/attention/ring.hpp>
#include <shardlib/autodiff.hpp>
#include <shardlib/kernels/cudnn_attention.hpp>
#include <shardlib/sharding/attention.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace shardlib {

/// Which kernel attention() runs.
enum class AttentionKernel : std::uint8_t {
  /// Fused where cuDNN can run it (GPU, 16-bit); in host memory (float, double) fused where the
  /// ops' scores on a device would be more than one of its tiles (16 MiB: about 2k tokens for a
  /// head per device in float), else the ops.
  automatic,
  /// No [Sq, Sk] scores in memory: in GPU memory cuDNN's fused kernel (bf16, f16); in host memory
  /// (float, double) the blockwise kernel of ring attention on one device (flash attention's
  /// online softmax over tiles of the scores, its own backward recomputing them). Throws
  /// std::runtime_error where neither can run, saying why.
  fused,
  unfused,  ///< the ops: scores, softmax, a product with v
};

/// The form of context parallelism attention() takes when q's sequence is split.
enum class ContextParallel {
  /// DeepSpeed-Ulysses: the sequence's axes move onto the heads (an all-to-all per operand and
  /// one back), the kernel runs on whole sequences of 1/p of the heads. Needs heads that the
  /// axes divide to spread the work; holds [B, H/p, S, S] scores (unfused) per device.
  all_to_all,
  /// Ring attention (attention/ring.hpp): k and v travel around the ring of the sequence's
  /// axes, p - 1 permutes each, folded into an online softmax; any head count; scores held one
  /// [B, H, S/p, S/p] block at a time. Host memory: float and double.
  ring,
  /// Ring attention on the sequence in zig-zag runs (attention/ring.hpp): ring rank j works on
  /// runs j and 2p - 1 - j of the sequence cut into 2p, so that under `causal` every device
  /// computes the same share of the scores (in order, the last device computes p blocks and the
  /// first one). The operands keep their layout: q, k, v are moved into the runs on entry and the
  /// output back, two exchanges each (the backward: o, its gradient, and dq, dk, dv too).
  ring_zigzag,
};

/// Options of attention().
struct AttentionOptions {
  bool causal = false;  ///< query i attends keys j <= i only (the diagonal from the top left)
  double scale = 0;     ///< multiplies q k^T; 0: 1 / sqrt(head dim)
  AttentionKernel kernel = AttentionKernel::automatic;
  /// How a split sequence is attended over (context parallelism; no effect otherwise).
  ContextParallel context = ContextParallel::all_to_all;
  /// The blockwise kernels' tile (ring attention, the host's fused kernel): scores computed
  /// block x block at a time; 0 picks the most whose [batch, heads, block, block] scores fit in
  /// 16 MiB (at least 64). The result does not depend on it beyond round-off.
  std::int64_t block = 0;
};

/// What this device's attention calls ran, since the Context began.
struct AttentionStats {
  std::uint64_t fused_forward = 0, fused_backward = 0, unfused_forward = 0, unfused_backward = 0;
  std::uint64_t ring_forward = 0, ring_backward = 0;  ///< ring attention's (ContextParallel::ring and ring_zigzag)
  /// Why the last call that could have been fused was not ("" when none fell back).
  std::string fallback;
};
/// This device's AttentionStats.
inline AttentionStats& attention_stats(Context& ctx) { return ctx.state<AttentionStats>(); }

namespace error {
template <int Operand, class Spec>
struct attention_operand_is_not_rank_4_batch_seq_heads_head_dim;
template <class Q, class Other>
struct attention_operands_have_different_element_types;
template <class Q, class Other>
struct attention_operands_are_on_different_meshes_or_memory_spaces;
template <class MaskSpec>
struct attention_mask_is_a_rank_2_tensor_of_qs_element_type_mesh_and_memory;
}  // namespace error

namespace detail {

/// Whether attention on T in Mem can take cuDNN's fused kernel in this build.
template <class T, class Mem>
inline constexpr bool attention_fusable_v =
#if defined(SHARDLIB_HAVE_CUDNN) && defined(KOKKOS_ENABLE_CUDA)
    is_half_v<T> && !host_memory_v<Mem>;
#else
    false;
#endif

/// Whether AttentionKernel::automatic takes the host's fused kernel: where the ops' [B, H, Sq, Sk]
/// scores on a device (the kernel's layout `s`, the largest block) would be more than the
/// one tile of them the fused kernel holds (attention_tile_bytes). Up to one tile the fused kernel
/// does the ops' work and the online softmax's besides (the ops are faster); beyond, it holds a
/// tile where the ops hold them all (docs/14 has the measurements). The same on every device.
/// (Not on shapes alone, `shape_only()`: a plan keeps the ops, as for GPU devices in float.)
inline bool attention_automatic_fused(const MeshShape& mesh, const Sharding& s, std::int64_t batch, std::int64_t heads,
                                      std::int64_t sq, std::int64_t sk, std::size_t element) {
  auto largest = [&](std::int64_t n, int dim) {
    std::int64_t parts = 1;
    for (int a : s.dims[static_cast<std::size_t>(dim)]) parts *= mesh.size(a);
    return (n + parts - 1) / parts;
  };
  return static_cast<double>(largest(batch, 0)) * static_cast<double>(largest(heads, 2)) * static_cast<double>(sq) *
             static_cast<double>(sk) * static_cast<double>(element) >
         attention_tile_bytes;
}

/// Prints `why` once per process (the unfused ops run instead of cuDNN's kernel).
inline void warn_attention_fallback_once(const std::string& why) {
  static std::mutex m;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(m);
  if (said.insert(why).second)
    std::fprintf(stderr, "shardlib: attention: the unfused ops run instead of cuDNN's fused kernel: %s\n", why.c_str());
}

/// The compile-time checks of attention's operands (tensor types).
template <class Q, class K, class V>
constexpr void attention_static_checks() {
  SHARDLIB_STATIC_REQUIRE((Q::rank == 4), "shardlib: attention: q is not [batch, seq, heads, head dim]",
                          error::attention_operand_is_not_rank_4_batch_seq_heads_head_dim<0, typename Q::spec_type>);
  SHARDLIB_STATIC_REQUIRE((K::rank == 4), "shardlib: attention: k is not [batch, seq, heads, head dim]",
                          error::attention_operand_is_not_rank_4_batch_seq_heads_head_dim<1, typename K::spec_type>);
  SHARDLIB_STATIC_REQUIRE((V::rank == 4), "shardlib: attention: v is not [batch, seq, heads, head dim]",
                          error::attention_operand_is_not_rank_4_batch_seq_heads_head_dim<2, typename V::spec_type>);
  SHARDLIB_STATIC_REQUIRE((std::is_same_v<typename Q::value_type, typename K::value_type> &&
                           std::is_same_v<typename Q::value_type, typename V::value_type>),
                          "shardlib: attention: q, k and v have different element types",
                          error::attention_operands_have_different_element_types<typename Q::value_type,
                                                                                 typename K::value_type>);
  SHARDLIB_STATIC_REQUIRE((std::is_same_v<typename Q::mesh_type, typename K::mesh_type> &&
                           std::is_same_v<typename Q::mesh_type, typename V::mesh_type> &&
                           std::is_same_v<typename Q::memory_space, typename K::memory_space> &&
                           std::is_same_v<typename Q::memory_space, typename V::memory_space>),
                          "shardlib: attention: q, k and v are on different mesh types or memory spaces",
                          error::attention_operands_are_on_different_meshes_or_memory_spaces<typename Q::memory_space,
                                                                                              typename K::memory_space>);
}

/// Whether attention_static_checks passes (the operands' types fit): attention() instantiates
/// nothing more otherwise, so that its own error is the one the compiler prints.
template <class Q, class K, class V>
inline constexpr bool attention_operands_fit_v =
    Q::rank == 4 && K::rank == 4 && V::rank == 4 && std::is_same_v<typename Q::value_type, typename K::value_type> &&
    std::is_same_v<typename Q::value_type, typename V::value_type> &&
    std::is_same_v<typename Q::mesh_type, typename K::mesh_type> && std::is_same_v<typename Q::mesh_type, typename V::mesh_type> &&
    std::is_same_v<typename Q::memory_space, typename K::memory_space> &&
    std::is_same_v<typename Q::memory_space, typename V::memory_space>;

/// Checks the shapes (throws std::invalid_argument naming the tensors and their shapes) and the
/// options (scale, block), and returns the scale.
template <std::size_t R>
double attention_check(const std::array<std::int64_t, R>& q, const std::array<std::int64_t, R>& k,
                       const std::array<std::int64_t, R>& v, const AttentionOptions& o) {
  const auto text = [](const std::array<std::int64_t, R>& s) { return shape_text(ArrayRef<std::int64_t>(s)); };
  const std::string all = " (q " + text(q) + ", k " + text(k) + ", v " + text(v) +
                          "; each is [batch, seq, heads, head dim])";
  const char* names[4] = {"batch (dim 0)", "sequence length (dim 1)", "heads (dim 2)", "head dim (dim 3)"};
  for (int d : {0, 2})
    if (q[static_cast<std::size_t>(d)] != k[static_cast<std::size_t>(d)] || q[static_cast<std::size_t>(d)] != v[static_cast<std::size_t>(d)])
      throw std::invalid_argument(std::string("shardlib: attention: q, k and v differ in their ") + names[d] + all);
  if (q[3] != k[3]) throw std::invalid_argument(std::string("shardlib: attention: q and k differ in their ") + names[3] + all);
  if (k[1] != v[1]) throw std::invalid_argument(std::string("shardlib: attention: k and v differ in their ") + names[1] + all);
  if (k[1] == 0 && q[1] > 0)
    throw std::invalid_argument("shardlib: attention: k and v have sequence length 0: a query has no key to attend to" + all);
  if (q[3] == 0) throw std::invalid_argument("shardlib: attention: the head dim is 0" + all);
  if (!std::isfinite(o.scale)) throw std::invalid_argument("shardlib: attention: the scale is not finite" + all);
  if (o.block < 0)  // refused whichever kernel runs: a later call may take the blockwise one
    throw std::invalid_argument("shardlib: attention: the block (AttentionOptions::block) is " + std::to_string(o.block) +
                                "; it is the side of the tiles of scores, positive, or 0 to pick one");
  return o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(q[3]));
}

/// Fills a [Sq, Sk] bias: -infinity above the diagonal (key j > query i), 0 elsewhere.
template <class T>
struct CausalBias {
  T masked;
  KOKKOS_INLINE_FUNCTION void operator()(const Index<2>& i, T& v) const { v = i[1] > i[0] ? masked : T(0.0f); }
};

/// The additive [Sq, Sk] bias of the unfused form (replicated): the mask, plus -infinity above the
/// diagonal under `causal`; nullopt when there is neither.
template <class T, class MeshT, class Mem, class Mask>
auto attention_bias(const MeshT& mesh, std::int64_t sq, std::int64_t sk, bool causal, const Mask* mask) {
  using B = DistributedTensor<T, MeshT, Spec<none, none>, Mem>;
  std::optional<B> bias;
  if (causal) {
    B c = B::uninitialized(mesh, {sq, sk}, same_shape);
    shardlib::parallel_for(c, CausalBias<T>{static_cast<T>(-std::numeric_limits<float>::infinity())});
    bias.emplace(mask ? B(c + *mask) : std::move(c));
  } else if (mask) {
    bias.emplace(*mask);
  }
  return bias;
}

/// The unfused form: softmax<3>(scale q k^T + bias) v, with the ops (on tensors or Vars), as
/// softmax<3>(q k^T + bias / scale, scale): the scale is the softmax's own (one pass over the
/// [B, H, Sq, Sk] scores fewer each way, forward and backward), the bias divided once.
/// With `causal_rows` (no mask of the user's) the causal mask is the softmax's own (normalize_run's
/// `causal`): each row of the scores read up to its diagonal, no [Sq, Sk] bias made and added in
/// passes of its own (0.38 ms of a float32 GPT-2 layer's step on an H100).
template <class Q, class K, class V, class Bias>
auto attention_composed(const Q& q, const K& k, const V& v, double scale, const Bias& bias, bool causal_rows = false) {
  using T = typename autodiff::detail::tensor_of_t<Q>::value_type;
  auto s = shardlib::einsum<"bqhk,bshk->bhqs">(q, k);
  if (causal_rows) {
    const std::int64_t sq = autodiff::detail::value(s).shape()[2];
    if constexpr (VarType<decltype(s)>)
      return shardlib::einsum<"bhqs,bshk->bqhk">(autodiff::detail::softmax_var<3>(s, scale, sq), v);
    else
      return shardlib::einsum<"bhqs,bshk->bqhk">(
          shardlib::detail::normalize_op<"softmax", shardlib::detail::Normalization::softmax, 3>(s, 0.0, scale, sq), v);
  }
  if (bias) return shardlib::einsum<"bhqs,bshk->bqhk">(shardlib::softmax<3>(s + *bias * static_cast<T>(1.0 / scale), scale), v);
  return shardlib::einsum<"bhqs,bshk->bqhk">(shardlib::softmax<3>(s, scale), v);
}

#if defined(SHARDLIB_HAVE_CUDNN) && defined(KOKKOS_ENABLE_CUDA)
/// The cuDNN problem of attention's local blocks ([b, S, h, K] row-major, contiguous).
template <class T>
kernels::cudnn::SdpaShape attention_shape(const ShardBox& q, const ShardBox& k, const ShardBox& v, bool causal,
                                          bool bias, bool stats, double scale) {
  kernels::cudnn::SdpaShape s;
  s.b = q.extent[0], s.h = q.extent[2], s.sq = q.extent[1], s.sk = k.extent[1], s.dqk = q.extent[3], s.dv = v.extent[3];
  auto strides = [&](std::int64_t seq, std::int64_t d) {
    return std::array<std::int64_t, 4>{seq * s.h * d, d, s.h * d, 1};  // (b, h, s, d) of a [b, S, h, d] block
  };
  s.q = strides(s.sq, s.dqk), s.k = strides(s.sk, s.dqk), s.v = strides(s.sk, s.dv), s.o = strides(s.sq, s.dv);
  s.elem = std::is_same_v<T, bf16> ? kernels::cudnn::Elem::bf16 : kernels::cudnn::Elem::f16;
  s.causal = causal, s.bias = bias, s.stats = stats, s.scale = static_cast<float>(scale);
  return s;
}
/// A workspace allocator over this device's block cache in `Mem`.
template <class Mem>
kernels::cudnn::WorkspaceAllocator attention_workspace(Context& ctx) {
  return [&ctx](std::size_t bytes) { return block_cache<Mem>(ctx).allocate(bytes); };
}
#endif

/// The fused forward on the local blocks: o (and, when `stats`, the softmax statistics, a
/// float [b, h, Sq] block it returns). "" in `why` when it ran, else the reason (nothing queued).
template <class QT, class KT, class VT, class OT>
std::shared_ptr<void> attention_fused_forward(const QT& q, const KT& k, const VT& v, const void* bias, bool causal,
                                              double scale, bool stats, OT& o, std::string& why) {
#if defined(SHARDLIB_HAVE_CUDNN) && defined(KOKKOS_ENABLE_CUDA)
  using T = typename QT::value_type;
  using Mem = typename QT::memory_space;
  Context& ctx = q.context();
  const auto s = attention_shape<T>(q.block(), k.block(), v.block(), causal, bias != nullptr, stats, scale);
  std::shared_ptr<void> st;
  if (stats) st = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(s.b * s.h * s.sq, 1)) * sizeof(float));
  if (s.b == 0 || s.h == 0 || s.sq == 0) return st;  // nothing on this device
  why = ctx.state<kernels::cudnn::Sdpa>().forward(ctx.exec_for<Mem>().cuda_stream(), s, q.local().data(), k.local().data(),
                                                  v.local().data(), bias, o.local().data(),
                                                  static_cast<float*>(st.get()), attention_workspace<Mem>(ctx));
  return st;
#else
  (void)q, (void)k, (void)v, (void)bias, (void)causal, (void)scale, (void)stats, (void)o;
  why = "this build has no cuDNN (SHARDLIB_HAVE_CUDNN) or no CUDA-enabled Kokkos";
  return {};
#endif
}

/// The fused backward on the local blocks: dq, dk, dv from the output's gradient `g` (laid out
/// as o). Returns "" when it ran, else the reason (nothing queued).
template <class QT, class KT, class VT, class OT>
std::string attention_fused_backward(const QT& q, const KT& k, const VT& v, const void* bias, bool causal, double scale,
                                     const OT& o, const OT& g, const void* stats, QT& dq, KT& dk, VT& dv) {
#if defined(SHARDLIB_HAVE_CUDNN) && defined(KOKKOS_ENABLE_CUDA)
  using T = typename QT::value_type;
  using Mem = typename QT::memory_space;
  Context& ctx = q.context();
  const auto s = attention_shape<T>(q.block(), k.block(), v.block(), causal, bias != nullptr, true, scale);
  if (s.b == 0 || s.h == 0) return {};  // nothing on this device (no query at all takes the ops)
  return ctx.state<kernels::cudnn::Sdpa>().backward(ctx.exec_for<Mem>().cuda_stream(), s, q.local().data(), k.local().data(),
                                                    v.local().data(), bias, o.local().data(), g.local().data(),
                                                    static_cast<const float*>(stats), dq.local().data(), dk.local().data(),
                                                    dv.local().data(), attention_workspace<Mem>(ctx));
#else
  (void)q, (void)k, (void)v, (void)bias, (void)causal, (void)scale, (void)o, (void)g, (void)stats, (void)dq, (void)dk, (void)dv;
  return "this build has no cuDNN (SHARDLIB_HAVE_CUDNN) or no CUDA-enabled Kokkos";
#endif
}

/// The gradients of the unfused form, from the ops (when the fused backward cannot run): with
/// p = softmax(scale q k^T + bias), dv = p^T g, ds = p (g v^T - rowsum(p g v^T)), dq = scale ds k,
/// dk = scale ds^T q.
template <class QT, class KT, class VT, class OT, class Bias>
void attention_unfused_backward(const QT& q, const KT& k, const VT& v, const Bias& bias, double scale, const OT& g,
                                QT& dq, KT& dk, VT& dv) {
  using T = typename QT::value_type;
  auto s = shardlib::einsum<"bqhk,bshk->bhqs">(q, k);
  auto p = bias ? shardlib::softmax<3>(s + *bias * static_cast<T>(1.0 / scale), scale) : shardlib::softmax<3>(s, scale);
  dv = VT(shardlib::einsum<"bhqs,bqhk->bshk">(p, g));
  auto dp = shardlib::einsum<"bqhk,bshk->bhqs">(g, v);
  auto ds = (p * (dp - shardlib::sum<3, true>(dp * p))) * static_cast<T>(scale);
  dq = QT(shardlib::einsum<"bhqs,bshk->bqhk">(ds, k));
  dk = KT(shardlib::einsum<"bhqs,bqhk->bshk">(ds, q));
}

/// attention() by the blockwise kernels of attention/ring.hpp on q, k and v resharded to `RSpec`
/// (a recorded reshard for a Var that differs), the result in that layout: ring attention over
/// `ring_axes` (ContextParallel::ring, ring_zigzag; `ring` true) or, with no axes, the host's fused
/// kernel on each device's block (`ring` false). Counted in attention_stats as such.
template <class RSpec, class Q, class K, class V, class Mask>
auto attention_blockwise(const Q& q0, const K& k0, const V& v0, const Mask* mask, bool causal, bool zigzag, double scale,
                         const AxisList& ring_axes, std::int64_t block, bool ring) {
  using autodiff::detail::tensor_of_t;
  using T = typename tensor_of_t<Q>::value_type;
  using MeshT = typename tensor_of_t<Q>::mesh_type;
  using Mem = typename tensor_of_t<Q>::memory_space;
  using RT = DistributedTensor<T, MeshT, RSpec, Mem>;
  if constexpr (host_memory_v<Mem> && !std::is_arithmetic_v<T>)
    throw std::invalid_argument(std::string("shardlib: attention: ") +
                                (ring ? "ring attention on the host takes float or double, not "
                                      : "the fused kernel on the host takes float or double, not ") +
                                element_name<T>() + (ring ? " (ContextParallel::all_to_all takes it)" : " (AttentionKernel::unfused takes it)"));
  const auto q = shardlib::reshard<RSpec>(q0);
  const auto k = shardlib::reshard<RSpec>(k0);
  const auto v = shardlib::reshard<RSpec>(v0);
  const RT& qv = autodiff::detail::value(q);
  const RT& kv = autodiff::detail::value(k);
  const RT& vv = autodiff::detail::value(v);
  using B = DistributedTensor<T, MeshT, Spec<none, none>, Mem>;
  std::optional<B> replicated_mask;
  if (mask) replicated_mask.emplace(*mask);
  const RingShape shape = ring_shape(qv, kv, vv, ring_axes, causal, zigzag, block);
  auto oshape = qv.shape();
  oshape[3] = vv.shape()[3];
  RT o(qv.mesh(), oshape);
  Context& ctx = qv.context();
  std::shared_ptr<void> lse = ring_attention_forward<T, Mem>(ctx, shape, qv.local().data(), kv.local().data(), vv.local().data(),
                                                             replicated_mask ? replicated_mask->local().data() : nullptr, scale,
                                                             o.local().data());
  ++(ring ? attention_stats(ctx).ring_forward : attention_stats(ctx).fused_forward);
  if constexpr (VarType<Q> || VarType<K> || VarType<V>) {
    const auto nq = autodiff::detail::node(q);
    const auto nk = autodiff::detail::node(k);
    const auto nv = autodiff::detail::node(v);
    return autodiff::detail::record(
        ring ? "attention (ring)" : "attention (fused)", o,
        [nq, nk, nv, qv, kv, vv, o, lse, mask_copy = std::move(replicated_mask), shape, scale, ring](const auto& g0,
                                                                                                  autodiff::BackwardPass& p) {
          const RT g(g0);  // the output's gradient, resolved to its layout
          RT dq(qv.mesh(), qv.shape()), dk(kv.mesh(), kv.shape()), dv(vv.mesh(), vv.shape());
          Context& c = qv.context();
          ring_attention_backward<T, Mem>(c, shape, qv.local().data(), kv.local().data(), vv.local().data(),
                                          mask_copy ? mask_copy->local().data() : nullptr, scale, o.local().data(),
                                          g.local().data(), lse.get(), dq.local().data(), dk.local().data(), dv.local().data());
          ++(ring ? attention_stats(c).ring_backward : attention_stats(c).fused_backward);
          if (nq) autodiff::detail::give(p, 0, *nq, dq);
          if (nk) autodiff::detail::give(p, 1, *nk, dk);
          if (nv) autodiff::detail::give(p, 2, *nv, dv);
        },
        nq, nk, nv);
  } else {
    return o;
  }
}

/// attention() (see the file comment) on operands that are tensors or Vars; `mask` null or a
/// replicated [Sq, Sk] tensor of q's element type, mesh and memory.
template <class Q, class K, class V, class Mask>
auto attention_impl(const Q& q0, const K& k0, const V& v0, const Mask* mask, const AttentionOptions& opts) {
  using autodiff::detail::tensor_of_t;
  using QT0 = tensor_of_t<Q>;
  using T = typename QT0::value_type;
  using MeshT = typename QT0::mesh_type;
  using Mem = typename QT0::memory_space;
  static constexpr OpRule rule = attention_rule(QT0::sharding, tensor_of_t<K>::sharding, tensor_of_t<V>::sharding);
  using InSpec = spec_from_t<MeshT, decltype([] { return rule.in[0]; })>;
  using QT = DistributedTensor<T, MeshT, InSpec, Mem>;
  using Out = QT;  // [B, Sq, H, Kv] as the kernel leaves it: its operands' layout (v's head dim)
  // The result: q's layout (a sequence split moved back from the heads: one all-to-all).
  using OutSpec = spec_from_t<MeshT, decltype([] { return rule.out; })>;
  using Result = DistributedTensor<T, MeshT, OutSpec, Mem>;
  const double scale = attention_check(autodiff::detail::value(q0).shape(), autodiff::detail::value(k0).shape(),
                                       autodiff::detail::value(v0).shape(), opts);
  if (mask) {
    const auto& ms = mask->shape();
    const std::int64_t sq = autodiff::detail::value(q0).shape()[1], sk = autodiff::detail::value(k0).shape()[1];
    if (ms[0] != sq || ms[1] != sk)
      throw std::invalid_argument("shardlib: attention: the mask has shape " + shape_text(ArrayRef<std::int64_t>(ms)) +
                                  "; it is added to the scores of q's " + std::to_string(sq) + " queries and k's " +
                                  std::to_string(sk) + " keys, so it must be [" + std::to_string(sq) + ", " +
                                  std::to_string(sk) + "]");
  }
  constexpr bool any_var = VarType<Q> || VarType<K> || VarType<V>;
  static constexpr OpRule ring = ring_attention_rule(QT0::sharding, tensor_of_t<K>::sharding, tensor_of_t<V>::sharding);
  if constexpr (!ring.comm.empty()) {
    using RSpec = spec_from_t<MeshT, decltype([] { return ring.in[0]; })>;
    static_assert(std::is_same_v<RSpec, OutSpec>, "shardlib: attention: both forms leave q's layout");
    if (opts.context == ContextParallel::ring || opts.context == ContextParallel::ring_zigzag)
      return attention_blockwise<RSpec>(q0, k0, v0, mask, opts.causal, opts.context == ContextParallel::ring_zigzag, scale,
                                        ring.comm, opts.block, true);
  }
  if constexpr (host_memory_v<Mem> && std::is_arithmetic_v<T>) {
    // (A plan on shapes alone keeps the ops: it stands for GPU devices, where float runs them.)
    const auto& qs = autodiff::detail::value(q0).shape();
    const bool automatic_fused =
        opts.kernel == AttentionKernel::automatic && !shape_only() &&
        attention_automatic_fused(autodiff::detail::value(q0).mesh().shape(), QT::sharding, qs[0], qs[2], qs[1],
                                  autodiff::detail::value(k0).shape()[1], sizeof(T));
    if (opts.kernel == AttentionKernel::fused || automatic_fused) {  // the blockwise kernel on each device's block
      auto out = attention_blockwise<InSpec>(q0, k0, v0, mask, opts.causal, false, scale, AxisList{}, opts.block, false);
      if constexpr (any_var) return shardlib::reshard<OutSpec>(out);
      else return Result(out);
    }
  }
  // The operands in the layout the kernel runs on (a recorded reshard for a Var that differs).
  const auto q = shardlib::reshard<InSpec>(q0);
  const auto k = shardlib::reshard<InSpec>(k0);
  const auto v = shardlib::reshard<InSpec>(v0);
  const bool wants_grad = [&] {
    if constexpr (any_var) return (autodiff::detail::node(q) || autodiff::detail::node(k) || autodiff::detail::node(v));
    else return false;
  }();
  Context& ctx = autodiff::detail::value(q).context();
  AttentionStats& stats = attention_stats(ctx);
  using B = DistributedTensor<T, MeshT, Spec<none, none>, Mem>;
  std::optional<B> replicated_mask;
  if (mask) replicated_mask.emplace(*mask);
  const B* m = replicated_mask ? &*replicated_mask : nullptr;

  if constexpr (attention_fusable_v<T, Mem>) {
    if (opts.kernel != AttentionKernel::unfused && autodiff::detail::value(q).shape()[1] > 0) {
      const QT& qv = autodiff::detail::value(q);
      const QT& kv = autodiff::detail::value(k);
      const QT& vv = autodiff::detail::value(v);
      auto vshape = qv.shape();
      vshape[3] = vv.shape()[3];
      Out o(qv.mesh(), vshape);
      std::string why;
      const void* bias = m ? static_cast<const void*>(m->local().data()) : nullptr;
      std::shared_ptr<void> st = attention_fused_forward(qv, kv, vv, bias, opts.causal, scale, wants_grad, o, why);
      if (why.empty()) {
        ++stats.fused_forward;
        if constexpr (any_var) {
          return shardlib::reshard<OutSpec>(autodiff::detail::record(
              "attention", o,
              [nq = autodiff::detail::node(q), nk = autodiff::detail::node(k), nv = autodiff::detail::node(v), qv, kv, vv,
               o, st, mask_copy = replicated_mask, causal = opts.causal, scale,
               strict = opts.kernel == AttentionKernel::fused](const auto& g0, autodiff::BackwardPass& p) {
                const Out g(g0);  // the output's gradient, resolved to its layout
                QT dq(qv.mesh(), qv.shape()), dk(kv.mesh(), kv.shape()), dv(vv.mesh(), vv.shape());
                const void* b = mask_copy ? static_cast<const void*>(mask_copy->local().data()) : nullptr;
                AttentionStats& s = attention_stats(qv.context());
                if (std::string w = attention_fused_backward(qv, kv, vv, b, causal, scale, o, g, st.get(), dq, dk, dv);
                    w.empty()) {
                  ++s.fused_backward;
                } else {
                  if (strict) throw std::runtime_error("shardlib: attention: cuDNN's fused backward cannot run: " + w);
                  warn_attention_fallback_once(w);
                  s.fallback = w;
                  ++s.unfused_backward;
                  const auto bias_t = attention_bias<T, MeshT, Mem>(qv.mesh(), qv.shape()[1], kv.shape()[1], causal,
                                                                    mask_copy ? &*mask_copy : nullptr);
                  attention_unfused_backward(qv, kv, vv, bias_t, scale, g, dq, dk, dv);
                }
                if (nq) autodiff::detail::give(p, 0, *nq, dq);
                if (nk) autodiff::detail::give(p, 1, *nk, dk);
                if (nv) autodiff::detail::give(p, 2, *nv, dv);
              },
              autodiff::detail::node(q), autodiff::detail::node(k), autodiff::detail::node(v)));
        } else {
          return Result(o);
        }
      }
      if (opts.kernel == AttentionKernel::fused)
        throw std::runtime_error("shardlib: attention: cuDNN's fused kernel cannot run: " + why);
      warn_attention_fallback_once(why);
      stats.fallback = why;
    }
  } else {
    if (opts.kernel == AttentionKernel::fused)
      throw std::runtime_error(std::string("shardlib: attention: the fused kernel takes float or double tensors in host "
                                           "memory, or bf16 or f16 tensors in GPU memory in a build with SHARDLIB_HAVE_CUDNN "
                                           "(cuDNN's); these are ") +
                               element_name<T>() + (host_memory_v<Mem> ? " in host memory" : " in GPU memory"));
  }
  ++stats.unfused_forward;
  if (wants_grad) ++stats.unfused_backward;  // the ops' own backward rules
  // A causal mask alone is the softmax's (attention_composed; on the host for float and double,
  // whose row kernels take it); else a bias.
  const bool causal_rows = opts.causal && m == nullptr && (!host_memory_v<Mem> || kernels::vmath::is_vector_type_v<T>);
  const auto bias = attention_bias<T, MeshT, Mem>(autodiff::detail::value(q).mesh(), autodiff::detail::value(q).shape()[1],
                                                  autodiff::detail::value(k).shape()[1], opts.causal && !causal_rows, m);
  auto out = attention_composed(q, k, v, scale, bias, causal_rows);
  if constexpr (any_var) return shardlib::reshard<OutSpec>(out);
  else return Result(out);
}

}  // namespace detail

/// Scaled dot-product attention of q, k, v ([B, S, H, K] tensors or Vars; see the file comment).
/// Throws std::invalid_argument naming the tensors and their shapes when they do not fit.
template <class Q, class K, class V>
  requires((TensorType<Q> || VarType<Q>) && (TensorType<K> || VarType<K>) && (TensorType<V> || VarType<V>))
auto attention(const Q& q, const K& k, const V& v, const AttentionOptions& opts = {}) {
  using T = typename autodiff::detail::tensor_of_t<Q>::value_type;
  using QT = autodiff::detail::tensor_of_t<Q>;
  using KT = autodiff::detail::tensor_of_t<K>;
  using VT = autodiff::detail::tensor_of_t<V>;
  detail::attention_static_checks<QT, KT, VT>();
  if constexpr (detail::attention_operands_fit_v<QT, KT, VT>) {
    using B = DistributedTensor<T, typename QT::mesh_type, Spec<none, none>, typename QT::memory_space>;
    return detail::attention_impl(q, k, v, static_cast<const B*>(nullptr), opts);
  }
}

/// attention() with an additive mask: a [Sq, Sk] tensor of q's element type, mesh and memory
/// (any spec: it is replicated), added to every head's scores before the softmax (-infinity
/// hides a key; a row with every key hidden gives NaN, as in PyTorch).
template <class Q, class K, class V, TensorType M>
  requires((TensorType<Q> || VarType<Q>) && (TensorType<K> || VarType<K>) && (TensorType<V> || VarType<V>))
auto attention(const Q& q, const K& k, const V& v, const M& mask, const AttentionOptions& opts = {}) {
  using QT = autodiff::detail::tensor_of_t<Q>;
  using KT = autodiff::detail::tensor_of_t<K>;
  using VT = autodiff::detail::tensor_of_t<V>;
  detail::attention_static_checks<QT, KT, VT>();
  SHARDLIB_STATIC_REQUIRE((M::rank == 2 && std::is_same_v<typename M::value_type, typename QT::value_type> &&
                           std::is_same_v<typename M::mesh_type, typename QT::mesh_type> &&
                           std::is_same_v<typename M::memory_space, typename QT::memory_space>),
                          "shardlib: attention: the mask is a [Sq, Sk] tensor of q's element type, mesh and memory",
                          error::attention_mask_is_a_rank_2_tensor_of_qs_element_type_mesh_and_memory<typename M::spec_type>);
  using B = DistributedTensor<typename QT::value_type, typename QT::mesh_type, Spec<none, none>, typename QT::memory_space>;
  if constexpr (!detail::attention_operands_fit_v<QT, KT, VT> || M::rank != 2 ||
                !std::is_same_v<typename M::value_type, typename QT::value_type> ||
                !std::is_same_v<typename M::mesh_type, typename QT::mesh_type> ||
                !std::is_same_v<typename M::memory_space, typename QT::memory_space>) {
    return;  // the static checks above said why
  } else if constexpr (std::is_same_v<M, B>) {
    return detail::attention_impl(q, k, v, &mask, opts);
  } else {
    const B replicated(mask);
    return detail::attention_impl(q, k, v, &replicated, opts);
  }
}

}  // namespace shardlib
