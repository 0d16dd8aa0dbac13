// SPDX-License-Identifier: Apache-2.0
/// @file
/// Differentiable reductions (`sum`, `mean` along a dim, `sum_all`, `mean_all`) and
/// normalisations (`softmax`, `log_softmax`, `layer_norm`, `rms_norm`) on Vars.
///
/// A reduction's backward spreads the gradient back over the reduced dim (local: every device
/// holds its rows whole). The normalisations' backward rules are written with the forward ops, so
/// they communicate exactly where the forward does: along a split dim, the row sums of the
/// backward are all-reduced over that dim's axes.
#pragma once

#include <shardlib/autodiff/elementwise.hpp>

namespace shardlib {

namespace autodiff::detail {
template <int Dim, bool KeepDim, bool Mean, class A>
auto reduce_var(const A& a) {
  using In = tensor_of_t<A>;
  using T = typename In::value_type;
  auto out = [&] {
    if constexpr (Mean) return shardlib::mean<Dim, KeepDim>(a.value());
    else return shardlib::sum<Dim, KeepDim>(a.value());
  }();
  const T scale = Mean ? T(1) / static_cast<T>(a.shape()[Dim]) : T(1);
  return record(Mean ? "mean" : "sum", std::move(out),
                [na = a.node(), scale](const auto& g, autodiff::BackwardPass& p) {
                  using G = std::remove_cvref_t<decltype(g)>;
                  give(p, 0, *na,
                       expand_dim<T, typename In::memory_space>(g.context(), g.mesh().shape(), G::sharding, g.block(),
                                                                g.local().data(), Dim, KeepDim, na->shape(), scale));
                },
                a.node());
}
}  // namespace autodiff::detail

/// Sum along `Dim` of a Var; its backward spreads the gradient over the dim.
template <int Dim, bool KeepDim = false, VarType A>
auto sum(const A& a) {
  return autodiff::detail::reduce_var<Dim, KeepDim, false>(a);
}
/// Mean along `Dim` of a Var.
template <int Dim, bool KeepDim = false, VarType A>
auto mean(const A& a) {
  return autodiff::detail::reduce_var<Dim, KeepDim, true>(a);
}
/// Sum of every element: a scalar (partial-sum over the axes that split the dims).
template <VarOrTensor A>
auto sum_all(const A& a) {
  if constexpr (autodiff::detail::tensor_of_t<A>::rank == 0) return a;
  else return sum_all(sum<0>(a));
}
/// Mean of every element: a scalar.
template <VarOrTensor A>
auto mean_all(const A& a) {
  using T = typename autodiff::detail::tensor_of_t<A>::value_type;
  std::int64_t n = 1;
  for (auto e : a.shape()) n *= e;
  return sum_all(a) * (T(1) / static_cast<T>(n));
}

/// softmax along `Dim` of a Var: backward y * (g - sum(g * y)).
template <int Dim, VarType A>
auto softmax(const A& a0) {
  using namespace autodiff::detail;
  const auto& a = resolved(a0);
  auto y = shardlib::softmax<Dim>(a.value());
  return record("softmax", y,
                [na = a.node(), y](const auto& g, autodiff::BackwardPass& p) {
                  give(p, 0, *na, y * (g - shardlib::sum<Dim, true>(g * y)));
                },
                a.node());
}
/// log_softmax along `Dim` of a Var: backward g - softmax * sum(g).
template <int Dim, VarType A>
auto log_softmax(const A& a0) {
  using namespace autodiff::detail;
  const auto& a = resolved(a0);
  auto y = shardlib::log_softmax<Dim>(a.value());
  return record("log_softmax", y,
                [na = a.node(), y](const auto& g, autodiff::BackwardPass& p) {
                  give(p, 0, *na, g - shardlib::exp(y) * shardlib::sum<Dim, true>(g));
                },
                a.node());
}
/// (x - mean) / sqrt(var + eps) along `Dim` of a Var: backward
/// rstd * (g - mean(g) - y * mean(g * y)).
template <int Dim, VarType A>
auto layer_norm(const A& a0, double eps = 1e-5) {
  using namespace autodiff::detail;
  const auto& a = resolved(a0);
  using T = typename tensor_of_t<decltype(a)>::value_type;
  auto y = shardlib::layer_norm<Dim>(a.value(), eps);
  return record("layer_norm", y,
                [na = a.node(), x = a.value(), y, eps](const auto& g, autodiff::BackwardPass& p) {
                  const auto centred = x - shardlib::mean<Dim, true>(x);
                  const auto rstd = shardlib::rsqrt(shardlib::mean<Dim, true>(shardlib::square(centred)) + T(eps));
                  give(p, 0, *na,
                       rstd * (g - shardlib::mean<Dim, true>(g) - y * shardlib::mean<Dim, true>(g * y)));
                },
                a.node());
}
/// x / sqrt(mean(x^2) + eps) along `Dim` of a Var: backward r * (g - y * mean(g * y)).
template <int Dim, VarType A>
auto rms_norm(const A& a0, double eps = 1e-6) {
  using namespace autodiff::detail;
  const auto& a = resolved(a0);
  using T = typename tensor_of_t<decltype(a)>::value_type;
  auto y = shardlib::rms_norm<Dim>(a.value(), eps);
  return record("rms_norm", y,
                [na = a.node(), x = a.value(), y, eps](const auto& g, autodiff::BackwardPass& p) {
                  const auto r = shardlib::rsqrt(shardlib::mean<Dim, true>(shardlib::square(x)) + T(eps));
                  give(p, 0, *na, r * (g - y * shardlib::mean<Dim, true>(g * y)));
                },
                a.node());
}

}  // namespace shardlib
