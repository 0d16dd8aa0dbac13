// SPDX-License-Identifier: Apache-2.0
/// @file
/// What the differentiable ops share: operands that are `Var`s, `Param`s or plain tensors
/// (constants), recording a node when one of them needs a gradient, and handing gradient blocks
/// to the inputs (summed over broadcast dims, checked for NaN on request).
#pragma once

#include <shardlib/autodiff/var.hpp>
#include <shardlib/ops.hpp>

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib {

/// An operand of a differentiable op: a `Var`, a `Param` or a tensor (a constant).
template <class T>
concept VarOrTensor = VarType<T> || TensorType<T>;
/// Operands of a differentiable op: at least one is a `Var` (ops on tensors alone are the
/// ops of ops.hpp and record nothing).
template <class... Ts>
concept DifferentiableOperands = (VarOrTensor<Ts> && ...) && (VarType<Ts> || ...);

namespace autodiff::detail {

template <class X>
struct tensor_of {
  using type = std::remove_cvref_t<X>;
};
template <VarType X>
struct tensor_of<X> {
  using type = typename std::remove_cvref_t<X>::tensor_type;
};
/// The tensor type of an operand.
template <class X>
using tensor_of_t = typename tensor_of<X>::type;

/// An operand's value.
template <class X>
const tensor_of_t<X>& value(const X& x) noexcept {
  if constexpr (VarType<X>) return x.value();
  else return x;
}
/// An operand's node (null for a constant).
template <class X>
std::shared_ptr<TensorNode<tensor_of_t<X>>> node(const X& x) {
  if constexpr (VarType<X>) return x.node();
  else return nullptr;
}

/// A Var of `value`, with a node running `rule` when an input needs a gradient; else a constant.
template <class Out, class Rule, class... In>
Var<Out> record(const char* op, Out value, Rule rule, const std::shared_ptr<In>&... inputs) {
  if ((!inputs && ...) || !recording(inputs...)) return Var<Out>(std::move(value));
  auto n = std::make_shared<OpNode<Out, Rule>>(op, std::vector<std::shared_ptr<Node>>{inputs...}, value, std::move(rule));
  return Var<Out>(std::move(value), std::move(n));
}

/// Hands the gradient `g` (a typed tensor) to input `k` (node `to`), summed over the dims it was
/// broadcast along (numpy's rules undone; local, partial over split dims).
template <class In, class G>
void give(BackwardPass& pass, int k, TensorNode<In>& to, const G& g) {
  using T = typename In::value_type;
  Contribution c{G::sharding, g.block(), g.block_owner(), const_cast<T*>(g.local().data())};
  bool same = G::rank == In::rank;
  if constexpr (G::rank == In::rank) same = g.shape() == to.shape();
  if (!same)
    c = sum_to_shape<T, typename In::memory_space>(to.mesh().context(), to.mesh().shape(), G::sharding, g.shape(),
                                                  g.block(), g.local().data(), g.block_owner(), to.shape());
  if (pass.options.check_finite) check_finite<T, typename In::memory_space>(to.mesh().context(), c, *pass.current, k, to);
  to.add(std::move(c));
}
/// Hands an untyped contribution (a block of the input's shape) to input `k`.
template <class In>
void give(BackwardPass& pass, int k, TensorNode<In>& to, Contribution c) {
  if (pass.options.check_finite)
    check_finite<typename In::value_type, typename In::memory_space>(to.mesh().context(), c, *pass.current, k, to);
  to.add(std::move(c));
}

/// Both operands of a differentiable op have one element type.
template <class A, class B>
constexpr void require_same_element_type() {
  SHARDLIB_STATIC_REQUIRE((std::is_same_v<typename A::value_type, typename B::value_type>),
                          "shardlib: a differentiable op needs operands of one element type",
                          error::differentiable_op_operands_have_different_element_types<typename A::value_type,
                                                                                          typename B::value_type>);
}

}  // namespace autodiff::detail

/// The same global tensor with spec `NewSpec` (see reshard of tensors). Its backward hands the
/// gradient's blocks to the input as they are, so they resolve at the input: the transpose of an
/// all_gather is a reduce_scatter, of an all_reduce nothing, of an all-to-all an all-to-all.
template <class NewSpec, VarType V>
auto reshard(const V& v) {
  using In = typename std::remove_cvref_t<V>::tensor_type;
  using Out = DistributedTensor<typename In::value_type, typename In::mesh_type, NewSpec, typename In::memory_space>;
  Out out = shardlib::reshard<NewSpec>(v.value());
  if (!v.requires_grad() || !autodiff::detail::recording(v.node())) return Var<Out>(std::move(out));
  auto n = std::make_shared<autodiff::detail::ReshardNode<Out, In>>(v.node(), out);
  return Var<Out>(std::move(out), std::move(n));
}

/// Tag of `reshard<NewSpec>(v, sl::recompute)`.
struct Recompute {};
/// `reshard<NewSpec>(v, sl::recompute)`: the backward pass computes the value again where it needs
/// it instead of keeping it from the forward (ZeRO-3 / FSDP: a weight gathered for its matmul is
/// freed after the forward, gathered again in the backward).
inline constexpr Recompute recompute{};

/// `reshard<NewSpec>(v)` whose value the backward pass recomputes rather than keeps: a contraction
/// (einsum, matmul, and their _add forms) that reads it saves nothing of it and reshards `v`'s
/// value again when its rule runs, as does one reading a `cast` of it. So a layer's gathered weight
/// lives for the forward's own handles on it, not until the backward: ZeRO-3's memory (parameters
/// 1/N) for one more all_gather per weight in the backward, as FSDP's `reshard_after_forward`.
/// The value the backward reshards is `v`'s as it is then: do not update `v` in place between
/// the forward and the backward (an optimizer step comes after the backward). Other ops that
/// save their operand (elementwise products, the norms) keep the value as they would.
/// `auto w = sl::reshard<sl::Spec<sl::none, sl::none>>(w_zero3, sl::recompute);`
template <class NewSpec, VarType V>
auto reshard(const V& v, Recompute) {
  using In = typename std::remove_cvref_t<V>::tensor_type;
  using Out = DistributedTensor<typename In::value_type, typename In::mesh_type, NewSpec, typename In::memory_space>;
  Out out = shardlib::reshard<NewSpec>(v.value());
  if (!v.requires_grad() || !autodiff::detail::recording(v.node())) return Var<Out>(std::move(out));
  auto n = std::make_shared<autodiff::detail::ReshardNode<Out, In>>(
      v.node(), out, [source = v.value()] { return shardlib::reshard<NewSpec>(source); });
  return Var<Out>(std::move(out), std::move(n));
}

namespace autodiff::detail {
/// The operand with its partial clause resolved (a recorded reshard), for nonlinear ops; the
/// operand itself when it is not partial.
template <class X>
decltype(auto) resolved(const X& x) {
  using Tn = tensor_of_t<X>;
  if constexpr (!Tn::sharding.is_partial()) {
    return (x);
  } else if constexpr (VarType<X>) {
    return shardlib::reshard<typename grad_tensor_t<Tn>::spec_type>(x);
  } else {
    return grad_tensor_t<Tn>(x);
  }
}
}  // namespace autodiff::detail

}  // namespace shardlib
