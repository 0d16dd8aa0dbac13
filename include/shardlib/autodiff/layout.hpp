// SPDX-License-Identifier: Apache-2.0
/// @file
/// Differentiable layout ops on Vars: `permute`/`transpose` (backward: the inverse permutation),
/// `reshape` (backward: the reverse pattern), `slice` (backward: the gradient shifted back into
/// zeros, along a split dim the same all_to_all the forward ran), `concat` (backward: two slices).
#pragma once

#include <shardlib/autodiff/record.hpp>

namespace shardlib {

namespace autodiff::detail {
/// The inverse of permutation `p`.
template <std::size_t N>
constexpr std::array<int, N> inverse_permutation(const std::array<int, N>& p) {
  std::array<int, N> inv{};
  for (std::size_t k = 0; k < N; ++k)
    if (p[k] >= 0 && p[k] < static_cast<int>(N)) inv[static_cast<std::size_t>(p[k])] = static_cast<int>(k);
  return inv;
}

/// "right -> left" of reshape pattern "left -> right".
constexpr OpName reverse_pattern(const OpName& p) {
  std::size_t n = 0, arrow = 0;
  while (n < sizeof(p.text) && p.text[n] != '\0') ++n;
  while (arrow + 1 < n && !(p.text[arrow] == '-' && p.text[arrow + 1] == '>')) ++arrow;
  OpName r("");
  if (arrow + 1 >= n) return p;  // no arrow: the forward op rejects it
  std::size_t k = 0;
  for (std::size_t i = arrow + 2; i < n && k + 1 < sizeof(r.text); ++i) r.text[k++] = p.text[i];
  for (char c : {' ', '-', '>', ' '})
    if (k + 1 < sizeof(r.text)) r.text[k++] = c;
  for (std::size_t i = 0; i < arrow && k + 1 < sizeof(r.text); ++i) r.text[k++] = p.text[i];
  return r;
}

/// The gradient of a slice [begin, begin + extent of g) along `dim` of a tensor of `shape`: g's
/// blocks shifted back into zeros, laid out as g (a local copy, or an all_to_all over the dim's
/// axes when it is split).
template <class T, class Mem, class G>
Contribution unslice(const G& g, int dim, std::int64_t begin, ArrayRef<std::int64_t> shape) {
  Context& ctx = g.context();
  const MeshShape& mesh = g.mesh().shape();
  Contribution c;
  c.sharding = G::sharding;
  c.box = shard_box(c.sharding, mesh, shape, ctx.device());
  const std::int64_t n = c.box.num_elements();
  c.keep = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(T));
  c.data = c.keep.get();
  fill<Mem>(ctx, static_cast<T*>(c.data), n, T{});
  shift_blocks<T, Mem>(ctx, mesh, G::sharding.dims[static_cast<std::size_t>(dim)], dim, g.local().data(), g.block(),
                  g.shape()[static_cast<std::size_t>(dim)], begin, static_cast<T*>(c.data), c.box,
                  shape[static_cast<std::size_t>(dim)]);
  return c;
}
}  // namespace autodiff::detail

/// permute of a Var; backward: the inverse permutation of the gradient (no communication).
template <int... Perm, VarType A>
auto permute(const A& a) {
  static constexpr std::array<int, sizeof...(Perm)> inv = autodiff::detail::inverse_permutation(std::array<int, sizeof...(Perm)>{Perm...});
  return autodiff::detail::record("permute", shardlib::permute<Perm...>(a.value()),
                                  [na = a.node()](const auto& g, autodiff::BackwardPass& p) {
                                    [&]<std::size_t... I>(std::index_sequence<I...>) {
                                      give(p, 0, *na, shardlib::permute<inv[I]...>(g));
                                    }(std::make_index_sequence<sizeof...(Perm)>{});
                                  },
                                  a.node());
}
/// transpose of a Var.
template <int D0, int D1, VarType A>
auto transpose(const A& a) {
  constexpr int r = static_cast<int>(std::remove_cvref_t<A>::rank);
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    return permute<(I == D0 ? D1 : I == D1 ? D0 : I)...>(a);
  }(std::make_integer_sequence<int, r>{});
}

namespace autodiff::detail {
template <OpName Pattern, std::size_t N, class A>
auto reshape_var(const A& a, const std::array<std::int64_t, N>* shape) {
  using In = tensor_of_t<A>;
  return record("reshape", shardlib::detail::reshape_op<Pattern, N>(a.value(), shape),
                [na = a.node()](const auto& g, autodiff::BackwardPass& p) {
                  const auto& s = na->shape();
                  give(p, 0, *na, shardlib::detail::reshape_op<reverse_pattern(Pattern), In::rank>(g, &s));
                },
                a.node());
}
}  // namespace autodiff::detail

/// reshape of a Var (see reshape of tensors); backward: the gradient reshaped back by the
/// reverse pattern.
template <OpName Pattern, VarType A>
auto reshape(const A& a) {
  return autodiff::detail::reshape_var<Pattern, 0>(a, nullptr);
}
template <OpName Pattern, VarType A, std::size_t N>
auto reshape(const A& a, const std::int64_t (&shape)[N]) {
  std::array<std::int64_t, N> s{};
  for (std::size_t i = 0; i < N; ++i) s[i] = shape[i];
  return autodiff::detail::reshape_var<Pattern, N>(a, &s);
}

/// slice of a Var; backward: the gradient in zeros of the input's shape.
template <int Dim, VarType A>
auto slice(const A& a, std::int64_t begin, std::int64_t end) {
  using In = autodiff::detail::tensor_of_t<A>;
  return autodiff::detail::record(
      "slice", shardlib::slice<Dim>(a.value(), begin, end),
      [na = a.node(), begin](const auto& g, autodiff::BackwardPass& p) {
        give(p, 0, *na,
             autodiff::detail::unslice<typename In::value_type, typename In::memory_space>(g, Dim, begin, na->shape()));
      },
      a.node());
}

/// concat of Vars (or a Var and a tensor); backward: the two slices of the gradient.
template <int Dim, class A, class B>
  requires DifferentiableOperands<A, B>
auto concat(const A& a, const B& b) {
  using namespace autodiff::detail;
  require_same_element_type<tensor_of_t<A>, tensor_of_t<B>>();
  const std::int64_t na_ext = value(a).shape()[static_cast<std::size_t>(Dim)];
  const std::int64_t nb_ext = value(b).shape()[static_cast<std::size_t>(Dim)];
  return record("concat", shardlib::concat<Dim>(value(a), value(b)),
                [na = node(a), nb = node(b), na_ext, nb_ext](const auto& g, autodiff::BackwardPass& p) {
                  if (na) give(p, 0, *na, shardlib::slice<Dim>(g, 0, na_ext));
                  if (nb) give(p, 1, *nb, shardlib::slice<Dim>(g, na_ext, na_ext + nb_ext));
                },
                node(a), node(b));
}

/// take of a Var table (the indices are integers: no gradient). Backward: the gradient
/// scatter-added into zeros of the table's shape (index_add): a vocabulary-split table gets its
/// rows' gradient with no communication; indices split over axes leave it partial over them
/// (resolved at the table: the all_reduce of a data-parallel embedding).
template <int Dim, VarType Table, TensorType Indices>
auto take(const Table& table, const Indices& indices) {
  using Tn = autodiff::detail::tensor_of_t<Table>;
  return autodiff::detail::record("take", shardlib::take<Dim>(table.value(), indices),
                                  [nt = table.node(), indices](const auto& g, autodiff::BackwardPass& p) {
                                    using Z = grad_tensor_t<Tn>;
                                    auto zeros = Z::zeros(nt->mesh(), nt->shape(), shardlib::detail::same_shape);
                                    give(p, 0, *nt, shardlib::index_add<Dim>(std::move(zeros), indices, g));
                                  },
                                  table.node());
}

/// index_add with a Var base or values: backward g for the base, take(g, indices) for the values.
template <int Dim, class Base, TensorType Indices, class Values>
  requires DifferentiableOperands<Base, Values>
auto index_add(const Base& base, const Indices& indices, const Values& values) {
  using namespace autodiff::detail;
  return record("index_add", shardlib::index_add<Dim>(value(base), indices, value(values)),
                [nb = node(base), nv = node(values), indices](const auto& g, autodiff::BackwardPass& p) {
                  if (nb) give(p, 0, *nb, g);
                  if (nv) give(p, 1, *nv, shardlib::take<Dim>(g, indices));
                },
                node(base), node(values));
}

}  // namespace shardlib
