// SPDX-License-Identifier: Apache-2.0
/// @file
/// Differentiable elementwise ops: `+ - * /` (Vars, tensors and scalars, numpy broadcasting),
/// `maximum`, `minimum`, `cast` and the unary math of ops/elementwise.hpp.
///
/// Backward rules are the forward ops on the gradient: `a * b` hands `g * b` to `a`, summed over
/// the dims `a` was broadcast along (a bias's gradient is the sum over the batch: local, partial
/// over the axes that split those dims). A unary op's derivative is one fused kernel on the
/// gradient and the saved input or output. Nonlinear ops resolve a partial operand first (a
/// recorded reshard, the same all_reduce the op would run).
#pragma once

#include <shardlib/autodiff/record.hpp>
#include <shardlib/kernels/vmath.hpp>

#include <cmath>

namespace shardlib {

/// Derivatives of the unary ops: `(g, x)` or `(g, y)` to the input's gradient.
namespace fn::grad {
// EXPR on scalars; the ops Eigen has packets for also get it as an `array` form on Eigen arrays
// (kernels/vmath.hpp), taken by the host kernels for float and double.
#define SHARDLIB_DFN_SCALAR(EXPR)                                                                \
  template <class A>                                                                             \
  KOKKOS_INLINE_FUNCTION A operator()(const A& g, const A& v) const {                            \
    using std::exp, std::tanh, std::erf;                                                         \
    return EXPR;                                                                                 \
  }
#define SHARDLIB_DFN(NAME, EXPR) \
  struct NAME {                  \
    SHARDLIB_DFN_SCALAR(EXPR)    \
  };
#define SHARDLIB_DFNV(NAME, EXPR)                                                                \
  struct NAME {                                                                                  \
    SHARDLIB_DFN_SCALAR(EXPR)                                                                    \
    template <class X>                                                                           \
    auto array(const X& g, const X& v) const {                                                   \
      using A [[maybe_unused]] = typename X::Scalar;                                             \
      using kernels::vmath::tanh, kernels::vmath::erf, kernels::vmath::exp;                                        \
      return EXPR;                                                                               \
    }                                                                                            \
  };
SHARDLIB_DFNV(exp, g* v)                          // v = y
SHARDLIB_DFNV(log, g / v)                         // v = x
SHARDLIB_DFN(sqrt, g / (A(2) * v))               // v = y
SHARDLIB_DFN(rsqrt, A(-0.5) * g * v * v * v)     // v = y
SHARDLIB_DFNV(tanh, g*(A(1) - v * v))             // v = y
SHARDLIB_DFN(abs, v > A(0) ? g : (v < A(0) ? -g : A(0)))  // v = x
SHARDLIB_DFNV(square, A(2) * g * v)               // v = x
SHARDLIB_DFN(relu, v > A(0) ? g : A(0))          // v = x
SHARDLIB_DFNV(sigmoid, g* v*(A(1) - v))           // v = y
SHARDLIB_DFNV(silu, g*(A(1) / (A(1) + exp(-v))) * (A(1) + v * (A(1) - A(1) / (A(1) + exp(-v)))))  // v = x
SHARDLIB_DFNV(gelu, g*(A(0.5) * (A(1) + erf(v * A(0.70710678118654752440))) +
                      v * A(0.39894228040143267794) * exp(A(-0.5) * v * v)))  // v = x
SHARDLIB_DFNV(gelu_tanh, g*(A(0.5) * (A(1) + tanh(A(0.79788456080286535588) * (v + A(0.044715) * v * v * v))) +
                           A(0.5) * v *
                               (A(1) - tanh(A(0.79788456080286535588) * (v + A(0.044715) * v * v * v)) *
                                           tanh(A(0.79788456080286535588) * (v + A(0.044715) * v * v * v))) *
                               A(0.79788456080286535588) * (A(1) + A(3 * 0.044715) * v * v)))  // v = x
#undef SHARDLIB_DFN
#undef SHARDLIB_DFNV
#undef SHARDLIB_DFN_SCALAR
/// d max(a, b) / da: 1 where a wins, 1/2 on ties (torch's rule).
struct max_a {
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(const A& g, const A& a, const A& b) const {
    return a > b ? g : (a == b ? g / A(2) : A(0));
  }
};
struct min_a {
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(const A& g, const A& a, const A& b) const {
    return a < b ? g : (a == b ? g / A(2) : A(0));
  }
};
/// -g * y / b: the gradient of a / b with respect to b (y = a / b).
struct div_b {
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(const A& g, const A& y, const A& b) const {
    return -g * y / b;
  }
};
}  // namespace fn::grad

// -- Var (op) Var or tensor -------------------------------------------------------------------------
template <class A, class B>
  requires DifferentiableOperands<A, B>
auto operator+(const A& a, const B& b) {
  using namespace autodiff::detail;
  require_same_element_type<tensor_of_t<A>, tensor_of_t<B>>();
  return record("add", value(a) + value(b),
                [na = node(a), nb = node(b)](const auto& g, autodiff::BackwardPass& p) {
                  if (na) give(p, 0, *na, g);
                  if (nb) give(p, 1, *nb, g);
                },
                node(a), node(b));
}
template <class A, class B>
  requires DifferentiableOperands<A, B>
auto operator-(const A& a, const B& b) {
  using namespace autodiff::detail;
  require_same_element_type<tensor_of_t<A>, tensor_of_t<B>>();
  return record("sub", value(a) - value(b),
                [na = node(a), nb = node(b)](const auto& g, autodiff::BackwardPass& p) {
                  if (na) give(p, 0, *na, g);
                  if (nb) give(p, 1, *nb, -g);
                },
                node(a), node(b));
}
template <class A, class B>
  requires DifferentiableOperands<A, B>
auto operator*(const A& a, const B& b) {
  using namespace autodiff::detail;
  require_same_element_type<tensor_of_t<A>, tensor_of_t<B>>();
  const auto& av = value(a);
  const auto& bv = value(b);
  auto na = node(a);
  auto nb = node(b);
  // Save an operand only when the other one needs its gradient.
  using AT = tensor_of_t<A>;
  using BT = tensor_of_t<B>;
  std::optional<AT> sa;
  std::optional<BT> sb;
  if (nb) sa = av;
  if (na) sb = bv;
  return record("mul", av * bv,
                [na, nb, sa = std::move(sa), sb = std::move(sb)](const auto& g, autodiff::BackwardPass& p) {
                  if (na) give(p, 0, *na, g * *sb);
                  if (nb) give(p, 1, *nb, g * *sa);
                },
                na, nb);
}
template <class A, class B>
  requires DifferentiableOperands<A, B>
auto operator/(const A& a, const B& b) {
  using namespace autodiff::detail;
  require_same_element_type<tensor_of_t<A>, tensor_of_t<B>>();
  const auto& bv = value(b);
  auto y = value(a) / bv;
  auto nb = node(b);
  using YT = decltype(y);
  std::optional<YT> sy;
  if (nb) sy = y;
  return record("div", std::move(y),
                [na = node(a), nb, bv, sy = std::move(sy)](const auto& g, autodiff::BackwardPass& p) {
                  if (na) give(p, 0, *na, g / bv);
                  if (nb) give(p, 1, *nb, zip(fn::grad::div_b{}, g, *sy, bv));
                },
                node(a), nb);
}

// -- Var (op) scalar -----------------------------------------------------------------------------
template <VarType A, class S>
  requires detail::is_scalar_v<S>
auto operator+(const A& a, S s) {
  return autodiff::detail::record("add", a.value() + s,
                                  [na = a.node()](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, g); }, a.node());
}
template <class S, VarType A>
  requires detail::is_scalar_v<S>
auto operator+(S s, const A& a) {
  return a + s;
}
template <VarType A, class S>
  requires detail::is_scalar_v<S>
auto operator-(const A& a, S s) {
  return autodiff::detail::record("sub", a.value() - s,
                                  [na = a.node()](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, g); }, a.node());
}
template <class S, VarType A>
  requires detail::is_scalar_v<S>
auto operator-(S s, const A& a) {
  return autodiff::detail::record("sub", s - a.value(),
                                  [na = a.node()](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, -g); }, a.node());
}
template <VarType A, class S>
  requires detail::is_scalar_v<S>
auto operator*(const A& a, S s) {
  return autodiff::detail::record("mul", a.value() * s,
                                  [na = a.node(), s](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, g * s); },
                                  a.node());
}
template <class S, VarType A>
  requires detail::is_scalar_v<S>
auto operator*(S s, const A& a) {
  return a * s;
}
template <VarType A, class S>
  requires detail::is_scalar_v<S>
auto operator/(const A& a, S s) {
  return autodiff::detail::record("div", a.value() / s,
                                  [na = a.node(), s](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, g / s); },
                                  a.node());
}
template <class S, VarType A>
  requires detail::is_scalar_v<S>
auto operator/(S s, const A& a) {
  const auto& x = autodiff::detail::resolved(a);
  auto y = s / x.value();
  return autodiff::detail::record("div", y,
                                  [na = x.node(), x = x.value(), y](const auto& g, autodiff::BackwardPass& p) {
                                    give(p, 0, *na, zip(fn::grad::div_b{}, g, y, x));
                                  },
                                  x.node());
}
/// `-a` (linear).
template <VarType A>
auto operator-(const A& a) {
  return autodiff::detail::record("neg", -a.value(),
                                  [na = a.node()](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, -g); }, a.node());
}

/// `cast<U>(a)` of a Var between floating-point element types: the gradient is cast back to
/// `a`'s type, keeping its spec (a partial float32 gradient of a bf16 parameter reaches the
/// parameter in bf16 and is reduced there: half the bytes of a float32 reduction).
template <class U, VarType A>
auto cast(const A& a) {
  using In = autodiff::detail::tensor_of_t<A>;
  static_assert(is_floating_v<U> && is_floating_v<typename In::value_type>,
                "shardlib: cast<U> of a Var converts between floating-point types (float, double, f16, bf16)");
  auto out = shardlib::cast<U>(a.value());
  using Out = decltype(out);
  if (!a.requires_grad() || !autodiff::detail::recording(a.node())) return Var<Out>(std::move(out));
  if (a.node()->recomputable()) {  // a cast of a recomputable value is one too (a 16-bit ZeRO-3 weight's float32 copy)
    auto n = std::make_shared<autodiff::detail::CastNode<Out, In>>(
        a.node(), out, [in = a.node()] { return shardlib::cast<U>(in->recompute()); });
    return Var<Out>(std::move(out), std::move(n));
  }
  auto n = std::make_shared<autodiff::detail::CastNode<Out, In>>(a.node(), out);
  return Var<Out>(std::move(out), std::move(n));
}

namespace autodiff::detail {
/// maximum (`Max`) or minimum of two operands; `D` gives d/da from (g, a, b).
template <bool Max, class D, class A0, class B0>
auto extremum2(const A0& a0, const B0& b0) {
  require_same_element_type<tensor_of_t<A0>, tensor_of_t<B0>>();
  const auto& a = resolved(a0);
  const auto& b = resolved(b0);
  const auto& av = value(a);
  const auto& bv = value(b);
  auto out = [&] {
    if constexpr (Max) return shardlib::maximum(av, bv);
    else return shardlib::minimum(av, bv);
  }();
  return record(Max ? "maximum" : "minimum", std::move(out),
                [na = node(a), nb = node(b), av, bv](const auto& g, BackwardPass& p) {
                  if (na) give(p, 0, *na, zip(D{}, g, av, bv));
                  if (nb) give(p, 1, *nb, zip(D{}, g, bv, av));
                },
                node(a), node(b));
}
}  // namespace autodiff::detail

/// Elementwise maximum / minimum; ties split the gradient in halves.
template <class A, class B>
  requires DifferentiableOperands<A, B>
auto maximum(const A& a, const B& b) {
  return autodiff::detail::extremum2<true, fn::grad::max_a>(a, b);
}
template <class A, class B>
  requires DifferentiableOperands<A, B>
auto minimum(const A& a, const B& b) {
  return autodiff::detail::extremum2<false, fn::grad::min_a>(a, b);
}

// -- unary math --------------------------------------------------------------------------------------
namespace autodiff::detail {
/// A unary op whose derivative reads the input (`OnOutput` false) or the output.
template <OpName Name, bool OnOutput, class Forward, class Derivative, class A>
auto unary(const A& a0) {
  const auto& a = resolved(a0);
  auto y = Forward{}(a.value());
  if constexpr (OnOutput)
    return record(Name.text, y,
                  [na = a.node(), y](const auto& g, autodiff::BackwardPass& p) { give(p, 0, *na, zip(Derivative{}, g, y)); },
                  a.node());
  else
    return record(Name.text, std::move(y),
                  [na = a.node(), x = a.value()](const auto& g, autodiff::BackwardPass& p) {
                    give(p, 0, *na, zip(Derivative{}, g, x));
                  },
                  a.node());
}
}  // namespace autodiff::detail

/// The unary ops on Vars: X(name, whether the derivative reads the output).
#define SHARDLIB_VAR_UNARY_OPS(X) \
  X(exp, true)                    \
  X(log, false)                   \
  X(sqrt, true)                   \
  X(rsqrt, true)                  \
  X(tanh, true)                   \
  X(abs, false)                   \
  X(square, false)                \
  X(relu, false)                  \
  X(sigmoid, true)                \
  X(silu, false)                  \
  X(gelu, false)                  \
  X(gelu_tanh, false)

namespace autodiff::detail::forward {
#define SHARDLIB_VAR_FORWARD(NAME, ON_OUTPUT) \
  struct NAME {                               \
    template <class X>                        \
    auto operator()(const X& x) const {       \
      return shardlib::NAME(x);               \
    }                                         \
  };
SHARDLIB_VAR_UNARY_OPS(SHARDLIB_VAR_FORWARD)
#undef SHARDLIB_VAR_FORWARD
}  // namespace autodiff::detail::forward

/// Unary math on Vars (the forward of ops/elementwise.hpp; derivatives in fn::grad).
#define SHARDLIB_VAR_UNARY(NAME, ON_OUTPUT)                                                                       \
  template <VarType A>                                                                                           \
  auto NAME(const A& a) {                                                                                        \
    return autodiff::detail::unary<#NAME, ON_OUTPUT, autodiff::detail::forward::NAME, fn::grad::NAME>(a);        \
  }
SHARDLIB_VAR_UNARY_OPS(SHARDLIB_VAR_UNARY)
#undef SHARDLIB_VAR_UNARY
#undef SHARDLIB_VAR_UNARY_OPS

}  // namespace shardlib
