// SPDX-License-Identifier: Apache-2.0
/// @file
/// Running a pipeline schedule (schedule.hpp) on tensors: each device of a mesh with a stage axis
/// holds its stage's layers (tensors whose specs do not name the axis: the other axes shard them
/// as in any recipe), and `pipeline::run` executes the table: the forward and backward of each
/// (micro-batch, chunk) the table gives this stage, in its order, with the boundary activations
/// sent to the next virtual stage and their gradients back. Under `threads` and `mpi` they go
/// point to point (a send is buffered: each stage waits for its inputs only); under `nccl`, where
/// a send may wait for its receiver, by one collective permute over the stage axis at each slot
/// boundary where the table has something cross it (deadlock-free). RunOptions::transport picks. Gradients stay pending on the
/// parameters over the micro-batches (backward with sync = false): the optimizer's step resolves
/// them, once per global batch.
///
/// Per-stage code runs on some devices only, so what it calls must not be collective over the
/// whole run: `StageScope` (held while the stages' code runs, from the model's construction on)
/// makes the factories check shapes among the stage's devices and creates every group of the mesh's
/// axes up front (their creation is collective over all devices). Inside a stage: ops, reshards over
/// the other axes, factories; not `to_host` or `parallel_reduce` (collective over all devices),
/// which the devices of every stage may call together outside the stage functions.
#pragma once

#include <shardlib/autodiff/checkpoint.hpp>
#include <shardlib/pipeline/schedule.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib::pipeline {

/// While alive, the code this device runs is its stage's (see the file comment). Collective over
/// all devices: every device makes one, with the same mesh. Nests (the outer scope is restored).
template <AxisName StageAxis = "stage">
class StageScope {
 public:
  template <MeshType MeshT>
  explicit StageScope(const MeshT& mesh) : ctx_(&mesh.context()) {
    const MeshShape& m = mesh.shape();
    const int axis = m.index_of(StageAxis);
    // Every group of the mesh's axes, in one order on every device (creating one is collective
    // over all devices; a stage's first use of a group would be on its devices alone).
    for (unsigned bits = 1; bits < (1u << m.rank()); ++bits) {
      AxisList axes;
      for (int a = 0; a < m.rank(); ++a)
        if (bits & (1u << a)) axes.push_back(a);
      ctx_->group(m, axes);
      if (ctx_->device_world()) ctx_->device_group(m, axes);
    }
    AxisList rest;
    for (int a = 0; a < m.rank(); ++a)
      if (a != axis) rest.push_back(a);
    coll::Communicator* stage_devices = rest.empty() ? nullptr : &ctx_->group(m, rest);
    if (rest.empty()) stage_devices = &ctx_->group(m, AxisList{});
    outer_ = ctx_->exchange_agreement_group(stage_devices);
  }
  ~StageScope() { ctx_->exchange_agreement_group(outer_); }
  StageScope(const StageScope&) = delete;
  StageScope& operator=(const StageScope&) = delete;

 private:
  Context* ctx_;
  coll::Communicator* outer_ = nullptr;
};

/// How the boundary tensors cross between stages.
enum class Transport : std::uint8_t {
  /// point_to_point where the stage group's sends are buffered and take the boundary tensor's
  /// memory (threads; mpi in host memory), else slot_permutes (nccl).
  automatic,
  /// Each stage sends what it made to its neighbour and waits only for its own inputs.
  point_to_point,
  /// One collective permute over the stage axis at each slot boundary where the table has
  /// something cross: deadlock-free without buffered sends, but every slot boundary is a meeting
  /// of neighbouring stages.
  slot_permutes,
};

/// Options of `run`.
struct RunOptions {
  /// Activation recomputation: each stage's forward runs under `checkpoint` (only its boundary
  /// input is kept per micro-batch; the backward runs it again). GPipe's usual companion.
  bool recompute = false;
  /// ZeRO-2: each micro-batch's gradients are reduce-scattered into the optimizer's state shards
  /// during its backward (BackwardOptions::settle). False: their full-size sums wait for the step,
  /// which reduces them once per global batch (ZeRO-1).
  bool settle = true;
  /// The factor the backward is seeded with besides 1/m: f16's loss scale (optim::LossScaler's
  /// `scale()`; the optimizer's `step(scaler)` divides it out and skips a step that overflowed).
  double loss_scale = 1.0;
  /// How the boundary tensors cross (Transport::automatic: the fastest the backend allows).
  Transport transport = Transport::automatic;
};

/// What one pipelined step did on this device.
struct StepStats {
  double loss = 0;          ///< the global batch's loss: the mean of the micro-batches' losses (every device)
  double seconds = 0;       ///< this device's wall time in `run`
  double busy_seconds = 0;  ///< its time in forwards and backwards (host clock: device memory's kernels are fenced)
  int forwards = 0, backwards = 0;
  /// The most activation bytes (MemoryRole::activations) this device held at the end of one of
  /// its ops, over what it held when `run` began: what the schedule keeps between forwards and
  /// backwards (at the first stage p micro-batches' under 1F1B, m under GPipe) without the
  /// scratch an op makes and frees within itself, which the memory account's peak also sees.
  std::int64_t held_activations = 0;
  /// The fraction of the step this device waited: the bubble, measured.
  double idle_fraction() const noexcept { return seconds > 0 ? 1.0 - busy_seconds / seconds : 0.0; }
};

namespace detail {
/// For each stage, the index of its op ending at each slot boundary (-1: none).
inline std::vector<std::vector<int>> ends_at(const Table& t) {
  std::vector<std::vector<int>> e(static_cast<std::size_t>(t.stages), std::vector<int>(static_cast<std::size_t>(t.length) + 1, -1));
  for (int s = 0; s < t.stages; ++s)
    for (std::size_t k = 0; k < t.ops[static_cast<std::size_t>(s)].size(); ++k)
      e[static_cast<std::size_t>(s)][static_cast<std::size_t>(t.ops[static_cast<std::size_t>(s)][k].end())] = static_cast<int>(k);
  return e;
}

/// What `run` (Training) and `forward` (not) share: the table followed on this device, with the
/// boundary tensors crossing between the stages. `last(microbatch, output)` on the last virtual
/// stage: the loss (Training), or the caller's use of the output.
template <bool Training, class Act, AxisName StageAxis, class StageFn, class LastFn>
StepStats execute(const Table& table, const typename Act::mesh_type& mesh, const typename Act::Shape& shape, StageFn& stage,
                  LastFn& last, const RunOptions& options, const char* fn) {
  static_assert(!Act::sharding.is_partial(), "shardlib: pipeline::run: the boundary tensor cannot be partial");
  using T = typename Act::value_type;
  using Mem = typename Act::memory_space;
  using V = Var<Act>;
  using LastResult = std::remove_cvref_t<std::invoke_result_t<LastFn&, int, const V&>>;
  if constexpr (Training)
    static_assert(VarType<LastResult> && LastResult::rank == 0,
                  "shardlib: pipeline::run: loss(microbatch, output) must return a rank-0 Var");
  using LossVar = std::conditional_t<Training, LastResult, V>;
  using Clock = std::chrono::steady_clock;
  using shardlib::detail::download, shardlib::detail::host_memory_v, shardlib::detail::reshards_on_device,
      shardlib::detail::upload;
  const auto t0 = Clock::now();
  Context& ctx = mesh.context();
  const std::int64_t activations_at_start = memory_usage<Mem>(ctx).activations();
  const MeshShape& ms = mesh.shape();
  const int axis = ms.index_of(StageAxis);
  if (ms.size(axis) != table.stages)
    throw std::invalid_argument(std::string("shardlib: pipeline::") + fn + ": the " + std::string(to_string(table.kind)) + " table has " +
                                std::to_string(table.stages) + " stages but axis '" + StageAxis.str() + "' of mesh " +
                                ms.to_string() + " has " + std::to_string(ms.size(axis)) + " devices");
  if (!(std::isfinite(options.loss_scale) && options.loss_scale > 0))
    throw std::invalid_argument(std::string("shardlib: pipeline::") + fn + ": RunOptions::loss_scale is " + std::to_string(options.loss_scale) +
                                ": it must be finite and > 0");
  const int p = table.stages, VS = table.virtual_stages(), m = table.microbatches;
  const int me = ms.coords(ctx.device())[static_cast<std::size_t>(axis)];
  AxisList stage_axes;
  stage_axes.push_back(axis);
  const bool direct = host_memory_v<Mem> || reshards_on_device<Mem>(ctx);
  coll::Communicator& host_group = ctx.group(ms, stage_axes);
  coll::Communicator& group = host_memory_v<Mem> || !direct ? host_group : ctx.device_group(ms, stage_axes);
  const auto ends = detail::ends_at(table);
  const auto& mine = table.ops[static_cast<std::size_t>(me)];

  struct Held {
    std::optional<V> input, output;
    std::optional<LossVar> loss;
  };
  std::map<std::pair<int, int>, Held> held;            // (micro-batch, chunk): forwarded, not yet backwarded
  std::map<std::pair<int, int>, Act> activations, grads;  // (micro-batch, chunk): received for this stage
  std::optional<Act> send_act, send_grad;                 // made by the op that ends next
  std::optional<typename LossVar::tensor_type> loss_sum;
  StepStats stats;

  // Boundary `slot`: what the ops ending there send, over the stage axis (a permute per direction
  // in which some stage sends; the table tells every device which).
  auto cross = [&](int slot, bool forward) {
    auto sends = [&](int s) -> int {  // the stage s sends to, or -1
      const int k = ends[static_cast<std::size_t>(s)][static_cast<std::size_t>(slot)];
      if (k < 0) return -1;
      const Op& o = table.ops[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)];
      const int vs = table.virtual_stage(s, o.chunk);
      if (o.forward != forward || (forward ? vs == VS - 1 : vs == 0)) return -1;
      return forward ? (s + 1) % p : (s - 1 + p) % p;
    };
    bool any = false;
    for (int s = 0; s < p; ++s) any = any || sends(s) >= 0;
    if (!any) return;
    const int dest = sends(me);
    const int from = forward ? (me - 1 + p) % p : (me + 1) % p;
    const int source = sends(from) == me ? from : -1;
    std::optional<Act> in;
    std::pair<int, int> key{};
    if (source >= 0) {
      const Op& o = table.ops[static_cast<std::size_t>(from)]
                             [static_cast<std::size_t>(ends[static_cast<std::size_t>(from)][static_cast<std::size_t>(slot)])];
      const int vs = table.virtual_stage(from, o.chunk) + (forward ? 1 : -1);
      key = {o.microbatch, vs / p};
      MemoryRoleScope role(forward ? shardlib::detail::current_memory_role() : MemoryRole::temporaries);
      in.emplace(Act::uninitialized(mesh, shape, shardlib::detail::same_shape));
    }
    std::optional<Act>& out = forward ? send_act : send_grad;
    const std::int64_t n_out = dest >= 0 ? out->block().num_elements() : 0, n_in = in ? in->block().num_elements() : 0;
    const T* src = dest >= 0 ? out->local().data() : nullptr;
    T* dst = in ? in->local().data() : nullptr;
    if (direct) {
      group.permute(src, static_cast<std::size_t>(n_out), dest, dst, static_cast<std::size_t>(n_in), source, coll::dtype_of<T>());
    } else {  // device memory without device collectives: through host memory
      std::vector<T> hs(static_cast<std::size_t>(n_out)), hr(static_cast<std::size_t>(n_in));
      if (n_out) download<Mem>(ctx, src, hs.data(), n_out);
      group.permute(hs.data(), hs.size(), dest, hr.data(), hr.size(), source, coll::dtype_of<T>());
      if (n_in) upload<Mem>(ctx, hr.data(), dst, n_in);
    }
    if (dest >= 0) out.reset();  // (an op running over several slots sends at its end, not before)
    if (in) (forward ? activations : grads).insert_or_assign(key, std::move(*in));
  };

  auto run_op = [&](const Op& o) {
    const auto start = Clock::now();
    const int vs = table.virtual_stage(me, o.chunk);
    const std::pair<int, int> key{o.microbatch, o.chunk};
    if (o.forward) {
      Held h;
      if (vs > 0) {
        auto it = activations.find(key);
        if (it == activations.end())
          throw std::logic_error("shardlib: pipeline::run: no activation arrived for micro-batch " + std::to_string(o.microbatch));
        h.input.emplace(it->second, std::make_shared<autodiff::detail::LeafNode<Act>>(it->second));
        activations.erase(it);
      }
      // (The checkpoint keeps its function until the backward: it captures by value.)
      auto forward = [f = &stage, chunk = o.chunk, mb = o.microbatch](const V* in) -> V { return (*f)(chunk, mb, in); };
      V out = !Training || !options.recompute ? forward(h.input ? &*h.input : nullptr)
              : h.input                       ? V(checkpoint([forward](const V& x) { return forward(&x); }, *h.input))
                                              : V(checkpoint([forward] { return forward(nullptr); }));
      if (vs == VS - 1) {
        if constexpr (Training) {
          h.loss.emplace(last(o.microbatch, out));
          loss_sum = loss_sum ? *loss_sum + h.loss->value() : h.loss->value();
        } else {
          last(o.microbatch, out);
        }
      } else {
        send_act.emplace(out.value());
        if constexpr (Training) h.output.emplace(std::move(out));
      }
      if constexpr (Training) held.insert_or_assign(key, std::move(h));
      ++stats.forwards;
    } else if constexpr (Training) {
      MemoryRoleScope role(MemoryRole::temporaries);  // (a backward's own bytes; the gradient sent back too)
      auto it = held.find(key);
      Held& h = it->second;
      const BackwardOptions bo{.sync = false, .settle = options.settle};
      if (vs == VS - 1) {
        if (h.loss->requires_grad()) backward(*h.loss * static_cast<typename LossVar::value_type>(options.loss_scale / m), bo);
      } else {
        auto g = grads.find(key);
        if (g == grads.end())
          throw std::logic_error("shardlib: pipeline::run: no gradient arrived for micro-batch " + std::to_string(o.microbatch));
        backward(*h.output, g->second, bo);
        grads.erase(g);
      }
      if (vs > 0) {  // the boundary input's gradient goes back (zeros when nothing reached it)
        auto& leaf = *h.input->node();
        send_grad.emplace(leaf.has_pending() ? leaf.template take_grad<Act>()
                                             : Act::zeros(mesh, shape, shardlib::detail::same_shape));
      }
      held.erase(it);
      ++stats.backwards;
    }
    if constexpr (!host_memory_v<Mem>) kernels::fence(ctx.exec_for<Mem>());  // the busy time is the kernels'
    stats.busy_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    stats.held_activations = std::max(stats.held_activations, memory_usage<Mem>(ctx).activations() - activations_at_start);
  };

  const bool p2p_possible = direct && group.buffered_sends();
  if (options.transport == Transport::point_to_point && !p2p_possible)
    throw std::invalid_argument(std::string("shardlib: pipeline::") + fn + ": Transport::point_to_point needs buffered sends " +
                                "in the boundary tensor's memory; the " + std::string(group.backend()) +
                                " group of the stage axis has none (use Transport::automatic)");
  if (p2p_possible && options.transport != Transport::slot_permutes) {
    // A send is buffered, a recv waits for its message only. Each stage runs its ops in the
    // table's order and waits for nothing but its inputs: the slots' collective permutes below
    // make every slot boundary a meeting of neighbouring stages.
    auto tag = [&](int mb, int chunk, bool forward) { return (mb * table.chunks + chunk) * 2 + (forward ? 0 : 1); };
    for (const Op& o : mine) {
      const int vs = table.virtual_stage(me, o.chunk);
      const std::pair<int, int> key{o.microbatch, o.chunk};
      if (p > 1 && (o.forward ? vs > 0 : vs < VS - 1)) {  // this op's input from the neighbour
        // (a gradient received counts as the backward's temporaries, as the one it makes)
        MemoryRoleScope role(o.forward ? shardlib::detail::current_memory_role() : MemoryRole::temporaries);
        Act in = Act::uninitialized(mesh, shape, shardlib::detail::same_shape);
        group.recv(in.local().data(), static_cast<std::size_t>(in.block().num_elements()), coll::dtype_of<T>(),
                   o.forward ? (me - 1 + p) % p : (me + 1) % p, tag(o.microbatch, o.chunk, o.forward));
        (o.forward ? activations : grads).insert_or_assign(key, std::move(in));
      }
      run_op(o);
      std::optional<Act>& out = o.forward ? send_act : send_grad;
      if (out) {  // to the next virtual stage's chunk (forward) or the previous one's (backward)
        const int to = o.forward ? vs + 1 : vs - 1;
        if (p == 1) {  // one stage of several chunks: its own next chunk
          (o.forward ? activations : grads).insert_or_assign(std::pair<int, int>{o.microbatch, to}, std::move(*out));
          out.reset();
          continue;
        }
        group.send(out->local().data(), static_cast<std::size_t>(out->block().num_elements()), coll::dtype_of<T>(), to % p,
                   tag(o.microbatch, to / p, o.forward));
        out.reset();
      }
    }
  } else {  // NCCL (a send may wait for its receiver), or asked for: messages cross at the slot boundaries
    std::size_t next = 0;
    for (int slot = 0; slot <= table.length; ++slot) {
      cross(slot, true);
      cross(slot, false);
      if (next < mine.size() && mine[next].start == slot) run_op(mine[next++]);
    }
  }
  if constexpr (!Training) {
    stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return stats;
  }
  // The loss, from the last virtual stage's devices to every device (one number over the stage axis).
  double l = 0;
  if (loss_sum) {  // resolved over the stage's other axes (a partial sum over "data": its devices alone)
    using L = typename LossVar::tensor_type;
    const grad_tensor_t<L> r(*loss_sum);
    typename L::value_type v{};
    download<typename L::memory_space>(ctx, r.local().data(), &v, 1);
    l = static_cast<double>(v) / m;
  }
  host_group.all_reduce(&l, &l, 1, coll::DType::f64, coll::Op::sum);
  stats.loss = l;
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}
}  // namespace detail

/// Runs one training step's forwards and backwards by `table` on this device's stage (collective:
/// every device of `mesh` calls it with the same table). `Act` is the boundary tensor (not partial:
/// its spec over the other axes), of `shape` for every micro-batch.
///
/// - `stage(chunk, microbatch, input)`: this device's chunk `chunk` (0 ≤ chunk < table.chunks;
///   virtual stage chunk·p + stage) on micro-batch `microbatch`; `input` is the boundary
///   activation (`const Var<Act>*`), null on virtual stage 0, which reads its own data. Returns
///   `Var<Act>`.
/// - `loss(microbatch, output)`: on the last virtual stage, the micro-batch's mean loss from the
///   stage's output (a rank-0 `Var`). The backward is seeded with 1/m: the step's gradients are
///   those of the mean over micro-batches of equal size.
///
/// Parameters' gradients are left pending (sync = false); an optimizer's `step()` resolves them.
/// Throws std::invalid_argument when the mesh's stage axis does not have table.stages devices.
template <class Act, AxisName StageAxis = "stage", class StageFn, class LossFn>
StepStats run(const Table& table, const typename Act::mesh_type& mesh, const typename Act::Shape& shape, StageFn&& stage,
              LossFn&& loss, const RunOptions& options = {}) {
  return detail::execute<true, Act, StageAxis>(table, mesh, shape, stage, loss, options, "run");
}

/// The forwards of `table` alone (table.forwards(): an evaluation or inference pass), recording
/// nothing (NoGrad), with `stage` as in `run`. `last(microbatch, output)` runs on the last virtual
/// stage's devices and returns a tensor or a Var computed from the output (a loss, the logits);
/// its values are the result: entry k holds micro-batch k's, whole and row-major, on every device
/// (gathered within the last stage, then sent over the stage axis). Collective over `mesh`.
template <class Act, AxisName StageAxis = "stage", class StageFn, class LastFn>
auto forward(const Table& table, const typename Act::mesh_type& mesh, const typename Act::Shape& shape, StageFn&& stage,
             LastFn&& last) {
  using V = Var<Act>;
  using Result = std::remove_cvref_t<std::invoke_result_t<LastFn&, int, const V&>>;
  using Tensor = typename decltype([] {
    if constexpr (VarType<Result>) return std::type_identity<typename Result::tensor_type>{};
    else return std::type_identity<Result>{};
  }())::type;
  using U = typename Tensor::value_type;
  const Table fwd = table.forwards();
  std::vector<std::vector<U>> out(static_cast<std::size_t>(table.microbatches));
  auto keep = [&](int mb, const V& output) {
    decltype(auto) r = last(mb, output);
    if constexpr (VarType<Result>) out[static_cast<std::size_t>(mb)] = r.value().to_host();  // (within the stage)
    else out[static_cast<std::size_t>(mb)] = r.to_host();
  };
  NoGrad no_grad;
  detail::execute<false, Act, StageAxis>(fwd, mesh, shape, stage, keep, RunOptions{}, "forward");
  // From the last stage to every stage: sizes, then the values.
  Context& ctx = mesh.context();
  const MeshShape& ms = mesh.shape();
  AxisList stage_axes;
  stage_axes.push_back(ms.index_of(StageAxis));
  coll::Communicator& group = ctx.group(ms, stage_axes);
  const int root = (table.virtual_stages() - 1) % table.stages;
  std::vector<std::uint64_t> sizes(out.size());
  for (std::size_t k = 0; k < out.size(); ++k) sizes[k] = out[k].size();
  if (group.size() > 1) group.broadcast(sizes.data(), sizes.size(), coll::DType::u64, root);
  for (std::size_t k = 0; k < out.size(); ++k) {
    out[k].resize(static_cast<std::size_t>(sizes[k]));
    if (group.size() > 1 && sizes[k]) group.broadcast(out[k].data(), out[k].size(), coll::dtype_of<U>(), root);
  }
  return out;
}

}  // namespace shardlib::pipeline
