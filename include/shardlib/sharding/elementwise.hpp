// SPDX-License-Identifier: Apache-2.0
/// @file
/// The sharding rule of elementwise ops: `a + b`, `a * b`, `exp(a)`, `where(c, a, b)`...
///
/// The rule, step by step (`in[i]`: the sharding operand i must have when the local kernel runs):
///  1. One to three operands. The output's rank is the largest operand rank; operands align to
///     the right (numpy broadcasting by rank). Extent-1 broadcasting is the op layer's matter:
///     the rule never sees extents.
///  2. Partial operands. Only a partial *sum* is ever kept (the output stays partial over the
///     same axes and the operand is not reduced); partial max/min operands are always reduced.
///     - `additive` (a + b, a - b, -a): kept when every operand is partial-sum over the same
///       axis set; otherwise every partial operand is reduced.
///     - `scaling` (a * b, s * a): with one operand, kept. With two, kept when exactly one is
///       partial-sum and the other is not partial at all. With three, all reduced.
///     - `quotient` (a / b): as `scaling`, but only operand 0 may stay partial (b / partial
///       is not linear in the partial operand).
///     - `nonlinear` (exp, max(a, b), ...): every partial operand is reduced.
///     Operands that are not partial are replicated over the kept partial axes (an axis never
///     both splits a dim and is partial).
///  3. Dims, outermost first: each operand that has output dim d offers its axis list for that
///     dim, less the axes already taken (by an outer dim or by the kept partial clause). The
///     offer with the most axes wins, ties to the lowest operand index (as GSPMD, the more
///     sharded layout is kept); its axes are taken.
///  4. `in[i]` is the output's layout on operand i's aligned dims, partial only where kept: an
///     operand that already agrees is not touched, a replicated one meeting a sharded one only
///     slices locally.
///
/// Pure rule: constexpr, no Kokkos, no communicator; never throws for bad input.
#pragma once

#include <shardlib/detail/array_ref.hpp>
#include <shardlib/mesh.hpp>
#include <shardlib/sharding/rule.hpp>
#include <shardlib/spec.hpp>

#include <array>
#include <cstddef>
#include <cstdint>

namespace shardlib {

/// How an elementwise op treats partial-sum operands (see the file comment for the rule).
enum class Linearity : std::uint8_t {
  nonlinear,  ///< exp(a), max(a, b), ...: every partial operand is reduced first
  additive,   ///< a + b, a - b, -a: partial-sum operands over the same axis set stay partial
  scaling,    ///< a * b, s * a: linear in either operand, one at a time
  quotient,   ///< a / b: linear in operand 0 only
};

/// The sharding rule of an elementwise op of `kind` over 1 to 3 `operands` (see the file
/// comment). `count` = number of operands; `comm` is always empty. Status `rank_mismatch`
/// with `operand` = 3 (0 for none) when there are not 1 to 3 operands, or `operand` = i when
/// operand i has a rank outside 0..max_tensor_rank.
constexpr OpRule elementwise_rule(Linearity kind, detail::ArrayRef<Sharding> operands) {
  using detail::is_partial_sum;
  using detail::without;
  OpRule r;
  const int n = static_cast<int>(operands.size());
  if (n < 1 || n > 3) {
    r.status = OpRule::rank_mismatch;
    r.operand = n < 1 ? 0 : 3;
    return r;
  }
  auto op = [&](int i) -> const Sharding& { return operands[static_cast<std::size_t>(i)]; };
  r.count = n;
  int rank = 0;
  for (int i = 0; i < n; ++i) {
    if (op(i).rank < 0 || op(i).rank > static_cast<int>(max_tensor_rank)) {
      r.status = OpRule::rank_mismatch;
      r.operand = i;
      return r;
    }
    if (op(i).rank > rank) rank = op(i).rank;
  }

  // Which operands keep their partial clause (all keep the same axis set).
  std::array<bool, 3> keep{};
  switch (kind) {
    case Linearity::additive: {
      bool all = true;
      for (int i = 0; i < n; ++i)
        all = all && is_partial_sum(op(i)) && detail::sorted_axes(op(i).partial) == detail::sorted_axes(op(0).partial);
      for (int i = 0; i < n; ++i) keep[static_cast<std::size_t>(i)] = all;
      break;
    }
    case Linearity::scaling:
    case Linearity::quotient:
      if (n == 1) {
        keep[0] = is_partial_sum(op(0));
      } else if (n == 2) {
        keep[0] = is_partial_sum(op(0)) && !op(1).is_partial();
        keep[1] = kind == Linearity::scaling && is_partial_sum(op(1)) && !op(0).is_partial();
      }
      break;
    case Linearity::nonlinear: break;
  }
  AxisList kept;
  for (int i = 0; i < n; ++i)
    if (keep[static_cast<std::size_t>(i)]) kept = detail::sorted_axes(op(i).partial);

  // Dims, outermost first: the offer with the most axes not yet taken wins.
  AxisList used = kept;
  r.out.rank = rank;
  r.out.partial = kept;
  for (int d = 0; d < rank; ++d) {
    AxisList best;
    bool offered = false;
    for (int i = 0; i < n; ++i) {
      const int j = d - (rank - op(i).rank);
      if (j < 0) continue;
      const AxisList c = without(op(i).dims[static_cast<std::size_t>(j)], used);
      if (!offered || c.size() > best.size()) best = c;
      offered = true;
    }
    r.out.dims[static_cast<std::size_t>(d)] = best;
    for (int a : best) used.push_back(a);
  }

  // Each operand takes the output's layout on its aligned dims.
  for (int i = 0; i < n; ++i) {
    Sharding& s = r.in[static_cast<std::size_t>(i)];
    s.rank = op(i).rank;
    for (int j = 0; j < s.rank; ++j)
      s.dims[static_cast<std::size_t>(j)] = r.out.dims[static_cast<std::size_t>(j + rank - s.rank)];
    if (keep[static_cast<std::size_t>(i)]) {
      s.partial = op(i).partial;  // its own order: a kept clause is never resharded
      s.op = op(i).op;
    }
  }
  return r;
}

}  // namespace shardlib
