// SPDX-License-Identifier: Apache-2.0
/// @file
/// Differentiable whole-array neighbour ops: `roll` (backward: the gradient rolled back, the
/// same exchange), `shift` (backward: the gradient shifted back, zeros where cells fell off),
/// `pad` with a zero or Dirichlet boundary (backward: the interior sliced out of the gradient)
/// and `where` (backward: the gradient routed to the operand each element was taken from).
///
/// pad with a periodic, reflect or edge boundary copies cells into the padding; its backward
/// (those copies' gradients folded back onto their sources) is not written: pad of a Var with
/// such a boundary throws std::invalid_argument.
#pragma once

#include <shardlib/autodiff/record.hpp>
#include <shardlib/ops/shift.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace shardlib {

namespace fn::grad {
/// `c ? g : 0` and `c ? 0 : g`: where's gradient for `a` and for `b`.
template <bool First>
struct select {
  template <class C, class G>
  KOKKOS_INLINE_FUNCTION constexpr G operator()(const C& c, const G& g) const {
    return (c != 0) == First ? g : G(0);
  }
};
}  // namespace fn::grad

namespace autodiff::detail {
/// `f` of `t` sliced to [w[k].lo, w[k].lo + shape[k]) along every dim k from K on (pad's backward).
template <std::size_t K, class G, std::size_t N, class S, class F>
void interior(const G& t, const std::array<PadWidth, N>& w, const S& shape, F&& f) {
  if constexpr (K == N) f(t);
  else interior<K + 1>(shardlib::slice<static_cast<int>(K)>(t, w[K].lo, w[K].lo + shape[K]), w, shape, f);
}
}  // namespace autodiff::detail

/// roll of a Var; backward: roll of the gradient by -shift (the same exchange).
template <VarType A>
auto roll(const A& a, std::int64_t by, int dim) {
  return autodiff::detail::record(
      "roll", shardlib::roll(a.value(), by, dim),
      [na = a.node(), by, dim](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, shardlib::roll(g, -by, dim)); },
      a.node());
}
template <int Dim, VarType A>
auto roll(const A& a, std::int64_t by) {
  return autodiff::detail::record(
      "roll", shardlib::roll<Dim>(a.value(), by),
      [na = a.node(), by](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, shardlib::roll<Dim>(g, -by)); },
      a.node());
}

/// shift of a Var; backward: the gradient shifted by -shift with zeros (the fill is a constant).
template <VarType A>
auto shift(const A& a, std::int64_t by, int dim, typename autodiff::detail::tensor_of_t<A>::value_type fill = {}) {
  return autodiff::detail::record(
      "shift", shardlib::shift(a.value(), by, dim, fill),
      [na = a.node(), by, dim](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, shardlib::shift(g, -by, dim)); },
      a.node());
}
template <int Dim, VarType A>
auto shift(const A& a, std::int64_t by, typename autodiff::detail::tensor_of_t<A>::value_type fill = {}) {
  return autodiff::detail::record(
      "shift", shardlib::shift<Dim>(a.value(), by, fill),
      [na = a.node(), by](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, shardlib::shift<Dim>(g, -by)); },
      a.node());
}

/// pad of a Var with a zero or Dirichlet boundary; backward: the gradient's interior (a slice
/// along each dim). Throws std::invalid_argument for a periodic, reflect or edge boundary.
template <VarType A, std::size_t N>
auto pad(const A& a, const PadWidth (&widths)[N], Boundary boundary = Boundary::zero()) {
  using In = autodiff::detail::tensor_of_t<A>;
  if (boundary.kind == Boundary::Kind::periodic || boundary.kind == Boundary::Kind::reflect ||
      boundary.kind == Boundary::Kind::edge)
    throw std::invalid_argument("shardlib: pad of a Var (" + detail::operand_text(a.value()) + ") with a " + boundary.to_string() +
                                " boundary: its backward is not implemented (zero and dirichlet boundaries are)");
  std::array<PadWidth, N> w{};
  for (std::size_t d = 0; d < N; ++d) w[d] = widths[d];
  const typename In::Shape shape = a.value().shape();
  return autodiff::detail::record(
      "pad", shardlib::pad(a.value(), widths, boundary),
      [na = a.node(), w, shape](const auto& g, autodiff::BackwardPass& p) {
        autodiff::detail::interior<0>(g, w, shape, [&](const auto& t) { give(p, 0, *na, t); });
      },
      a.node());
}

/// where with a Var (or tensor) `a` and `b` (the condition is an integer tensor: no gradient);
/// backward: `a` gets the gradient where the condition holds, `b` where it does not (summed over
/// the dims each was broadcast along). Partial `a` or `b` are resolved first (recorded reshards).
template <TensorType C, class A, class B>
  requires DifferentiableOperands<A, B>
auto where(const C& cond, const A& a0, const B& b0) {
  using namespace autodiff::detail;
  require_same_element_type<tensor_of_t<A>, tensor_of_t<B>>();
  const auto& a = resolved(a0);
  const auto& b = resolved(b0);
  return record("where", shardlib::where(cond, value(a), value(b)),
                [na = node(a), nb = node(b), cond](const auto& g, autodiff::BackwardPass& p) {
                  if (na) give(p, 0, *na, zip(fn::grad::select<true>{}, cond, g));
                  if (nb) give(p, 1, *nb, zip(fn::grad::select<false>{}, cond, g));
                },
                node(a), node(b));
}

}  // namespace shardlib
