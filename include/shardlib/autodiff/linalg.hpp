// SPDX-License-Identifier: Apache-2.0
/// @file
/// Differentiable contractions: `einsum` and `matmul` on Vars.
///
/// The backward of `einsum<"A,B->C">(a, b)` is two einsums of the forward kind:
/// `einsum<"C,B->A">(g, b)` and `einsum<"A,C->B">(a, g)`, so their shardings follow from the same
/// rule: the column-parallel product's input gradient is partial over the split dim (resolved by
/// one all_reduce where it meets a replicated input), a data-parallel weight's gradient is partial
/// over "data" (resolved at the parameter).
#pragma once

#include <shardlib/autodiff/record.hpp>

namespace shardlib {

namespace error {
/// An einsum label appears in one operand only and not in the output (summed over one operand):
/// its gradient would need a broadcast that the backward of einsum does not do; sum the operand
/// along that dim first.
template <OpName Subscripts, char Label>
struct einsum_label_summed_over_one_operand_is_not_differentiable;
}  // namespace error

namespace autodiff::detail {

/// The first label of operand `which` summed over that operand alone, or 0.
constexpr char summed_alone(const EinsumSubscripts& s, int which) {
  const auto& in = s.in[static_cast<std::size_t>(which)];
  const auto& other = s.in[static_cast<std::size_t>(1 - which)];
  for (int i = 0; i < s.rank[static_cast<std::size_t>(which)]; ++i) {
    const char c = in[static_cast<std::size_t>(i)];
    bool found = false;
    for (int j = 0; j < s.rank[static_cast<std::size_t>(1 - which)]; ++j) found = found || other[static_cast<std::size_t>(j)] == c;
    for (int j = 0; j < s.out_rank; ++j) found = found || s.out[static_cast<std::size_t>(j)] == c;
    if (!found) return c;
  }
  return 0;
}

/// "X,Y->Z" from label lists (for the backward einsums).
constexpr OpName join_subscripts(const std::array<char, max_tensor_rank>& x, int nx,
                                 const std::array<char, max_tensor_rank>& y, int ny,
                                 const std::array<char, max_tensor_rank>& z, int nz) {
  OpName s("");
  std::size_t k = 0;
  for (int i = 0; i < nx; ++i) s.text[k++] = x[static_cast<std::size_t>(i)];
  s.text[k++] = ',';
  for (int i = 0; i < ny; ++i) s.text[k++] = y[static_cast<std::size_t>(i)];
  s.text[k++] = '-';
  s.text[k++] = '>';
  for (int i = 0; i < nz; ++i) s.text[k++] = z[static_cast<std::size_t>(i)];
  return s;
}

template <OpName Sub>
inline constexpr EinsumSubscripts parsed = parse_einsum(std::string_view(Sub.text));

/// The differentiable einsum of operands `a`, `b` (Vars or tensors) with subscripts `Sub`; with
/// `c` (a third operand, `Added`), of `c + einsum` (einsum_add: `c` folded into the GEMM where
/// it can be, its gradient `g` as the add's).
template <OpName Name, OpName Sub, class A, class B, bool Added = false, class C = A>
auto einsum_var(const A& a, const B& b, const C* c = nullptr) {
  constexpr EinsumSubscripts s = parsed<Sub>;
  auto out = [&] {
    if constexpr (Added) return einsum_add_op<Name, Sub>(value(a), value(b), value(*c));
    else return einsum_op<Name, Sub>(value(a), value(b));
  }();
  if constexpr (s.status == OpRule::ok && s.n_in == 2) {
    constexpr char alone_a = summed_alone(s, 0), alone_b = summed_alone(s, 1);
    SHARDLIB_STATIC_REQUIRE((alone_a == 0 && alone_b == 0),
                            "shardlib: an einsum label summed over one operand alone is not differentiable",
                            error::einsum_label_summed_over_one_operand_is_not_differentiable<Sub, (alone_a ? alone_a : alone_b)>);
    static constexpr OpName ga = join_subscripts(s.out, s.out_rank, s.in[1], s.rank[1], s.in[0], s.rank[0]);
    static constexpr OpName gb = join_subscripts(s.in[0], s.rank[0], s.out, s.out_rank, s.in[1], s.rank[1]);
    using AT = tensor_of_t<A>;
    using BT = tensor_of_t<B>;
    auto na = node(a);
    auto nb = node(b);
    std::optional<AT> sa;
    std::optional<BT> sb;
    // An operand the backward can compute again (reshard(v, sl::recompute)) is not kept: the
    // rule recomputes it.
    if (nb && !(na && na->recomputable())) sa = value(a);
    if (na && !(nb && nb->recomputable())) sb = value(b);
    // (Operands of other ranks than the subscripts': the forward has said so; the backward's
    // einsums are not instantiated, to say it once.)
    constexpr bool fits = static_cast<int>(AT::rank) == s.rank[0] && static_cast<int>(BT::rank) == s.rank[1];
    auto rule = [na, nb, sa = std::move(sa), sb = std::move(sb)](const auto& g, BackwardPass& p) {
      if constexpr (fits) {
        if (na) give(p, 0, *na, einsum_op<Name, ga>(g, sb ? *sb : nb->recompute()));
        if (nb) give(p, 1, *nb, einsum_op<Name, gb>(sa ? *sa : na->recompute(), g));
      }
    };
    if constexpr (Added) {
      auto nc = node(*c);
      return record(Name.text, std::move(out),
                    [rule = std::move(rule), nc](const auto& g, BackwardPass& p) {
                      rule(g, p);
                      if (nc) give(p, 2, *nc, g);
                    },
                    na, nb, nc);
    } else {
      return record(Name.text, std::move(out), std::move(rule), na, nb);
    }
  } else {
    return out;
  }
}
}  // namespace autodiff::detail

/// Einstein summation with a Var operand (see einsum of tensors); differentiable in both.
template <OpName Subscripts, class A, class B>
  requires DifferentiableOperands<A, B>
auto einsum(const A& a, const B& b) {
  return autodiff::detail::einsum_var<"einsum", Subscripts>(a, b);
}

/// `c + einsum<Subscripts>(a, b)` with a Var operand (see einsum_add of tensors): `c` folded into
/// the GEMM where it lies as the product does; differentiable in all three.
template <OpName Subscripts, class A, class B, class C>
  requires DifferentiableOperands<A, B, C>
auto einsum_add(const A& a, const B& b, const C& c) {
  return autodiff::detail::einsum_var<"einsum_add", Subscripts, A, B, true>(a, b, &c);
}

/// Matrix product with a Var operand (see matmul of tensors).
template <class A, class B>
  requires DifferentiableOperands<A, B>
auto matmul(const A& a, const B& b) {
  constexpr std::size_t ra = autodiff::detail::tensor_of_t<A>::rank, rb = autodiff::detail::tensor_of_t<B>::rank;
  SHARDLIB_STATIC_REQUIRE((ra >= 2 && (rb == 2 || rb == ra)),
                          "shardlib: matmul needs rank >= 2 operands: equal ranks, or a rank-2 right operand",
                          error::op_has_no_sharding_rule_for_these_specs<"matmul", OpRule::rank_mismatch,
                                                                         typename autodiff::detail::tensor_of_t<A>::spec_type,
                                                                         typename autodiff::detail::tensor_of_t<B>::spec_type>);
  if constexpr (ra >= 2 && (rb == 2 || rb == ra))
    return autodiff::detail::einsum_var<"matmul", detail::matmul_subscripts<ra, rb>()>(a, b);
}

/// `c + matmul(a, b)` with a Var operand (see matmul_add of tensors).
template <class A, class B, class C>
  requires DifferentiableOperands<A, B, C>
auto matmul_add(const A& a, const B& b, const C& c) {
  constexpr std::size_t ra = autodiff::detail::tensor_of_t<A>::rank, rb = autodiff::detail::tensor_of_t<B>::rank;
  SHARDLIB_STATIC_REQUIRE((ra >= 2 && (rb == 2 || rb == ra)),
                          "shardlib: matmul needs rank >= 2 operands: equal ranks, or a rank-2 right operand",
                          error::op_has_no_sharding_rule_for_these_specs<"matmul_add", OpRule::rank_mismatch,
                                                                         typename autodiff::detail::tensor_of_t<A>::spec_type,
                                                                         typename autodiff::detail::tensor_of_t<B>::spec_type>);
  if constexpr (ra >= 2 && (rb == 2 || rb == ra))
    return autodiff::detail::einsum_var<"matmul_add", detail::matmul_subscripts<ra, rb>(), A, B, true>(a, b, &c);
}

}  // namespace shardlib
