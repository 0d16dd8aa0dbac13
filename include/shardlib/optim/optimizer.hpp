// SPDX-License-Identifier: Apache-2.0
/// @file
/// `Optimizer<Rule>`: a first-order optimizer over sharded `Param`s whose state tensors take a
/// spec of their own (docs/08_training.md). The rule (optim/sgd.hpp, optim/adamw.hpp) says how
/// many state tensors a parameter has and how one shard is updated; this file does the rest,
/// the same for every rule:
///
/// - `add(param)` keeps the state in the parameter's spec (data parallelism, FSDP: the update is
///   local); `add<StateSpec>(param)` in another (ZeRO: the state split over `"data"` while the
///   parameter is replicated); `add_zero<"data">(params...)` picks that spec for each parameter.
/// - `step()`:
///   1. the learning rate (the schedule's, checked finite and >= 0);
///   2. gradients still pending (a backward with `sync = false`) resolve straight into the
///      state's spec: a reduce_scatter where the state is split and the parameter is not
///      (ZeRO-2), one all_reduce per bucket where the state has the parameter's spec;
///   3. clipping by the global norm: the sum of squares of each gradient element counted once
///      (on the primary replica of its block), one all_reduce of one number for all parameters;
///   4. the update of each state shard and the parameter's values there (local);
///   5. where the state's spec differs from the parameter's, the updated values are gathered
///      back into the parameter's block (one all_gather for a replicated parameter: ZeRO-1/2).
///   A step either updates every parameter or, when it throws before step 4 (a bad learning
///   rate, a non-finite gradient norm), none.
///
/// Mixed precision: a parameter of f16 or bf16 elements gets float32 master weights, kept at its
/// state's shard with the state (float32 too); the update runs on them and the parameter gets
/// them rounded (gathered back in 16 bits where the specs differ). Its gradients stay 16-bit:
/// reduced in 16 bits (half the bytes), read as float32 by the update. With AdamW that is the
/// ZeRO paper's 16 bytes per parameter: 2 (parameter) + 2 (gradient) + 12 (master, two moments).
/// f16 gradients need loss scaling (`step(LossScaler&)`, optim/loss_scaler.hpp); bf16 ones do not.
///
/// In shape-only mode (detail/shape_only.hpp) a step allocates what a real one does and computes
/// nothing: the gradients' norm is zero (finite: the step is taken, the loss scaler counts a good
/// step, clipping scales by 1).
#pragma once

#include <shardlib/autodiff/var.hpp>
#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/kernels/optim.hpp>
#include <shardlib/detail/diagnostics.hpp>
#include <shardlib/memory.hpp>
#include <shardlib/ops/elementwise.hpp>
#include <shardlib/optim/loss_scaler.hpp>
#include <shardlib/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib {

namespace error {
/// The optimizer state of a parameter must have the parameter's rank.
template <class StateSpec, class ParamSpec>
struct optimizer_state_spec_has_another_rank_than_the_parameter;
/// Optimizer state is a value, not addends: its spec cannot be partial.
template <class StateSpec>
struct optimizer_state_spec_cannot_be_partial;
}  // namespace error

namespace optim {

/// A learning-rate schedule: the rate of step `t` (t = 1 for the first step).
using Schedule = std::function<double(std::int64_t t)>;

namespace detail {

/// The spec `Tensor`'s optimizer state takes under ZeRO over mesh axis `Axis`: the parameter's
/// spec with `Axis` added to its first unsplit dim (to dim 0's axes when every dim is split);
/// the parameter's own spec when `Axis` already splits it (FSDP) or it is a scalar.
template <class Tensor, AxisName Axis>
struct zero_spec {
  static constexpr Sharding make() {
    Sharding s = Tensor::sharding;
    const int a = Tensor::mesh_type::template index_of<Axis>();
    if (s.rank == 0 || s.shards_over(a)) return s;
    for (int d = 0; d < s.rank; ++d)
      if (s.dims[static_cast<std::size_t>(d)].empty()) {
        s.dims[static_cast<std::size_t>(d)].push_back(a);
        return s;
      }
    s.dims[0].push_back(a);
    return s;
  }
  static constexpr Sharding sharding = make();
  using type = spec_from_t<typename Tensor::mesh_type, decltype([] { return sharding; })>;
};

/// Throws std::invalid_argument "shardlib: NAME: WHAT is V: WANT".
[[noreturn]] inline void bad_option(const char* optimizer, const char* what, double v, const char* want) {
  throw std::invalid_argument(std::string("shardlib: ") + optimizer + ": " + what + " is " + std::to_string(v) + ": " +
                              want);
}

/// The checks every optimizer's options share: lr (unless a schedule gives it), weight_decay,
/// clip_norm.
template <class Options>
void check_common_options(const char* optimizer, const Options& o) {
  if (!o.schedule && !(std::isfinite(o.lr) && o.lr >= 0)) bad_option(optimizer, "lr", o.lr, "it must be finite and >= 0");
  if (!(std::isfinite(o.weight_decay) && o.weight_decay >= 0))
    bad_option(optimizer, "weight_decay", o.weight_decay, "it must be >= 0");
  if (!(std::isfinite(o.clip_norm) && o.clip_norm >= 0))
    bad_option(optimizer, "clip_norm", o.clip_norm, "it must be >= 0 (0: off)");
}

/// Whether `P` is a `Param<...>` (and its tensor type).
template <class P>
struct is_param : std::false_type {};
template <class Tensor>
struct is_param<Param<Tensor>> : std::true_type {
  using tensor = Tensor;
};

}  // namespace detail

/// The spec of `Tensor` with mesh axis `Axis` added to its first unsplit dim (to dim 0's axes
/// when every dim is split; unchanged when `Axis` already splits it or it is a scalar): where
/// ZeRO keeps a parameter's optimizer state (`add_zero`), and where FSDP keeps the parameter.
template <class Tensor, AxisName Axis>
using zero_spec_t = typename detail::zero_spec<Tensor, Axis>::type;

namespace detail {

/// What the optimizer needs of one parameter, whatever its type and its state's spec.
template <class Rule>
class Slot {
 public:
  virtual ~Slot() = default;
  virtual const void* id() const noexcept = 0;  // the parameter's leaf: one slot per parameter
  virtual Context& context() const = 0;
  virtual std::string describe() const = 0;
  /// Pending gradient that resolves by the bucketed all_reduce (state in the parameter's spec).
  virtual autodiff::LeafGrad* bucketed_pending() noexcept = 0;
  /// Resolves what is pending into the state's spec and makes the step's gradient; false when
  /// the parameter has no gradient (no backward reached it since zero_grad: it is skipped).
  virtual bool take_grad() = 0;
  /// Sum of squares of the step's gradient over the elements this device counts (each global
  /// element on one device).
  /// This device's part of the gradients' sum of squares: its block's, when it is the block's
  /// primary replica; along mesh axis `stage` (a pipeline's, or empty) every device counts its own.
  virtual double local_sum_of_squares(const AxisName& stage) const = 0;
  /// The update of this device's shard (local).
  virtual void update(const typename Rule::Step& step) = 0;
  /// Writes the updated values back into the parameter (collective where the specs differ), and
  /// drops the step's gradient unless the optimizer holds it (ZeRO-2).
  virtual void finish() = 0;
  virtual void zero_grad() noexcept = 0;
  virtual std::int64_t num_elements() const noexcept = 0;
};

template <class Rule, class Tensor, class StateSpec>
class TypedSlot final : public Slot<Rule> {
 public:
  using T = typename Tensor::value_type;
  /// Mixed precision: a 16-bit parameter gets float32 master weights and state.
  static constexpr bool mixed = is_half_v<T>;
  using M = compute_t<T>;
  using Mesh = typename Tensor::mesh_type;
  using Mem = typename Tensor::memory_space;
  /// Optimizer state (and master weights): float32 for a 16-bit parameter.
  using State = DistributedTensor<M, Mesh, StateSpec, Mem>;
  /// The parameter's type in the state's spec: the step's gradient, and the updated values.
  using Shard = DistributedTensor<T, Mesh, StateSpec, Mem>;
  static constexpr bool same_spec = std::is_same_v<Shard, Tensor>;

  TypedSlot(const Param<Tensor>& p, int num_states) : param_(p) {
    MemoryRoleScope role(MemoryRole::optimizer_state);
    for (int i = 0; i < num_states; ++i)
      state_.push_back(State::zeros(p.value().mesh(), p.value().shape(), shardlib::detail::same_shape));
    if constexpr (mixed) master_.emplace(shardlib::cast<M>(p.value()));  // at the state's shard: local
    // ZeRO-2: a backward that leaves the gradient pending reduce-scatters it into the state's
    // layout as soon as it is done with the parameter (the full-size addend freed then).
    if constexpr (!same_spec) param_.leaf().settle_into(State::sharding);
  }
  ~TypedSlot() override {
    if constexpr (!same_spec) param_.leaf().settle_into(std::nullopt);
  }
  TypedSlot(const TypedSlot&) = delete;
  TypedSlot& operator=(const TypedSlot&) = delete;
  const void* id() const noexcept override { return &param_.leaf(); }
  Context& context() const override { return param_.value().context(); }
  std::string describe() const override {
    return "parameter " + shardlib::detail::shape_text(param_.shape()) + " with " + Tensor::spec_string() +
           " (state with " + State::spec_string() + ")";
  }
  autodiff::LeafGrad* bucketed_pending() noexcept override {
    return same_spec && param_.leaf().has_pending() ? &param_.leaf() : nullptr;
  }
  bool take_grad() override {
    auto& leaf = param_.leaf();
    if (leaf.has_pending()) {  // resolve straight into the state's spec
      Shard g = leaf.template take_grad<Shard>();
      if (leaf.grad()) {  // an earlier synchronised pass left a gradient: add it in the state's spec
        const Shard c(*leaf.grad());
        autodiff::detail::add_blocks<T, Mem>(context(), g.local().data(), g.local().data(), c.local().data(), g.block().num_elements());
      }
      if (held_)  // the gradient held since the last zero_grad: gradients add up until zero_grad
        autodiff::detail::add_blocks<T, Mem>(context(), g.local().data(), g.local().data(), held_->local().data(),
                                     g.block().num_elements());
      leaf.zero_grad();
      tag_memory(g, MemoryRole::gradients);
      held_ = std::move(g);  // the gradient lives here now, in the state's spec
      grad_ = held_;
      return true;
    }
    if (held_) {  // a step again without a new backward: the same gradient
      if (leaf.grad()) {  // but a synchronised backward since: its gradient adds to the held one
        const Shard c(*leaf.grad());
        Shard g = Shard::uninitialized(held_->mesh(), held_->shape(), shardlib::detail::same_shape);
        autodiff::detail::add_blocks<T, Mem>(context(), g.local().data(), held_->local().data(), c.local().data(),
                                     g.block().num_elements());
        leaf.zero_grad();
        tag_memory(g, MemoryRole::gradients);
        held_ = std::move(g);
      }
      grad_ = held_;
      return true;
    }
    if (!leaf.grad()) return false;
    if constexpr (same_spec)
      grad_ = *leaf.grad();
    else
      grad_ = Shard(*leaf.grad());  // a local slice when the parameter is replicated (ZeRO-1)
    return true;
  }
  double local_sum_of_squares(const AxisName& stage) const override {
    const Shard& g = *grad_;
    const MeshShape& mesh = g.mesh().shape();
    const auto c = mesh.coords(context().device());
    const int own = stage.empty() ? -1 : mesh.find(stage);  // each stage holds its own parameters
    for (int a : State::sharding.replicated_axes(mesh.rank()))
      if (a != own && c[static_cast<std::size_t>(a)] != 0) return 0;  // not the block's primary replica
    auto guard = shardlib::detail::kernel_guard_for<Mem>(context(), true);
    return kernels::sum_of_squares(context().template exec_for<Mem>(), g.block().num_elements(), g.local().data());
  }
  void update(const typename Rule::Step& step) override {
    if constexpr (mixed) {
      run(*master_, step);  // float32 master weights; the parameter gets them rounded
      if constexpr (same_spec) round_into(param_.value());
      else
        round_into(values_.emplace(
            Shard::uninitialized(param_.value().mesh(), param_.value().shape(), shardlib::detail::same_shape)));
    } else if constexpr (same_spec) {
      run(param_.value(), step);
    } else {
      values_ = Shard(param_.value());  // the parameter's values at the state's shard
      run(*values_, step);
    }
  }
  void finish() override {
    if constexpr (!same_spec) {
      if (!values_) {  // no update ran (a step that throws): nothing to write back
        grad_.reset();
        return;
      }
      const Tensor back(*values_);  // one all_gather for a replicated parameter (16-bit: half the bytes)
      if (!shardlib::shape_only()) {  // (shape-only mode: no values to copy)
        const auto& exec = context().template exec_for<Mem>();
        Kokkos::deep_copy(exec, param_.value().local(), back.local());
        if constexpr (shardlib::detail::host_memory_v<Mem>) kernels::fence(exec);
      }
      values_.reset();
    }
    grad_.reset();
  }
  void zero_grad() noexcept override {
    param_.zero_grad();
    held_.reset();
  }
  std::int64_t num_elements() const noexcept override { return param_.value().size(); }
  /// The state tensors (Rule::num_states of them) and the master weights (16-bit parameters).
  std::vector<State>& states() noexcept { return state_; }
  std::optional<State>& master() noexcept { return master_; }

 private:
  template <class P>
  void run(P& p, const typename Rule::Step& step) {
    M* s[Rule::max_states] = {};
    for (std::size_t i = 0; i < state_.size(); ++i) s[i] = state_[i].local().data();
    auto guard = shardlib::detail::kernel_guard_for<Mem>(context(), false);
    Rule::update(context().template exec_for<Mem>(), p.block().num_elements(), p.local().data(), grad_->local().data(), s, step);
  }
  /// The master weights rounded into `out`'s block (laid out as the state's; local).
  template <class Out>
  void round_into(Out& out) {
    autodiff::detail::convert_block<T, M, Mem>(context(), out.local().data(), master_->local().data(), out.block().num_elements());
  }

  Param<Tensor> param_;
  std::vector<State> state_;
  std::optional<State> master_;  // mixed precision: the float32 master weights, at the state's shard
  std::optional<Shard> grad_;    // the step's gradient, in the state's spec
  std::optional<Shard> held_;    // a gradient resolved into the state's spec (ZeRO-2), until zero_grad
  std::optional<Shard> values_;  // the parameter's updated values at the state's shard
};

}  // namespace detail

/// A first-order optimizer over sharded parameters (see the file comment). `Rule` is
/// `SgdRule` or `AdamWRule`: use the aliases `SGD` and `AdamW`. Every call is collective:
/// every device adds the same parameters in the same order and steps together.
template <class Rule>
class Optimizer {
 public:
  using Options = typename Rule::Options;

  /// Throws std::invalid_argument naming the option when a hyperparameter is out of range.
  explicit Optimizer(Options options) : options_(std::move(options)) { Rule::check(options_); }

  /// Adds parameters whose state takes the parameter's own spec (DP, FSDP, TP: a local update).
  /// (Takes `Params` rather than `Param<Tensors>`, so that `add<StateSpec>(param)` below never
  /// names a `Param<StateSpec>`: that is a hard error, not a candidate set aside.)
  template <class... Params>
    requires(detail::is_param<Params>::value && ...)
  Optimizer& add(const Params&... params) {
    (add_one<typename detail::is_param<Params>::tensor::spec_type>(params), ...);
    return *this;
  }
  /// Adds a parameter whose state takes `StateSpec` (same rank, not partial): the update runs on
  /// the state's shards and the values are gathered back into the parameter.
  template <class StateSpec, class Tensor>
  Optimizer& add(const Param<Tensor>& param) {
    add_one<StateSpec>(param);
    return *this;
  }
  /// Adds parameters with their state split over mesh axis `Axis` (ZeRO-1/2): each parameter's
  /// spec with `Axis` on its first unsplit dim; uneven sizes are fine.
  template <AxisName Axis, class... Tensors>
  Optimizer& add_zero(const Param<Tensors>&... params) {
    (add_one<zero_spec_t<Tensors, Axis>>(params), ...);
    return *this;
  }

  /// One step (see the file comment). Collective.
  void step() { step_impl(nullptr); }

  /// One step of loss-scaled training (f16; optim/loss_scaler.hpp): the gradients are those of
  /// `loss * scaler.scale()`. Their global norm is taken whether or not clipping is on (one
  /// all_reduce of one number); when it is not finite (an overflow on any device) the step is
  /// skipped (no parameter, state or step count changes, the step's gradients are dropped as
  /// after any step) and the scale backs off; otherwise the gradients are divided by the scale
  /// (and clipped by their true norm) in the update. Returns whether the step was taken.
  bool step(LossScaler& scaler) { return step_impl(&scaler); }

  /// Pipeline parallelism (docs/11_pipeline_parallel.md): along mesh axis `axis` each device holds
  /// the parameters of its own stage, whose specs do not name the axis; the global norm then adds
  /// every stage's gradients (otherwise a parameter replicated along an axis counts once).
  Optimizer& stage_axis(const AxisName& axis) {
    stage_axis_ = axis;
    return *this;
  }

  /// Forgets every parameter's gradient (and those the optimizer holds in its state's spec).
  void zero_grad() noexcept {
    for (auto& s : slots_) s->zero_grad();
  }
  /// Steps taken.
  std::int64_t steps() const noexcept { return steps_; }
  /// What the optimizer keeps for one parameter, as tensors in the state's spec (references into
  /// the optimizer: valid while it lives). For checkpoints: io::save them beside the parameters
  /// and io::load into them (any mesh, any spec) to resume, with `set_steps`.
  template <class State>
  struct ParamState {
    std::vector<State>& moments;  ///< AdamW: the first and second moments; SGD: the momentum (if any)
    State* master;                ///< a 16-bit parameter's float32 master weights; null otherwise
  };
  /// The state of parameter `p`, added with state spec `StateSpec` (p's own spec after add(p),
  /// `zero_spec_t<Tensor, Axis>` after add_zero<Axis>(p), the given one after add<StateSpec>(p)).
  /// Throws std::invalid_argument when p was not added, or was added with another state spec.
  template <class StateSpec, class Tensor>
  auto state(const Param<Tensor>& p) {
    using Typed = detail::TypedSlot<Rule, Tensor, StateSpec>;
    for (auto& s : slots_) {
      if (s->id() != &p.leaf()) continue;
      auto* typed = dynamic_cast<Typed*>(s.get());
      if (!typed)
        throw std::invalid_argument(std::string("shardlib: ") + Rule::name + "::state: the " + s->describe() +
                                    " was added with another state spec than " + StateSpec::value.to_string());
      return ParamState<typename Typed::State>{typed->states(), typed->master() ? &*typed->master() : nullptr};
    }
    throw std::invalid_argument(std::string("shardlib: ") + Rule::name + "::state: the parameter " +
                                p.value().spec_string() + " " + shardlib::detail::shape_text(p.shape()) +
                                " was not added to this optimizer");
  }
  /// Sets the number of steps taken (a resumed run's: AdamW's bias correction and the schedule
  /// count from it). Throws std::invalid_argument for a negative count.
  void set_steps(std::int64_t steps) {
    if (steps < 0)
      throw std::invalid_argument(std::string("shardlib: ") + Rule::name + "::set_steps: " + std::to_string(steps) +
                                  " steps: the count cannot be negative");
    steps_ = steps;
  }
  /// The gradients' global norm at the last step (before clipping); NaN when not clipping.
  double last_grad_norm() const noexcept { return last_norm_; }
  /// Parameters added.
  std::size_t size() const noexcept { return slots_.size(); }
  /// The total element count of the parameters (Ψ of the ZeRO paper).
  std::int64_t num_parameters() const noexcept {
    std::int64_t n = 0;
    for (auto& s : slots_) n += s->num_elements();
    return n;
  }
  const Options& options() const noexcept { return options_; }

 private:
  bool step_impl(LossScaler* scaler) {
    if (slots_.empty()) return true;
    const std::int64_t t = steps_ + 1;
    const double lr = options_.schedule ? options_.schedule(t) : options_.lr;
    if (!std::isfinite(lr) || lr < 0)
      throw std::invalid_argument(std::string("shardlib: ") + Rule::name + " step " + std::to_string(t) +
                                  ": the learning rate is " + std::to_string(lr) +
                                  (options_.schedule ? " (from the schedule)" : "") +
                                  ": it must be finite and >= 0; no parameter changed");
    // Pending gradients: the bucketed all_reduce first (state in the parameter's spec), then
    // each other slot resolves its own into the state's spec.
    std::vector<autodiff::LeafGrad*> bucketed;
    for (auto& s : slots_)
      if (autodiff::LeafGrad* l = s->bucketed_pending()) bucketed.push_back(l);
    if (!bucketed.empty()) autodiff::detail::resolve_leaves(bucketed, options_.bucket_bytes);
    std::vector<detail::Slot<Rule>*> live;
    for (auto& s : slots_)
      if (s->take_grad()) live.push_back(s.get());
    const double unscale = scaler ? 1 / scaler->scale() : 1;
    double scale = unscale;
    last_norm_ = std::numeric_limits<double>::quiet_NaN();
    if (options_.clip_norm > 0 || scaler) {
      double sq = 0;
      for (auto* s : live) sq += s->local_sum_of_squares(stage_axis_);
      Context& ctx = slots_.front()->context();
      if (ctx.num_devices() > 1) ctx.world().all_reduce(&sq, &sq, 1, coll::DType::f64, coll::Op::sum);
      last_norm_ = std::sqrt(sq) * unscale;
      if (!std::isfinite(last_norm_)) {
        for (auto* s : live) s->finish();
        if (scaler) {  // an overflow: skip the step, back off
          scaler->update(false);
          return false;
        }
        throw std::runtime_error(std::string("shardlib: ") + Rule::name + " step " + std::to_string(t) +
                                 ": the gradients' global norm is " + std::to_string(last_norm_) +
                                 " (a NaN or infinity in a gradient); no parameter changed");
      }
      if (options_.clip_norm > 0)  // torch.nn.utils.clip_grad_norm_, on the unscaled gradients
        scale *= std::min(1.0, options_.clip_norm / (last_norm_ + 1e-6));
    }
    const typename Rule::Step st = Rule::make_step(options_, lr, scale, t);
    for (auto* s : live) s->update(st);
    for (auto* s : live) s->finish();
    steps_ = t;
    if (scaler) scaler->update(true);
    return true;
  }

  template <class StateSpec, class Tensor>
  void add_one(const Param<Tensor>& p) {
    using S = spec_sharding<StateSpec, typename Tensor::mesh_type>;
    SHARDLIB_STATIC_REQUIRE((S::rank == Tensor::rank),
                            "shardlib: an optimizer state spec must have the parameter's rank",
                            error::optimizer_state_spec_has_another_rank_than_the_parameter<
                                StateSpec, typename Tensor::spec_type>);
    SHARDLIB_STATIC_REQUIRE((!S::partial), "shardlib: an optimizer state spec cannot be partial",
                            error::optimizer_state_spec_cannot_be_partial<StateSpec>);
    if constexpr (S::rank == Tensor::rank && !S::partial) {
      for (auto& s : slots_) {
        if (s->id() == &p.leaf())
          throw std::invalid_argument(std::string("shardlib: ") + Rule::name + ": the " + s->describe() +
                                      " was already added");
        if (&s->context() != &p.value().context())
          throw std::invalid_argument(std::string("shardlib: ") + Rule::name +
                                      ": a parameter of another run than the others (" + p.value().spec_string() + ")");
      }
      slots_.push_back(
          std::make_unique<detail::TypedSlot<Rule, Tensor, StateSpec>>(p, Rule::num_states(options_)));
    }
  }

  template <class StateSpec, class Mesh>
  struct spec_sharding {
    static constexpr std::size_t rank = StateSpec::rank;
    static constexpr bool partial = StateSpec::value.is_partial();
  };

  Options options_;
  std::vector<std::unique_ptr<detail::Slot<Rule>>> slots_;
  std::int64_t steps_ = 0;
  double last_norm_ = std::numeric_limits<double>::quiet_NaN();
  AxisName stage_axis_{};
};

}  // namespace optim
}  // namespace shardlib
