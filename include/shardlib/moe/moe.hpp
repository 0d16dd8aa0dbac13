// SPDX-License-Identifier: Apache-2.0
/// @file
/// A mixture-of-experts MLP layer (GShard, Switch Transformer), expert parallel:
///
/// ```
/// auto r = sl::moe(x, router, w1, w2, {.top_k = 2, .capacity_factor = 1.25});
/// auto loss = task_loss(x + r.y) + 0.01 * r.aux_loss;   // r.dropped: choices over capacity
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
/// What moves: each device is a group; it routes its own tokens, writes them into a dispatch
/// tensor [G, E, C, D] (G = the devices along A, one group each, split over A), which one
/// all-to-all reshards so that the experts' dim is split over X (each device then holds the slots
/// of its experts from every group of its expert group); the experts run as two batched einsums
/// on local blocks; one all-to-all brings their outputs back, and each device combines its tokens'
/// rows. One small all-reduce over A (the experts' first-choice counts and the drops: the aux
/// loss's f and the report) and, in the aux loss, the mean of the probabilities. The backward is
/// the two all-to-alls the other way. Dispatch and combine are local index kernels
/// (kernels/moe.hpp), not the dense one-hot einsums of GShard's paper (the tests' oracle).
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

#include <cstdint>
#include <memory>
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
};

/// What this device's last moe() call routed, over the whole layer (every group).
struct MoeStats {
  std::int64_t tokens = 0;     ///< tokens routed (all groups)
  std::int64_t choices = 0;    ///< tokens * top_k
  std::int64_t dropped = 0;    ///< choices over their expert's capacity (no expert output, no gradient)
  std::int64_t capacity = 0;   ///< slots per expert and group
  std::vector<std::int64_t> first_choice;  ///< per expert: tokens whose first choice it is
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

}  // namespace detail

/// The mixture-of-experts layer (see the file comment) on x [T, D] (a Var or tensor split over
/// its token axes along dim 0, D whole), router [D, E], w1 [E, D, F], w2 [E, F, D] (Params, Vars
/// or tensors; resharded, recorded, to the layout the layer computes in: the router replicated,
/// the experts split over w1's expert axes). Throws std::invalid_argument for shapes that do not
/// fit, a capacity factor <= 0 or top-k outside [1, E], and std::domain_error, on every device,
/// when a router probability is NaN or infinite (NaN router logits).
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
  static_assert(std::is_same_v<T, typename tensor_of_t<R>::value_type> && std::is_same_v<T, typename tensor_of_t<W1>::value_type> &&
                    std::is_same_v<T, typename tensor_of_t<W2>::value_type>,
                "shardlib: moe: x, router, w1 and w2 must have one element type");
  using TokSpec = spec_from_t<MeshT, decltype([] { return rule.tokens; })>;
  using DispSpec = spec_from_t<MeshT, decltype([] { return rule.dispatched; })>;
  using ExpSpec = spec_from_t<MeshT, decltype([] { return rule.experts; })>;
  using WSpec = spec_from_t<MeshT, decltype([] { return rule.weights; })>;
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

  // The router: probabilities [T, E], split as the tokens.
  const auto xt = shardlib::reshard<TokSpec>(x);
  const auto probs = shardlib::softmax<1>(shardlib::matmul(xt, shardlib::reshard<Spec<none, none>>(router)));
  const Tok& tv = value(xt);
  const std::int64_t local = tv.block().extent[0];
  // Route this group's tokens (on the host), then agree on the counts over the groups.
  auto index = std::make_shared<detail::MoeIndex<Mem>>();
  {
    const auto host = detail::moe_host_block(value(probs));
    index->route = moe_route(host.data(), local, E, opts.top_k, capacity, opts.normalize_gates && opts.top_k > 1);
  }
  const MoeRouting& rt = index->route;
  std::vector<std::int64_t> counts(rt.first_choice);
  counts.push_back(rt.dropped);
  counts.push_back(rt.non_finite);
  ctx.group(mesh, rule.tokens.dims[0]).all_reduce(counts.data(), counts.data(), counts.size(), coll::DType::i64, coll::Op::sum);
  const std::int64_t dropped = counts[static_cast<std::size_t>(E)], bad = counts[static_cast<std::size_t>(E) + 1];
  if (bad > 0)
    throw std::domain_error("shardlib: moe: the router's probabilities are NaN or infinite for " + std::to_string(bad) + " of " +
                            std::to_string(tokens) + " tokens (NaN or infinite router logits: x or the router weights)");
  MoeStats& stats = moe_stats(ctx);
  stats.tokens = tokens, stats.choices = tokens * opts.top_k, stats.dropped = dropped, stats.capacity = capacity;
  stats.first_choice.assign(counts.begin(), counts.begin() + E);
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
  // The experts: one all-to-all onto the experts' axes, two batched einsums, one all-to-all back.
  const auto at_experts = shardlib::reshard<ExpSpec>(dispatched);
  const auto h = shardlib::gelu(shardlib::einsum<"gecd,edf->gecf">(at_experts, shardlib::reshard<WSpec>(w1)));
  const auto out = shardlib::reshard<DispSpec>(shardlib::einsum<"gecf,efd->gecd">(h, shardlib::reshard<WSpec>(w2)));
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
  if constexpr (VarType<X> || VarType<R> || VarType<W1> || VarType<W2>)
    return MoeResult<std::remove_cvref_t<decltype(combined)>, std::remove_cvref_t<decltype(aux)>>{combined, aux, dropped};
  else
    return MoeResult<Tok, std::remove_cvref_t<decltype(aux)>>{value(combined), aux, dropped};
}

}  // namespace shardlib
