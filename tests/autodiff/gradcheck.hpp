// SPDX-License-Identifier: Apache-2.0
// Gradient checks for the autodiff tests: a function of parameters (a generic lambda returning a
// scalar Var) is differentiated by backward(), and the gradient of some elements of each
// parameter is compared with central finite differences of the function (float64). Every call is collective: all devices call it in the same order with the same
// arguments (the elements checked are drawn from a generator seeded the same on every device).
#pragma once

#include <doctest/doctest.h>
#include <shardlib/autodiff.hpp>

#include "../ops/oracle.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace shardlib::test::grad {

/// The scalar value of a rank-0 Var or tensor (collective).
template <class V>
double scalar(const V& v) {
  if constexpr (VarType<V>) return static_cast<double>(v.value().to_host().at(0));
  else return static_cast<double>(v.to_host().at(0));
}

/// `t` with `delta` added to its element of global row-major index `k` (on every replica).
template <class Tensor>
Tensor bumped(const Tensor& t, std::int64_t k, double delta) {
  Tensor c = t.clone();
  const auto shape = t.shape();
  using T = typename Tensor::value_type;
  parallel_for(c, [=](const Index<Tensor::rank>& i, T& v) {
    std::int64_t lin = 0;
    for (std::size_t d = 0; d < Tensor::rank; ++d) lin = lin * shape[d] + i[d];
    if (lin == k) v += static_cast<T>(delta);
  });
  return c;
}

/// Whether gradient `got` of element `k` of parameter `param` agrees with central difference
/// `fd`, reporting it (naming `what`) when not. Out of line: one copy, not one per check().
inline bool agrees(const std::string& what, std::size_t param, std::int64_t k, double got, double fd, double tol) {
  const bool ok = std::abs(got - fd) <= tol * (1 + std::abs(fd));
  if (!ok) MESSAGE(what << ": d/d param " << param << " [" << k << "] = " << got << ", finite differences " << fd);
  return ok;
}

/// Compares the gradients of `f(params...)` from backward() with central differences at
/// `per_param` random elements of each parameter; whether all agree (each disagreement is also
/// reported, naming the case `what`, the parameter and the element).
template <class F, class... Tensors>
bool check(F f, oracle::Rng& rng, const std::string& what, double tol, int per_param, const Tensors&... tensors) {
  std::tuple<Param<Tensors>...> params{Param<Tensors>(tensors)...};
  auto loss = std::apply(f, params);
  backward(loss);
  const std::tuple<Tensors...> grads = std::apply([](const auto&... p) { return std::tuple{p.grad()...}; }, params);
  const std::tuple<Tensors...> values{tensors...};
  // The function at perturbed values, on parameters again: the same instantiation of f as the
  // backward pass above (constant Vars would compile every op of f a second time).
  auto eval = [&](const auto&... ts) { return scalar(f(Param<std::remove_cvref_t<decltype(ts)>>(ts)...)); };
  constexpr double h = 1e-6;
  bool all = true;
  auto check_one = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
    const auto& t = std::get<I>(values);
    const std::vector<double> g = [&] {
      auto v = std::get<I>(grads).to_host();
      return std::vector<double>(v.begin(), v.end());
    }();
    const std::int64_t n = t.size();
    for (int s = 0; s < per_param && n > 0; ++s) {
      const std::int64_t k = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(n)));
      auto at = [&](double delta) {
        auto vs = values;
        std::get<I>(vs) = bumped(t, k, delta);
        return std::apply(eval, vs);
      };
      const double fd = (at(h) - at(-h)) / (2 * h);
      all = agrees(what, I, k, g[static_cast<std::size_t>(k)], fd, tol) && all;
    }
  };
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (check_one(std::integral_constant<std::size_t, I>{}), ...);
  }(std::index_sequence_for<Tensors...>{});
  return all;
}

/// The float64 tensors and spec types the op tests draw from, on oracle::M2 = Mesh<"x", "y">.
namespace specs {
namespace sl = shardlib;
namespace oracle = shardlib::test::oracle;
namespace gc = shardlib::test::grad;
using oracle::M2;
using sl::axes;
using sl::none;
using sl::Spec;
template <class S>
using D = sl::DistributedTensor<double, M2, S>;
using namespace oracle::specs;
}  // namespace specs

}  // namespace shardlib::test::grad

/// Device counts of the op tests.
#define DEVICE_COUNTS {1, 2, 3, 4, 6, 8}
