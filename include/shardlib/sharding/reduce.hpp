// SPDX-License-Identifier: Apache-2.0
/// @file
/// Sharding rules of reductions along one dim, and of the normalisations that need a whole row.
///
/// | op | operand when the kernel runs | output | op's own collective |
/// |---|---|---|---|
/// | sum, mean along `dim` | partial sum kept, other partials reduced | dims without `dim` (keepdim: replicated, extent 1); partial sum over kept partial ∪ axes of `dim` | none |
/// | max / min along `dim` | max keeps a partial max, min a partial min; other partials reduced | as sum, partial max / min | none |
/// | argmax along `dim` | partials reduced | dims without `dim`; not partial | over the axes of `dim` (the op finds the global argmax itself) |
/// | softmax, log_softmax, layer_norm, rms_norm along `dim` | partials reduced | the operand's layout | over the axes of `dim` (row statistics) |
///
/// A reduction along a split dim leaves each device a reduction of its own block: the output is
/// then partial over the dim's axes (mean divides by the global extent, so its addends sum to the
/// mean), and the pending reduction runs only when a later op or a conversion needs the value.
/// Pure rules: every function is constexpr and answers bad input with a status, never a throw.
#pragma once

#include <shardlib/sharding/rule.hpp>

#include <cstddef>
#include <cstdint>

namespace shardlib {

/// Reductions along one dim.
enum class Reduction : std::uint8_t { sum, mean, max, min, argmax };

namespace detail::reduce_rules {
/// `a` followed by the axes of `b` it lacks.
constexpr AxisList axes_union(AxisList a, const AxisList& b) {
  for (int x : b)
    if (!a.contains(x)) a.push_back(x);
  return a;
}
/// A rule answering "dim `dim` is outside the rank of operand `operand`".
constexpr OpRule bad_dim(int operand, int dim, int count) {
  OpRule r;
  r.status = OpRule::dim_out_of_range;
  r.operand = operand;
  r.dim = dim;
  r.count = count;
  return r;
}
constexpr bool dim_in_range(const Sharding& s, int dim) noexcept { return dim >= 0 && dim < s.rank; }
}  // namespace detail::reduce_rules

/// The rule of reduction `r` of `in` along `dim` (0 <= dim < in.rank; else dim_out_of_range).
/// A partial operand stays partial when the reduction commutes with its pending one (sum and mean
/// with partial sum, max with partial max, min with partial min) and is reduced otherwise; the
/// output drops `dim` (keepdim: keeps it, replicated) and is partial over the kept partial axes
/// and the axes `dim` was split over. argmax reduces its operand, is never partial, and
/// communicates over the axes of `dim` itself (`comm`).
constexpr OpRule reduce_rule(Reduction r, const Sharding& in, int dim, bool keepdim) {
  if (!detail::reduce_rules::dim_in_range(in, dim)) return detail::reduce_rules::bad_dim(0, dim, 1);
  const auto ud = static_cast<std::size_t>(dim);
  OpRule rule;
  rule.count = 1;
  const bool keep = in.is_partial() &&
                    (((r == Reduction::sum || r == Reduction::mean) && in.op == ReduceOp::sum) ||
                     (r == Reduction::max && in.op == ReduceOp::max) || (r == Reduction::min && in.op == ReduceOp::min));
  rule.in[0] = keep ? in : detail::reduced(in);
  Sharding& out = rule.out;
  for (int d = 0; d < in.rank; ++d) {
    if (d == dim) {
      if (keepdim) out.dims[static_cast<std::size_t>(out.rank++)] = AxisList{};
      continue;
    }
    out.dims[static_cast<std::size_t>(out.rank++)] = in.dims[static_cast<std::size_t>(d)];
  }
  if (r == Reduction::argmax) {
    rule.comm = in.dims[ud];
    return rule;
  }
  out.partial = detail::sorted_axes(detail::reduce_rules::axes_union(rule.in[0].partial, in.dims[ud]));
  if (out.is_partial())
    out.op = r == Reduction::max ? ReduceOp::max : r == Reduction::min ? ReduceOp::min : ReduceOp::sum;
  return rule;
}

/// The rule of a normalisation along `dim` (softmax, log_softmax, layer_norm, rms_norm): the
/// operand is reduced (these are not linear), the output has its layout, and the op runs its
/// row statistics over the axes `dim` is split over (`comm`). dim_out_of_range for a bad dim.
constexpr OpRule normalize_rule(const Sharding& in, int dim) {
  if (!detail::reduce_rules::dim_in_range(in, dim)) return detail::reduce_rules::bad_dim(0, dim, 1);
  OpRule rule;
  rule.count = 1;
  rule.in[0] = detail::reduced(in);
  rule.out = rule.in[0];
  rule.comm = in.dims[static_cast<std::size_t>(dim)];
  return rule;
}

}  // namespace shardlib
