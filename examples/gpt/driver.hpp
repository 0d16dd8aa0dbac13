// SPDX-License-Identifier: Apache-2.0
// The gpt example's driver: trains recipe R in precision E, prints each step, and with --check
// compares the losses with everything replicated. Its instantiations are spread over a few
// translation units (gpt_dense.cpp, gpt_pp.cpp and their 16-bit twins) that compile in
// parallel; gpt.cpp parses the flags and calls them.
#pragma once
#include "gpt.hpp"

#include <algorithm>
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
};

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

template <class R, class E>
std::vector<double> run(shardlib::Context& ctx, const gpt::Config& cfg, const gpt::PipeConfig& pc, int steps, bool verbose,
                        bool describe) {
  std::vector<double> losses;
  if constexpr (gpt::Pipelined<R>) {
    if (describe) {  // the schedule, and device 0's collectives of one step of a model made for it (a dry run)
      if (ctx.device() == 0) std::printf("the schedule of every step:\n%s", pc.table().to_string().c_str());
      gpt::StepReport dry;
      shardlib::coll::dry_run([&] { gpt::train_pipelined<R, E>(ctx, cfg, pc, 1, [&](int, const gpt::StepReport& r) { dry = r; }); });
      if (ctx.device() == 0)
        std::printf("the collectives of every step on device 0 (stage 0), in order (a dry run):\n%s", dry.trace.to_string().c_str());
    }
    gpt::train_pipelined<R, E>(ctx, cfg, pc, steps, [&](int s, const gpt::StepReport& r) {
      losses.push_back(r.loss);
      if (!verbose || ctx.device() != 0) return;
      std::printf("step %3d  loss %.6f  grad norm %.4f  stage 0 idle %.1f%%%s\n", s, r.loss, r.grad_norm,
                  100 * r.pipeline.idle_fraction(),
                  r.skipped ? "  (skipped: the f16 gradients overflowed; loss scale halved)" : "");
      if (s == 0 || s == steps - 1) {
        print_stats("pipeline", r.forward);
        print_stats("step", r.update);
        std::printf("    memory   %s (device 0)\n", r.memory.to_string().c_str());
      }
    });
    return losses;
  } else {
  if (describe) {  // before training: one step of a model made for it, with the collectives counted, not performed
    gpt::StepReport dry;
    shardlib::coll::dry_run([&] { gpt::train<R, E>(ctx, cfg, 1, [&](int, const gpt::StepReport& r) { dry = r; }); });
    if (ctx.device() == 0) std::printf("the collectives of every step, in order (a dry run):\n%s", dry.trace.to_string().c_str());
  }
  gpt::train<R, E>(ctx, cfg, steps, [&](int s, const gpt::StepReport& r) {
    losses.push_back(r.loss);
    if (!verbose || ctx.device() != 0) return;
    std::printf("step %3d  loss %.6f  grad norm %.4f%s\n", s, r.loss, r.grad_norm,
                r.skipped ? "  (skipped: the f16 gradients overflowed; loss scale halved)" : "");
    if (s == 0 || s == steps - 1) {
      print_stats("forward", r.forward);
      print_stats("backward", r.backward);
      print_stats("step", r.update);
      std::printf("    memory   %s (device 0)\n", r.memory.to_string().c_str());
    }
  });
  return losses;
  }
}

template <class R, class E>
int main_for(shardlib::Runtime& rt, const Run& run_) {
  const std::string& recipe = run_.recipe;
  const gpt::Config& cfg = run_.cfg;
  const gpt::PipeConfig& pc = run_.pc;
  const int steps = run_.steps;
  const bool check = run_.check, describe = run_.describe;
  int status = 0;
  rt.spmd([&](shardlib::Context& ctx) {
    if (ctx.device() == 0)
      std::printf("recipe %s, %s parameters, on %d devices (%s): %lld layers, D %lld, %lld heads, FF %lld, V %lld, S %lld, B %lld\n",
                  recipe.c_str(), shardlib::element_name<E>(), ctx.num_devices(), std::string(shardlib::to_string(rt.backend())).c_str(), (long long)cfg.layers, (long long)cfg.dim,
                  (long long)cfg.heads, (long long)cfg.ff, (long long)cfg.vocab, (long long)cfg.seq,
                  (long long)cfg.batch);
    if constexpr (gpt::Pipelined<R>)
      if (ctx.device() == 0)
        std::printf("pipeline: %d stages, %d micro-batches of %lld sequences, schedule %s%s%s\n", pc.stages, pc.microbatches,
                    (long long)(cfg.batch / pc.microbatches), std::string(shardlib::pipeline::to_string(pc.schedule)).c_str(),
                    pc.chunks > 1 ? (", " + std::to_string(pc.chunks) + " chunks per stage").c_str() : "",
                    pc.recompute ? ", recomputed" : "");
    const std::vector<double> got = run<R, E>(ctx, cfg, pc, steps, true, describe);
    if (!check) return;
    const std::vector<double> want = run<gpt::Replicated, E>(ctx, cfg, pc, steps, false, false);
    double worst = 0;
    for (int s = 0; s < steps; ++s) worst = std::max(worst, std::abs(got[s] - want[s]) / std::abs(want[s]));
    if (ctx.device() == 0) {
      std::printf("largest relative difference from one device's losses: %.3g\n", worst);
      if (!(worst <= (std::is_same_v<E, float> ? 1e-4 : 1e-2))) status = 1;
    }
  });
  return status;
}

}  // namespace gpt::driver
