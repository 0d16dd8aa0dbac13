// SPDX-License-Identifier: Apache-2.0
/// @file
/// Elementwise ops: `+ - * /` between tensors and with scalars, unary math (exp, log, sqrt, tanh,
/// relu, gelu, ...), and user functors over one (`map`, tensor.hpp) or several tensors (`zip`),
/// with numpy broadcasting; `cast<U>` between element types.
///
/// 16-bit operands (f16, bf16; half.hpp) reach every functor, a user's too, as float, and the
/// result is stored back in 16 bits when every floating-point operand has that type (bf16 + bf16
/// is bf16, bf16 + float is float): each op rounds once.
///
/// The output spec comes from `elementwise_rule` (sharding/elementwise.hpp) at compile time:
/// operands align to the right, each dim keeps the more sharded operand's axes, the other operand
/// is resharded to it (from replicated that is a local slice, no communication). A partial-sum
/// operand stays partial through linear ops (`a + b` of two partials over the same axes, `-a`,
/// `a * s`, `a * b` with `b` not partial, `a / b`); every other op reduces it first. An operand
/// whose extent is 1 along a dim the output is longer in is read with stride 0 (replicated along
/// that dim first when it was split there: the plan depends on the shapes, the type does not).
#pragma once

#include <shardlib/kernels/elementwise.hpp>
#include <shardlib/ops/common.hpp>
#include <shardlib/sharding/elementwise.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace shardlib {
namespace detail {

/// A scalar operand of an elementwise op: arithmetic (not bool), f16 or bf16.
template <class T>
inline constexpr bool is_scalar_v = (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) || is_half_v<T>;

/// The broadcast shape (rank `rank`, into `out`) of operands `ops` (numpy rules), or throws
/// std::invalid_argument naming every operand's shape and spec and the dim that does not match.
SHARDLIB_NOINLINE inline void broadcast_shape(const char* op, ArrayRef<OperandInfo> ops, std::int64_t* out,
                                              std::size_t rank) {
  for (std::size_t d = 0; d < rank; ++d) out[d] = 1;
  int bad = -1;
  for (const OperandInfo& t : ops) {
    const std::size_t r = t.shape.size();
    for (std::size_t d = 0; d < r; ++d) {
      const std::size_t o = d + (rank - r);
      const std::int64_t e = t.shape[d];
      if (e == out[o] || e == 1) continue;
      if (out[o] == 1) out[o] = e;
      else if (bad < 0) bad = static_cast<int>(o);
    }
  }
  if (bad >= 0) {
    std::string s = std::string("shardlib: ") + op + ": shapes do not broadcast (output dim " + std::to_string(bad) + "):";
    for (const OperandInfo& t : ops) s += " " + operand_text(t) + ",";
    s.pop_back();
    throw std::invalid_argument(s);
  }
}
template <std::size_t R, class... Ts>
std::array<std::int64_t, R> broadcast_shape(const char* op, const Ts&... ts) {
  const std::array<OperandInfo, sizeof...(Ts)> infos{info(ts)...};
  std::array<std::int64_t, R> out;
  broadcast_shape(op, ArrayRef<OperandInfo>(infos), out.data(), R);
  return out;
}

/// The layout operand `t` is read in: the rule's, replicated along dims of extent 1 that broadcast.
template <std::size_t R, class T>
Sharding broadcast_layout(const OperandRef<T>& t, Sharding target, const std::array<std::int64_t, R>& out_shape) {
  const std::size_t r = t.shape.size();
  for (std::size_t d = 0; d < r; ++d)
    if (t.shape[d] == 1 && out_shape[d + (R - r)] != 1) target.dims[d] = AxisList{};
  return target;
}

/// Strides of block `b` of an operand of global shape `shape` (rank r <= R), seen from output
/// block `out_box`: 0 along dims the operand broadcasts; the pointer is at the output block's first
/// element.
template <std::size_t R, class T>
kernels::Strided<T, R> strided_view(const Block<T>& b, ArrayRef<std::int64_t> shape, const ShardBox& out_box,
                                    const std::array<std::int64_t, R>& out_shape) {
  kernels::Strided<T, R> s;
  std::int64_t stride = 1, base = 0;
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::size_t o = d + (R - shape.size());
    const bool broadcast = shape[d] == 1 && out_shape[o] != 1;
    s.stride[o] = broadcast ? 0 : stride;
    if (!broadcast) base += (out_box.offset[o] - b.box.offset[d]) * stride;
    stride *= b.box.extent[d];
  }
  s.data = out_box.num_elements() ? b.data + base : b.data;
  return s;
}

template <class T>
using element_t = typename std::remove_cvref_t<T>::value_type;

/// The runtime part of an elementwise op, compiled once per functor, element types and rank
/// (whatever the specs): each operand read in its layout (`layouts[i]`, resharded when its own
/// differs), one kernel writes the output block `out` (`out_box` of global `shape`), on the
/// device's execution-space instance for `Mem` (in device memory, queued on its stream: the
/// output's later readers are ordered after it on that stream).
template <std::size_t R, class Mem, class U, class F, std::size_t... I, class... Ts>
SHARDLIB_NOINLINE void elementwise_run(Context& ctx, F f, U* out, const ShardBox& out_box,
                                       const std::array<std::int64_t, R>& shape, const Sharding* layouts,
                                       std::index_sequence<I...>, const OperandRef<Ts>&... ops) {
  const std::tuple blocks{block_as<Mem>(ops, broadcast_layout<R>(ops, layouts[I], shape))...};
  std::array<std::int64_t, R> extent{};
  for (std::size_t d = 0; d != R; ++d) extent[d] = out_box.extent[d];  // != R: nvcc warns of d < 0 for R = 0
  auto guard = kernel_guard(ctx, false);
  std::apply(
      [&](const auto&... bs) {
        kernels::elementwise(ctx.exec_for<Mem>(), out, extent, f, strided_view<R>(bs, ops.shape, out_box, shape)...);
      },
      blocks);
}

/// The element type of `f` over operands of element types `Ts`: what `f` returns on their compute
/// types (16-bit values reach `f` as float), stored back in 16 bits when every floating-point
/// operand is of one 16-bit type (half.hpp's `stored_t`). `Forced`, when not void, instead.
template <class Forced, class F, class... Ts>
struct elementwise_result {
  using computed = std::remove_cvref_t<std::invoke_result_t<F, const compute_t<Ts>&...>>;
  using type = std::conditional_t<std::is_void_v<Forced>, stored_t<computed, Ts...>, Forced>;
};

}  // namespace detail

namespace fn {
/// `f` over operands some of which are 16-bit: each reaches `f` as its compute type (float), and
/// the result is stored as `U` (rounded once).
template <class F, class U>
struct widened {
  F f;
  template <class... A>
  KOKKOS_INLINE_FUNCTION constexpr U operator()(const A&... a) const {
    return static_cast<U>(f(static_cast<compute_t<A>>(a)...));
  }
};
}  // namespace fn

namespace detail {

/// The op: rule at compile time, broadcast shape and operand layouts at run time, one kernel.
/// `Forced`: the output's element type when the op says it (cast), not `f`'s result.
template <OpName Name, Linearity Kind, class Forced = void, class F, class Tensor0, class... Tensors>
auto elementwise_op(F f, const Tensor0& t0, const Tensors&... ts) {
  using MeshT = typename Tensor0::mesh_type;
  using Mem = typename Tensor0::memory_space;
  SHARDLIB_STATIC_REQUIRE(((std::is_same_v<typename Tensors::mesh_type, MeshT> && ...)),
                          "shardlib: an elementwise op on tensors of different mesh types",
                          error::op_operands_are_on_different_meshes<Name, MeshT, typename Tensors::mesh_type...>);
  SHARDLIB_STATIC_REQUIRE(((std::is_same_v<typename Tensors::memory_space, Mem> && ...)),
                          "shardlib: an elementwise op on tensors in different memory spaces",
                          error::op_operands_are_in_different_memory_spaces<Name, Mem, typename Tensors::memory_space...>);
  static constexpr std::array<Sharding, 1 + sizeof...(Tensors)> shardings{Tensor0::sharding, Tensors::sharding...};
  static constexpr OpRule rule = elementwise_rule(Kind, detail::ArrayRef<Sharding>(shardings.data(), shardings.size()));
  SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: no sharding rule for this elementwise op and these specs",
                          error::op_has_no_sharding_rule_for_these_specs<Name, rule.status, typename Tensor0::spec_type,
                                                                         typename Tensors::spec_type...>);
  constexpr std::size_t R = static_cast<std::size_t>(rule.out.rank);
  using U = typename elementwise_result<Forced, F, element_t<Tensor0>, element_t<Tensors>...>::type;
  using Out = DistributedTensor<U, MeshT, spec_from_t<MeshT, decltype([] { return rule.out; })>, Mem>;
  (check_same_mesh(Name.text, t0, ts), ...);
  const std::array<std::int64_t, R> shape = broadcast_shape<R>(Name.text, t0, ts...);
  Out out(t0.mesh(), shape);
  constexpr bool widen = is_half_v<element_t<Tensor0>> || (is_half_v<element_t<Tensors>> || ...);
  auto g = [&] {
    if constexpr (widen) return fn::widened<F, U>{f};
    else return f;
  }();
  elementwise_run<R, Mem>(out.context(), g, out.local().data(), out.block(), shape, rule.in.data(),
                          std::index_sequence_for<Tensor0, Tensors...>{}, ref(t0), ref(ts)...);
  return out;
}

}  // namespace detail

// -- functors (host and device callable, so kernels can inline them) -------------------------------
namespace fn {
// Each functor is callable on scalars (host and device) and, for the ops Eigen has packets for, has
// an `array` form: the same expression on Eigen arrays (kernels/vmath.hpp), taken by the host
// kernels for float and double. `A` is the element type in both.
#define SHARDLIB_FN2_SCALAR(EXPR) \
  template <class A, class B>     \
  KOKKOS_INLINE_FUNCTION constexpr auto operator()(const A& a, const B& b) const { return EXPR; }
#define SHARDLIB_FN2(NAME, EXPR) \
  struct NAME {                  \
    SHARDLIB_FN2_SCALAR(EXPR)    \
  };
#define SHARDLIB_FN2V(NAME, EXPR)                                  \
  struct NAME {                                                   \
    SHARDLIB_FN2_SCALAR(EXPR)                                     \
    template <class A, class B>                                   \
    auto array(const A& a, const B& b) const { return EXPR; }     \
  };
SHARDLIB_FN2V(add, a + b)
SHARDLIB_FN2V(sub, a - b)
SHARDLIB_FN2V(mul, a * b)
SHARDLIB_FN2V(div, a / b)
SHARDLIB_FN2(max, a < b ? b : a)
SHARDLIB_FN2(min, b < a ? b : a)
#undef SHARDLIB_FN2
#undef SHARDLIB_FN2V
#undef SHARDLIB_FN2_SCALAR
/// `f(x, s)` with a scalar bound on the right (or on the left when Left).
template <class F, class S, bool Left>
struct bind_scalar {
  F f;
  S s;
  template <class A>
  KOKKOS_INLINE_FUNCTION constexpr auto operator()(const A& a) const {
    if constexpr (Left) return f(static_cast<A>(s), a);
    else return f(a, static_cast<A>(s));
  }
  /// The array form, where F has one (X: an Eigen array expression).
  template <class X>
    requires requires(const F& g, const X& x, const typename X::Scalar& v) { g.array(x, v); }
  auto array(const X& x) const {
    using A = typename X::Scalar;
    if constexpr (Left) return f.array(static_cast<A>(s), x);
    else return f.array(x, static_cast<A>(s));
  }
};
struct neg {
  template <class A>
  KOKKOS_INLINE_FUNCTION constexpr A operator()(const A& a) const { return -a; }
  template <class X>
  auto array(const X& x) const { return -x; }
};
// Unary: EXPR on scalars (std:: math), VEXPR the same on Eigen arrays (Eigen's math; tanh and erf
// from kernels/vmath.hpp, which takes glibc's vector math for double).
#define SHARDLIB_FN1(NAME, EXPR, VEXPR)                                          \
  struct NAME {                                                                  \
    template <class A>                                                           \
    KOKKOS_INLINE_FUNCTION A operator()(const A& x) const { using std::exp, std::log, std::sqrt, std::tanh, std::abs, std::erf; return EXPR; } \
    template <class X>                                                           \
    auto array(const X& x) const { using A [[maybe_unused]] = typename X::Scalar; using kernels::vmath::exp, kernels::vmath::tanh, Eigen::abs, kernels::vmath::erf; return VEXPR; } \
  };
SHARDLIB_FN1(exp, exp(x), kernels::vmath::exp(x))
SHARDLIB_FN1(log, log(x), kernels::vmath::log(x))
// sqrt: scalar only (exact; see kernels/vmath.hpp).
struct sqrt {
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(const A& x) const { using std::sqrt; return sqrt(x); }
};
struct rsqrt {
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(const A& x) const { using std::sqrt; return A(1) / sqrt(x); }
};
SHARDLIB_FN1(tanh, tanh(x), kernels::vmath::tanh(x))
SHARDLIB_FN1(abs, abs(x), abs(x))
SHARDLIB_FN1(square, x * x, x * x)
SHARDLIB_FN1(relu, x > A(0) ? x : A(0), (x > A(0)).select(x, A(0)))
SHARDLIB_FN1(sigmoid, A(1) / (A(1) + exp(-x)), A(1) / (A(1) + exp(-x)))
SHARDLIB_FN1(silu, x / (A(1) + exp(-x)), x / (A(1) + exp(-x)))
/// GELU, the exact form x/2 (1 + erf(x / sqrt 2)) (torch's default).
SHARDLIB_FN1(gelu, A(0.5) * x * (A(1) + erf(x * A(0.70710678118654752440))),
             A(0.5) * x * (A(1) + erf(x * A(0.70710678118654752440))))
/// GELU, the tanh approximation (torch's approximate="tanh").
SHARDLIB_FN1(gelu_tanh, A(0.5) * x * (A(1) + tanh(A(0.79788456080286535588) * (x + A(0.044715) * x * x * x))),
             A(0.5) * x * (A(1) + tanh(A(0.79788456080286535588) * (x + A(0.044715) * x * x * x))))
#undef SHARDLIB_FN1
}  // namespace fn

// -- tensor (op) tensor ----------------------------------------------------------------------------
#define SHARDLIB_BINARY(OP, NAME, KIND, FN)                                                                         \
  template <TensorType A, TensorType B>                                                                              \
  auto operator OP(const A& a, const B& b) {                                                                         \
    return detail::elementwise_op<NAME, KIND>(FN{}, a, b);                                                           \
  }                                                                                                                  \
  template <TensorType A, class S>                                                                                   \
    requires detail::is_scalar_v<S>                                                                                  \
  auto operator OP(const A& a, S s) {                                                                                \
    constexpr Linearity k = KIND == Linearity::scaling ? Linearity::scaling : Linearity::nonlinear;                 \
    return detail::elementwise_op<NAME, k>(fn::bind_scalar<FN, S, false>{FN{}, s}, a);                              \
  }                                                                                                                  \
  template <class S, TensorType B>                                                                                   \
    requires detail::is_scalar_v<S>                                                                                  \
  auto operator OP(S s, const B& b) {                                                                                \
    constexpr Linearity k = std::is_same_v<FN, fn::mul> ? Linearity::scaling : Linearity::nonlinear;                \
    return detail::elementwise_op<NAME, k>(fn::bind_scalar<FN, S, true>{FN{}, s}, b);                               \
  }
/// `a + b`: partial-sum operands over the same axes stay partial; a scalar added to a partial
/// tensor reduces it first (each addend would get the scalar).
SHARDLIB_BINARY(+, "add", Linearity::additive, fn::add)
SHARDLIB_BINARY(-, "sub", Linearity::additive, fn::sub)
/// `a * b`: linear in each operand: one partial-sum operand stays partial.
SHARDLIB_BINARY(*, "mul", Linearity::scaling, fn::mul)
#undef SHARDLIB_BINARY

/// `a / b`: linear in `a` only (a partial divisor is reduced first).
template <TensorType A, TensorType B>
auto operator/(const A& a, const B& b) {
  return detail::elementwise_op<"div", Linearity::quotient>(fn::div{}, a, b);
}
template <TensorType A, class S>
  requires detail::is_scalar_v<S>
auto operator/(const A& a, S s) {
  return detail::elementwise_op<"div", Linearity::scaling>(fn::bind_scalar<fn::div, S, false>{fn::div{}, s}, a);
}
template <class S, TensorType B>
  requires detail::is_scalar_v<S>
auto operator/(S s, const B& b) {
  return detail::elementwise_op<"div", Linearity::nonlinear>(fn::bind_scalar<fn::div, S, true>{fn::div{}, s}, b);
}
/// `-a` (linear: a partial tensor stays partial).
template <TensorType A>
auto operator-(const A& a) {
  return detail::elementwise_op<"neg", Linearity::additive>(fn::neg{}, a);
}

/// Elementwise maximum / minimum (nonlinear: partial operands are reduced first).
template <TensorType A, TensorType B>
auto maximum(const A& a, const B& b) {
  return detail::elementwise_op<"maximum", Linearity::nonlinear>(fn::max{}, a, b);
}
template <TensorType A, TensorType B>
auto minimum(const A& a, const B& b) {
  return detail::elementwise_op<"minimum", Linearity::nonlinear>(fn::min{}, a, b);
}

#define SHARDLIB_UNARY(NAME)                                                           \
  template <TensorType A>                                                             \
  auto NAME(const A& a) {                                                             \
    return detail::elementwise_op<#NAME, Linearity::nonlinear>(fn::NAME{}, a);        \
  }
/// Unary math, elementwise (a partial operand is reduced first).
SHARDLIB_UNARY(exp)
SHARDLIB_UNARY(log)
SHARDLIB_UNARY(sqrt)
SHARDLIB_UNARY(rsqrt)
SHARDLIB_UNARY(tanh)
SHARDLIB_UNARY(abs)
SHARDLIB_UNARY(square)
SHARDLIB_UNARY(relu)
SHARDLIB_UNARY(sigmoid)
SHARDLIB_UNARY(silu)
SHARDLIB_UNARY(gelu)
SHARDLIB_UNARY(gelu_tanh)
#undef SHARDLIB_UNARY

namespace fn {
/// Conversion to U (C++'s, rounded to nearest for f16 and bf16).
template <class U>
struct cast {
  template <class A>
  KOKKOS_INLINE_FUNCTION constexpr U operator()(const A& a) const {
    return static_cast<U>(a);
  }
};
}  // namespace fn

/// The elements of `a` converted to `U`, in `a`'s spec (no communication): float to bf16 or f16
/// rounds to nearest even (overflow to infinity), back is exact. Between floating-point types it
/// is treated as linear, so a partial tensor stays partial and its addends are converted (a
/// float32 gradient cast to bf16 is then reduced in bf16: half the bytes); an integer source or
/// target reduces a partial operand first. `cast<T>` of a tensor of T is a copy.
template <class U, TensorType A>
auto cast(const A& a) {
  static_assert(detail::is_element_v<U>, "shardlib: cast<U>: U must be a tensor element type (arithmetic, f16 or bf16)");
  constexpr bool linear = is_floating_v<U> && is_floating_v<typename A::value_type>;
  return detail::elementwise_op<"cast", linear ? Linearity::additive : Linearity::nonlinear, U>(fn::cast<U>{}, a);
}

/// `f(a_i, b_i, ...)` elementwise over tensors that broadcast against each other (numpy rules);
/// `f` is treated as nonlinear (partial operands are reduced first). The element type of the
/// result is what `f` returns.
template <class F, TensorType A, TensorType... B>
auto zip(F f, const A& a, const B&... b) {
  return detail::elementwise_op<"zip", Linearity::nonlinear>(f, a, b...);
}

}  // namespace shardlib
