// SPDX-License-Identifier: Apache-2.0
/// @file
/// A mixture-of-experts MLP layer (GShard, Switch Transformer), expert parallel:
///
/// ```
/// auto r = sl::moe(x, router, w1, w2, {.top_k = 2, .capacity_factor = 1.25});
/// auto loss = task_loss(x + r.y) + 0.01 * r.aux_loss;   // r.dropped: choices over capacity
/// // optional: .router_jitter = 0.01, .jitter_seed = step (Switch); .z_loss = true, + 0.001 * r.z_loss (ST-MoE)
/// ```
///
/// x is [T, D] tokens (split over the token axes A: data parallel), router [D, E], w1 [E, D, F]
/// and w2 [E, F, D] the E experts' GELU MLPs stacked along the expert dim, split over the
/// expert axes X, a subset of A (GShard: the experts live on the devices that hold the tokens).
/// The layer computes `y[t] = sum over t's kept choices j of gate_j * w2[e_j]^T gelu(w1[e_j]^T x[t])`
/// with the router's softmax probabilities p = softmax(x router), each token's top-k experts,
/// a capacity of C slots per expert and group (moe/routing.hpp: overflow dropped), and the
/// load-balancing loss of Switch, `aux_loss = E * sum_e f_e P_e` (f_e: the fraction of tokens
/// whose first choice is e; P_e: the mean probability of e).
///
/// What moves: each device is a group; it routes its own tokens and writes them into its block of
/// a dispatch tensor [G, E, C, D] (G = the devices along A, one group each, split over A). The
/// groups first exchange their counts (one small all-gather over A: each expert's slots filled,
/// its first choices, the drops), then one all-to-all sends each expert's filled slots, and only
/// those, to the device that holds it, into the experts' layout [G, E, C, D] split over A \ X and
/// X (each device then holds the slots of its experts from every group of its expert group; the
/// slots no token filled are zeros there, not sent); the experts run as two batched einsums on
/// local blocks; one all-to-all brings the filled slots' outputs back, and each device combines
/// its tokens' rows. The bytes of each all-to-all are the routed tokens' (kept choices') rows,
/// however much of the capacity is left empty. In the aux loss, the mean of the probabilities. The
/// backward is the two all-to-alls the other way, of the same rows. Dispatch, combine, and the
/// packing of the filled slots are local index kernels (kernels/moe.hpp), not the dense one-hot
/// einsums of GShard's paper (the tests' oracle).
///
/// Tensor parallelism of each expert (Megatron's MLP split): with w1's hidden dim F split over
/// axes M that do not split the tokens (`Mesh<"data", "model">`, x [T, D] over "data", w1 [E, D, F]
/// split ("data", -, "model")), every device of an M group routes the same tokens and moves them
/// among its own token group; its experts' first einsum is column-parallel, the second
/// row-parallel, and one all-reduce over M of the experts' [G_l, E_l, C, D] block completes
/// their outputs (the backward: one all-reduce over M of the slots' gradient).
///
/// Planned on shapes alone (the simulate backend, plan/simulate.hpp), the layer has no
/// probabilities to route: every group routes as a perfectly balanced router would
/// (moe_route_balanced: each expert an even share of the choices, at most its capacity), so a
/// plan's all-to-alls carry the bytes of a balanced load. In a dry run (coll::dry_run: the other
/// groups' counts unknown) the all-to-alls are sized by that balanced load too. Unlike every other
/// op's, the layer's all-to-all bytes depend on the values (the routing): they change from step
/// to step.
///
/// Everything is differentiable: x through the dispatch and the router, the router through the
/// gates and the aux loss, the experts' weights through the einsums. Dropped choices get no
/// gradient.
#pragma once

#include <shardlib/autodiff.hpp>
#include <shardlib/kernels/moe.hpp>
#include <shardlib/memory.hpp>
#include <shardlib/moe/routing.hpp>
#include <shardlib/sharding/moe.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlib {

/// Options of moe().
struct MoeOptions {
  int top_k = 1;                 ///< experts per token: 1 (Switch) or 2 (GShard); at most E
  double capacity_factor = 1.25; ///< slots per expert and group: ceil(top_k * tokens * factor / E)
  /// Gates: with top_k > 1, the k probabilities divided by their sum (GShard); top-1 always the
  /// probability itself (Switch).
  bool normalize_gates = true;
  /// Router jitter (Switch Transformer): the router's input multiplied by noise uniform in
  /// [1 - router_jitter, 1 + router_jitter] (the experts see x itself); 0: off. The noise is drawn
  /// from `jitter_seed` by global index, so any mesh gets the same noise: pass a new seed each
  /// step (e.g. the step number) to train with it, and none (0) to evaluate.
  double router_jitter = 0;
  std::uint64_t jitter_seed = 0;
  /// Computes the router z-loss of ST-MoE into MoeResult::z_loss: the mean over the tokens of
  /// the square of the log-sum-exp of the router's logits (it keeps the logits small); add it to
  /// the loss with a small weight (ST-MoE: 0.001). Off: z_loss is 0 and costs nothing.
  bool z_loss = false;
};

/// What this device's last moe() call routed, over the whole layer (every group).
struct MoeStats {
  std::int64_t tokens = 0;     ///< tokens routed (all groups)
  std::int64_t choices = 0;    ///< tokens * top_k
  std::int64_t dropped = 0;    ///< choices over their expert's capacity (no expert output, no gradient)
  std::int64_t capacity = 0;   ///< slots per expert and group
  std::vector<std::int64_t> first_choice;  ///< per expert: tokens whose first choice it is
  /// Per group and expert ([G × E], row-major): the slots filled (the choices kept), each sent to
  /// the expert's device and back, nothing of the empty ones.
  std::vector<std::int64_t> kept;
};
/// This device's MoeStats (its last moe() call).
inline MoeStats& moe_stats(Context& ctx) { return ctx.state<MoeStats>(); }

/// moe()'s result: the layer's output (x's type), the load-balancing loss (a scalar Var) and
/// the choices dropped over capacity (the whole layer's).
template <class Y, class Aux>
struct MoeResult {
  Y y;
  Aux aux_loss;
  std::int64_t dropped = 0;
  Aux z_loss;  ///< the router z-loss with MoeOptions::z_loss (a scalar Var like aux_loss), else 0
};

namespace detail {

/// One group's routing in the memory of the tensors (the index arrays the kernels read), and
/// the host copy.
template <class Mem>
struct MoeIndex {
  MoeRouting route;
  std::shared_ptr<void> token_slot, choice_expert, slot_token, slot_choice, prob, gate;
  const std::int64_t* i64(const std::shared_ptr<void>& p) const { return static_cast<const std::int64_t*>(p.get()); }
  const double* f64(const std::shared_ptr<void>& p) const { return static_cast<const double*>(p.get()); }
};

template <class Mem, class U>
std::shared_ptr<void> moe_upload(Context& ctx, const std::vector<U>& v) {
  std::shared_ptr<void> p = block_cache<Mem>(ctx).allocate(std::max<std::size_t>(v.size(), 1) * sizeof(U));
  if (!v.empty()) upload<Mem>(ctx, v.data(), static_cast<U*>(p.get()), static_cast<std::int64_t>(v.size()));
  return p;
}

/// The tokens' probabilities block on the host (a copy from GPU memory).
template <class PT>
std::vector<typename PT::value_type> moe_host_block(const PT& p) {
  using T = typename PT::value_type;
  std::vector<T> h(static_cast<std::size_t>(p.block().num_elements()));
  if (!h.empty()) download<typename PT::memory_space>(p.context(), p.local().data(), h.data(), static_cast<std::int64_t>(h.size()));
  return h;
}

/// The filled slots' moves between the dispatch layout (this device: its group's [E, C, D]
/// block of [G, E, C, D]) and the experts' (its [G_l, E_l, C, D] block): which rows go to and
/// come from each device of the token axes' group, packed in (device, expert, slot) order, and
/// the row indices of the kernels that pack and unpack them (in `Mem`). The move back is the same
/// with sending and receiving swapped.
template <class Mem>
struct MoeSlotMoves {
  std::vector<coll::Region> disp_side, exp_side;  ///< per device of the group: its packed rows' elements
  std::int64_t disp_packed = 0, exp_packed = 0;   ///< packed rows on each side
  std::int64_t disp_rows = 0, exp_rows = 0;       ///< rows of the two blocks (E C; G_l E_l C)
  bool local = false;  ///< the experts are not split (one device of the expert axes): nothing leaves a device
  /// packed row -> block row (both sides); block row -> packed row or -1 (both sides).
  std::shared_ptr<void> pack_disp, pack_exp, unpack_disp, unpack_exp;
};

/// The moves of this device (`device` of `mesh`, the token axes `tokens`, the experts' layout
/// `experts` of [G, E, C, D]) for the filled slots `kept` ([G × E]).
template <class Mem>
MoeSlotMoves<Mem> moe_slot_moves(Context& ctx, const MeshShape& mesh, const AxisList& tokens, const Sharding& experts,
                                 std::int64_t G, std::int64_t E, std::int64_t C, std::int64_t D, int device,
                                 const std::vector<std::int64_t>& kept) {
  MoeSlotMoves<Mem> m;
  const int n = mesh.group_size(tokens), me = mesh.group_rank(device, tokens);
  const std::array<std::int64_t, 4> shape{G, E, C, D};
  const ShardBox mine = shard_box(experts, mesh, ArrayRef<std::int64_t>(shape), device);
  const std::int64_t g0 = mine.offset[0], gl = mine.extent[0], e0 = mine.offset[1], el = mine.extent[1];
  auto filled = [&](std::int64_t g, std::int64_t e) { return kept[static_cast<std::size_t>(g * E + e)]; };
  m.disp_rows = E * C, m.exp_rows = gl * el * C;
  m.local = mesh.group_size(experts.dims[1]) == 1;
  std::vector<std::int64_t> pack_disp, pack_exp, unpack_disp(static_cast<std::size_t>(m.disp_rows), -1),
      unpack_exp(static_cast<std::size_t>(m.exp_rows), -1);
  m.disp_side.assign(static_cast<std::size_t>(n), coll::Region{});
  m.exp_side.assign(static_cast<std::size_t>(n), coll::Region{});
  auto region = [D](std::int64_t first, std::int64_t rows) {
    return rows > 0 ? coll::Region::contiguous(static_cast<std::size_t>(first * D), static_cast<std::size_t>(rows * D)) : coll::Region{};
  };
  for (int j = 0; j < n; ++j) {
    // To device j: this group's filled slots of j's experts, when j holds this group.
    const ShardBox theirs = shard_box(experts, mesh, ArrayRef<std::int64_t>(shape), mesh.group_member(device, tokens, j));
    const std::int64_t first = m.disp_packed;
    if (me >= theirs.offset[0] && me < theirs.offset[0] + theirs.extent[0])
      for (std::int64_t e = theirs.offset[1]; e < theirs.offset[1] + theirs.extent[1]; ++e)
        for (std::int64_t c = 0; c < filled(me, e); ++c) {
          unpack_disp[static_cast<std::size_t>(e * C + c)] = m.disp_packed++;
          pack_disp.push_back(e * C + c);
        }
    m.disp_side[static_cast<std::size_t>(j)] = region(first, m.disp_packed - first);
    // From device j (group j): its filled slots of this device's experts, when this device holds group j.
    const std::int64_t from = m.exp_packed;
    if (j >= g0 && j < g0 + gl)
      for (std::int64_t e = e0; e < e0 + el; ++e)
        for (std::int64_t c = 0; c < filled(j, e); ++c) {
          const std::int64_t row = ((j - g0) * el + (e - e0)) * C + c;
          unpack_exp[static_cast<std::size_t>(row)] = m.exp_packed++;
          pack_exp.push_back(row);
        }
    m.exp_side[static_cast<std::size_t>(j)] = region(from, m.exp_packed - from);
  }
  m.pack_disp = moe_upload<Mem>(ctx, pack_disp), m.pack_exp = moe_upload<Mem>(ctx, pack_exp);
  m.unpack_disp = moe_upload<Mem>(ctx, unpack_disp), m.unpack_exp = moe_upload<Mem>(ctx, unpack_exp);
  return m;
}

/// Moves the filled slots' rows of `src` (the dispatch block, or with `to_experts` false the
/// experts' block) into `dst` (the other), the rows no slot filled zero: a pack, one exchange
/// over the token axes' group (counted as an all-to-all), an unpack.
template <class Mem, class T>
void moe_move(Context& ctx, const MeshShape& mesh, const AxisList& tokens, const MoeSlotMoves<Mem>& m, bool to_experts, const T* src,
              T* dst, std::int64_t D) {
  const auto i64 = [](const std::shared_ptr<void>& p) { return static_cast<const std::int64_t*>(p.get()); };
  const std::int64_t out = to_experts ? m.disp_packed : m.exp_packed, in = to_experts ? m.exp_packed : m.disp_packed;
  auto& cache = block_cache<Mem>(ctx);
  const std::shared_ptr<void> send = cache.allocate(static_cast<std::size_t>(std::max<std::int64_t>(out * D, 1)) * sizeof(T));
  const std::shared_ptr<void> recv = cache.allocate(static_cast<std::size_t>(std::max<std::int64_t>(in * D, 1)) * sizeof(T));
  const auto& exec = ctx.exec_for<Mem>();
  {
    auto guard = kernel_guard_for<Mem>(ctx, false);
    kernels::moe_dispatch(exec, static_cast<T*>(send.get()), src, i64(to_experts ? m.pack_disp : m.pack_exp), out, D);
  }
  // (Experts not split: every row stays, packed in the same order on both sides.)
  if (!m.local)
    exchange_in<Mem>(ctx, &mesh, tokens, static_cast<const T*>(send.get()), out * D, to_experts ? m.disp_side : m.exp_side,
                     static_cast<T*>(recv.get()), in * D, to_experts ? m.exp_side : m.disp_side);
  auto guard = kernel_guard_for<Mem>(ctx, false);
  kernels::moe_dispatch(exec, dst, static_cast<const T*>((m.local ? send : recv).get()), i64(to_experts ? m.unpack_exp : m.unpack_disp),
                        to_experts ? m.exp_rows : m.disp_rows, D);
}

/// moe_move, recorded: `in` (a Var or tensor, in one of the two layouts) moved into a new tensor
/// of type `To` (the experts' layout with `to_experts`, else the dispatch's); its gradient moves
/// the other way in the backward.
template <class To, class In, class Mem>
auto moe_move_recorded(const char* name, const In& in, const std::shared_ptr<const MoeSlotMoves<Mem>>& moves, const AxisList& tokens,
                       bool to_experts, std::int64_t D) {
  using From = std::remove_cvref_t<decltype(autodiff::detail::value(in))>;
  const From& v = autodiff::detail::value(in);
  To out(v.mesh(), v.shape());
  moe_move<Mem>(v.context(), v.mesh().shape(), tokens, *moves, to_experts, v.local().data(), out.local().data(), D);
  return autodiff::detail::record(
      name, out,
      [n = autodiff::detail::node(in), moves, mesh_v = v.mesh(), shape = v.shape(), tokens, to_experts, D](const auto& g0,
                                                                                                      autodiff::BackwardPass& p) {
        const To g(g0);
        From d(mesh_v, shape);
        moe_move<Mem>(d.context(), mesh_v.shape(), tokens, *moves, !to_experts, g.local().data(), d.local().data(), D);
        if (n) autodiff::detail::give(p, 0, *n, d);
      },
      autodiff::detail::node(in));
}
}  // namespace detail

/// The mixture-of-experts layer (see the file comment) on x [T, D] (a Var or tensor split over
/// its token axes along dim 0, D whole), router [D, E], w1 [E, D, F], w2 [E, F, D] (Params, Vars
/// or tensors; resharded, recorded, to the layout the layer computes in: the router replicated,
/// the experts split over w1's expert axes and their hidden dim over w1's F axes). Throws
/// std::invalid_argument for shapes that do not fit, a capacity factor <= 0 or top-k outside
/// [1, E], and std::domain_error, on every device, when a router probability is NaN or infinite
/// (NaN router logits).
template <class X, class R, class W1, class W2>
  requires((TensorType<X> || VarType<X>) && (TensorType<R> || VarType<R>) && (TensorType<W1> || VarType<W1>) &&
           (TensorType<W2> || VarType<W2>))
auto moe(const X& x, const R& router, const W1& w1, const W2& w2, const MoeOptions& opts = {}) {
  using autodiff::detail::tensor_of_t;
  using autodiff::detail::value;
  using XT = tensor_of_t<X>;
  using T = typename XT::value_type;
  using MeshT = typename XT::mesh_type;
  using Mem = typename XT::memory_space;
  static constexpr MoeRule rule = moe_rule(XT::sharding, tensor_of_t<W1>::sharding, tensor_of_t<W2>::sharding);
  static_assert(rule.status != MoeRule::tokens_not_rank_2, "shardlib: moe: x must be [tokens, D] (rank 2)");
  static_assert(rule.status != MoeRule::weights_not_rank_3, "shardlib: moe: w1 and w2 must be [E, D, F] and [E, F, D] (rank 3)");
  static_assert(rule.status != MoeRule::model_dim_split, "shardlib: moe: x's model dim D must not be split (only its tokens)");
  static_assert(rule.status != MoeRule::partial_tokens, "shardlib: moe: x is partial; reshard it to a non-partial spec first");
  static_assert(rule.status != MoeRule::experts_not_over_token_axes,
                "shardlib: moe: w1's expert dim must be split over (some of) the axes that split x's tokens (GShard: "
                "the experts live on the devices of the tokens)");
  static_assert(rule.status != MoeRule::hidden_over_token_axes,
                "shardlib: moe: w1's hidden dim F must not be split over an axis that splits x's tokens (tensor "
                "parallelism of the experts splits F over an axis the tokens are replicated over)");
  static_assert(std::is_same_v<T, typename tensor_of_t<R>::value_type> && std::is_same_v<T, typename tensor_of_t<W1>::value_type> &&
                    std::is_same_v<T, typename tensor_of_t<W2>::value_type>,
                "shardlib: moe: x, router, w1 and w2 must have one element type");
  using TokSpec = spec_from_t<MeshT, decltype([] { return rule.tokens; })>;
  using DispSpec = spec_from_t<MeshT, decltype([] { return rule.dispatched; })>;
  using ExpSpec = spec_from_t<MeshT, decltype([] { return rule.experts; })>;
  using W1Spec = spec_from_t<MeshT, decltype([] { return rule.w1; })>;
  using W2Spec = spec_from_t<MeshT, decltype([] { return rule.w2; })>;
  using Tok = DistributedTensor<T, MeshT, TokSpec, Mem>;
  using Disp = DistributedTensor<T, MeshT, DispSpec, Mem>;

  const XT& xv = value(x);
  const auto& xs = xv.shape();
  const auto& rs = value(router).shape();
  const auto& s1 = value(w1).shape();
  const auto& s2 = value(w2).shape();
  const std::int64_t tokens = xs[0], D = xs[1], E = rs[1], F = s1[2];
  auto shapes = [&] {
    return " (x " + detail::shape_text(detail::ArrayRef<std::int64_t>(xs)) + ", router " + detail::shape_text(detail::ArrayRef<std::int64_t>(rs)) + ", w1 " +
           detail::shape_text(detail::ArrayRef<std::int64_t>(s1)) + ", w2 " + detail::shape_text(detail::ArrayRef<std::int64_t>(s2)) +
           "; x is [tokens, D], router [D, E], w1 [E, D, F], w2 [E, F, D])";
  };
  if (rs[0] != D || s1[0] != E || s1[1] != D || s2[0] != E || s2[1] != F || s2[2] != D)
    throw std::invalid_argument("shardlib: moe: the shapes do not fit" + shapes());
  const MeshShape& mesh = xv.mesh().shape();
  const int groups = mesh.group_size(rule.tokens.dims[0]);
  const std::int64_t capacity = moe_capacity(block_of(tokens, groups, 0).size, E, opts.top_k, opts.capacity_factor);
  Context& ctx = xv.context();
  const auto& exec = ctx.exec_for<Mem>();

  if (!(opts.router_jitter >= 0 && opts.router_jitter < 1))
    throw std::invalid_argument("shardlib: moe: router jitter " + std::to_string(opts.router_jitter) +
                                "; it must be in [0, 1) (the noise multiplies the router's input by [1 - jitter, 1 + jitter])");

  // The router: logits and probabilities [T, E], split as the tokens (the input jittered).
  const auto xt = shardlib::reshard<TokSpec>(x);
  const Tok& tv = value(xt);
  const auto replicated_router = shardlib::reshard<Spec<none, none>>(router);
  std::optional<Tok> noise;
  if (opts.router_jitter > 0)
    noise.emplace(Tok::random(xv.mesh(), tv.shape(), opts.jitter_seed, static_cast<T>(1 - opts.router_jitter),
                              static_cast<T>(1 + opts.router_jitter)));
  const auto logits = noise ? shardlib::matmul(xt * *noise, replicated_router) : shardlib::matmul(xt, replicated_router);
  const auto probs = shardlib::softmax<1>(logits);
  const std::int64_t local = tv.block().extent[0];
  // Route this group's tokens (on the host), then agree on the counts over the groups.
  // On shapes alone (a plan) there are no probabilities: every group routes as a balanced router.
  auto index = std::make_shared<detail::MoeIndex<Mem>>();
  if (shape_only()) {
    index->route = moe_route_balanced(local, E, opts.top_k, capacity);
  } else {
    const auto host = detail::moe_host_block(value(probs));
    index->route = moe_route(host.data(), local, E, opts.top_k, capacity, opts.normalize_gates && opts.top_k > 1);
  }
  const MoeRouting& rt = index->route;
  // Every group's counts (its experts' first choices and filled slots, its drops and non-finite
  // rows), gathered over the groups: the aux loss's f, the report, and the all-to-alls' sizes.
  const auto stride = static_cast<std::size_t>(2 * E + 2);
  std::vector<std::int64_t> mine(rt.first_choice);
  mine.insert(mine.end(), rt.kept.begin(), rt.kept.end());
  mine.push_back(rt.dropped);
  mine.push_back(rt.non_finite);
  std::vector<std::int64_t> every(stride * static_cast<std::size_t>(groups));
  ctx.group(mesh, rule.tokens.dims[0]).all_gather(mine.data(), every.data(), stride, coll::DType::i64);
  if (shape_only() || coll::DryRun::active()) {  // (counted, not performed: every group's balanced counts)
    MoeRouting b;
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t size = block_of(tokens, groups, static_cast<int>(g)).size;
      if (g == 0 || size != b.tokens) b = moe_route_balanced(size, E, opts.top_k, capacity);
      std::int64_t* c = every.data() + static_cast<std::size_t>(g) * stride;
      std::copy(b.first_choice.begin(), b.first_choice.end(), c);
      std::copy(b.kept.begin(), b.kept.end(), c + E);
      c[2 * E] = b.dropped, c[2 * E + 1] = 0;
    }
  }
  std::vector<std::int64_t> counts(static_cast<std::size_t>(E) + 2, 0), kept(static_cast<std::size_t>(groups * E));
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t* c = every.data() + static_cast<std::size_t>(g) * stride;
    for (std::int64_t e = 0; e < E; ++e) counts[static_cast<std::size_t>(e)] += c[e], kept[static_cast<std::size_t>(g * E + e)] = c[E + e];
    counts[static_cast<std::size_t>(E)] += c[2 * E], counts[static_cast<std::size_t>(E) + 1] += c[2 * E + 1];
  }
  const std::int64_t dropped = counts[static_cast<std::size_t>(E)], bad = counts[static_cast<std::size_t>(E) + 1];
  if (bad > 0)
    throw std::domain_error("shardlib: moe: the router's probabilities are NaN or infinite for " + std::to_string(bad) + " of " +
                            std::to_string(tokens) + " tokens (NaN or infinite router logits: x or the router weights)");
  MoeStats& stats = moe_stats(ctx);
  stats.tokens = tokens, stats.choices = tokens * opts.top_k, stats.dropped = dropped, stats.capacity = capacity;
  stats.first_choice.assign(counts.begin(), counts.begin() + E);
  stats.kept = kept;
  index->token_slot = detail::moe_upload<Mem>(ctx, rt.token_slot);
  index->choice_expert = detail::moe_upload<Mem>(ctx, rt.choice_expert);
  index->slot_token = detail::moe_upload<Mem>(ctx, rt.slot_token);
  index->slot_choice = detail::moe_upload<Mem>(ctx, rt.slot_choice);
  index->prob = detail::moe_upload<Mem>(ctx, rt.prob);
  index->gate = detail::moe_upload<Mem>(ctx, rt.gate);
  const int k = opts.top_k;

  // Dispatch: this group's tokens into its [1, E, C, D] block of the dispatch tensor.
  Disp slots(xv.mesh(), {groups, E, capacity, D});
  {
    auto guard = detail::kernel_guard_for<Mem>(ctx, false);
    kernels::moe_dispatch(exec, slots.local().data(), tv.local().data(), index->i64(index->slot_token), E * capacity, D);
  }
  const auto dispatched = autodiff::detail::record(
      "moe dispatch", slots,
      [nx = autodiff::detail::node(xt), index, mesh_v = xv.mesh(), xshape = tv.shape(), local, k, D](const auto& g0,
                                                                                                  autodiff::BackwardPass& p) {
        const Disp g(g0);
        Tok dx(mesh_v, xshape);
        auto guard = detail::kernel_guard_for<Mem>(dx.context(), false);
        kernels::moe_gather(dx.context().template exec_for<Mem>(), dx.local().data(), g.local().data(), index->i64(index->token_slot),
                            local, k, D);
        if (nx) autodiff::detail::give(p, 0, *nx, dx);
      },
      autodiff::detail::node(xt));
  // The experts: one all-to-all of the filled slots onto the experts' axes, two batched einsums,
  // one all-to-all of their rows back.
  using Exp = DistributedTensor<T, MeshT, ExpSpec, Mem>;
  const AxisList& taxes = rule.tokens.dims[0];
  const auto moves = std::make_shared<const detail::MoeSlotMoves<Mem>>(
      detail::moe_slot_moves<Mem>(ctx, mesh, taxes, rule.experts, groups, E, capacity, D, ctx.device(), kept));
  const auto at_experts = detail::moe_move_recorded<Exp>("moe to experts", dispatched, moves, taxes, true, D);
  // (With F split over M, the second einsum's sums are partial over M: all-reduced here.)
  const auto h = shardlib::gelu(shardlib::einsum<"gecd,edf->gecf">(at_experts, shardlib::reshard<W1Spec>(w1)));
  const auto out_e = shardlib::reshard<ExpSpec>(shardlib::einsum<"gecf,efd->gecd">(h, shardlib::reshard<W2Spec>(w2)));
  const auto out = detail::moe_move_recorded<Disp>("moe from experts", out_e, moves, taxes, false, D);
  // Combine: each token's gated sum of its kept choices' rows.
  const Disp& ov = value(out);
  Tok y(xv.mesh(), tv.shape());
  {
    auto guard = detail::kernel_guard_for<Mem>(ctx, false);
    kernels::moe_combine(exec, y.local().data(), ov.local().data(), index->i64(index->token_slot), index->f64(index->gate), local, k, D);
  }
  using PT = std::remove_cvref_t<decltype(value(probs))>;
  const auto combined = autodiff::detail::record(
      "moe combine", y,
      [no = autodiff::detail::node(out), np = autodiff::detail::node(probs), index, ov, pshape = value(probs).shape(), local, k, E,
       capacity, D, normalized = opts.normalize_gates && opts.top_k > 1](const auto& g0, autodiff::BackwardPass& p) {
        const Tok g(g0);
        Context& c = g.context();
        Disp dslots(ov.mesh(), ov.shape());
        PT dp(ov.mesh(), pshape);
        const std::shared_ptr<void> a = detail::block_cache<Mem>(c).allocate(static_cast<std::size_t>(std::max<std::int64_t>(local * k, 1)) * sizeof(double));
        {
          auto guard = detail::kernel_guard_for<Mem>(c, false);
          kernels::moe_combine_backward(c.template exec_for<Mem>(), g.local().data(), ov.local().data(), index->i64(index->token_slot),
                                        index->i64(index->slot_token), index->i64(index->slot_choice), index->f64(index->gate),
                                        index->f64(index->prob), index->i64(index->choice_expert), local, k, E * capacity, E, D,
                                        normalized, dslots.local().data(), static_cast<double*>(a.get()), dp.local().data());
        }
        if (no) autodiff::detail::give(p, 0, *no, dslots);
        if (np) autodiff::detail::give(p, 1, *np, dp);
      },
      autodiff::detail::node(out), autodiff::detail::node(probs));
  // Switch's load-balancing loss: E * sum_e f_e P_e.
  std::vector<T> f(static_cast<std::size_t>(E));
  for (std::int64_t e = 0; e < E; ++e)
    f[static_cast<std::size_t>(e)] = static_cast<T>(tokens > 0 ? static_cast<double>(counts[static_cast<std::size_t>(e)]) / static_cast<double>(tokens) : 0.0);
  using Vec = DistributedTensor<T, MeshT, Spec<none>, Mem>;
  const Vec fe = Vec::from_host(xv.mesh(), {E}, std::span<const T>(f));
  auto aux = shardlib::sum_all(shardlib::mean<0>(probs) * fe) * static_cast<T>(E);
  // ST-MoE's router z-loss: mean over tokens of logsumexp(logits)^2; the log-sum-exp as
  // logits - log_softmax(logits), the same in every column (their mean: stable, exact gradient).
  auto z = aux * static_cast<T>(0);
  if (opts.z_loss) {
    const auto lse = shardlib::mean<1>(logits - shardlib::log_softmax<1>(logits));
    z = shardlib::mean_all(lse * lse);
  }
  if constexpr (VarType<X> || VarType<R> || VarType<W1> || VarType<W2>)
    return MoeResult<std::remove_cvref_t<decltype(combined)>, std::remove_cvref_t<decltype(aux)>>{combined, aux, dropped, z};
  else
    return MoeResult<Tok, std::remove_cvref_t<decltype(aux)>>{value(combined), aux, dropped, z};
}

}  // namespace shardlib
