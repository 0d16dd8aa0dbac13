// SPDX-License-Identifier: Apache-2.0
/// @file
/// Activation recomputation: `checkpoint(f, inputs...)` runs `f` forward without recording its
/// interior (its intermediate tensors are freed as `f` returns) and keeps only its inputs; the
/// backward pass runs `f` again, recording, and back-propagates through that copy. The gradients
/// are those of `f` recorded (the same kernels on the same values), for the bytes of the inputs
/// instead of every saved intermediate: a transformer stack keeps one [B, S, D] per layer.
///
/// The rules (docs/05_gradients.md, "Recomputing activations"): `f` takes the inputs as `Var`s and
/// returns one `Var`; it may read parameters it captures (their gradients arrive, resolved by the
/// pass as any parameter's), and constants; a `Var` it captures that is not a parameter is an
/// error (std::logic_error naming the op that made it): its gradient would have no path back.
/// `f` must compute the same thing when called again (no state it changes).
#pragma once

#include <shardlib/autodiff/record.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib {

namespace error {
/// `checkpoint(f, inputs...)`: f must return a Var (or Param) of a tensor.
template <class Result>
struct checkpoint_function_must_return_a_var;
}  // namespace error

namespace autodiff::detail {

/// A checkpoint's node: its inputs' values and nodes, and `f`, run again by the backward rule.
template <class Out, class F, class... Ins>
class CheckpointNode final : public TensorNode<Out> {
 public:
  CheckpointNode(std::vector<std::shared_ptr<Node>> inputs, const Out& value, F f, std::tuple<Var<Ins>...> args)
      : TensorNode<Out>("checkpoint", std::move(inputs), value), saved_(std::in_place, std::move(f), std::move(args)) {}

  void backward(BackwardPass& pass) override {
    if (!this->has_pending()) return;
    auto g = this->take_grad();
    auto& f = saved_->first;  // (not a structured binding: clang 14 cannot capture one)
    auto& args = saved_->second;
    // Fresh leaves stand for the inputs that need a gradient: the recomputed graph ends at them,
    // and what they receive goes on to the inputs' own nodes.
    auto fresh = std::apply([](const auto&... a) { return std::tuple{leaf_for(a)...}; }, args);
    auto out = std::apply([&](const auto&... a) { return f(a...); }, fresh);
    if (!out.requires_grad()) return;  // f's value depends on no input and no parameter: zero gradients
    out.node()->add(g);
    std::vector<std::shared_ptr<Node>> keep;
    const std::vector<Node*> order = backward_order(out.node().get(), keep);
    const Node* current = pass.current;
    try {
      for (Node* n : order)
        if (!n->as_leaf()) n->backward(pass);  // parameters: pending, resolved by the outer pass
    } catch (...) {
      pass.current = current;
      for (Node* n : order) n->drop_pending();  // the parameters' part is restored by the outer pass
      throw;
    }
    pass.current = current;
    for (Node* n : order)
      if (!n->as_leaf()) n->release();
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (pass_on(std::get<K>(fresh), std::get<K>(args)), ...);
    }(std::index_sequence_for<Ins...>{});
  }

 protected:
  void release_saved() override { saved_.reset(); }

 private:
  template <class T>
  static Var<T> leaf_for(const Var<T>& a) {
    if (!a.requires_grad()) return a;
    return Var<T>(a.value(), std::make_shared<LeafNode<T>>(a.value()));
  }
  template <class T>
  static void pass_on(const Var<T>& fresh, const Var<T>& arg) {
    if (arg.requires_grad() && fresh.node() != arg.node()) fresh.node()->pass_to(*arg.node());
  }

  std::optional<std::pair<F, std::tuple<Var<Ins>...>>> saved_;
};

template <class X>
Var<tensor_of_t<X>> as_var(const X& x) {
  if constexpr (VarType<X>) return Var<tensor_of_t<X>>(x.value(), x.node());
  else return Var<tensor_of_t<X>>(x);
}

}  // namespace autodiff::detail

/// While alive on this device's thread, ops on Params and Vars record nothing and return
/// constants (torch.no_grad): an evaluation's forward, a validation loss, sampling, whose values
/// alone are wanted — no graph is built and no tensor is saved for a backward. Scopes nest (a
/// checkpoint inside one records nothing either).
/// `{ sl::NoGrad no_grad; val += model.loss(ids, targets).value().item(); }`
class NoGrad {
 public:
  NoGrad() : scope_(autodiff::detail::NoRecordScope::Lenient{}) {}
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  autodiff::detail::NoRecordScope scope_;
};

/// Activation recomputation (see the file comment): `f(inputs...)`'s value, whose backward runs
/// `f` again. Inputs are `Var`s, `Param`s or tensors (constants); `f` receives each as a `Var` of
/// its tensor and returns a `Var`. Nested checkpoints recompute their interior again during the
/// outer one's recomputation.
/// `auto x2 = sl::checkpoint([&](const auto& x) { return block(x); }, x1);`
template <class F, VarOrTensor... Xs>
auto checkpoint(F f, const Xs&... inputs) {
  using namespace autodiff::detail;
  using Result = std::remove_cvref_t<std::invoke_result_t<F&, const Var<tensor_of_t<Xs>>&...>>;
  SHARDLIB_STATIC_REQUIRE(VarType<Result>, "shardlib: checkpoint(f, inputs...): f must return a Var",
                          error::checkpoint_function_must_return_a_var<Result>);
  if constexpr (VarType<Result>) {
    using Out = typename Result::tensor_type;
    std::tuple<Var<tensor_of_t<Xs>>...> args{as_var(inputs)...};
    if (NoRecordScope::current()) {  // inside another checkpoint's forward: nothing records anyway
      (recording(node(inputs)), ...);
      return Var<Out>(std::apply([&](const auto&... a) { return f(a...); }, args).value());
    }
    std::vector<std::shared_ptr<autodiff::Node>> nodes;  // the inputs that need a gradient, then the parameters f read
    ((node(inputs) ? nodes.push_back(node(inputs)) : void()), ...);
    Out value = [&] {
      NoRecordScope scope(std::vector<const autodiff::Node*>{node(inputs).get()...});
      Out v = std::apply([&](const auto&... a) { return f(a...); }, args).value();
      for (const std::shared_ptr<autodiff::Node>& l : scope.leaves())
        if (std::find(nodes.begin(), nodes.end(), l) == nodes.end()) nodes.push_back(l);
      return v;
    }();
    if (nodes.empty()) return Var<Out>(std::move(value));  // nothing needs a gradient: a constant
    auto n = std::make_shared<CheckpointNode<Out, F, tensor_of_t<Xs>...>>(std::move(nodes), value, std::move(f),
                                                                       std::move(args));
    return Var<Out>(std::move(value), std::move(n));
  }
}

}  // namespace shardlib
