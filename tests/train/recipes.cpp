// SPDX-License-Identifier: Apache-2.0
// The training recipes of examples/gpt/gpt.hpp (docs/08_training.md) against one device: each
// recipe trains the small GPT for 20 steps on 4 and 8 threads devices (and once under mpirun)
// and must give the losses of every step and the final parameters of the same model trained
// with everything replicated (each device computing what one device would) to 1e-4 relative;
// the collectives of each phase of a step are those the strategy prescribes, counted; the
// per-device memory of parameters, gradients and optimizer state is ZeRO's formula exactly.
#include <doctest/doctest.h>

#include "../../examples/gpt/gpt.hpp"
#include "../collectives/harness.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace sl = shardlib;
using Kind = sl::coll::Kind;

constexpr int steps = 20;

/// Sizes that split evenly over 1, 2, 4 and 8 devices on every dim a recipe splits.
gpt::Config config() {
  gpt::Config c;
  c.vocab = 64, c.seq = 16, c.dim = 32, c.heads = 8, c.ff = 64, c.layers = 2, c.batch = 8;
  return c;
}

/// Ψ: the parameter count.
std::int64_t num_params(const gpt::Config& c) {
  const std::int64_t hk = c.heads * c.head_dim();
  return c.vocab * c.dim + c.seq * c.dim + c.layers * (4 * c.dim + 4 * c.dim * hk + 2 * c.dim * c.ff) + 2 * c.dim +
         c.dim * c.vocab;
}

std::uint64_t calls(const sl::coll::CommStats& s, Kind k) { return s[k].calls; }

/// Whether every size a recipe splits divides by the n devices. The recipes' checks of
/// collectives and bytes per parameter (ZeRO's formulas: 12Ψ/N) hold for even blocks; under
/// mpirun -np 5 or 7 the blocks are uneven (a batch of 8 over 5 devices: 2, 2, 2, 2, 0, and a
/// reshape of the uneven batch dim gathers) and those checks are left out, the training against
/// one device still checked.
bool splits_evenly(const gpt::Config& c, int n) {
  for (const std::int64_t e : {c.vocab, c.seq, c.dim, c.heads, c.ff, c.batch})
    if (e % n != 0) return false;
  return true;
}

struct Run {
  std::vector<double> losses;
  std::vector<gpt::StepReport> reports;
  std::vector<std::vector<float>> params;
};

template <class R, class E = float>
Run train(sl::Context& ctx, const gpt::Config& cfg = config()) {
  Run r;
  r.params = gpt::train<R, E>(ctx, cfg, steps, [&](int, const gpt::StepReport& s) {
    r.losses.push_back(s.loss);
    r.reports.push_back(s);
  });
  return r;
}

/// Trains recipe R with parameters of element type E and the replicated reference in the same
/// precision and compares them, then hands each step's report to `check`. In 16 bits the
/// tolerances are wider: each device rounds its part of a gradient before the reduction, where
/// one device rounds the sum, and the parameters are compared to a step of bf16. `tol_scale`
/// widens both.
template <class R, class E = float, class Check>
void against_one_device(Check check, const gpt::Config& cfg = config(), double tol_scale = 1) {
  const double loss_tol = (std::is_same_v<E, float> ? 1e-4 : 1e-3) * tol_scale;
  const double param_tol = (std::is_same_v<E, float> ? 1e-4 : 2e-3) * tol_scale;
  sl::test::for_each_run(
      [&](sl::Context& ctx) {
        if (std::is_same_v<R, gpt::DPxCP> && ctx.num_devices() % cfg.cp != 0) return;  // (mpirun -np 5, 7)
        const Run got = train<R, E>(ctx, cfg);
        const Run want = train<gpt::Replicated, E>(ctx, cfg);
        REQUIRE(got.losses.size() == want.losses.size());
        double worst = 0;
        for (std::size_t s = 0; s < got.losses.size(); ++s) {
          const double rel = std::abs(got.losses[s] - want.losses[s]) / std::abs(want.losses[s]);
          worst = std::max(worst, rel);
          CHECK_MESSAGE(rel <= loss_tol, R::name << " on " << ctx.num_devices() << " devices, step " << s << ": loss "
                                             << got.losses[s] << ", one device " << want.losses[s]);
        }
        // The model learns: the loss falls well below log(V) in 20 steps.
        CHECK(got.losses.back() < 0.85 * got.losses.front());
        REQUIRE(got.params.size() == want.params.size());
        // float32: every parameter; 16 bits: the parameters as a whole (relative L2 distance),
        // since Adam turns the rounding of a near-zero gradient into a step of lr either way.
        double pworst = 0, diff2 = 0, norm2 = 0;
        for (std::size_t p = 0; p < got.params.size(); ++p)
          for (std::size_t i = 0; i < got.params[p].size(); ++i) {
            const double g = got.params[p][i], w = want.params[p][i];
            pworst = std::max(pworst, std::abs(g - w) / (1e-2 + std::abs(w)));
            diff2 += (g - w) * (g - w);
            norm2 += w * w;
          }
        const double pdist = std::is_same_v<E, float> ? pworst : std::sqrt(diff2 / norm2);
        CHECK_MESSAGE(pdist <= param_tol, std::string(R::name) << " on " << ctx.num_devices()
                                                               << " devices: final parameters differ by " << pdist
                                                               << " (relative)");
        // Every step emits the collectives of the first, in order, with the same groups and bytes:
        // the first step's trace describes every step (docs/02, "Describing a step"). Not with
        // MoE layers: their all-to-alls carry the routed tokens, which change with the values.
        REQUIRE(!got.reports.empty());
        const bool formulas = splits_evenly(cfg, ctx.num_devices());
        if (cfg.moe > 0) {
          if (formulas)
            for (const gpt::StepReport& s : got.reports) check(ctx, s);
          return;
        }
        const std::string first = got.reports.front().trace.to_string();
        CHECK(got.reports.front().trace.calls.size() == got.reports.front().trace.totals.total_calls());
        for (const gpt::StepReport& s : got.reports) CHECK_MESSAGE(s.trace.to_string() == first, R::name);
        // ... and a dry run of one step on a model made for it says so before anything runs.
        gpt::StepReport dry;
        sl::coll::dry_run([&] { gpt::train<R, E>(ctx, cfg, 1, [&](int, const gpt::StepReport& s) { dry = s; }); });
        CHECK_MESSAGE(dry.trace.to_string() == first, R::name << ": dry run\n" << dry.trace.to_string() << "real\n" << first);
        if (formulas)
          for (const gpt::StepReport& s : got.reports) check(ctx, s);
      },
      {4, 8});
}

/// No all_to_all in any phase: each strategy's layout changes are gathers, scatters and sums.
void no_all_to_all(const gpt::StepReport& s) {
  CHECK(calls(s.forward, Kind::all_to_all) == 0);
  CHECK(calls(s.backward, Kind::all_to_all) == 0);
  CHECK(calls(s.update, Kind::all_to_all) == 0);
}

constexpr std::int64_t P = 2 + 10 * 2 + 3;  // parameter tensors: wte, wpe, 10 per layer, gf, bf, head

/// Pipelined recipe R with `pc` (0 stages: every device a stage) against one device: the
/// loss and the global gradient norm of every step (the norm adds every stage's gradients), and
/// one activation forward and one gradient back per micro-batch and stage boundary.
template <class R>
void pipelined_against_one_device(gpt::PipeConfig pc, std::int64_t layers = 4) {
  gpt::Config cfg = config();
  cfg.layers = layers;
  constexpr int pp_steps = 8;
  sl::test::for_each_run(
      [&](sl::Context& ctx) {
        gpt::PipeConfig c = pc;
        if (c.stages == 0) c.stages = ctx.num_devices();  // every device a stage
        if (ctx.num_devices() % c.stages != 0) return;  // (mpirun -np 2: the 4-stage cases)
        std::vector<gpt::StepReport> got;
        gpt::train_pipelined<R>(ctx, cfg, c, pp_steps, [&](int, const gpt::StepReport& r) { got.push_back(r); });
        std::vector<gpt::StepReport> want;
        gpt::train<gpt::Replicated>(ctx, cfg, pp_steps, [&](int, const gpt::StepReport& r) { want.push_back(r); });
        REQUIRE(got.size() == want.size());
        const auto mesh = R::mesh(ctx, c.stages);
        const int me = mesh.shape().coords(ctx.device())[0];
        const std::int64_t b = cfg.batch / c.microbatches;
        // This device's block of the boundary [b, S, D] (split over "data" or, under TP, "model").
        using XT = typename gpt::Model<R>::X::tensor_type;
        const std::int64_t shape[] = {b, cfg.seq, cfg.dim};
        const std::uint64_t block = static_cast<std::uint64_t>(
            sl::shard_box(XT::sharding, mesh.shape(), shape, ctx.device()).num_elements() * 4);
        const int V = c.stages * c.chunks;
        std::uint64_t crossings = 0;
        for (int ch = 0; ch < c.chunks; ++ch) {
          const int vs = ch * c.stages + me;
          crossings += static_cast<std::uint64_t>((vs < V - 1) + (vs > 0)) * static_cast<std::uint64_t>(c.microbatches);
        }
        for (std::size_t s = 0; s < got.size(); ++s) {
          CAPTURE(R::name);
          CAPTURE(s);
          CHECK(got[s].loss == doctest::Approx(want[s].loss).epsilon(1e-4));
          CHECK(got[s].grad_norm == doctest::Approx(want[s].grad_norm).epsilon(1e-4));
          CHECK(got[s].forward[Kind::permute].bytes_sent + got[s].forward[Kind::send].bytes_sent == crossings * block);
          CHECK(got[s].forward[Kind::permute].bytes_received + got[s].forward[Kind::recv].bytes_received == crossings * block);
          CHECK(got[s].pipeline.forwards == c.microbatches * c.chunks);
          if constexpr (R::zero == gpt::Zero::stage2) {
            // ZeRO-2: each micro-batch's backward reduce-scatters every parameter of this stage's
            // into its state's shard (the step reduces nothing more); the gradients held are
            // those shards, not the full-size sums ZeRO-1 keeps.
            const auto [first, last] = sl::pipeline::layers_of(c.table(), static_cast<int>(cfg.layers), me, 0);
            const std::uint64_t params = 10u * static_cast<std::uint64_t>(last - first) + (me == 0 ? 2u : 0u) +
                                         (me == c.stages - 1 ? 3u : 0u);
            if (mesh.shape().size(1) > 1) {
              CHECK(got[s].forward[Kind::reduce_scatter].calls == params * static_cast<std::uint64_t>(c.microbatches));
              CHECK(got[s].update[Kind::reduce_scatter].calls == 0);
              if (splits_evenly(cfg, mesh.shape().size(1)))  // (3 shards of 64 rows: 22, 22 and 20)
                CHECK(got[s].memory.gradients() * mesh.shape().size(1) <= got[s].memory.parameters() + 64 * params);
            }
          }
          if constexpr (R::zero == gpt::Zero::stage1) {
            // ZeRO-1: the micro-batches' gradients add up locally; the step reduce-scatters each
            // of this stage's parameters once into its state's shard (none during the pipeline).
            const auto [first, last] = sl::pipeline::layers_of(c.table(), static_cast<int>(cfg.layers), me, 0);
            const std::uint64_t params = 10u * static_cast<std::uint64_t>(last - first) + (me == 0 ? 2u : 0u) +
                                         (me == c.stages - 1 ? 3u : 0u);
            CHECK(got[s].forward[Kind::reduce_scatter].calls == 0);
            if (mesh.shape().size(1) > 1) CHECK(got[s].update[Kind::reduce_scatter].calls == params);
          }
        }
        CHECK(got.back().loss < 0.9 * got.front().loss);
      },
      {4, 8});
}

}  // namespace

TEST_SUITE("train") {
TEST_CASE("DP: one gradient all_reduce (one bucket), replicated state: 16 bytes per parameter") {
  const std::int64_t psi = num_params(config());
  against_one_device<gpt::DP>([&](sl::Context&, const gpt::StepReport& s) {
    CHECK(s.forward.total_calls() == 0);
    CHECK(calls(s.backward, Kind::all_reduce) == 1);
    CHECK(s.backward.total_calls() == 1);
    CHECK(calls(s.update, Kind::all_reduce) == 1);  // the global norm, one number
    CHECK(s.update.total_calls() == 1);
    CHECK(s.memory.parameters() == 4 * psi);
    CHECK(s.memory.gradients() == 4 * psi);
    CHECK(s.memory.optimizer_state() == 8 * psi);
  });
}

TEST_CASE("ZeRO-1: state split over data, one all_gather per parameter: 8 + 8/N bytes per parameter") {
  const std::int64_t psi = num_params(config());
  against_one_device<gpt::Zero1>([&](sl::Context& ctx, const gpt::StepReport& s) {
    const std::int64_t n = ctx.num_devices();
    CHECK(s.forward.total_calls() == 0);
    CHECK(calls(s.backward, Kind::all_reduce) == 1);
    CHECK(s.backward.total_calls() == 1);
    CHECK(calls(s.update, Kind::all_gather) == P);
    CHECK(calls(s.update, Kind::all_reduce) == 1);
    CHECK(s.update.total_calls() == P + 1);
    CHECK(s.memory.parameters() == 4 * psi);
    CHECK(s.memory.gradients() == 4 * psi);
    CHECK(s.memory.optimizer_state() == 8 * psi / n);
  });
}

TEST_CASE("ZeRO-2: gradients reduce-scattered into the state's shards: 4 + 12/N bytes per parameter") {
  const std::int64_t psi = num_params(config());
  against_one_device<gpt::Zero2>([&](sl::Context& ctx, const gpt::StepReport& s) {
    const std::int64_t n = ctx.num_devices();
    CHECK(s.forward.total_calls() == 0);
    // Each gradient reduce-scattered into its state's shard as soon as the backward is done with
    // the parameter; the step gathers the updated values.
    CHECK(calls(s.backward, Kind::reduce_scatter) == P);
    CHECK(s.backward.total_calls() == P);
    CHECK(calls(s.update, Kind::all_gather) == P);
    CHECK(calls(s.update, Kind::all_reduce) == 1);
    CHECK(s.update.total_calls() == P + 1);
    CHECK(s.memory.parameters() == 4 * psi);
    CHECK(s.memory.gradients() == 4 * psi / n);
    CHECK(s.memory.optimizer_state() == 8 * psi / n);
  });
}

TEST_CASE("ZeRO-3 / FSDP: all_gather before use (again in the backward for the einsums), reduce_scatter of gradients: 16/N bytes per parameter") {
  const std::int64_t psi = num_params(config());
  // The weights an einsum reads (wq, wk, wv, wo, w1, w2 per layer, and the head) are gathered
  // again in the backward (reshard(p, sl::recompute)), not kept from the forward.
  constexpr std::uint64_t regathered = 6 * 2 + 1;
  against_one_device<gpt::Zero3>([&](sl::Context& ctx, const gpt::StepReport& s) {
    const std::int64_t n = ctx.num_devices();
    CHECK(calls(s.forward, Kind::all_gather) == P);
    CHECK(s.forward.total_calls() == P);
    CHECK(calls(s.backward, Kind::reduce_scatter) == P);
    CHECK(calls(s.backward, Kind::all_gather) == regathered);
    CHECK(s.backward.total_calls() == P + regathered);
    CHECK(calls(s.update, Kind::all_reduce) == 1);
    CHECK(s.update.total_calls() == 1);
    CHECK(s.memory.parameters() == 4 * psi / n);
    CHECK(s.memory.gradients() == 4 * psi / n);
    CHECK(s.memory.optimizer_state() == 8 * psi / n);
  });
}

TEST_CASE("Megatron TP + SP: all_gather before and reduce_scatter after each parallel pair, no all_reduce of activations") {
  against_one_device<gpt::TP>([&](sl::Context&, const gpt::StepReport& s) {
    const std::uint64_t pairs = 2 * 2 + 1;  // attention and MLP per layer, and the LM head / embedding
    CHECK(calls(s.forward, Kind::all_gather) == pairs);
    CHECK(calls(s.forward, Kind::reduce_scatter) == pairs);
    CHECK(calls(s.forward, Kind::all_reduce) == 2);  // the vocab-parallel cross-entropy: row max and sum
    CHECK(calls(s.backward, Kind::reduce_scatter) == pairs);
    // The transposes of the forward's, and the positions' gradient: summed over the batch
    // locally, split along the sequence, gathered into the replicated table.
    CHECK(calls(s.backward, Kind::all_gather) == pairs + 1);
    CHECK(calls(s.backward, Kind::all_reduce) == 1);  // the norms' gradients, one bucket
    CHECK(s.update.total_calls() == 1);
    no_all_to_all(s);
  });
}

TEST_CASE("2-D DP x TP: the TP collectives over model, the gradient buckets over data") {
  against_one_device<gpt::DPxTP>([&](sl::Context& ctx, const gpt::StepReport& s) {
    const bool tp = gpt::DPxTP::model_size(ctx.num_devices()) > 1;
    const std::uint64_t pairs = tp ? 2 * 2 + 1 : 0;
    CHECK(calls(s.forward, Kind::all_gather) == pairs);
    CHECK(calls(s.forward, Kind::reduce_scatter) == pairs);
    CHECK(calls(s.forward, Kind::all_reduce) == (tp ? 2u : 0u));
    CHECK(calls(s.backward, Kind::reduce_scatter) == pairs);
    CHECK(calls(s.backward, Kind::all_gather) == (tp ? pairs + 1 : 0u));
    // Two buckets, whatever the order the pass meets the parameters in: those pending over
    // "data" (the matrices, split over "model") and those over ("data", "model") (the norms);
    // and the positions' gradient, pending over "data" and split along the sequence.
    // (With one device on "data", the norms' bucket alone: groups of one device add nothing.)
    const bool dp = ctx.num_devices() / gpt::DPxTP::model_size(ctx.num_devices()) > 1;
    if (tp) CHECK(calls(s.backward, Kind::all_reduce) == (dp ? 3u : 1u));
    CHECK(s.update.total_calls() == 1);
    no_all_to_all(s);
  });
}

TEST_CASE("context parallelism (cp): attention's four all_to_alls each way per layer, nothing gathered; 16 bytes per parameter") {
  const std::int64_t psi = num_params(config());
  against_one_device<gpt::DPxCP>([&](sl::Context& ctx, const gpt::StepReport& s) {
    const bool dp = ctx.num_devices() / config().cp > 1;  // (mpirun -np 2: one device on "data")
    const std::uint64_t layers = 2;
    CHECK(calls(s.forward, Kind::all_to_all) == 4 * layers);  // q, k, v onto the heads; the output back
    // The LM head's loss takes [B S, V] rows: merging the batch (over "data") with the sequence
    // (over "seq") gathers the sequence of the logits and of the targets.
    CHECK(calls(s.forward, Kind::all_gather) == 2);
    CHECK(s.forward.total_calls() == 4 * layers + 2);
    CHECK(calls(s.backward, Kind::all_to_all) == 4 * layers);
    CHECK(calls(s.backward, Kind::all_gather) == 1);  // the positions' gradient, split along the sequence
    CHECK(calls(s.backward, Kind::all_reduce) == (dp ? 2u : 1u));  // the gradients over "data" and "seq"; the positions' over "data"
    CHECK(s.update.total_calls() == 1);
    CHECK(s.memory.parameters() == 4 * psi);
    CHECK(s.memory.gradients() == 4 * psi);
    CHECK(s.memory.optimizer_state() == 8 * psi);
  });
}

TEST_CASE("context parallelism as ring attention (cp, --cp-kind ring): k and v around the ring, p - 1 permutes each per layer") {
  gpt::Config cfg = config();
  cfg.cp_kind = sl::ContextParallel::ring;
  against_one_device<gpt::DPxCP>(
      [&](sl::Context& ctx, const gpt::StepReport& s) {
        const bool dp = ctx.num_devices() / cfg.cp > 1;
        const std::uint64_t layers = 2, p = static_cast<std::uint64_t>(cfg.cp);
        CHECK(calls(s.forward, Kind::permute) == 2 * (p - 1) * layers);  // k and v to the next device
        CHECK(calls(s.forward, Kind::all_to_all) == 0);
        CHECK(calls(s.forward, Kind::all_gather) == 2);  // the loss's rows, as with Ulysses
        CHECK(s.forward.total_calls() == 2 * (p - 1) * layers + 2);
        CHECK(calls(s.backward, Kind::permute) == (2 * (p - 1) + 2 * p) * layers);  // k, v again; dk, dv home
        CHECK(calls(s.backward, Kind::all_to_all) == 0);
        CHECK(calls(s.backward, Kind::all_reduce) == (dp ? 2u : 1u));
      },
      cfg);
}

TEST_CASE("context parallelism as zig-zag ring attention (--cp-kind ring_zigzag): the ring's permutes, q, k, v moved into its runs and the output back") {
  gpt::Config cfg = config();
  cfg.cp_kind = sl::ContextParallel::ring_zigzag;
  against_one_device<gpt::DPxCP>(
      [&](sl::Context& ctx, const gpt::StepReport& s) {
        const bool dp = ctx.num_devices() / cfg.cp > 1;
        const std::uint64_t layers = 2, p = static_cast<std::uint64_t>(cfg.cp);
        CHECK(calls(s.forward, Kind::permute) == 2 * (p - 1) * layers);
        CHECK(calls(s.forward, Kind::all_to_all) == 8 * layers);  // q, k, v in, the output out: two exchanges each
        CHECK(calls(s.forward, Kind::all_gather) == 2);
        CHECK(calls(s.backward, Kind::permute) == (2 * (p - 1) + 2 * p) * layers);
        CHECK(calls(s.backward, Kind::all_to_all) == 16 * layers);  // q, k, v, o, its gradient in; dq, dk, dv out
        CHECK(calls(s.backward, Kind::all_reduce) == (dp ? 2u : 1u));
      },
      cfg);
}

TEST_CASE("mixed precision, bf16 ZeRO-2: 16-bit gradients reduce-scattered, float32 master weights: 2 + 14/N bytes per parameter") {
  const std::int64_t psi = num_params(config());
  against_one_device<gpt::Zero2, sl::bf16>([&](sl::Context& ctx, const gpt::StepReport& s) {
    const std::int64_t n = ctx.num_devices();
    CHECK(calls(s.backward, Kind::reduce_scatter) == P);
    CHECK(calls(s.update, Kind::all_gather) == P);
    CHECK(s.backward.total_bytes_sent() == static_cast<std::uint64_t>(2 * (psi - psi / n)));  // 2 bytes an element
    CHECK(s.memory.parameters() == 2 * psi);
    CHECK(s.memory.gradients() == 2 * psi / n);
    CHECK(s.memory.optimizer_state() == 12 * psi / n);
  });
}

TEST_CASE("mixed precision, f16 ZeRO-3 with loss scaling: parameters gathered in 16 bits, 16/N bytes per parameter") {
  const std::int64_t psi = num_params(config());
  against_one_device<gpt::Zero3, sl::f16>([&](sl::Context& ctx, const gpt::StepReport& s) {
    const std::int64_t n = ctx.num_devices();
    CHECK(!s.skipped);  // S = 2^16 fits this model's gradients
    CHECK(calls(s.forward, Kind::all_gather) == P);
    CHECK(calls(s.backward, Kind::reduce_scatter) == P);
    CHECK(calls(s.update, Kind::all_reduce) == 1);  // the norm: clipping and the overflow check share it
    CHECK(s.memory.parameters() == 2 * psi / n);
    CHECK(s.memory.gradients() == 2 * psi / n);
    CHECK(s.memory.optimizer_state() == 12 * psi / n);
  });
}

TEST_CASE("MoE recipes (dp, zero3, dp_tp): each step's loss and the parameters as one device's, with router jitter and z-loss") {
  gpt::Config cfg = config();
  cfg.moe = 4, cfg.top_k = 2, cfg.capacity_factor = 4;  // (nothing dropped: the groups do not matter)
  cfg.router_jitter = 0.2, cfg.z_loss_weight = 0.001;
  const auto any = [](sl::Context&, const gpt::StepReport& s) { CHECK(s.forward[Kind::all_gather].calls >= 1); };
  // (Twice the tolerance: the router's softmax, the gates and the experts' sums split over the
  // devices add roundings that 20 steps of Adam carry into the parameters; dp_tp on 8 devices
  // ended 1.03e-4 from one device's, the dense recipes within 1e-4.)
  against_one_device<gpt::DP>(any, cfg, 2);
  against_one_device<gpt::Zero3>(any, cfg, 2);
  against_one_device<gpt::DPxTP>(any, cfg, 2);
  // The jitter is drawn: without it the first step's loss differs.
  gpt::Config plain = cfg;
  plain.router_jitter = 0;
  sl::test::for_each_run([&](sl::Context& ctx) { CHECK(train<gpt::DP>(ctx, cfg).losses[0] != train<gpt::DP>(ctx, plain).losses[0]); },
                         {2});
}

TEST_CASE("uneven sizes: a global batch, a vocabulary and widths that do not divide by the devices") {
  // 6 sequences over 4 and 8 devices (blocks of 2, 2, 1, 1 and of 1 or 0), and every dim the
  // recipes split uneven: the losses are still one device's, for every recipe.
  gpt::Config c;
  c.vocab = 60, c.seq = 12, c.dim = 36, c.heads = 6, c.ff = 60, c.layers = 1, c.batch = 6;
  auto any = [](sl::Context&, const gpt::StepReport&) {};
  against_one_device<gpt::DP>(any, c);
  against_one_device<gpt::Zero1>(any, c);
  against_one_device<gpt::Zero2>(any, c);
  against_one_device<gpt::Zero3>(any, c);
  against_one_device<gpt::TP>(any, c);
  against_one_device<gpt::DPxTP>(any, c);
}
TEST_CASE("pipeline recipes: 1F1B, GPipe with recomputation and interleaved, with DP, TP, ZeRO-1 and ZeRO-2, against one device") {
  namespace pp = sl::pipeline;
  pipelined_against_one_device<gpt::PPxDP>({.stages = 2, .microbatches = 4, .schedule = pp::Schedule::one_f_one_b});
  pipelined_against_one_device<gpt::PPxDP>({.stages = 4, .microbatches = 2, .schedule = pp::Schedule::gpipe, .recompute = true});
  pipelined_against_one_device<gpt::PPxTP>({.stages = 2, .microbatches = 2, .schedule = pp::Schedule::one_f_one_b});
  pipelined_against_one_device<gpt::PPxZero1>({.stages = 2, .microbatches = 8, .schedule = pp::Schedule::one_f_one_b});
  pipelined_against_one_device<gpt::PPxZero2>({.stages = 2, .microbatches = 4, .schedule = pp::Schedule::one_f_one_b});
  pipelined_against_one_device<gpt::PPxDP>({.stages = 2, .microbatches = 4, .schedule = pp::Schedule::interleaved, .chunks = 2});
  pipelined_against_one_device<gpt::PP>({.stages = 0, .microbatches = 8, .schedule = pp::Schedule::one_f_one_b}, 8);
}

TEST_CASE("pipeline recipes: the first stage's activation peak is what it holds between ops, so 1F1B's is p/m of GPipe's") {
  // No op of the model holds a [b, S, D] product beside its sum: each residual add is folded into
  // its projection's GEMM (Model::residual, einsum_add), so the peak of the first stage's
  // activations is the bytes it holds at the ends of its ops (StepStats::held_activations), and
  // 1F1B's (p micro-batches in flight) over GPipe's (all m) is p/m exactly. (With D = 64 the
  // attention ops' scores, [b, H, S, S] before the softmax, are scratch below what the rest of the
  // layer adds; at long sequences they can top the held bytes: the fused kernel holds no scores.)
  namespace pp = sl::pipeline;
  gpt::Config cfg = config();
  cfg.layers = 4;
  cfg.dim = 64;
  for (int m : {4, 8}) {
    CAPTURE(m);
    std::int64_t peak[2] = {0, 0}, held[2] = {0, 0};
    int i = 0;
    for (pp::Schedule s : {pp::Schedule::gpipe, pp::Schedule::one_f_one_b}) {
      sl::Runtime::threads(2).spmd([&](sl::Context& ctx) {
        gpt::StepReport last;
        gpt::train_pipelined<gpt::PP>(ctx, cfg, {.stages = 2, .microbatches = m, .schedule = s}, 2,
                                      [&](int, const gpt::StepReport& r) { last = r; });
        if (ctx.device() == 0) peak[i] = last.memory.peak_of(sl::MemoryRole::activations), held[i] = last.pipeline.held_activations;
      });
      ++i;
    }
    CHECK(held[0] > 0);
    CHECK(peak[0] == held[0]);
    CHECK(peak[1] == held[1]);
    CHECK(peak[1] * m == peak[0] * 2);
  }
}

TEST_CASE("pipeline recipes: micro-batches that do not divide the batch, and more stages than layers, are refused by name") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        gpt::Config cfg = config();  // batch 8, 2 layers
        auto none = [](int, const gpt::StepReport&) {};
        CHECK_THROWS_WITH_AS(gpt::train_pipelined<gpt::PPxDP>(ctx, cfg, {.stages = 2, .microbatches = 3}, 1, none),
                             "gpt: 3 micro-batches do not divide the batch of 8 sequences", std::invalid_argument);
        if (ctx.num_devices() > 2)
          CHECK_THROWS_WITH_AS(gpt::train_pipelined<gpt::PP>(ctx, cfg, {.stages = ctx.num_devices(), .microbatches = 4}, 1, none),
                               doctest::Contains("2 layers cannot fill"), std::invalid_argument);
      },
      {4});
}
}
