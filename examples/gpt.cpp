// SPDX-License-Identifier: Apache-2.0
// Trains a small GPT-style language model with one of the recipes of docs/08_training.md and
// prints, per step, the loss, the collectives of the forward, backward and optimizer step (from
// the counters) and the per-device memory of parameters, gradients and optimizer state.
//
//   gpt [--recipe dp|zero1|zero2|zero3|tp|dp_tp|replicated] [--devices N] [--steps N]
//       [--layers N] [--dim N] [--batch N] [--seq N] [--vocab N] [--heads N] [--ff N]
//       [--precision f32|bf16|f16]  parameters and gradients in 16 bits with float32 master
//                     weights and state (mixed precision; f16 with dynamic loss scaling)
//       [--check 1]   also train on everything replicated (one device's computation) and exit
//                     non-zero when a step's loss differs by more than 1e-4 relative (1e-2 in
//                     16 bits: gradients are rounded before their reduction)
//       [--describe 1] before training, print the collectives of a step in order, with group and
//                     bytes, from a dry run (coll::dry_run) of one step on a model made for it (every
//                     step emits the same: they follow from types, shapes and mesh)
//
// Under mpirun each rank is a device: mpirun -np 4 gpt --recipe zero2
#include "common.hpp"
#include "gpt/gpt.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

void print_stats(const char* phase, const shardlib::coll::CommStats& s) {
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
std::vector<double> run(shardlib::Context& ctx, const gpt::Config& cfg, int steps, bool verbose, bool describe) {
  std::vector<double> losses;
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

template <class R, class E>
int main_for(shardlib::Runtime& rt, const gpt::Config& cfg, int steps, bool check, bool describe) {
  int status = 0;
  rt.spmd([&](shardlib::Context& ctx) {
    if (ctx.device() == 0)
      std::printf("recipe %s, %s parameters, on %d devices (%s): %lld layers, D %lld, %lld heads, FF %lld, V %lld, S %lld, B %lld\n",
                  R::name, shardlib::element_name<E>(), ctx.num_devices(), std::string(shardlib::to_string(rt.backend())).c_str(), (long long)cfg.layers, (long long)cfg.dim,
                  (long long)cfg.heads, (long long)cfg.ff, (long long)cfg.vocab, (long long)cfg.seq,
                  (long long)cfg.batch);
    const std::vector<double> got = run<R, E>(ctx, cfg, steps, true, describe);
    if (!check) return;
    const std::vector<double> want = run<gpt::Replicated, E>(ctx, cfg, steps, false, false);
    double worst = 0;
    for (int s = 0; s < steps; ++s) worst = std::max(worst, std::abs(got[s] - want[s]) / std::abs(want[s]));
    if (ctx.device() == 0) {
      std::printf("largest relative difference from one device's losses: %.3g\n", worst);
      if (!(worst <= (std::is_same_v<E, float> ? 1e-4 : 1e-2))) status = 1;
    }
  });
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto rt = shardlib::Runtime::from_args(argc, argv, 4);
    gpt::Config cfg;
    cfg.layers = example::arg(argc, argv, "--layers", cfg.layers);
    cfg.dim = example::arg(argc, argv, "--dim", cfg.dim);
    cfg.heads = example::arg(argc, argv, "--heads", cfg.heads);
    cfg.ff = example::arg(argc, argv, "--ff", cfg.ff);
    cfg.vocab = example::arg(argc, argv, "--vocab", cfg.vocab);
    cfg.seq = example::arg(argc, argv, "--seq", cfg.seq);
    cfg.batch = example::arg(argc, argv, "--batch", cfg.batch);
    const int steps = static_cast<int>(example::arg(argc, argv, "--steps", 20));
    const bool check = example::arg(argc, argv, "--check", 0) != 0;
    const bool describe = example::arg(argc, argv, "--describe", 0) != 0;
    const std::string recipe = example::arg_text(argc, argv, "--recipe", "dp");
    if (cfg.dim % cfg.heads != 0)
      throw std::invalid_argument("--dim " + std::to_string(cfg.dim) + " is not a multiple of --heads " +
                                  std::to_string(cfg.heads));
    const std::string precision = example::arg_text(argc, argv, "--precision", "f32");
    if (precision != "f32" && precision != "bf16" && precision != "f16")
      throw std::invalid_argument("unknown --precision '" + precision + "' (f32, bf16, f16)");
    auto with = [&]<class R>(std::type_identity<R>) {
      if (precision == "bf16") return main_for<R, shardlib::bf16>(rt, cfg, steps, check, describe);
      if (precision == "f16") return main_for<R, shardlib::f16>(rt, cfg, steps, check, describe);
      return main_for<R, float>(rt, cfg, steps, check, describe);
    };
    if (recipe == "dp") return with(std::type_identity<gpt::DP>{});
    if (recipe == "zero1") return with(std::type_identity<gpt::Zero1>{});
    if (recipe == "zero2") return with(std::type_identity<gpt::Zero2>{});
    if (recipe == "zero3") return with(std::type_identity<gpt::Zero3>{});
    if (recipe == "tp") return with(std::type_identity<gpt::TP>{});
    if (recipe == "dp_tp") return with(std::type_identity<gpt::DPxTP>{});
    if (recipe == "replicated") return with(std::type_identity<gpt::Replicated>{});
    throw std::invalid_argument("unknown --recipe '" + recipe + "' (dp, zero1, zero2, zero3, tp, dp_tp, replicated)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: %s\n", e.what());
    return 1;
  }
}
