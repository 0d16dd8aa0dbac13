// SPDX-License-Identifier: Apache-2.0
// A small GPT-style language model and the training recipes of docs/08_training.md, each a
// choice of specs: token embedding (split over the vocabulary under tensor parallelism), learned
// positions, N pre-LN blocks (multi-head causal attention, sl::attention; a GELU MLP), a final norm and an LM
// head with the vocab-parallel cross-entropy; trained with AdamW on a synthetic token stream or
// any data source with its batches (gpt/data.hpp: a corpus of text).
//
// Shared by examples/gpt.cpp (the program), tests/train/recipes.cpp (each recipe against one
// device) and benchmarks/train.cpp.
#pragma once

#include <shardlib/attention.hpp>
#include <shardlib/moe.hpp>
#include <shardlib/optim.hpp>
#include <shardlib/pipeline.hpp>
#include <shardlib/plan/cost.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

namespace sl = shardlib;
using sl::none;
using sl::Spec;

/// Sizes of the model and of a training run.
struct Config {
  std::int64_t vocab = 64;   ///< V (split over "model" under TP: a multiple of its size keeps blocks even)
  std::int64_t seq = 16;     ///< S, tokens per sequence (split over "model" between blocks under SP)
  std::int64_t dim = 32;     ///< D
  std::int64_t heads = 4;    ///< H (split over "model" under TP)
  std::int64_t ff = 128;     ///< the MLP's hidden size (split over "model" under TP)
  std::int64_t layers = 2;
  std::int64_t batch = 8;    ///< sequences per global batch (split over "data")
  int cp = 2;                ///< devices on the "seq" axis (recipe cp: context parallelism)
  int tp = 0;                ///< devices on the "model" axis of dp_tp, a divisor of the devices (0: 2 if they are even)
  /// How attention runs over a split sequence (recipe cp): Ulysses' all-to-alls or the ring.
  sl::ContextParallel cp_kind = sl::ContextParallel::all_to_all;
  /// Attention's kernel (sl::AttentionKernel): automatic (cuDNN's in GPU memory for 16-bit types,
  /// else the ops), fused (no [S, S] scores in memory: on the host the blockwise kernel) or unfused.
  sl::AttentionKernel attention_kernel = sl::AttentionKernel::automatic;
  /// Experts of the mixture-of-experts MLP in every other block (the odd ones, as Switch); 0:
  /// every MLP dense. Recipes dp and zero1-3 (experts over "data"), tp and dp_tp (each expert's
  /// hidden dim over "model" too) and replicated.
  std::int64_t moe = 0;
  int top_k = 1;                  ///< experts per token (1: Switch, 2: GShard)
  double capacity_factor = 1.25;  ///< slots per expert and device: ceil(top_k * tokens * cf / moe)
  double aux_weight = 0.01;       ///< the load-balancing loss's weight in the training loss
  double z_loss_weight = 0;       ///< the router z-loss's weight (ST-MoE: 0.001); 0: not computed
  /// Switch's router jitter while training (noise in [1 - j, 1 + j] on the router's input, drawn
  /// anew for each step and layer, the same on any mesh); 0: off. Never when evaluating.
  double router_jitter = 0;
  std::uint64_t seed = 1;
  double lr = 3e-3;
  double clip = 1.0;         ///< clipping by the global norm (0: off)
  int eval_every = 0;        ///< validation loss every this many steps and after the last (0: never)
  std::int64_t eval_batches = 8;  ///< validation batches per evaluation (at most the data has)
  std::int64_t head_dim() const { return dim / heads; }
};

enum class Zero { none, stage1, stage2 };

// ---- Recipes: a mesh and the specs of activations and parameters --------------------------------

/// Data parallelism: weights replicated, the batch split over "data"; one all_reduce of the
/// gradients per bucket.
struct DP {
  static constexpr const char* name = "dp";
  using Mesh = sl::Mesh<"data">;
  static Mesh mesh(sl::Context& ctx) { return Mesh(ctx, {ctx.num_devices()}); }
  using Act = Spec<"data", none, none>;   // the residual stream [B, S, D] between blocks
  using Full = Spec<"data", none, none>;  // the input of the column-parallel products [B, S, D]
  using Ids = Spec<"data", none>;         // tokens [B, S]
  using Wte = Spec<none, none>;           // [V, D]
  using Qkv = Spec<none, none, none>;     // [D, H, K]
  using Wo = Spec<none, none, none>;      // [H, K, D]
  using W1 = Spec<none, none>;            // [D, F]
  using W2 = Spec<none, none>;            // [F, D]
  using Head = Spec<none, none>;          // [D, V]
  static constexpr bool fsdp = false;     // parameters stored split over "data", gathered for use
  static constexpr Zero zero = Zero::none;
};
/// ZeRO-1: DP with the optimizer state split over "data"; the updated shard all-gathered back.
struct Zero1 : DP {
  static constexpr const char* name = "zero1";
  static constexpr Zero zero = Zero::stage1;
};
/// ZeRO-2: ZeRO-1 with the gradients reduce-scattered straight into the state's shards.
struct Zero2 : DP {
  static constexpr const char* name = "zero2";
  static constexpr Zero zero = Zero::stage2;
};
/// ZeRO-3 / FSDP: parameters, gradients and state split over "data"; each parameter
/// all-gathered before use, its gradient reduce-scattered.
struct Zero3 : DP {
  static constexpr const char* name = "zero3";
  static constexpr bool fsdp = true;
};
/// Megatron tensor parallelism with sequence parallelism on a "model" axis: attention heads and
/// the MLP's hidden dim split, the residual stream split along the sequence; all_gather before
/// the column-parallel products, reduce_scatter after the row-parallel ones; the embedding and
/// the LM head split over the vocabulary.
struct TP {
  static constexpr const char* name = "tp";
  using Mesh = sl::Mesh<"model">;
  static Mesh mesh(sl::Context& ctx) { return Mesh(ctx, {ctx.num_devices()}); }
  using Act = Spec<none, "model", none>;
  using Full = Spec<none, none, none>;
  using Ids = Spec<none, none>;
  using Wte = Spec<"model", none>;
  using Qkv = Spec<none, "model", none>;
  using Wo = Spec<"model", none, none>;
  using W1 = Spec<none, "model">;
  using W2 = Spec<"model", none>;
  using Head = Spec<none, "model">;
  static constexpr bool fsdp = false;
  static constexpr Zero zero = Zero::none;
};
/// 2-D: data parallelism over "data" times TP + SP over "model" (TP's weight specs; the
/// activations split over "data" too).
struct DPxTP : TP {
  static constexpr const char* name = "dp_tp";
  using Mesh = sl::Mesh<"data", "model">;
  /// `model` devices on "model" (the rest on "data").
  static int model_size(int devices) { return devices % 2 == 0 ? 2 : 1; }
  static Mesh mesh(sl::Context& ctx) {
    const int m = model_size(ctx.num_devices());
    return Mesh(ctx, {ctx.num_devices() / m, m});
  }
  /// cfg.tp devices on "model" when given.
  static Mesh mesh(sl::Context& ctx, const Config& cfg) {
    if (cfg.tp == 0) return mesh(ctx);
    if (cfg.tp < 0 || ctx.num_devices() % cfg.tp != 0)
      throw std::invalid_argument("gpt: --tp " + std::to_string(cfg.tp) + " does not divide the " +
                                  std::to_string(ctx.num_devices()) + " devices");
    return Mesh(ctx, {ctx.num_devices() / cfg.tp, cfg.tp});
  }
  using Act = Spec<"data", "model", none>;
  using Full = Spec<"data", none, none>;
  using Ids = Spec<"data", none>;
};
/// Context parallelism on a "seq" axis beside data parallelism: the sequence split over "seq"
/// everywhere (every op but attention works token by token), the weights replicated, their
/// gradients all-reduced over both axes; attention moves the sequence's split onto the heads and
/// back (sl::attention, DeepSpeed-Ulysses: one all_to_all for each of q, k, v and the output,
/// the same backward). `cfg.cp` devices on "seq" (a divisor of the devices), the rest on "data".
struct DPxCP : DP {
  static constexpr const char* name = "cp";
  using Mesh = sl::Mesh<"data", "seq">;
  static Mesh mesh(sl::Context& ctx, const Config& cfg) {
    if (cfg.cp < 1 || ctx.num_devices() % cfg.cp != 0)
      throw std::invalid_argument("gpt: --cp " + std::to_string(cfg.cp) + " does not divide the " +
                                  std::to_string(ctx.num_devices()) + " devices");
    return Mesh(ctx, {ctx.num_devices() / cfg.cp, cfg.cp});
  }
  using Act = Spec<"data", "seq", none>;
  using Full = Spec<"data", "seq", none>;
  using Ids = Spec<"data", "seq">;
};
/// The mesh of recipe R: `R::mesh(ctx, cfg)` where the recipe sizes it from the config, else
/// `R::mesh(ctx)`.
template <class R>
typename R::Mesh mesh_of(sl::Context& ctx, const Config& cfg) {
  if constexpr (requires { R::mesh(ctx, cfg); }) return R::mesh(ctx, cfg);
  else return R::mesh(ctx);
}
/// Everything replicated on every device: each device computes what one device would (the
/// reference the tests compare every recipe with, on any backend).
struct Replicated : DP {
  static constexpr const char* name = "replicated";
  using Act = Spec<none, none, none>;
  using Full = Spec<none, none, none>;
  using Ids = Spec<none, none>;
};

/// Pipeline parallelism over a "stage" axis (docs/11_pipeline_parallel.md): each stage holds its
/// layers (the embedding on the first, the final norm and LM head on the last), with the specs of
/// recipe `Inner` over the other axes ("data", "model"); micro-batches flow through the stages by
/// a schedule (pipeline/schedule.hpp). `Data` and `Model` are the sizes of those axes as a
/// function of the devices left per stage.
template <class Inner, int DataShare, int ModelShare>
struct PPOf : Inner {
  using Mesh = sl::Mesh<"stage", "data", "model">;
  static constexpr bool pipelined = true;
  /// `stages` devices on "stage", the rest on "data" (DataShare) or "model" (ModelShare); with
  /// both, `tp` of them on "model" (2 when 0 and they are even).
  static Mesh mesh(sl::Context& ctx, int stages, int tp = 0) {
    const int n = ctx.num_devices();
    if (stages < 1 || n % stages != 0)
      throw std::invalid_argument("gpt: " + std::to_string(stages) + " stages do not divide the " + std::to_string(n) + " devices");
    const int per = n / stages;
    if constexpr (DataShare && ModelShare) {
      const int m = tp > 0 ? tp : per % 2 == 0 ? 2 : 1;
      if (per % m != 0)
        throw std::invalid_argument("gpt: --tp " + std::to_string(m) + " does not divide the " + std::to_string(per) +
                                    " devices of each stage");
      return Mesh(ctx, {stages, per / m, m});
    } else {
      return Mesh(ctx, {stages, DataShare ? per : 1, ModelShare ? per : 1});
    }
  }
};
struct PPxDP : PPOf<DP, 1, 0> {
  static constexpr const char* name = "pp_dp";
};
/// Pipeline parallelism alone: pp_dp with every device a stage ("data" of size 1; one type, so the
/// example compiles the recipe once).
using PP = PPxDP;
struct PPxZero1 : PPOf<DP, 1, 0> {
  static constexpr const char* name = "pp_zero1";
  static constexpr Zero zero = Zero::stage1;
};
/// ZeRO-2 in each stage: every micro-batch's gradients reduce-scattered into the state's shards
/// during its backward (no full-size gradient kept between micro-batches).
struct PPxZero2 : PPOf<DP, 1, 0> {
  static constexpr const char* name = "pp_zero2";
  static constexpr Zero zero = Zero::stage2;
};
struct PPxTP : PPOf<TP, 0, 1> {
  static constexpr const char* name = "pp_tp";
};
/// 3-D: pipeline stages, each a DP x TP + SP mesh (dp_tp's specs; Megatron-LM's PTD-P).
struct PPxDPxTP : PPOf<DPxTP, 1, 1> {
  static constexpr const char* name = "pp_dp_tp";
};

template <class R>
concept Pipelined = requires { R::pipelined; };

// ---- The model ---------------------------------------------------------------------------------

/// Which parts of the model a device holds: every part, or a pipeline stage's.
struct Parts {
  std::vector<bool> layers;  ///< layer l held (cfg.layers entries)
  bool embedding = true;     ///< token and position embeddings (the first virtual stage)
  bool head = true;          ///< final norm and LM head (the last virtual stage)
  static Parts all(const Config& c) { return {std::vector<bool>(static_cast<std::size_t>(c.layers), true), true, true}; }
};

/// The model of recipe R with parameters of element type E: float, or bf16/f16 for mixed
/// precision (16-bit parameters and gradients, float32 master weights and optimizer state, the
/// forward and backward computed in float32 from the parameters cast up where they are used).
/// Recipes whose MoE layers run: dp and zero1-3 (the experts split over "data", GShard's
/// placement: their optimizer state, and under ZeRO-3 the experts themselves, are split there
/// already), tp and dp_tp (each expert's hidden dim split over "model" as the dense MLP's is) and
/// the replicated reference.
template <class R>
inline constexpr bool experts_over_data =
    std::is_same_v<R, DP> || std::is_same_v<R, Zero1> || std::is_same_v<R, Zero2> || std::is_same_v<R, Zero3> || std::is_same_v<R, DPxTP>;
template <class R>
inline constexpr bool runs_moe = experts_over_data<R> || std::is_same_v<R, TP> || std::is_same_v<R, Replicated>;
template <class R, class E = float>
struct Model {
  using Mesh = typename R::Mesh;
  template <class S>
  using Ten = sl::DistributedTensor<float, Mesh, S>;
  template <class S>
  using PTen = sl::DistributedTensor<E, Mesh, S>;
  /// Where a parameter used with spec S is kept: S, or split over "data" under FSDP.
  template <class S, bool Split = R::fsdp>
  struct stored {
    using type = S;
  };
  template <class S>
  struct stored<S, true> {
    using type = sl::optim::zero_spec_t<PTen<S>, "data">;
  };
  template <class S>
  using Stored = typename stored<S>::type;
  template <class S>
  using P = sl::Param<PTen<Stored<S>>>;
  using Vec = Spec<none>;
  using Pos = Spec<none, none>;

  /// The experts w1 [E, D, F] and w2 [E, F, D] of an MoE layer: E split over "data" under dp,
  /// zero1-3 and dp_tp, F over "model" under tp and dp_tp (as the dense W1 and W2's F).
  static constexpr bool over_data = experts_over_data<R>;
  static constexpr bool over_model = std::is_same_v<R, TP> || std::is_same_v<R, DPxTP>;
  using ExpertW1 = std::conditional_t<over_model, std::conditional_t<over_data, Spec<"data", none, "model">, Spec<none, none, "model">>,
                                      std::conditional_t<over_data, Spec<"data", none, none>, Spec<none, none, none>>>;
  using ExpertW2 = std::conditional_t<over_model, std::conditional_t<over_data, Spec<"data", "model", none>, Spec<none, "model", none>>,
                                      std::conditional_t<over_data, Spec<"data", none, none>, Spec<none, none, none>>>;
  /// An MoE layer's router [D, E] and experts (kept as they are used: no FSDP storage), and the
  /// seed its router jitter starts from.
  struct Experts {
    sl::Param<PTen<Pos>> router;
    sl::Param<PTen<ExpertW1>> w1;
    sl::Param<PTen<ExpertW2>> w2;
    std::uint64_t seed = 0;
  };
  struct Layer {
    P<Vec> g1, b1;
    P<typename R::Qkv> wq, wk, wv;
    P<typename R::Wo> wo;
    P<Vec> g2, b2;
    P<typename R::W1> w1;
    P<typename R::W2> w2;
    std::optional<Experts> moe;  ///< its MLP is a mixture of experts (w1, w2 unused)
  };

  Config cfg;
  Mesh mesh;
  /// The training step (from 1) whose router jitter the MoE layers draw; 0: none (evaluating).
  /// train() sets it around each step's forward.
  std::uint64_t jitter_step = 0;
  /// The choices the MoE layers dropped over capacity (each layer's over all its groups, the same
  /// on every device) since train() last set it to 0, before each step's forward.
  mutable std::int64_t moe_dropped = 0;
  std::optional<P<typename R::Wte>> wte;
  std::optional<P<Pos>> wpe;
  std::vector<std::optional<Layer>> layers;  // layer l, when this device holds it
  std::optional<P<Vec>> gf, bf;
  std::optional<P<typename R::Head>> head;
  /// The residual stream between blocks [B, S, D].
  using X = sl::Var<Ten<typename R::Act>>;

  /// Parameters drawn from `cfg.seed` by global index: the same values on any mesh and layout,
  /// and for a pipeline stage (`parts`) the values of the whole model's parts it holds.
  Model(const Config& c, const Mesh& m, const Parts& parts) : cfg(c), mesh(m) {
    if (c.moe > 0 && !runs_moe<R>)
      throw std::invalid_argument(std::string("gpt: --moe: recipe ") + R::name +
                                  " has no placement of the experts (dp, zero1-3, tp and dp_tp have)");
    if (parts.embedding) {
      wte.emplace(init<typename R::Wte>({c.vocab, c.dim}, 1, 0.5f));
      wpe.emplace(init<Pos>({c.seq, c.dim}, 2, 0.1f));
    }
    if (parts.head) {
      gf.emplace(vec(1.f));
      bf.emplace(vec(0.f));
      head.emplace(init<typename R::Head>({c.dim, c.vocab}, 3, 1.f / std::sqrt(float(c.dim))));
    }
    const float wd = 1.f / std::sqrt(float(c.dim)), wf = 1.f / std::sqrt(float(c.ff));
    const std::int64_t H = c.heads, K = c.head_dim();
    for (std::int64_t l = 0; l < c.layers; ++l) {
      layers.emplace_back();
      if (!parts.layers[static_cast<std::size_t>(l)]) continue;
      const std::uint64_t s = 100 * static_cast<std::uint64_t>(l + 1);
      layers.back().emplace(Layer{vec(1.f), vec(0.f), init<typename R::Qkv>({c.dim, H, K}, s + 1, wd),
                                  init<typename R::Qkv>({c.dim, H, K}, s + 2, wd), init<typename R::Qkv>({c.dim, H, K}, s + 3, wd),
                                  init<typename R::Wo>({H, K, c.dim}, s + 4, wd), vec(1.f), vec(0.f),
                                  init<typename R::W1>({c.dim, c.ff}, s + 5, wd), init<typename R::W2>({c.ff, c.dim}, s + 6, wf),
                                  std::nullopt});
      if (c.moe > 0 && l % 2 == 1) {
        const std::uint64_t seed = c.seed * 7919 + s;
        layers.back()->moe.emplace(Experts{sl::Param(PTen<Pos>::random(mesh, {c.dim, c.moe}, seed + 7, -wd, wd)),
                                           sl::Param(PTen<ExpertW1>::random(mesh, {c.moe, c.dim, c.ff}, seed + 8, -wd, wd)),
                                           sl::Param(PTen<ExpertW2>::random(mesh, {c.moe, c.ff, c.dim}, seed + 9, -wf, wf)), seed});
      }
    }
  }
  Model(const Config& c, const Mesh& m) : Model(c, m, Parts::all(c)) {}

  /// Calls f(param) on every parameter this device holds, in one order on every device.
  template <class F>
  void for_each_param(F&& f) {
    if (wte) f(*wte), f(*wpe);
    for (auto& l : layers) {
      if (l) f(l->g1), f(l->b1), f(l->wq), f(l->wk), f(l->wv), f(l->wo), f(l->g2), f(l->b2), f(l->w1), f(l->w2);
      if (l && l->moe) f(l->moe->router), f(l->moe->w1), f(l->moe->w2);
    }
    if (head) f(*gf), f(*bf), f(*head);
  }
  /// Calls f(name, param) on every parameter this device holds, in for_each_param's order, with
  /// names that do not depend on the recipe ("wte", "layer0/wq", "head"): a checkpoint's.
  template <class F>
  void for_each_named_param(F&& f) {
    if (wte) f(std::string("wte"), *wte), f(std::string("wpe"), *wpe);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      auto& l = layers[i];
      if (!l) continue;
      const std::string p = "layer" + std::to_string(i) + "/";
      f(p + "g1", l->g1), f(p + "b1", l->b1), f(p + "wq", l->wq), f(p + "wk", l->wk), f(p + "wv", l->wv), f(p + "wo", l->wo);
      f(p + "g2", l->g2), f(p + "b2", l->b2), f(p + "w1", l->w1), f(p + "w2", l->w2);
      if (l->moe) f(p + "router", l->moe->router), f(p + "experts_w1", l->moe->w1), f(p + "experts_w2", l->moe->w2);
    }
    if (head) f(std::string("gf"), *gf), f(std::string("bf"), *bf), f(std::string("head"), *head);
  }
  std::int64_t num_params() {
    std::int64_t n = 0;
    for_each_param([&](auto& p) { n += p.value().size(); });
    return n;
  }

  /// The mean next-token cross-entropy of a batch: `ids` [B, S] predict `targets` [B, S].
  /// With MoE layers, plus `cfg.aux_weight` times their load-balancing losses and
  /// `cfg.z_loss_weight` times their router z-losses.
  template <class Ids>
  auto loss(const Ids& ids, const Ids& targets) const {
    X x = embed(ids);
    std::optional<Aux> aux;
    for (const auto& l : layers) x = block(*l, x, &aux);
    auto loss = head_loss(x, targets);
    if constexpr (runs_moe<R>) {
      if (aux) {  // (in the loss's layout: a partial sum over "data" keeps the value on one device)
        using LossSpec = typename sl::autodiff::detail::tensor_of_t<decltype(loss)>::spec_type;
        return loss + sl::reshard<LossSpec>(*aux);
      }
    }
    return loss;
  }
  /// The residual stream of the tokens `ids` [B, S]: their embeddings plus the positions'.
  /// Under TP the table is split over the vocabulary: each device looks up the ids it holds and
  /// the partial rows are reduce-scattered along the sequence (SP).
  template <class Ids>
  X embed(const Ids& ids) const {
    return sl::reshard<typename R::Act>(sl::take<0>(use<typename R::Wte>(*wte), ids)) + use<Pos>(*wpe);
  }
  /// The sum of the MoE layers' weighted auxiliary losses (a scalar).
  using Aux = sl::Var<sl::DistributedTensor<float, Mesh, Spec<>>>;
  /// One pre-LN block: causal multi-head attention, then the GELU MLP (or, in an MoE layer, the
  /// mixture of experts, its weighted load-balancing and z-losses added to `*aux`), each with its
  /// residual.
  X block(const Layer& l, const X& x0, std::optional<Aux>* aux = nullptr) const {
    using Act = typename R::Act;
    using Full = typename R::Full;
    auto a = sl::reshard<Full>(sl::layer_norm<2>(x0) * use<Vec>(l.g1) + use<Vec>(l.b1));
    auto q = sl::einsum<"bsd,dhk->bshk">(a, use<typename R::Qkv>(l.wq));
    auto k = sl::einsum<"bsd,dhk->bshk">(a, use<typename R::Qkv>(l.wk));
    auto v = sl::einsum<"bsd,dhk->bshk">(a, use<typename R::Qkv>(l.wv));
    auto att = sl::attention(q, k, v, {.causal = true, .kernel = cfg.attention_kernel, .context = cfg.cp_kind});  // scale 1 / sqrt(head dim)
    X x = residual<"bqhk,hkd->bqd">(x0, att, use<typename R::Wo>(l.wo));
    auto h = sl::reshard<Full>(sl::layer_norm<2>(x) * use<Vec>(l.g2) + use<Vec>(l.b2));
    if constexpr (runs_moe<R>) {
      if (l.moe) {
        const auto shape = x.value().shape();
        auto r = sl::moe(sl::reshape<"b s d -> (b s) d">(h), use<Pos>(l.moe->router), cast_up(l.moe->w1), cast_up(l.moe->w2),
                         {.top_k = cfg.top_k,
                          .capacity_factor = cfg.capacity_factor,
                          .router_jitter = jitter_step > 0 ? cfg.router_jitter : 0.0,
                          .jitter_seed = jitter_step > 0 ? l.moe->seed * 1000003 + jitter_step : 0,
                          .z_loss = cfg.z_loss_weight > 0});
        moe_dropped += r.dropped;
        if (aux) {  // (weighted, summed over the groups: one all_reduce of a scalar)
          const auto w = r.aux_loss * static_cast<float>(cfg.aux_weight);
          Aux a = cfg.z_loss_weight > 0 ? Aux(sl::reshard<Spec<>>(w + r.z_loss * static_cast<float>(cfg.z_loss_weight)))
                                        : Aux(sl::reshard<Spec<>>(w));
          *aux = *aux ? Aux(**aux + a) : a;
        }
        return x + sl::reshard<Act>(sl::reshape<"(b s) d -> b s d">(r.y, {shape[0], shape[1], shape[2]}));
      }
    }
    auto f = sl::gelu(sl::einsum<"bsd,df->bsf">(h, use<typename R::W1>(l.w1)));
    return residual<"bsf,fd->bsd">(x, f, use<typename R::W2>(l.w2));
  }
  /// `x + reshard<Act>(einsum<Sub>(a, w))`: a projection added to the residual stream `x`. Where
  /// the product already lies as the stream does (no partial sum over "model" to resolve), `x` is
  /// folded into the GEMM (einsum_add: its initial C), so no [B, S, D] product is held beside
  /// the sum and the add takes no pass of its own.
  template <sl::OpName Sub, class A, class W>
  X residual(const X& x, const A& a, const W& w) const {
    if constexpr (std::is_same_v<decltype(sl::einsum<Sub>(a, w)), X>) return sl::einsum_add<Sub>(a, w, x);
    else return x + sl::reshard<typename R::Act>(sl::einsum<Sub>(a, w));
  }
  /// The final norm and the LM head: the logits [B, S, V] (split over the vocabulary under TP).
  auto head_logits(const X& x) const {
    auto h = sl::reshard<typename R::Full>(sl::layer_norm<2>(x) * use<Vec>(*gf) + use<Vec>(*bf));
    return sl::einsum<"bsd,dv->bsv">(h, use<typename R::Head>(*head));
  }
  /// The final norm, the LM head and the mean cross-entropy against `targets` [B, S].
  template <class Ids>
  auto head_loss(const X& x, const Ids& targets) const {
    return sl::cross_entropy(sl::reshape<"b s v -> (b s) v">(head_logits(x)), sl::reshape<"b s -> (b s)">(targets));
  }
  /// The logits [B, S, V] of the tokens `ids` [B, S] (every part of the model on this device).
  template <class Ids>
  auto logits(const Ids& ids) const {
    X x = embed(ids);
    for (const auto& l : layers) x = block(*l, x);
    return head_logits(x);
  }

 private:
  template <class S, std::size_t N>
  P<S> init(const std::int64_t (&shape)[N], std::uint64_t salt, float amp) const {
    return P<S>(PTen<Stored<S>>::random(mesh, shape, cfg.seed * 7919 + salt, -amp, amp));
  }
  P<Vec> vec(float value) const { return P<Vec>(PTen<Stored<Vec>>::full(mesh, {cfg.dim}, value)); }
  /// A parameter as the forward uses it: gathered under FSDP (its gradient reduce-scattered;
  /// gathered again in the backward where an einsum needs it, not kept from the forward:
  /// reshard(p, sl::recompute)), and cast to float32 when it is 16-bit (its gradient cast back
  /// to 16 bits, so that the gradient reductions move 16-bit words).
  /// An expert weight as the forward uses it: cast to float32 when it is 16-bit.
  template <class Param>
  static decltype(auto) cast_up(const Param& p) {
    if constexpr (!std::is_same_v<E, float>) return sl::cast<float>(p);
    else return (p);
  }
  template <class S, class Param>
  static decltype(auto) use(const Param& p) {
    if constexpr (!std::is_same_v<E, float>)
      return sl::cast<float>(gathered<S>(p));
    else
      return gathered<S>(p);
  }
  template <class S, class Param>
  static decltype(auto) gathered(const Param& p) {
    if constexpr (std::is_same_v<typename Param::spec_type, S>)
      return static_cast<const sl::Var<typename Param::tensor_type>&>(p);
    else
      return sl::reshard<S>(p, sl::recompute);
  }
};

// ---- Data ----------------------------------------------------------------------------------------

/// A synthetic token stream made in the program: token t+1 follows token t by a fixed random
/// permutation of the vocabulary, except one time in eight, when it is drawn at random; a model
/// that learns the permutation drives the loss towards the noise floor. Global batch `step`
/// holds sequences [step * B, (step + 1) * B) of the stream; each device fills only its block of
/// it (each data-parallel rank its own slice of every global batch).
class TokenStream {
 public:
  TokenStream(std::int64_t vocab, std::int64_t seq, std::uint64_t seed) : vocab_(vocab), seq_(seq), seed_(seed) {
    perm_.resize(static_cast<std::size_t>(vocab));
    for (std::int64_t i = 0; i < vocab; ++i) perm_[static_cast<std::size_t>(i)] = i;
    for (std::int64_t i = vocab - 1; i > 0; --i)  // Fisher-Yates with the stream's hash
      std::swap(perm_[static_cast<std::size_t>(i)], perm_[static_cast<std::size_t>(hash(seed_, 0, i) % (i + 1))]);
  }
  /// Token `pos` (0..S) of global sequence `n`.
  std::int64_t token(std::int64_t n, std::int64_t pos) const {
    std::int64_t t = static_cast<std::int64_t>(hash(seed_, n + 1, 0) % static_cast<std::uint64_t>(vocab_));
    for (std::int64_t i = 1; i <= pos; ++i)
      t = hash(seed_, n + 1, i) % 8 == 0 ? static_cast<std::int64_t>(hash(seed_ + 1, n + 1, i) % static_cast<std::uint64_t>(vocab_))
                                         : perm_[static_cast<std::size_t>(t)];
    return t;
  }
  /// The inputs and targets of global batch `step` ([B, S] each), laid out by `Ids`.
  template <class Tensor, class Mesh>
  std::pair<Tensor, Tensor> batch(const Mesh& mesh, std::int64_t batch, std::int64_t step) const {
    Tensor ids = Tensor::uninitialized(mesh, {batch, seq_});
    Tensor targets = Tensor::uninitialized(mesh, {batch, seq_});
    sl::parallel_for(ids, targets, [this, batch, step](const sl::Index<2>& i, std::int64_t& x, std::int64_t& y) {
      const std::int64_t n = step * batch + i[0];
      x = token(n, i[1]);
      y = token(n, i[1] + 1);
    });
    return {ids, targets};
  }

 private:
  static std::uint64_t hash(std::uint64_t a, std::int64_t b, std::int64_t c) {
    std::uint64_t z = a * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(b) * 0xBF58476D1CE4E5B9ull +
                      static_cast<std::uint64_t>(c) * 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::int64_t vocab_, seq_;
  std::uint64_t seed_;
  std::vector<std::int64_t> perm_;
};

// ---- Training ------------------------------------------------------------------------------------

/// What one step did, on this device.
struct StepReport {
  double loss = 0;
  double val_loss = std::numeric_limits<double>::quiet_NaN();  ///< this step's validation loss (NaN: not evaluated)
  double grad_norm = 0;
  bool skipped = false;  // f16: the step was skipped (its gradients overflowed; the loss scale halved)
  sl::coll::CommStats forward, backward, update;  // collectives of each phase
  sl::coll::CommTrace trace;  // the whole step's collectives in order (the loss's read-back included)
  sl::MemoryUsage memory;  // after the update; its peak: the step's high point
  sl::plan::Work work;  // this device's GEMMs, other kernels and collectives in the step (recomputation included)
  sl::pipeline::StepStats pipeline;  // pipelined recipes: the step's forwards and backwards (`forward` counts their collectives)
  std::int64_t moe_dropped = 0;  // the choices the MoE layers dropped over capacity in the step's forward
  std::int64_t moe_groups = 0;   // the groups they route in, each with its own capacity (0: no MoE layer)
};

/// A pipelined run's shape: stages, micro-batches per global batch, schedule, chunks per stage
/// (interleaved), recomputation.
struct PipeConfig {
  int stages = 2;
  int microbatches = 4;
  sl::pipeline::Schedule schedule = sl::pipeline::Schedule::one_f_one_b;
  int chunks = 1;
  bool recompute = false;
  sl::pipeline::Transport transport = sl::pipeline::Transport::automatic;  ///< how the boundaries cross
  /// The table of this run (a backward takes 2 slots, 3 when recomputed).
  sl::pipeline::Table table() const { return sl::pipeline::schedule(schedule, stages, microbatches, chunks, recompute ? 3 : 2); }
};

/// The mean loss over the first cfg.eval_batches validation batches of `stream` (forward only,
/// nothing recorded: sl::NoGrad). Collective.
template <class R, class E, class Data>
double validation_loss(const Model<R, E>& model, const Data& stream, const typename R::Mesh& mesh) {
  using Ids = sl::DistributedTensor<std::int64_t, typename R::Mesh, typename R::Ids>;
  sl::NoGrad no_grad;
  const std::int64_t n = std::min<std::int64_t>(stream.val_batches(model.cfg.batch), std::max<std::int64_t>(1, model.cfg.eval_batches));
  double sum = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    const auto b = stream.template val_batch<Ids>(mesh, model.cfg.batch, k);
    sum += model.loss(b.first, b.second).value().item();
  }
  return sum / static_cast<double>(n);
}

/// `n` tokens generated after `context` (cfg.seq tokens; each new token joins its end and the
/// first leaves) from `logits(context)`, the model's logits [1, S, V] on the host: greedy when
/// `temperature` is 0, else drawn from softmax(logits / T) with a generator seeded by `seed` (the
/// same draws on every device).
template <class Logits>
std::vector<std::int64_t> generate_from(Logits&& logits, const Config& cfg, std::vector<std::int64_t> context, int n,
                                        double temperature, std::uint64_t seed) {
  const std::int64_t S = cfg.seq, V = cfg.vocab;
  if (static_cast<std::int64_t>(context.size()) != S)
    throw std::invalid_argument("gpt: generate: the context has " + std::to_string(context.size()) + " tokens, the model reads " +
                                std::to_string(S));
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> out;
  for (int i = 0; i < n; ++i) {
    const std::vector<float> all = logits(context);  // [1, S, V]
    const float* last = all.data() + (S - 1) * V;
    std::int64_t next = 0;
    if (temperature <= 0) {
      next = std::max_element(last, last + V) - last;
    } else {
      const float top = *std::max_element(last, last + V);
      std::vector<double> w(static_cast<std::size_t>(V));
      for (std::int64_t v = 0; v < V; ++v) w[static_cast<std::size_t>(v)] = std::exp((last[v] - top) / temperature);
      next = std::discrete_distribution<std::int64_t>(w.begin(), w.end())(rng);
    }
    out.push_back(next);
    context.erase(context.begin());
    context.push_back(next);
  }
  return out;
}

/// `n` tokens generated by `model` (every part of it on this device) after `context` (see
/// generate_from). Collective.
template <class R, class E>
std::vector<std::int64_t> generate(const Model<R, E>& model, std::vector<std::int64_t> context, int n, double temperature,
                                   std::uint64_t seed) {
  using Ids = sl::DistributedTensor<std::int64_t, typename R::Mesh, typename R::Ids>;
  sl::NoGrad no_grad;
  return generate_from([&](const std::vector<std::int64_t>& c) {
    return model.logits(Ids::from_host(model.mesh, {1, model.cfg.seq}, c)).value().to_host();
  }, model.cfg, std::move(context), n, temperature, seed);
}

/// train()'s hooks, none by default: `start(model, opt, scaler)` returns the step to begin with
/// (a resumed run's), `after_step(step, model, opt, scaler)` runs after each step's report
/// (checkpoints), `end(model)` after the last step (sampling). The scaler is f16's LossScaler
/// (every run has one; only f16 uses it).
struct NoHooks {
  template <class M, class O>
  int start(M&, O&, sl::optim::LossScaler&) {
    return 0;
  }
  template <class M, class O>
  void after_step(int, M&, O&, sl::optim::LossScaler&) {}
  template <class M>
  void end(M&) {}
};

/// Adds every parameter `model` holds to `opt`, with its state as recipe R keeps it (ZeRO: split
/// over "data").
template <class R, class E>
void add_params(sl::optim::AdamW& opt, Model<R, E>& model) {
  model.for_each_param([&](auto& p) {
    if constexpr (R::zero == Zero::none)
      opt.add(p);
    else
      opt.template add_zero<"data">(p);
  });
}

/// Trains `R`'s model with parameters of element type `E` for `steps` steps with AdamW and calls
/// `on_step(step, report)` after each. f16 trains with dynamic loss scaling (a step whose
/// gradients overflow is skipped: `StepReport::skipped`). Collective: every device runs it.
/// Returns the final model's parameters gathered on the host (in for_each_param order, as
/// float), for comparisons; nothing when shape-only (the simulate backend: a plan).
///
/// With a data source `data` (TokenStream, or CorpusStream of gpt/data.hpp: `batch<Ids>(mesh, B,
/// step)`) in place of the synthetic stream; a source with a validation part (`val_batch`) gives
/// StepReport::val_loss every `cfg.eval_every` steps and after the last. `hooks` (NoHooks):
/// a resumed start, checkpoints after steps, sampling at the end.
template <class R, class E = float, class Data, class OnStep, class Hooks = NoHooks>
std::vector<std::vector<float>> train(sl::Context& ctx, const Config& cfg, const Data& stream, int steps, OnStep&& on_step,
                                      Hooks&& hooks = {}) {
  auto mesh = mesh_of<R>(ctx, cfg);
  Model<R, E> model(cfg, mesh);
  sl::optim::LossScaler scaler;  // used by f16 only
  sl::optim::AdamW opt({.lr = cfg.lr, .weight_decay = 0.01, .clip_norm = cfg.clip});
  add_params(opt, model);
  using Ids = sl::DistributedTensor<std::int64_t, typename R::Mesh, typename R::Ids>;
  for (int s = hooks.start(model, opt, scaler); s < steps; ++s) {
    StepReport r;
    sl::coll::CommRecorder whole(sl::coll::keep_calls);
    const auto batch = stream.template batch<Ids>(mesh, cfg.batch, s);
    const Ids& ids = batch.first;  // (not a structured binding: clang 14 cannot capture one)
    const Ids& targets = batch.second;
    opt.zero_grad();
    sl::reset_peak_memory(ctx);  // r.memory.peak: this step's high point
    const sl::kernels::FlopCount flops0 = sl::kernels::flop_count();
    auto loss = [&] {
      sl::coll::CommRecorder rec;
      model.jitter_step = static_cast<std::uint64_t>(s) + 1;
      model.moe_dropped = 0;
      auto l = model.loss(ids, targets);
      model.jitter_step = 0;
      r.moe_dropped = model.moe_dropped;
      if (cfg.moe > 0) r.moe_groups = static_cast<std::int64_t>(sl::moe_stats(ctx).kept.size()) / cfg.moe;
      r.forward = rec.stats();
      return l;
    }();
    {
      sl::coll::CommRecorder rec;
      if constexpr (std::is_same_v<E, sl::f16>)
        sl::backward(loss * scaler.scale(), {.sync = R::zero != Zero::stage2});
      else
        sl::backward(loss, {.sync = R::zero != Zero::stage2});
      r.backward = rec.stats();
    }
    {
      sl::coll::CommRecorder rec;
      if constexpr (std::is_same_v<E, sl::f16>)
        r.skipped = !opt.step(scaler);
      else
        opt.step();
      r.update = rec.stats();
    }
    r.memory = sl::memory_usage(ctx);
    r.work = sl::plan::work_since(flops0, whole);
    r.grad_norm = opt.last_grad_norm();
    r.loss = loss.value().item();  // the pending sum over the batch's devices: one all_reduce
    r.trace = {whole.stats(), whole.calls()};
    if constexpr (requires { stream.val_batches(cfg.batch); })
      if (cfg.eval_every > 0 && stream.val_batches(cfg.batch) > 0 && ((s + 1) % cfg.eval_every == 0 || s + 1 == steps))
        r.val_loss = validation_loss(model, stream, mesh);
    on_step(s, r);
    hooks.after_step(s, model, opt, scaler);
  }
  hooks.end(model);
  std::vector<std::vector<float>> out;
  if (sl::shape_only()) return out;  // a plan (the simulate backend) has no values to gather
  model.for_each_param([&](auto& p) {
    const auto v = p.value().to_host();
    out.emplace_back(v.begin(), v.end());
  });
  return out;
}
/// train() on the synthetic TokenStream of `cfg` (vocab, seq, seed).
template <class R, class E = float, class OnStep>
std::vector<std::vector<float>> train(sl::Context& ctx, const Config& cfg, int steps, OnStep&& on_step) {
  return train<R, E>(ctx, cfg, TokenStream(cfg.vocab, cfg.seq, cfg.seed), steps, static_cast<OnStep&&>(on_step));
}

namespace pp = sl::pipeline;

/// This device's stage of a pipelined model (R::pipelined) as pipeline::run and forward call it:
/// chunk `chunk` of micro-batch `mb`, whose tokens `ids(mb)` the first virtual stage embeds.
template <class R, class E, class IdsFn>
auto stage_of(const Model<R, E>& model, const pp::Table& table, IdsFn ids) {
  const int me = model.mesh.shape().coords(model.mesh.context().device())[0];
  return [&model, &table, me, ids](int chunk, int mb, const typename Model<R, E>::X* in) {
    typename Model<R, E>::X x = in ? *in : model.embed(ids(mb));
    const auto [first, last] = pp::layers_of(table, static_cast<int>(model.cfg.layers), me, chunk);
    for (int l = first; l < last; ++l) x = model.block(*model.layers[static_cast<std::size_t>(l)], x);
    return x;
  };
}

/// validation_loss() of a pipelined model: each validation batch's micro-batches through the
/// forwards of `pc`'s schedule (pipeline::forward), nothing recorded. Collective.
template <class R, class E, class Data>
double pipelined_validation_loss(const Model<R, E>& model, const PipeConfig& pc, const Data& stream) {
  using Ids = sl::DistributedTensor<std::int64_t, typename R::Mesh, typename R::Ids>;
  using XT = typename Model<R, E>::X::tensor_type;
  const Config& cfg = model.cfg;
  const pp::Table table = pc.table();
  const int m = pc.microbatches;
  const std::int64_t b = cfg.batch / m;
  const std::int64_t n = std::min<std::int64_t>(stream.val_batches(cfg.batch), std::max<std::int64_t>(1, cfg.eval_batches));
  double sum = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    auto batch = [&](int mb) { return stream.template val_batch<Ids>(model.mesh, b, k * m + mb); };
    const auto losses = pp::forward<XT>(table, model.mesh, {b, cfg.seq, cfg.dim},
                                        stage_of(model, table, [&](int mb) { return batch(mb).first; }),
                                        [&](int mb, const typename Model<R, E>::X& out) { return model.head_loss(out, batch(mb).second); });
    for (const auto& l : losses) sum += l.empty() ? 0.0 : l[0] / m;  // (empty in a coll::dry_run, which moves nothing)
  }
  return sum / static_cast<double>(n);
}

/// generate() for a pipelined model: each token's logits through the stages (one micro-batch;
/// the interleaved schedule takes p copies of it). Collective.
template <class R, class E>
std::vector<std::int64_t> generate_pipelined(const Model<R, E>& model, const PipeConfig& pc, std::vector<std::int64_t> context,
                                             int n, double temperature, std::uint64_t seed) {
  using Ids = sl::DistributedTensor<std::int64_t, typename R::Mesh, typename R::Ids>;
  using XT = typename Model<R, E>::X::tensor_type;
  const pp::Table table = pc.chunks > 1 ? pp::schedule(pp::Schedule::interleaved, pc.stages, pc.stages, pc.chunks)
                                        : pp::schedule(pp::Schedule::gpipe, pc.stages, 1);
  return generate_from([&](const std::vector<std::int64_t>& c) {
    const auto out = pp::forward<XT>(table, model.mesh, {1, model.cfg.seq, model.cfg.dim},
                                     stage_of(model, table, [&](int) { return Ids::from_host(model.mesh, {1, model.cfg.seq}, c); }),
                                     [&](int, const typename Model<R, E>::X& x) { return model.head_logits(x); });
    return out[0];
  }, model.cfg, std::move(context), n, temperature, seed);
}

/// train() for a pipelined recipe (R::pipelined): the mesh {stages, ...} of `pc`, this device's
/// stage's parts of the model, and each step's forwards and backwards by `pc`'s schedule over
/// micro-batches of cfg.batch / m sequences (micro-batch k of step s holds the global batch's
/// sequences [k b, (k + 1) b): the same data as the other recipes). AdamW steps once per global
/// batch over this stage's parameters (its global norm over every stage's: Optimizer::stage_axis).
/// Validation (pipelined_validation_loss) and `hooks` as in train(): each stage's hooks see its
/// own part of the model (a checkpoint lists each stage's tensors: io::save takes them so).
/// Throws std::invalid_argument when m does not divide the batch or the layers do not split.
/// Returns nothing (the parameters live on their stages).
template <class R, class E = float, class Data, class OnStep, class Hooks = NoHooks>
void train_pipelined(sl::Context& ctx, const Config& cfg, const PipeConfig& pc, const Data& stream, int steps, OnStep&& on_step,
                     Hooks&& hooks = {}) {
  if (pc.microbatches < 1 || cfg.batch % pc.microbatches != 0)
    throw std::invalid_argument("gpt: " + std::to_string(pc.microbatches) + " micro-batches do not divide the batch of " +
                                std::to_string(cfg.batch) + " sequences");
  const pp::Table table = pc.table();
  auto mesh = R::mesh(ctx, pc.stages, cfg.tp);
  pp::StageScope scope(mesh);  // from here, this device runs its stage's code
  const int me = mesh.shape().coords(ctx.device())[0];
  Parts parts{std::vector<bool>(static_cast<std::size_t>(cfg.layers), false), me == 0, me == pc.stages - 1};
  for (int c = 0; c < table.chunks; ++c) {
    const auto [first, last] = pp::layers_of(table, static_cast<int>(cfg.layers), me, c);
    for (int l = first; l < last; ++l) parts.layers[static_cast<std::size_t>(l)] = true;
  }
  Model<R, E> model(cfg, mesh, parts);
  sl::optim::LossScaler scaler;  // used by f16 only
  sl::optim::AdamW opt({.lr = cfg.lr, .weight_decay = 0.01, .clip_norm = cfg.clip});
  opt.stage_axis("stage");
  add_params(opt, model);
  using Ids = sl::DistributedTensor<std::int64_t, typename R::Mesh, typename R::Ids>;
  using XT = typename Model<R, E>::X::tensor_type;
  const std::int64_t b = cfg.batch / pc.microbatches;
  for (int s = hooks.start(model, opt, scaler); s < steps; ++s) {
    StepReport r;
    sl::coll::CommRecorder whole(sl::coll::keep_calls);
    opt.zero_grad();
    sl::reset_peak_memory(ctx);
    const sl::kernels::FlopCount flops0 = sl::kernels::flop_count();
    {
      sl::coll::CommRecorder rec;
      auto batch = [&](int mb) { return stream.template batch<Ids>(mesh, b, s * pc.microbatches + mb); };
      r.pipeline = pp::run<XT>(
          table, mesh, {b, cfg.seq, cfg.dim}, stage_of(model, table, [&](int mb) { return batch(mb).first; }),
          [&](int mb, const typename Model<R, E>::X& out) { return model.head_loss(out, batch(mb).second); },
          {.recompute = pc.recompute,
           .settle = R::zero != Zero::stage1,
           .loss_scale = std::is_same_v<E, sl::f16> ? scaler.scale() : 1.0,
           .transport = pc.transport});
      r.forward = rec.stats();
    }
    {
      sl::coll::CommRecorder rec;
      if constexpr (std::is_same_v<E, sl::f16>)
        r.skipped = !opt.step(scaler);  // the norm adds every stage's: all skip or none
      else
        opt.step();
      r.update = rec.stats();
    }
    r.memory = sl::memory_usage(ctx);
    r.work = sl::plan::work_since(flops0, whole);
    r.grad_norm = opt.last_grad_norm();
    r.loss = r.pipeline.loss;
    r.work.bubble = table.bubble();  // every stage runs as many forwards and backwards: the same idle fraction
    r.trace = {whole.stats(), whole.calls()};
    if constexpr (requires { stream.val_batches(cfg.batch); })
      if (cfg.eval_every > 0 && stream.val_batches(cfg.batch) > 0 && ((s + 1) % cfg.eval_every == 0 || s + 1 == steps))
        r.val_loss = pipelined_validation_loss(model, pc, stream);
    on_step(s, r);
    hooks.after_step(s, model, opt, scaler);
  }
  hooks.end(model);
}

/// train_pipelined() on the synthetic TokenStream of `cfg`.
template <class R, class E = float, class OnStep>
void train_pipelined(sl::Context& ctx, const Config& cfg, const PipeConfig& pc, int steps, OnStep&& on_step) {
  train_pipelined<R, E>(ctx, cfg, pc, TokenStream(cfg.vocab, cfg.seq, cfg.seed), steps, static_cast<OnStep&&>(on_step));
}

}  // namespace gpt
