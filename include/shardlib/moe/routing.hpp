// SPDX-License-Identifier: Apache-2.0
/// @file
/// The routing of a mixture-of-experts layer, on one group of tokens (GShard's groups: the
/// tokens one device holds): which experts each token goes to, into which slot, with which gate.
///
/// - Each token's k most probable experts (top-1: Switch; top-2: GShard), ties to the lower index.
/// - Capacity: every expert has `capacity` slots per group, C = ceil(k T cf / E) for T tokens in
///   the group and a capacity factor cf (`moe_capacity`). Slots are filled choice by choice — every
///   token's first choice, in token order, before any second choice (GShard's priority) — and a
///   choice whose expert is full is dropped: it contributes nothing (the residual carries the
///   token), and gets no gradient.
/// - Gates: the router probability of the choice (Switch), or, with `normalize`, the
///   probabilities of the token's k choices divided by their sum (GShard's top-2), dropped choices
///   included in the sum.
///
/// Pure host code: no Kokkos, no communicator.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardlib {

/// Slots per expert and group: ceil(k * tokens * capacity_factor / experts), at least 1 when the
/// group has a token. Throws std::invalid_argument for a capacity factor that is not > 0 and
/// finite, k outside [1, experts], or no expert.
inline std::int64_t moe_capacity(std::int64_t tokens, std::int64_t experts, int k, double capacity_factor) {
  if (experts < 1) throw std::invalid_argument("shardlib: moe: " + std::to_string(experts) + " experts; a layer needs 1 or more");
  if (k < 1 || k > experts)
    throw std::invalid_argument("shardlib: moe: top-k " + std::to_string(k) + " with " + std::to_string(experts) +
                                " experts; k must be in [1, " + std::to_string(experts) + "]");
  if (!(capacity_factor > 0) || !std::isfinite(capacity_factor))
    throw std::invalid_argument("shardlib: moe: capacity factor " + std::to_string(capacity_factor) +
                                "; it must be > 0 (1.0: each expert takes its even share of the choices)");
  if (tokens <= 0) return 0;
  const double c = std::ceil(static_cast<double>(k) * static_cast<double>(tokens) * capacity_factor / static_cast<double>(experts));
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(c));
}

/// One group's routing (see the file comment). Choice i = t k + j is token t's j-th choice.
struct MoeRouting {
  std::int64_t tokens = 0, experts = 0, capacity = 0;
  int k = 1;
  std::vector<std::int64_t> token_slot;     ///< per choice: its slot e C + c, or -1 when dropped
  std::vector<std::int64_t> choice_expert;  ///< per choice: its expert
  std::vector<double> prob;                 ///< per choice: the router probability
  std::vector<double> gate;                 ///< per choice: its gate (0 when dropped)
  std::vector<std::int64_t> slot_token;     ///< per slot: its token, or -1 when empty
  std::vector<std::int64_t> slot_choice;    ///< per slot: its choice t k + j, or -1 when empty
  std::vector<std::int64_t> first_choice;   ///< per expert: tokens whose first choice it is
  std::vector<std::int64_t> kept;           ///< per expert: slots filled
  std::int64_t dropped = 0;                 ///< choices dropped (over capacity)
  std::int64_t non_finite = 0;              ///< tokens with a NaN or infinite probability (not routed)
};

/// A routing of `tokens` tokens with nothing routed yet: every array at its size, no slot filled.
inline MoeRouting moe_routing_empty(std::int64_t tokens, std::int64_t experts, int k, std::int64_t capacity) {
  MoeRouting r;
  r.tokens = tokens, r.experts = experts, r.capacity = capacity, r.k = k;
  const auto nk = static_cast<std::size_t>(tokens * k), ns = static_cast<std::size_t>(experts * capacity);
  r.token_slot.assign(nk, -1);
  r.choice_expert.assign(nk, 0);
  r.prob.assign(nk, 0.0);
  r.gate.assign(nk, 0.0);
  r.slot_token.assign(ns, -1);
  r.slot_choice.assign(ns, -1);
  r.first_choice.assign(static_cast<std::size_t>(experts), 0);
  r.kept.assign(static_cast<std::size_t>(experts), 0);
  return r;
}

/// Routes `tokens` rows of `experts` probabilities (`probs`, row-major, any arithmetic type)
/// into `capacity` slots per expert, k choices per token (see the file comment).
template <class P>
MoeRouting moe_route(const P* probs, std::int64_t tokens, std::int64_t experts, int k, std::int64_t capacity, bool normalize) {
  MoeRouting r = moe_routing_empty(tokens, experts, k, capacity);
  std::vector<bool> routed(static_cast<std::size_t>(tokens), true);
  // Each token's k choices, most probable first (ties: the lower expert).
  for (std::int64_t t = 0; t < tokens; ++t) {
    const P* row = probs + t * experts;
    bool finite = true;
    for (std::int64_t e = 0; e < experts; ++e) finite = finite && std::isfinite(static_cast<double>(row[e]));
    if (!finite) {
      routed[static_cast<std::size_t>(t)] = false;
      ++r.non_finite;
      continue;
    }
    double total = 0;
    for (int j = 0; j < k; ++j) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || r.choice_expert[static_cast<std::size_t>(t * k + i)] == e;
        if (!taken && (best < 0 || static_cast<double>(row[e]) > static_cast<double>(row[best]))) best = e;
      }
      const auto i = static_cast<std::size_t>(t * k + j);
      r.choice_expert[i] = best;
      r.prob[i] = static_cast<double>(row[best]);
      total += r.prob[i];
    }
    ++r.first_choice[static_cast<std::size_t>(r.choice_expert[static_cast<std::size_t>(t * k)])];
    for (int j = 0; j < k; ++j) {
      const auto i = static_cast<std::size_t>(t * k + j);
      r.gate[i] = normalize ? r.prob[i] / total : r.prob[i];
    }
  }
  // Slots: first choices of every token, then second ones, in token order.
  for (int j = 0; j < k; ++j)
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (!routed[static_cast<std::size_t>(t)]) continue;
      const auto i = static_cast<std::size_t>(t * k + j);
      const auto e = static_cast<std::size_t>(r.choice_expert[i]);
      if (r.kept[e] >= capacity) {
        ++r.dropped;
        r.gate[i] = 0;
        continue;
      }
      const std::int64_t slot = static_cast<std::int64_t>(e) * capacity + r.kept[e]++;
      r.token_slot[i] = slot;
      r.slot_token[static_cast<std::size_t>(slot)] = t;
      r.slot_choice[static_cast<std::size_t>(slot)] = static_cast<std::int64_t>(i);
    }
  return r;
}

/// The routing a perfectly balanced router gives a group of `tokens` (planning on shapes alone,
/// where there are no probabilities to route: plan/simulate.hpp): its k * tokens choices spread
/// evenly over the experts (the first k * tokens mod E experts one more), its first choices
/// likewise, each expert keeping at most `capacity` and the rest dropped. The per-choice and
/// per-slot arrays have moe_route's sizes, unfilled (-1 and 0: no kernel reads them then).
inline MoeRouting moe_route_balanced(std::int64_t tokens, std::int64_t experts, int k, std::int64_t capacity) {
  MoeRouting r = moe_routing_empty(tokens, experts, k, capacity);
  const std::int64_t choices = tokens * k;
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t share = choices / experts + (e < choices % experts ? 1 : 0);
    r.first_choice[static_cast<std::size_t>(e)] = tokens / experts + (e < tokens % experts ? 1 : 0);
    r.kept[static_cast<std::size_t>(e)] = std::min(share, capacity);
    r.dropped += share - r.kept[static_cast<std::size_t>(e)];
  }
  return r;
}

}  // namespace shardlib
