// SPDX-License-Identifier: Apache-2.0
/// @file
/// The sharding rule of the mixture-of-experts layer (moe/moe.hpp), `moe(x, router, w1, w2)` on
/// tokens x [T, D], experts w1 [E, D, F] and w2 [E, F, D]:
///
///  1. x of rank 2, w1 and w2 of rank 3 (else `tokens_not_rank_2`, `weights_not_rank_3`).
///  2. The tokens may be split over axes A (data parallel); their model dim D not
///     (`model_dim_split`); nothing partial (`partial_tokens`).
///  3. The experts are split over X = the axes that split w1's expert dim, which must be among A
///     (`experts_not_over_token_axes`; GShard: the experts live on the devices of the tokens).
///     Each expert's hidden dim F may be split over axes M = those that split w1's F, none of A
///     (`hidden_over_token_axes`; Megatron's tensor parallelism of each expert, the tokens
///     replicated over M): w1 computes in [X, -, M] and w2 in [X, M, -] (their model dims
///     whole), and the second einsum's partial sums over M are all-reduced where the experts
///     run.
///  4. The dispatch tensor [G, E, C, D] (G = the groups: the devices along A) is split over A
///     along G as the routing fills it (`dispatched`), and over A \ X along G and X along E where
///     the experts run (`experts`): the reshard between the two is the layer's all-to-all.
///
/// Pure rule: constexpr, no Kokkos, no communicator; never throws for bad input.
#pragma once

#include <shardlib/mesh.hpp>
#include <shardlib/sharding/rule.hpp>
#include <shardlib/spec.hpp>

namespace shardlib {

/// The layouts of moe() (see the file comment).
struct MoeRule {
  enum Status : std::uint8_t {
    ok = 0,
    tokens_not_rank_2,
    weights_not_rank_3,
    model_dim_split,
    partial_tokens,
    experts_not_over_token_axes,
    hidden_over_token_axes,
  };
  Status status = ok;
  Sharding tokens{};      ///< x [T, D]: A, whole
  Sharding w1{};          ///< w1 [E, D, F]: X, whole, M
  Sharding w2{};          ///< w2 [E, F, D]: X, M, whole
  Sharding dispatched{};  ///< [G, E, C, D]: A, whole, whole, whole
  Sharding experts{};     ///< [G, E, C, D]: A \ X, X, whole, whole
  AxisList hidden{};      ///< M: the axes of each expert's hidden dim (empty: not split)
};

/// The rule of moe(x, router, w1, w2) for the shardings of x, w1 and w2 (see the file comment).
constexpr MoeRule moe_rule(const Sharding& x, const Sharding& w1, const Sharding& w2) {
  MoeRule r;
  if (x.rank != 2) return r.status = MoeRule::tokens_not_rank_2, r;
  if (w1.rank != 3 || w2.rank != 3) return r.status = MoeRule::weights_not_rank_3, r;
  if (!x.dims[1].empty()) return r.status = MoeRule::model_dim_split, r;
  if (!x.partial.empty()) return r.status = MoeRule::partial_tokens, r;
  const AxisList& a = x.dims[0];
  const AxisList& ex = w1.dims[0];
  for (int axis : ex)
    if (!a.contains(axis)) return r.status = MoeRule::experts_not_over_token_axes, r;
  const AxisList& m = w1.dims[2];
  for (int axis : m)
    if (a.contains(axis)) return r.status = MoeRule::hidden_over_token_axes, r;
  r.tokens.rank = 2;
  r.tokens.dims[0] = a;
  r.hidden = m;
  r.w1.rank = r.w2.rank = 3;
  r.w1.dims[0] = r.w2.dims[0] = ex;
  r.w1.dims[2] = r.w2.dims[1] = m;
  r.dispatched.rank = 4;
  r.dispatched.dims[0] = a;
  r.experts.rank = 4;
  for (int axis : a)
    if (!ex.contains(axis)) r.experts.dims[0].push_back(axis);
  r.experts.dims[1] = ex;
  return r;
}

}  // namespace shardlib
