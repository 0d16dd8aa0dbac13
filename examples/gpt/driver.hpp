// SPDX-License-Identifier: Apache-2.0
// The gpt example's driver: trains recipe R in precision E, prints each step, and with --check
// compares the losses with everything replicated. Its instantiations are spread over a few
// translation units (gpt_dense.cpp, gpt_pp.cpp and their 16-bit twins) that compile in
// parallel; gpt.cpp parses the flags and calls them.
#pragma once
#include "data.hpp"
#if defined(GPT_HAVE_IO)
#include "checkpoint.hpp"
#endif
#include "gpt.hpp"

#include <shardlib/plan.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

namespace gpt::driver {

/// What the flags chose besides the recipe and the precision.
struct Run {
  std::string recipe;
  Config cfg;
  PipeConfig pc;
  int steps = 0;
  bool check = false, describe = false;
  DataStream data;
  int sample = 0;            ///< --sample: tokens to generate after training
  double temperature = 0.8;  ///< --temperature (0: greedy)
  int log_every = 0;         ///< --log-every (0: about 40 lines per run)
  double val_below = 0;      ///< --val-below: exit 1 unless the last validation loss is below it (0: no check)
  std::string save, resume;  ///< --save DIR, --resume DIR (gpt/checkpoint.hpp)
  int save_every = 0;        ///< --every K: a checkpoint every K steps (and after the last)
  /// --plan: when set, main_for plans the recipe on the simulate backend quietly (two steps: the
  /// first makes the optimizer's state) and writes the second step on device 0 here.
  shardlib::plan::Candidate* plan = nullptr;
  /// --backend simulate: the devices the step's time is predicted for (--gpu, --profile, --node).
  const shardlib::plan::Profile* profile = nullptr;
};

/// Device 0's last validation loss of the run (NaN: none).
inline double& last_val_loss() {
  static double v = std::numeric_limits<double>::quiet_NaN();
  return v;
}

/// Runs `run.recipe` (a recipe of docs/08, not pp*) with parameters of type E; returns the exit status.
template <class E>
int dense(shardlib::Runtime& rt, const Run& run);
/// Runs `run.recipe` (pp, pp_dp, pp_tp, pp_zero1, pp_zero2) with parameters of type E.
template <class E>
int pipelined(shardlib::Runtime& rt, const Run& run);

inline void print_stats(const char* phase, const shardlib::coll::CommStats& s) {
  std::string t = s.to_string();
  if (t.empty()) t = "none\n";
  std::size_t at = 0;
  for (bool first = true; at < t.size(); first = false) {  // one line per kind, aligned
    const std::size_t end = t.find('\n', at);
    std::printf("    %-9s%s\n", first ? phase : "", t.substr(at, end - at).c_str());
    at = end + 1;
  }
}

/// The progress of a run on device 0: a line per logged step with tokens/s since the first step
/// and the time left at that rate.
class Progress {
 public:
  Progress(int steps, std::int64_t tokens_per_step, int every) : steps_(steps), tokens_(tokens_per_step), every_(every) {}
  /// The first step of this run (a resumed one's is not 0).
  void first(int s) noexcept { first_ = s; }
  /// Whether step `s` is printed (every `every` steps, the first, the last, and evaluated ones).
  bool logged(int s, const gpt::StepReport& r) const {
    return s == first_ || s + 1 == steps_ || (s + 1) % every_ == 0 || !std::isnan(r.val_loss);
  }
  /// " 12.3k tok/s, ETA 1m05s" after step `s` (empty after the first, whose time includes warm-up).
  std::string rate(int s) {
    const auto now = std::chrono::steady_clock::now();
    if (s == first_) {
      t1_ = now;
      return "";
    }
    const double secs = std::chrono::duration<double>(now - t1_).count();
    const double per_step = secs / (s - first_), tok = static_cast<double>(tokens_) / per_step;
    const double left = per_step * (steps_ - 1 - s);
    char buf[96];
    std::snprintf(buf, sizeof buf, "  %.1fk tok/s  ETA %dm%02ds", tok / 1000, static_cast<int>(left) / 60,
                  static_cast<int>(left) % 60);
    return buf;
  }

 private:
  int steps_;
  std::int64_t tokens_;
  int every_;
  int first_ = 0;
  std::chrono::steady_clock::time_point t1_{};
};

/// What a run prints of its corpus after training: the prompt and `n` tokens the model wrote.
inline std::string as_text(const gpt::Corpus& c, const std::vector<std::int64_t>& tokens) {
  std::string out;
  for (std::int64_t t : tokens) {
    if (c.vocab() <= 256) {
      const char ch = static_cast<char>(t);
      out += (ch == '\n' || ch == '\t' || (static_cast<unsigned char>(ch) >= 32 && ch != 127)) ? ch : '?';
    } else {
      out += (out.empty() ? "" : " ") + std::to_string(t);
    }
  }
  return out;
}

/// A step's collectives by phase and its memory by role, one line each (`where`: after the memory).
template <class R>
void print_step(const gpt::StepReport& r, const char* where) {
  if constexpr (gpt::Pipelined<R>) {
    print_stats("pipeline", r.forward);
  } else {
    print_stats("forward", r.forward);
    print_stats("backward", r.backward);
  }
  print_stats("step", r.update);
  using shardlib::MemoryUsage, shardlib::MemoryRole;
  std::string held;  // (a pipeline's: the most its schedule kept at the end of an op)
  if constexpr (gpt::Pipelined<R>) held = " (" + MemoryUsage::bytes_text(r.pipeline.held_activations) + " held between ops)";
  std::printf("    memory   %s; activations at most %s%s, temporaries at most %s%s\n", r.memory.to_string().c_str(),
              MemoryUsage::bytes_text(r.memory.peak_of(MemoryRole::activations)).c_str(), held.c_str(),
              MemoryUsage::bytes_text(r.memory.peak_of(MemoryRole::temporaries)).c_str(), where);
}

/// The choices the MoE layers of `cfg` route in a step (0 without MoE layers): every other block
/// (the odd ones) routes each of the batch's tokens to top_k experts.
inline std::int64_t moe_choices(const gpt::Config& cfg) {
  return cfg.moe > 0 ? cfg.batch * cfg.seq * cfg.top_k * (cfg.layers / 2) : 0;
}

/// A step's routing by the MoE layers: the choices dropped over capacity, and the groups routed
/// (each with its own capacity).
struct MoeStep {
  std::int64_t dropped = 0, groups = 0;
};

/// Trains recipe R (E parameters) for `steps` steps and returns each step's loss; `moe`, when
/// given, gets each step's MoE routing.
template <class R, class E>
std::vector<double> run(shardlib::Context& ctx, const Run& run_, int steps, bool verbose, bool describe,
                        std::vector<MoeStep>* moe = nullptr) {
  const gpt::Config& cfg = run_.cfg;
  const gpt::PipeConfig& pc = run_.pc;
  const gpt::DataStream& data = run_.data;
  std::vector<double> losses;
  Progress progress(steps, cfg.batch * cfg.seq, run_.log_every > 0 ? run_.log_every : std::max(1, steps / 40));
  auto val_text = [](const gpt::StepReport& r) {
    char buf[32] = "";
    if (!std::isnan(r.val_loss)) std::snprintf(buf, sizeof buf, "  val %.4f", r.val_loss);
    return std::string(buf);
  };
  if (describe) {  // before training: one step of a model made for it, with the collectives counted, not performed
    gpt::StepReport dry;
    auto keep = [&](int, const gpt::StepReport& r) { dry = r; };
    if constexpr (gpt::Pipelined<R>) {
      if (ctx.device() == 0) std::printf("the schedule of every step:\n%s", pc.table().to_string().c_str());
      shardlib::coll::dry_run([&] { gpt::train_pipelined<R, E>(ctx, cfg, pc, data, 1, keep); });
      if (ctx.device() == 0)
        std::printf("the collectives of every step on device 0 (stage 0), in order (a dry run):\n%s", dry.trace.to_string().c_str());
    } else {
      shardlib::coll::dry_run([&] { gpt::train<R, E>(ctx, cfg, data, 1, keep); });
      if (ctx.device() == 0) std::printf("the collectives of every step, in order (a dry run):\n%s", dry.trace.to_string().c_str());
    }
  }
  auto sample = [&](gpt::Model<R, E>& model) {  // --sample: text the trained model writes
    if (!verbose || run_.sample <= 0 || !data.corpus()) return;
    const gpt::CorpusStream& c = *data.corpus();
    std::vector<std::int64_t> prompt(static_cast<std::size_t>(cfg.seq));
    for (std::int64_t i = 0; i < cfg.seq; ++i) prompt[static_cast<std::size_t>(i)] = c.corpus().token(c.train_tokens() + i);
    std::vector<std::int64_t> text;
    if constexpr (gpt::Pipelined<R>)
      text = gpt::generate_pipelined(model, pc, prompt, run_.sample, run_.temperature, cfg.seed);
    else
      text = gpt::generate(model, prompt, run_.sample, run_.temperature, cfg.seed);
    if (ctx.device() == 0)
      std::printf("sample (%s, after a prompt of %lld tokens from the validation part):\n--- prompt\n%s\n--- model\n%s\n---\n",
                  run_.temperature > 0 ? ("temperature " + std::to_string(run_.temperature)).c_str() : "greedy",
                  (long long)cfg.seq, as_text(c.corpus(), prompt).c_str(), as_text(c.corpus(), text).c_str());
  };
#if defined(GPT_HAVE_IO)
  gpt::CheckpointHooks<decltype(sample)> hooks{verbose ? run_.resume : "", verbose ? run_.save : "", run_.save_every, steps,
                                               sample};
#else
  struct {
    decltype(sample)& end_fn;
    int start(gpt::Model<R, E>&, shardlib::optim::AdamW&, shardlib::optim::LossScaler&) { return 0; }
    void after_step(int, gpt::Model<R, E>&, shardlib::optim::AdamW&, shardlib::optim::LossScaler&) {}
    void end(gpt::Model<R, E>& m) { end_fn(m); }
  } hooks{sample};
#endif
  bool first = true;
  auto on_step = [&](int s, const gpt::StepReport& r) {
    if (first) {
      progress.first(s);
      first = false;
      if (s > 0 && verbose && ctx.device() == 0) std::printf("resumed from %s after step %d\n", run_.resume.c_str(), s - 1);
    }
    losses.push_back(r.loss);
    if (moe) moe->push_back({r.moe_dropped, r.moe_groups});
    if (shardlib::shape_only()) {  // --backend simulate: a plan, with no values to print
      if (!verbose || s + 1 != steps) return;
      std::printf("plan of step %d on device %d of %d (simulated: shapes only, no values, nothing moved)\n", s,
                  ctx.device(), ctx.num_devices());
      print_step<R>(r, "");
      std::printf("    compute  %.4g TFLOP in %llu GEMMs of %llu products (2 M N K each; %.4g TFLOP in batches), %s in %llu "
                  "other kernels\n",
                  r.work.gemm_flops * 1e-12, (unsigned long long)r.work.gemm_calls, (unsigned long long)r.work.gemm_products,
                  r.work.batched_gemm_flops * 1e-12,
                  shardlib::coll::bytes_text(r.work.kernel_bytes).c_str(), (unsigned long long)r.work.kernel_calls);
      if (const shardlib::plan::Profile* p = run_.profile) {
        const shardlib::plan::StepTime t = shardlib::plan::predict(r.work, *p);
        std::printf("    time     on %s devices, %d to a node: %s; %.4g tokens/s\n", p->name.c_str(), p->node_size,
                    shardlib::plan::breakdown(t).c_str(), static_cast<double>(cfg.batch * cfg.seq) / t.total());
      }
      return;
    }
    if (verbose && ctx.device() == 0 && !std::isnan(r.val_loss)) last_val_loss() = r.val_loss;
    if (!verbose || ctx.device() != 0) return;
    const std::string rate = progress.rate(s);
    if (!progress.logged(s, r)) return;
    char idle[48] = "";
    if constexpr (gpt::Pipelined<R>) std::snprintf(idle, sizeof idle, "  stage 0 idle %.1f%%", 100 * r.pipeline.idle_fraction());
    char drops[64] = "";
    if (cfg.moe > 0)
      std::snprintf(drops, sizeof drops, "  dropped %lld of %lld choices", (long long)r.moe_dropped,
                    (long long)moe_choices(cfg));
    std::printf("step %3d/%d  loss %.6f%s  grad norm %.4f%s%s%s%s\n", s, steps, r.loss, val_text(r).c_str(), r.grad_norm,
                drops, idle, rate.c_str(), r.skipped ? "  (skipped: the f16 gradients overflowed; loss scale halved)" : "");
    if (s == 0 || s == steps - 1) print_step<R>(r, " (device 0)");
  };
  if constexpr (gpt::Pipelined<R>)
    gpt::train_pipelined<R, E>(ctx, cfg, pc, data, steps, on_step, hooks);
  else
    gpt::train<R, E>(ctx, cfg, data, steps, on_step, hooks);
  return losses;
}

template <class R, class E>
int main_for(shardlib::Runtime& rt, const Run& run_) {
  const std::string& recipe = run_.recipe;
  const gpt::Config& cfg = run_.cfg;
  const gpt::PipeConfig& pc = run_.pc;
  const int steps = run_.steps;
  const bool check = run_.check, describe = run_.describe;
  int status = 0;
  if (shardlib::plan::Candidate* c = run_.plan) {  // --plan: one candidate of the table, quietly
    rt.spmd([&](shardlib::Context& ctx) {
      gpt::StepReport last;
      auto keep = [&](int, const gpt::StepReport& r) { last = r; };
      c->device = ctx.device();
      if constexpr (gpt::Pipelined<R>) {
        c->mesh = R::mesh(ctx, pc.stages, cfg.tp).shape().to_string();
        gpt::train_pipelined<R, E>(ctx, cfg, pc, run_.data, 2, keep);
      } else {
        c->mesh = gpt::mesh_of<R>(ctx, cfg).shape().to_string();
        gpt::train<R, E>(ctx, cfg, run_.data, 2, keep);
      }
      c->memory = last.memory;
      c->comm = last.trace.totals;
      c->work = last.work;
    });
    return 0;
  }
  rt.spmd([&](shardlib::Context& ctx) {
    if (ctx.device() == rt.first_local_device())
      std::printf("recipe %s, %s parameters, on %d devices (%s): %lld layers, D %lld, %lld heads, FF %lld, V %lld, S %lld, B %lld\n",
                  recipe.c_str(), shardlib::element_name<E>(), ctx.num_devices(), std::string(shardlib::to_string(rt.backend())).c_str(), (long long)cfg.layers, (long long)cfg.dim,
                  (long long)cfg.heads, (long long)cfg.ff, (long long)cfg.vocab, (long long)cfg.seq,
                  (long long)cfg.batch);
    if (ctx.device() == rt.first_local_device()) {
      if (const gpt::CorpusStream* c = run_.data.corpus())
        std::printf("data: %s: %lld tokens, %lld to train on, %lld to validate\n", c->corpus().description().c_str(),
                    (long long)c->corpus().size(), (long long)c->train_tokens(), (long long)c->val_tokens());
      else
        std::printf("data: the synthetic token stream (--data synthetic)\n");
    }
    if constexpr (gpt::Pipelined<R>)
      if (ctx.device() == 0)
        std::printf("pipeline: %d stages, %d micro-batches of %lld sequences, schedule %s%s%s\n", pc.stages, pc.microbatches,
                    (long long)(cfg.batch / pc.microbatches), std::string(shardlib::pipeline::to_string(pc.schedule)).c_str(),
                    pc.chunks > 1 ? (", " + std::to_string(pc.chunks) + " chunks per stage").c_str() : "",
                    pc.recompute ? ", recomputed" : "");
    std::vector<MoeStep> got_moe, want_moe;
    const std::vector<double> got = run<R, E>(ctx, run_, steps, true, describe, &got_moe);
    if (ctx.device() == 0 && run_.val_below > 0) {  // --val-below: the run's own check
      const double v = last_val_loss();
      const bool ok = v < run_.val_below;
      std::printf("validation loss %.4f %s %.4f (--val-below)\n", v, ok ? "<" : "is not below", run_.val_below);
      if (!ok) status = 1;
    }
    if (!check) return;
    const std::vector<double> want = run<gpt::Replicated, E>(ctx, run_, steps, false, false, &want_moe);
    // A step whose MoE layers dropped choices over capacity differs by design where the split run
    // routes in several groups (experts over "data": each device's tokens a group with its own
    // capacity) and the replicated run in one (docs/15). Those steps are not compared; where the
    // split run routes in one group too (tp), both drop the same choices.
    double worst = 0;
    int compared = 0;
    std::int64_t split_drops = 0, one_drops = 0;
    for (int s = 0; s < steps; ++s) {
      split_drops += got_moe[s].dropped, one_drops += want_moe[s].dropped;
      if (got_moe[s].groups > 1 && (got_moe[s].dropped || want_moe[s].dropped)) continue;
      ++compared;
      worst = std::max(worst, std::abs(got[s] - want[s]) / std::abs(want[s]));
    }
    if (ctx.device() == 0) {
      const double tolerance = std::is_same_v<E, float> ? 1e-4 : 1e-2;
      if (compared == steps) {
        std::printf("largest relative difference from one device's losses: %.3g\n", worst);
      } else {
        std::printf("the MoE layers dropped choices over capacity in %d of %d steps (%lld choices here, %lld in the "
                    "replicated run): this run routes each of its %lld groups' tokens with its own capacity, the "
                    "replicated run all of them as one group, so those steps' losses differ by design "
                    "(docs/15_experts.md); --capacity-factor %lld (experts / top-k) or more drops none\n",
                    steps - compared, steps, (long long)split_drops, (long long)one_drops,
                    (long long)got_moe.front().groups, (long long)((cfg.moe + cfg.top_k - 1) / cfg.top_k));
        if (compared > 0)
          std::printf("largest relative difference from one device's losses over the %d steps without drops: %.3g\n",
                      compared, worst);
        else
          std::printf("check failed: no step without drops to compare\n");
      }
      if (compared == 0 || !(worst <= tolerance)) status = 1;
    }
  });
  return status;
}

}  // namespace gpt::driver
