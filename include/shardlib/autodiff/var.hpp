// SPDX-License-Identifier: Apache-2.0
/// @file
/// `Var` (a tensor that may carry a gradient), `Param` (a tensor the user trains), `backward()`,
/// `sync_grads()` and `value_and_grad()`.
///
/// Ops on `Var`s compute what the same ops on tensors compute and, when an operand needs a
/// gradient, record a node (graph.hpp). Ops on plain `DistributedTensor`s record nothing: there is
/// no tape where nothing needs a gradient. A gradient has its tensor's spec without the partial
/// clause: `grad()` of a `Param` is in the parameter's own spec.
#pragma once

#include <shardlib/autodiff/graph.hpp>
#include <shardlib/tensor.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib {

namespace error {
/// `grad()` is asked of a Var that is not a Param (only parameters keep a gradient).
template <class SpecT>
struct grad_is_asked_of_a_var_that_is_not_a_param;
/// `backward(y)` without a seed needs a scalar (rank-0) y.
template <class SpecT>
struct backward_without_a_seed_needs_a_scalar;
/// The seed of `backward(y, seed)` must have y's gradient spec (y's spec without partial clause).
template <class SeedSpec, class GradSpec>
struct backward_seed_has_another_spec_than_the_gradient;
/// A Param cannot be partial: its value is what devices hold, not addends of it.
template <class SpecT>
struct a_param_cannot_have_a_partial_spec;
/// Differentiable ops need operands of one element type.
template <class A, class B>
struct differentiable_op_operands_have_different_element_types;
}  // namespace error

namespace autodiff::detail {
/// The gradient type of `Tensor`: its spec without the partial clause (the tensor itself when
/// not partial).
template <class Tensor, bool Partial = Tensor::sharding.is_partial()>
struct grad_of {
  using type = Tensor;
};
template <class Tensor>
struct grad_of<Tensor, true> {
  static constexpr Sharding s = without_partial(Tensor::sharding);
  using type = DistributedTensor<typename Tensor::value_type, typename Tensor::mesh_type,
                                 spec_from_t<typename Tensor::mesh_type, decltype([] { return s; })>,
                                 typename Tensor::memory_space>;
};
}  // namespace autodiff::detail

/// The tensor type of a gradient of `Tensor` (its spec without partial clause).
template <class Tensor>
using grad_tensor_t = typename autodiff::detail::grad_of<Tensor>::type;

namespace autodiff::detail {

/// A node whose value is a `Tensor`: its shape and mesh, and its gradient's contributions.
template <class Tensor>
class TensorNode : public Node {
 public:
  using T = typename Tensor::value_type;
  using Mem = typename Tensor::memory_space;
  using Grad = grad_tensor_t<Tensor>;

  TensorNode(const char* op, std::vector<std::shared_ptr<Node>> inputs, const Tensor& value)
      : Node(op, std::move(inputs)), mesh_(value.mesh()), shape_(value.shape()) {}

  std::string describe() const override { return shape_text(shape_) + " with " + Tensor::spec_string(); }
  const typename Tensor::mesh_type& mesh() const noexcept { return mesh_; }
  const typename Tensor::Shape& shape() const noexcept { return shape_; }

  /// Adds a gradient contribution (a block in any sharding of this node's shape). A parameter's
  /// contributions count as `gradients` in the memory account from here on, not only once
  /// resolved: a pass with `sync = false` (a pipeline's micro-batches) holds them between passes.
  void add(Contribution c) {
    if (!as_leaf()) return add_contribution<T, Mem>(mesh_.context(), pending_, std::move(c));
    MemoryRoleScope role(MemoryRole::gradients);  // a sum of two is allocated as gradients
    add_contribution<T, Mem>(mesh_.context(), pending_, std::move(c));
    for (const Contribution& p : pending_)
      if (p.keep) block_cache<Mem>(mesh_.context()).retag(p.keep, MemoryRole::gradients);
  }
  /// Adds a typed gradient contribution.
  template <class G>
  void add(const G& g) {
    add(Contribution{G::sharding, g.block(), g.block_owner(), const_cast<T*>(g.local().data())});
  }
  /// Moves this node's contributions to `to` (a node of the same shape and element type).
  void pass_to(TensorNode& to) {
    for (Contribution& c : pending_) to.add(std::move(c));
    pending_.clear();
  }
  /// The gradient: the contributions resolved into the gradient's spec, or into tensor type `G`'s
  /// (an optimizer's state spec: ZeRO-2's reduce_scatter) (collective when one is partial or
  /// laid out otherwise), then forgotten.
  template <class G = Grad>
  G take_grad() {
    Block<T> b = resolve<T, Mem>(mesh_.context(), mesh_.shape(), shape_, pending_, G::sharding);
    pending_.clear();
    return G(mesh_, shape_, std::move(b.keep), const_cast<T*>(b.data));
  }

  /// Whether the backward pass can compute this node's value again instead of an op keeping it
  /// for its backward rule: a `reshard(v, sl::recompute)` (ZeRO-3's gathered weights), and a cast
  /// of one. A contraction (einsum, matmul) saves such an operand as nothing and recomputes it
  /// when its rule runs, so the value lives only as long as the forward's own handles on it.
  bool recomputable() const noexcept { return static_cast<bool>(recompute_); }
  /// This node's value, computed again (collective where the op is; only where recomputable()).
  Tensor recompute() const {
    if (!recompute_)
      throw std::logic_error("shardlib: recompute() of op '" + std::string(this->op()) +
                             "', whose value the backward cannot compute again (only reshard(v, sl::recompute) and a cast of it can)");
    return recompute_();
  }

 protected:
  typename Tensor::mesh_type mesh_;
  typename Tensor::Shape shape_;
  std::function<Tensor()> recompute_;  ///< set by the ops that can recompute their value (see recomputable())
};

/// An op's node: `Rule` runs the backward rule on the resolved gradient (a `grad_tensor_t<Out>`).
template <class Out, class Rule>
class OpNode final : public TensorNode<Out> {
 public:
  OpNode(const char* op, std::vector<std::shared_ptr<Node>> inputs, const Out& value, Rule rule)
      : TensorNode<Out>(op, std::move(inputs), value), rule_(std::move(rule)) {}
  void backward(BackwardPass& pass) override {
    if (!this->has_pending()) return;
    auto g = this->take_grad();
    pass.current = this;
    (*rule_)(g, pass);
  }

 protected:
  void release_saved() override { rule_.reset(); }

 private:
  std::optional<Rule> rule_;
};

/// A reshard's node: the gradient is the same global tensor, so its contributions go to the input
/// unchanged (resolved there: an all_gather's transpose is a reduce_scatter).
template <class Out, class In>
class ReshardNode final : public TensorNode<Out> {
 public:
  ReshardNode(std::shared_ptr<TensorNode<In>> input, const Out& value)
      : TensorNode<Out>("reshard", {input}, value), input_(std::move(input)) {}
  /// The same, whose value `recompute` computes again in the backward (reshard(v, sl::recompute)).
  ReshardNode(std::shared_ptr<TensorNode<In>> input, const Out& value, std::function<Out()> recompute)
      : ReshardNode(std::move(input), value) {
    this->recompute_ = std::move(recompute);
  }
  void backward(BackwardPass&) override {
    for (Contribution& c : this->pending_) input_->add(std::move(c));
    this->pending_.clear();
  }

 protected:
  void release_saved() override {
    input_.reset();
    this->recompute_ = nullptr;
  }

 private:
  std::shared_ptr<TensorNode<In>> input_;
};

/// A cast's node: each contribution goes to the input laid out as it is (a partial one stays
/// partial), its elements converted to the input's type: a float32 gradient of a 16-bit
/// parameter is reduced in 16 bits at the parameter (half the bytes).
template <class Out, class In>
class CastNode final : public TensorNode<Out> {
 public:
  CastNode(std::shared_ptr<TensorNode<In>> input, const Out& value)
      : TensorNode<Out>("cast", {input}, value), input_(std::move(input)) {}
  /// The same, recomputable (a cast of a recomputable value: `recompute` casts it again).
  CastNode(std::shared_ptr<TensorNode<In>> input, const Out& value, std::function<Out()> recompute)
      : CastNode(std::move(input), value) {
    this->recompute_ = std::move(recompute);
  }
  void backward(BackwardPass&) override {
    using U = typename Out::value_type;
    using T = typename In::value_type;
    using Mem = typename In::memory_space;
    Context& ctx = this->mesh_.context();
    for (Contribution& c : this->pending_) {
      const std::int64_t n = c.box.num_elements();
      std::shared_ptr<void> keep = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(n) * sizeof(T));
      T* out = static_cast<T*>(keep.get());
      convert_block<T, U, Mem>(ctx, out, static_cast<const U*>(c.data), n);
      input_->add(Contribution{c.sharding, c.box, std::move(keep), out});
    }
    this->pending_.clear();
  }

 protected:
  void release_saved() override {
    input_.reset();
    this->recompute_ = nullptr;
  }

 private:
  std::shared_ptr<TensorNode<In>> input_;
};

/// A parameter's node: its gradient, accumulated over backward passes until zeroed.
template <class Tensor>
class LeafNode final : public TensorNode<Tensor>, public LeafGrad {
  using T = typename Tensor::value_type;
  using Mem = typename Tensor::memory_space;

 public:
  explicit LeafNode(const Tensor& value) : TensorNode<Tensor>("param", {}, value) {}
  LeafGrad* as_leaf() noexcept override { return this; }
  void backward(BackwardPass&) override {}  // resolved by the pass (in buckets) or by sync_grads

  std::size_t elem_size() const noexcept override { return sizeof(T); }
  coll::DType dtype() const noexcept override { return coll::dtype_of<T>(); }
  Context& context() const override { return this->mesh_.context(); }
  const MeshShape& mesh_shape() const noexcept override { return this->mesh_.shape(); }
  bool has_pending_grad() const noexcept override { return this->has_pending(); }
  bool resolves_by_all_reduce(AxisList& axes) const override {
    if (this->pending_.size() != 1) return false;
    const Sharding& s = this->pending_.front().sharding;
    if (without_partial(s) != Tensor::sharding || s.op != ReduceOp::sum) return false;
    axes = s.partial;
    return true;
  }
  const Contribution& only_pending() const override { return this->pending_.front(); }
  bool in_host_memory() const noexcept override { return host_memory_v<Mem>; }
  bool bucketable() const override { return host_memory_v<Mem> || reshards_on_device<Mem>(this->mesh_.context()); }
  std::shared_ptr<void> allocate_bucket(std::size_t bytes) override {
    MemoryRoleScope role(MemoryRole::gradients);
    return block_cache<Mem>(this->mesh_.context()).allocate(bytes);
  }
  void copy_pending_to(void* dst) override {
    const Contribution& c = this->pending_.front();
    ShardBox b;
    b.rank = 1;
    b.extent[0] = c.box.num_elements();
    copy_box<Mem>(this->mesh_.context(), static_cast<const T*>(c.data), b, static_cast<T*>(dst), b, b);
  }
  coll::Communicator& bucket_group(const AxisList& axes) override {
    Context& ctx = this->mesh_.context();
    if constexpr (host_memory_v<Mem>) return ctx.group(this->mesh_.shape(), axes);
    else return ctx.device_group(this->mesh_.shape(), axes);
  }
  std::shared_ptr<void> resolve_alone() override {
    Block<T> b = resolve<T, typename Tensor::memory_space>(this->mesh_.context(), this->mesh_.shape(), this->shape_,
                                                          this->pending_, Tensor::sharding);
    return std::make_shared<Tensor>(this->mesh_, this->shape_, std::move(b.keep), const_cast<T*>(b.data));
  }
  std::shared_ptr<void> from_block(std::shared_ptr<void> keep, void* data) override {
    return std::make_shared<Tensor>(this->mesh_, this->shape_, std::move(keep), static_cast<T*>(data));
  }
  void commit(const std::shared_ptr<void>& resolved) override {
    this->pending_.clear();
    const Tensor& g = *static_cast<const Tensor*>(resolved.get());
    if (!grad_) {
      grad_ = g;
    } else {
      Tensor sum(this->mesh_, this->shape_);
      add_blocks<T, Mem>(this->mesh_.context(), sum.local().data(), grad_->local().data(), g.local().data(),
                 sum.block().num_elements());
      grad_ = std::move(sum);
    }
    tag_memory(*grad_, MemoryRole::gradients);
  }

  bool settles() const noexcept override { return settle_.has_value(); }
  std::size_t full_bytes() const noexcept override {
    std::size_t n = sizeof(T);
    for (auto e : this->shape_) n *= static_cast<std::size_t>(e);
    return n;
  }
  void settle() override {
    if (settle_) settle_as(*settle_);
  }
  void settle_own() override { settle_as(Tensor::sharding); }
  /// Where `settle` resolves pending contributions (an optimizer's state layout), or nothing.
  void settle_into(std::optional<Sharding> layout) noexcept { settle_ = layout; }

  const std::optional<Tensor>& grad() const noexcept { return grad_; }
  void zero_grad() noexcept {
    grad_.reset();
    this->pending_.clear();
  }

 protected:
  void release_saved() override {}

 private:
  /// The pending contributions resolved into `layout`, as the one pending contribution.
  void settle_as(const Sharding& layout) {
    if (this->pending_.empty()) return;
    if (this->pending_.size() == 1 && this->pending_.front().sharding == layout) return;
    Block<T> b = resolve<T, Mem>(this->mesh_.context(), this->mesh_.shape(), this->shape_, this->pending_, layout);
    if (b.keep) block_cache<Mem>(this->mesh_.context()).retag(b.keep, MemoryRole::gradients);
    Contribution c{layout, b.box, std::move(b.keep), const_cast<T*>(b.data)};
    this->pending_.clear();
    this->pending_.push_back(std::move(c));
  }

  std::optional<Tensor> grad_;
  std::optional<Sharding> settle_;
};

}  // namespace autodiff::detail

/// A tensor that may carry a gradient: the value of an op on `Var`s or `Param`s, or a constant
/// (a `Var` made from a tensor). Copies share the value's block and the graph node. The tensor
/// may live in device memory: the backward rules, the gradients' sums and their buckets are then
/// kernels and collectives on the device's stream (docs/13_gpus.md).
template <class Tensor>
class Var {
  static_assert(is_tensor_v<Tensor>, "shardlib: Var<Tensor>: Tensor must be a DistributedTensor<...>");

 public:
  using tensor_type = Tensor;
  using value_type = typename Tensor::value_type;
  using mesh_type = typename Tensor::mesh_type;
  using spec_type = typename Tensor::spec_type;
  using memory_space = typename Tensor::memory_space;
  using node_type = autodiff::detail::TensorNode<Tensor>;
  static constexpr std::size_t rank = Tensor::rank;
  static constexpr Sharding sharding = Tensor::sharding;

  /// A constant: ops on it record nothing for it.
  explicit Var(Tensor value) : value_(std::move(value)) {}
  /// Internal (ops): a value and the node that made it.
  Var(Tensor value, std::shared_ptr<node_type> node) : value_(std::move(value)), node_(std::move(node)) {}

  const Tensor& value() const noexcept { return value_; }
  /// Whether a gradient flows back through this Var (it depends on a Param).
  bool requires_grad() const noexcept { return node_ != nullptr; }
  const typename Tensor::Shape& shape() const noexcept { return value_.shape(); }
  const mesh_type& mesh() const noexcept { return value_.mesh(); }
  Context& context() const { return value_.context(); }
  static std::string spec_string() { return Tensor::spec_string(); }
  /// Internal (ops): the node, or null for a constant.
  const std::shared_ptr<node_type>& node() const noexcept { return node_; }

  /// Only a `Param` keeps a gradient: asking one of another Var does not compile.
  template <class D = void>
  void grad() const {
    SHARDLIB_STATIC_REQUIRE((!std::is_void_v<D>), "shardlib: grad() is asked of a Var that is not a Param",
                            error::grad_is_asked_of_a_var_that_is_not_a_param<spec_type>);
  }

 protected:
  Tensor value_;
  std::shared_ptr<node_type> node_;
};

/// A tensor the user trains: gradients flow into it. `grad()` is in the parameter's own spec,
/// accumulated over backward passes until `zero_grad()`. The spec cannot be partial.
template <class Tensor>
class Param : public Var<Tensor> {
  SHARDLIB_STATIC_REQUIRE((!Tensor::sharding.is_partial()), "shardlib: a Param cannot have a partial spec",
                          error::a_param_cannot_have_a_partial_spec<typename Tensor::spec_type>);
  using Leaf = autodiff::detail::LeafNode<Tensor>;

 public:
  /// Counts the value's block as parameters in the device's memory ledger (memory.hpp).
  explicit Param(Tensor value) : Var<Tensor>(value, std::make_shared<Leaf>(value)) {
    tag_memory(this->value_, MemoryRole::parameters);
  }

  /// The accumulated gradient, in the parameter's spec (zeros when no backward reached it since
  /// the last zero_grad). Throws std::logic_error while contributions are pending
  /// (backward with `sync = false`): call `sync_grads` first.
  Tensor grad() const {
    if (leaf().has_pending())
      throw std::logic_error("shardlib: grad() of a parameter " + leaf().describe() +
                             " whose gradient is pending (backward with sync = false): call sync_grads first");
    if (leaf().grad()) return *leaf().grad();
    return Tensor::zeros(this->value_.mesh(), this->value_.shape(), shardlib::detail::same_shape);
  }
  /// Forgets the accumulated gradient (and pending contributions).
  void zero_grad() noexcept { leaf().zero_grad(); }
  /// The value, for an optimizer to update in place (the block is shared with this Param).
  Tensor& value() noexcept { return this->value_; }
  const Tensor& value() const noexcept { return this->value_; }
  /// Internal.
  Leaf& leaf() const noexcept { return static_cast<Leaf&>(*this->node_); }
};

template <class T>
inline constexpr bool is_var_v = false;
template <class T>
inline constexpr bool is_var_v<Var<T>> = true;
template <class T>
inline constexpr bool is_var_v<Param<T>> = true;
/// A `Var<...>` or `Param<...>` (cv-ref ignored).
template <class T>
concept VarType = is_var_v<std::remove_cvref_t<T>>;

namespace autodiff::detail {

/// The backward pass from `root`, whose seed contribution is added: the rules in reverse
/// topological order, then (with options.sync) the parameters' gradients resolved and added.
/// What it allocates counts as MemoryRole::temporaries, parameters' gradients as gradients.
/// Without options.keep_graph each node's saved tensors are freed as soon as its rule has run
/// (its consumers ran before it), so the activations shrink while the gradients grow, as in
/// PyTorch. When it throws, no parameter's gradient changed and the contributions of this pass
/// are dropped; the nodes whose rules had run stay freed (another backward through them throws,
/// naming the op: keep_graph = true keeps a graph for a retry).
SHARDLIB_NOINLINE inline void run_backward(Node& root, const BackwardOptions& options) {
  MemoryRoleScope role(MemoryRole::temporaries);
  std::vector<std::shared_ptr<Node>> keep;
  const std::vector<Node*> order = backward_order(&root, keep);
  for (Node* n : order)
    if (n->freed())
      throw std::logic_error(std::string("shardlib: backward through op '") + n->op() + "' (output " + n->describe() +
                             ") whose saved tensors a previous backward freed (pass keep_graph = true to the first)");
  BackwardPass pass{options};
  std::vector<LeafGrad*> leaves, unsettled;
  std::size_t unsettled_bytes = 0;
  auto settle_all = [&] {
    for (LeafGrad* l : unsettled) options.sync ? l->settle_own() : l->settle();
    unsettled.clear();
    unsettled_bytes = 0;
  };
  std::vector<std::pair<Node*, std::vector<Contribution>>> before;  // the leaves' pending, to restore
  for (Node* n : order)
    if (n->as_leaf()) before.emplace_back(n, n->pending());
  try {
    for (Node* n : order) {
      if (LeafGrad* l = n->as_leaf()) {
        leaves.push_back(l);
        // Every consumer of the parameter has run: its pending gradient is complete. ZeRO-2's
        // reduce_scatters go by buckets of full-size bytes (the same on every device), as do
        // ZeRO-3's (a split parameter's gradient, resolved with sync = true) into its own spec.
        AxisList axes;
        const bool settles = options.sync ? !l->resolves_by_all_reduce(axes) : options.settle && l->settles();
        if (settles && l->has_pending_grad()) {
          unsettled.push_back(l);
          unsettled_bytes += l->full_bytes();
          if (unsettled_bytes >= options.bucket_bytes) settle_all();
        }
        continue;
      }
      n->backward(pass);
      if (!options.keep_graph) n->release();
    }
    settle_all();
    if (options.sync) {
      std::erase_if(leaves, [](LeafGrad* l) { return !l->has_pending_grad(); });
      resolve_leaves(leaves, options.bucket_bytes);
    }
  } catch (...) {
    for (Node* n : order)
      if (!n->as_leaf()) n->drop_pending();
    for (auto& [n, p] : before) n->set_pending(std::move(p));
    throw;
  }
}

}  // namespace autodiff::detail

/// Runs the backward pass from a scalar `loss` (seed 1): every `Param` it depends on gets
/// d loss / d param added to its gradient (see BackwardOptions for when pending sums resolve).
/// Collective: every device calls it on its part of the same graph.
template <class Tensor>
void backward(const Var<Tensor>& loss, const BackwardOptions& options = {}) {
  SHARDLIB_STATIC_REQUIRE((Tensor::rank == 0), "shardlib: backward(y) without a seed needs a scalar (rank-0) y",
                          error::backward_without_a_seed_needs_a_scalar<typename Tensor::spec_type>);
  if constexpr (Tensor::rank == 0) {
    if (!loss.requires_grad()) return;
    using G = grad_tensor_t<Tensor>;
    loss.node()->add(G::full(loss.mesh(), {}, typename Tensor::value_type(1)));
    autodiff::detail::run_backward(*loss.node(), options);
  }
}

/// Runs the backward pass from `y` with the seed gradient `seed` (d loss / d y, in y's gradient
/// spec: y's spec without partial clause). Throws std::invalid_argument when the shapes differ.
template <class Tensor, class Seed>
void backward(const Var<Tensor>& y, const Seed& seed, const BackwardOptions& options = {}) {
  using G = grad_tensor_t<Tensor>;
  SHARDLIB_STATIC_REQUIRE((std::is_same_v<typename Seed::spec_type, typename G::spec_type> &&
                           std::is_same_v<typename Seed::value_type, typename Tensor::value_type>),
                          "shardlib: the seed of backward(y, seed) must have y's gradient spec and element type",
                          error::backward_seed_has_another_spec_than_the_gradient<typename Seed::spec_type,
                                                                                  typename G::spec_type>);
  if (seed.shape() != y.shape())
    throw std::invalid_argument("shardlib: backward: the seed " + shardlib::detail::operand_text(seed) +
                                " does not have the shape of y " + shardlib::detail::operand_text(y.value()));
  if (!y.requires_grad()) return;
  y.node()->add(seed);
  autodiff::detail::run_backward(*y.node(), options);
}

/// Resolves the gradients left pending by backward passes with `sync = false` (gradient
/// accumulation: one reduction for N micro-batches), in buckets as backward does. Collective.
template <class... Tensors>
void sync_grads(const Param<Tensors>&... params) {
  std::vector<autodiff::LeafGrad*> leaves;
  ((params.leaf().has_pending() ? leaves.push_back(&params.leaf()) : void()), ...);
  autodiff::detail::resolve_leaves(leaves, BackwardOptions{}.bucket_bytes);
}
template <class... Tensors>
void sync_grads(std::size_t bucket_bytes, const Param<Tensors>&... params) {
  std::vector<autodiff::LeafGrad*> leaves;
  ((params.leaf().has_pending() ? leaves.push_back(&params.leaf()) : void()), ...);
  autodiff::detail::resolve_leaves(leaves, bucket_bytes);
}

/// JAX's value_and_grad: calls `f(Param<...>...)` on parameters made from `tensors` (f returns a
/// scalar `Var`), runs its backward pass and returns `std::pair{loss, grads}`:
/// - `loss`: the loss's value, resolved: a rank-0 tensor replicated on every device (a loss that
///   was a partial sum over the batch's axes is all-reduced, one number), so `loss.item()` is the
///   number on every device;
/// - `grads`: a `std::tuple` of the gradients, each in its tensor's spec (and type).
///
/// `auto [loss, grads] = value_and_grad(f, w1, w2); double l = loss.item(); auto& g1 = std::get<0>(grads);`
template <class F, class... Tensors>
auto value_and_grad(F&& f, const Tensors&... tensors) {
  std::tuple<Param<Tensors>...> params{Param<Tensors>(tensors)...};
  auto loss = std::apply(f, params);
  using L = typename decltype(loss)::tensor_type;
  static_assert(L::rank == 0, "shardlib: value_and_grad: f must return a scalar (rank-0) Var, the loss");
  backward(loss);
  return std::pair{grad_tensor_t<L>(loss.value()), std::apply([](const auto&... p) { return std::tuple{p.grad()...}; }, params)};
}

}  // namespace shardlib
