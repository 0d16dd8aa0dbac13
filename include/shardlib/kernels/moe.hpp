// SPDX-License-Identifier: Apache-2.0
/// @file
/// The local kernels of a mixture-of-experts layer's dispatch and combine (moe/moe.hpp): rows of
/// D elements copied between a device's tokens `[tokens][D]` and its slots `[experts][capacity][D]`
/// by index arrays that the routing computed (moe/routing.hpp), and their transposes for the
/// backward. Slot s belongs to at most one token (`slot_token[s]`, -1 when empty); token t's j-th
/// choice has slot `token_slot[t * k + j]` (-1 when dropped) and gate `gate[t * k + j]`.
///
/// Portable kernels (a Kokkos range on any execution space; a host instance is fenced). Knows
/// nothing of tensors or collectives.
#pragma once

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/half.hpp>
#include <shardlib/kernels/exec.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace shardlib::kernels {
namespace detail::moe_rows {

/// slots[s, :] = tokens[slot_token[s], :], or 0 for an empty slot.
template <class T>
struct Dispatch {
  T* slots;
  const T* tokens;
  const std::int64_t* slot_token;
  std::int64_t d;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t e) const {
    const std::int64_t t = slot_token[e / d];
    slots[e] = t < 0 ? T(0) : tokens[t * d + e % d];
  }
};

/// y[t, :] = sum over t's kept choices j of gate[t k + j] slots[token_slot[t k + j], :], the gates
/// 1 when `gate` is null: the combine, and (ungated) the dispatch's transpose, which gathers the
/// slots' gradients back to their tokens.
template <class T>
struct Combine {
  T* y;
  const T* slots;
  const std::int64_t* token_slot;
  const double* gate;  // null: 1
  std::int64_t k, d;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t e) const {
    const std::int64_t t = e / d, c = e % d;
    compute_t<T> sum = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t s = token_slot[t * k + j];
      if (s < 0) continue;
      const auto x = static_cast<compute_t<T>>(slots[s * d + c]);
      sum += gate ? static_cast<compute_t<T>>(gate[t * k + j]) * x : x;
    }
    y[e] = static_cast<T>(sum);
  }
};

/// dslots[s, :] = gate of s's token choice * dy[token, :] (0 for an empty slot).
template <class T>
struct CombineSlots {
  T* dslots;
  const T* dy;
  const std::int64_t* slot_token;
  const std::int64_t* slot_choice;  // the choice index t k + j that owns slot s
  const double* gate;
  std::int64_t d;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t e) const {
    const std::int64_t s = e / d;
    const std::int64_t t = slot_token[s];
    dslots[e] = t < 0 ? T(0)
                      : static_cast<T>(static_cast<compute_t<T>>(gate[slot_choice[s]]) *
                                       static_cast<compute_t<T>>(dy[t * d + e % d]));
  }
};

/// a[i] = dy[t, :] . slots[token_slot[i], :] for choice i = t k + j (0 when dropped): the
/// gradient of the choice's gate.
template <class T>
struct GateGradient {
  double* a;
  const T* dy;
  const T* slots;
  const std::int64_t* token_slot;
  std::int64_t k, d;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t s = token_slot[i];
    double sum = 0;
    if (s >= 0) {
      const T* y = dy + (i / k) * d;
      const T* x = slots + s * d;
      for (std::int64_t c = 0; c < d; ++c) sum += static_cast<double>(y[c]) * static_cast<double>(x[c]);
    }
    a[i] = sum;
  }
};

/// The router probabilities' gradient, row t of [tokens][experts]: 0 but at t's chosen experts,
/// where it is a_j (gate = the probability p_j) or, with the gates normalised over the k choices
/// (g_j = p_j / sum p), (a_j - sum_i a_i g_i) / sum p.
template <class T>
struct ProbGradient {
  T* dp;
  const double* a;
  const double* prob;                  // p_j of each choice
  const std::int64_t* choice_expert;  // e_j of each choice
  std::int64_t k, experts;
  bool normalized;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t) const {
    T* row = dp + t * experts;
    for (std::int64_t e = 0; e < experts; ++e) row[e] = T(0);
    const std::int64_t at = t * k;
    double total = 0, mean = 0;
    if (normalized) {
      for (std::int64_t j = 0; j < k; ++j) total += prob[at + j];
      for (std::int64_t j = 0; j < k; ++j) mean += a[at + j] * prob[at + j] / total;
    }
    for (std::int64_t j = 0; j < k; ++j)
      row[choice_expert[at + j]] = static_cast<T>(normalized ? (a[at + j] - mean) / total : a[at + j]);
  }
};

}  // namespace detail::moe_rows

/// slots = tokens dispatched: `experts_capacity` slots of d elements (moe_rows::Dispatch).
template <class Exec, class T>
void moe_dispatch(const Exec& exec, T* slots, const T* tokens, const std::int64_t* slot_token, std::int64_t experts_capacity,
                  std::int64_t d) {
  if (experts_capacity > 0 && d > 0) {  // slots written; slot_token read; a token row read per slot (at most)
    const std::uint64_t rows = static_cast<std::uint64_t>(experts_capacity);
    count_kernel(rows * (2 * static_cast<std::uint64_t>(d) * sizeof(T) + sizeof(std::int64_t)));
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::moe::dispatch", experts_capacity * d, detail::moe_rows::Dispatch<T>{slots, tokens, slot_token, d});
}
/// dtokens = the slots' gradients gathered back to their tokens (dispatch's transpose).
template <class Exec, class T>
void moe_gather(const Exec& exec, T* dtokens, const T* dslots, const std::int64_t* token_slot, std::int64_t tokens,
                std::int64_t k, std::int64_t d) {
  if (tokens > 0 && d > 0) {  // dtokens written; token_slot read; a slot row read per kept choice (at most k a token)
    const std::uint64_t choices = static_cast<std::uint64_t>(tokens * k);
    count_kernel((static_cast<std::uint64_t>(tokens) + choices) * static_cast<std::uint64_t>(d) * sizeof(T) +
                 choices * sizeof(std::int64_t));
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::moe::gather", tokens * d, detail::moe_rows::Combine<T>{dtokens, dslots, token_slot, nullptr, k, d});
}
/// y = each token's gated sum of its experts' outputs.
template <class Exec, class T>
void moe_combine(const Exec& exec, T* y, const T* slots, const std::int64_t* token_slot, const double* gate, std::int64_t tokens,
                 std::int64_t k, std::int64_t d) {
  if (tokens > 0 && d > 0) {  // y written; token_slot, gate read; a slot row read per kept choice (at most k a token)
    const std::uint64_t choices = static_cast<std::uint64_t>(tokens * k);
    count_kernel((static_cast<std::uint64_t>(tokens) + choices) * static_cast<std::uint64_t>(d) * sizeof(T) +
                 choices * (sizeof(std::int64_t) + sizeof(double)));
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::moe::combine", tokens * d, detail::moe_rows::Combine<T>{y, slots, token_slot, gate, k, d});
}
/// combine's backward: the slots' gradient, the gates' (a), and the router probabilities' (dp).
template <class Exec, class T>
void moe_combine_backward(const Exec& exec, const T* dy, const T* slots, const std::int64_t* token_slot,
                          const std::int64_t* slot_token, const std::int64_t* slot_choice, const double* gate,
                          const double* prob, const std::int64_t* choice_expert, std::int64_t tokens, std::int64_t k,
                          std::int64_t experts_capacity, std::int64_t experts, std::int64_t d, bool normalized, T* dslots,
                          double* a, T* dp) {
  if (tokens > 0 || experts_capacity > 0) {  // its three kernels': each input read once, each output written once
    const std::uint64_t choices = static_cast<std::uint64_t>(tokens * k);
    const std::uint64_t row = static_cast<std::uint64_t>(d) * sizeof(T);
    // dslots written, slot_token and slot_choice read
    std::uint64_t bytes = static_cast<std::uint64_t>(experts_capacity) * (row + 2 * sizeof(std::int64_t));
    // dy read, dp written
    bytes += static_cast<std::uint64_t>(tokens) * (row + static_cast<std::uint64_t>(experts) * sizeof(T));
    // the kept choices' slot rows, token_slot, choice_expert, gate and prob read, a written
    bytes += choices * (row + 2 * sizeof(std::int64_t) + 3 * sizeof(double));
    count_kernel(bytes);
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::moe::combine_slots", experts_capacity * d,
                        detail::moe_rows::CombineSlots<T>{dslots, dy, slot_token, slot_choice, gate, d});
  detail::portable::run(exec, "shardlib::moe::gate_gradient", tokens * k,
                        detail::moe_rows::GateGradient<T>{a, dy, slots, token_slot, k, d});
  detail::portable::run(exec, "shardlib::moe::prob_gradient", tokens,
                        detail::moe_rows::ProbGradient<T>{dp, a, prob, choice_expert, k, experts, normalized});
}

}  // namespace shardlib::kernels
