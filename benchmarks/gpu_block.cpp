// SPDX-License-Identifier: Apache-2.0
// GPU benchmark: a transformer layer's training step (forward + backward) on one GPU, beside
// PyTorch running the same layer on the same GPU (benchmarks/peers/block_torch.py; the two are run
// by scripts/gpu-check.sh and `benchmarks/run gpu`). One JSON record per case on stdout, progress
// on stderr.
//
//   bench_gpu_block [--devices N] [--config gpt2|large|small] [--dtype bf16|f32|tf32] [--quick]
//                   [--profile-step] [--host] [--plan NAME|FILE|none]
//
// The layer (pre-LN, as GPT-2's): x [B, S, D]; a = layer_norm(x) g1 + b1; q, k, v = a Wq, a Wk,
// a Wv ([D, H, K] each: [B, S, H, K]); o = attention(q, k, v, causal) (cuDNN's fused kernel in
// bf16 where it loads); x1 = x + o Wo; h = layer_norm(x1) g2 + b2; y = x1 + gelu(h W1) W2. On N
// virtual devices on the one GPU, tensor parallel over "model" (heads and F split, Megatron's two
// all_reduces), the batch over "data" when N has a factor left. Parameters are Params (the step's
// backward gives every one its gradient); the step is one forward and one backward seeded with a
// fixed dy (as PyTorch's y.backward(dy)), gradients zeroed before it.
//
// Records (part "block"): name "<config> fwd+bwd" and "<config> fwd", dtype, devices, seconds
// (median over 7 batches of back-to-back steps, each batch fenced), tflops (the layer's matrix
// products and attention, causal attention counted at half its full product's flops), the
// attention kernel that ran (and why not the fused one), and per step in steady state the block
// cache's allocations and frees from the GPU's memory and the waits for the GPU stream (goal: 0).
// The baseline is PyTorch's eager step on the same shapes (block_torch.py: "torch-eager" with a
// mask, and "torch-compile" with scaled_dot_product_attention), joined by the report and the
// gpu-check summary.
//
// --plan (issue 44, planning): on 1 device each record also has the cost model's prediction
// (docs/16): the same step run again on shapes alone (device 0 of a simulated run of 1), its work
// ("work": GEMM FLOPs, cuDNN's fused products included, and the other kernels' calls and bytes)
// and plan::predict's time on the profile ("predicted_seconds", "prediction_ratio" = predicted /
// measured, "predicted": its parts, "profile"): a preset (h100, h200, a100) or a file of
// `benchmarks/run calibrate`. By default, on a GPU, the preset of its name (H100, H200), none on
// others and on host memory. The presets' GEMM rate is bf16's: with one, float32 records carry
// their work but no prediction.
//
// --profile-step: one step alone between cudaProfilerStart and cudaProfilerStop, with its fenced
// wall time as a {"part": "profile"} record (what scripts/gpu-check.sh --profile hands to ncu).
// --host runs on host memory (CI keeps the program compiling and running; its figures are no GPU
// figures).
#include <shardlib/attention.hpp>
#include <shardlib/plan.hpp>
#include <shardlib/shardlib.hpp>

#include "gpu_common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {

using gpubench::batch_seconds;
using gpubench::fence;
using gpubench::Mem;
using gpubench::num;
using gpubench::on_gpu;
using gpubench::record;
using gpubench::say;
using MD = sl::Mesh<"data", "model">;

/// Whether float products take TF32 (cuBLAS's; never on host memory).
bool tf32() {
#if defined(KOKKOS_ENABLE_CUDA)
  return sl::kernels::tf32_allowed();
#else
  return false;
#endif
}

struct Config {
  const char* name;
  std::int64_t b, s, d, h, k, f;
};
Config config_named(const std::string& n) {
  if (n == "gpt2") return {"gpt2", 8, 1024, 768, 12, 64, 3072};
  if (n == "large") return {"large", 4, 2048, 2048, 16, 128, 8192};
  if (n == "small") return {"small", 2, 128, 256, 4, 64, 1024};
  throw std::invalid_argument("--config is gpt2, large or small, not '" + n + "'");
}

/// The layer's parameters and its step, in element type E (see the file comment).
template <class E>
struct Layer {
  template <class S>
  using P = sl::Param<sl::DistributedTensor<E, MD, S, Mem>>;
  template <class S>
  using Ten = sl::DistributedTensor<E, MD, S, Mem>;
  using Act = sl::Spec<"data", none, none>;
  using Vec = sl::Spec<none>;
  Config c;
  P<Vec> g1, b1, g2, b2;
  P<sl::Spec<none, "model", none>> wq, wk, wv;
  P<sl::Spec<"model", none, none>> wo;
  P<sl::Spec<none, "model">> w1;
  P<sl::Spec<"model", none>> w2;
  Ten<Act> x, dy;

  template <class S, std::size_t N>
  static P<S> init(const MD& mesh, const std::int64_t (&shape)[N], std::uint64_t seed, float amp) {
    return P<S>(Ten<S>::random(mesh, shape, seed, E(-amp), E(amp)));
  }
  Layer(const MD& m, const Config& cfg)
      : c(cfg),
        g1(P<Vec>(Ten<Vec>::full(m, {cfg.d}, E(1.0f)))), b1(P<Vec>(Ten<Vec>::zeros(m, {cfg.d}))),
        g2(P<Vec>(Ten<Vec>::full(m, {cfg.d}, E(1.0f)))), b2(P<Vec>(Ten<Vec>::zeros(m, {cfg.d}))),
        wq(init<sl::Spec<none, "model", none>>(m, {cfg.d, cfg.h, cfg.k}, 1, 0.02f)),
        wk(init<sl::Spec<none, "model", none>>(m, {cfg.d, cfg.h, cfg.k}, 2, 0.02f)),
        wv(init<sl::Spec<none, "model", none>>(m, {cfg.d, cfg.h, cfg.k}, 3, 0.02f)),
        wo(init<sl::Spec<"model", none, none>>(m, {cfg.h, cfg.k, cfg.d}, 4, 0.02f)),
        w1(init<sl::Spec<none, "model">>(m, {cfg.d, cfg.f}, 5, 0.02f)),
        w2(init<sl::Spec<"model", none>>(m, {cfg.f, cfg.d}, 6, 0.02f)),
        x(Ten<Act>::random(m, {cfg.b, cfg.s, cfg.d}, 7, E(-1.0f), E(1.0f))),
        dy(Ten<Act>::random(m, {cfg.b, cfg.s, cfg.d}, 8, E(-1.0f), E(1.0f))) {}

  auto forward() const {
    auto a = sl::layer_norm<2>(x) * g1 + b1;
    auto q = sl::einsum<"bsd,dhk->bshk">(a, wq);
    auto k = sl::einsum<"bsd,dhk->bshk">(a, wk);
    auto v = sl::einsum<"bsd,dhk->bshk">(a, wv);
    auto x1 = x + sl::reshard<Act>(sl::einsum<"bqhk,hkd->bqd">(sl::attention(q, k, v, {.causal = true}), wo));
    auto h = sl::layer_norm<2>(x1) * g2 + b2;
    return x1 + sl::reshard<Act>(sl::einsum<"bsf,fd->bsd">(sl::gelu(sl::einsum<"bsd,df->bsf">(h, w1)), w2));
  }
  void zero_grad() {
    for (auto* p : {&g1, &b1, &g2, &b2}) p->zero_grad();
    for (auto* p : {&wq, &wk, &wv}) p->zero_grad();
    wo.zero_grad(), w1.zero_grad(), w2.zero_grad();
  }
  void step() {
    zero_grad();
    sl::backward(forward(), dy);
  }
  /// The step's floating-point operations: 2 m n k per product, forward 1x, backward 2x; causal
  /// attention at half the flops of its two full products.
  double flops(bool backward) const {
    const double t = double(c.b) * c.s, hk = double(c.h) * c.k;
    const double fwd = 2 * t * c.d * hk * 3 + 2 * t * hk * c.d + 2 * 2 * t * c.d * c.f + 2 * 2 * double(c.b) * c.h * c.s * c.s * c.k / 2;
    return backward ? 3 * fwd : fwd;
  }
};

/// The cost model's side of a record (--plan): the step's work on shapes alone, fwd+bwd and fwd,
/// and the profile that turns it into time (none: the work alone).
struct Plan {
  sl::plan::Work work[2];  // [0]: fwd, [1]: fwd+bwd
  std::string attention;   // the kernel the planned step's attention took (as the measured one's)
  std::optional<sl::plan::Profile> profile;
};

/// The layer's step planned on shapes alone, as device 0 of a simulated run of 1 (see the file
/// comment): after a first step (as the measured steps are), the work of one fwd+bwd and one fwd.
template <class E>
Plan plan_block(const Config& cfg, std::optional<sl::plan::Profile> profile) {
  Plan out;
  out.profile = std::move(profile);
  sl::Runtime::simulate(1, 0).spmd([&](sl::Context& ctx) {
    const MD mesh(ctx, {1, 1});
    Layer<E> layer(mesh, cfg);
    layer.step();
    for (const bool backward : {true, false}) {
      const sl::kernels::FlopCount f0 = sl::kernels::flop_count();
      sl::coll::CommRecorder calls(sl::coll::keep_calls);
      if (backward) {
        layer.step();
      } else {
        auto y = layer.forward().value();
      }
      out.work[backward ? 1 : 0] = sl::plan::work_since(f0, calls);
    }
    out.attention = sl::attention_stats(ctx).fused_forward > 0 ? "cudnn fused" : "unfused ops";
  });
  return out;
}

/// The record's fields of `plan` for a step measured at `seconds` (see the file comment).
std::string plan_fields(const Plan& plan, bool backward, double seconds) {
  const sl::plan::Work& w = plan.work[backward ? 1 : 0];
  std::string s = ", \"work\": {\"gemm_flops\": " + num(double(w.gemm_flops)) + ", \"gemm_calls\": " + num(double(w.gemm_calls)) +
                  ", \"kernel_bytes\": " + num(double(w.kernel_bytes)) + ", \"kernel_calls\": " + num(double(w.kernel_calls)) +
                  ", \"collective_calls\": " + num(double(w.calls.size())) + ", \"attention_kernel\": \"" + plan.attention +
                  "\"}";
  if (!plan.profile) return s;
  const sl::plan::StepTime t = sl::plan::predict(w, *plan.profile);
  return s + ", \"profile\": \"" + plan.profile->name + "\", \"predicted_seconds\": " + num(t.total()) +
         ", \"prediction_ratio\": " + num(t.total() / seconds) + ", \"predicted\": {\"gemm\": " + num(t.gemm) +
         ", \"kernels\": " + num(t.kernels) + ", \"communication\": " + num(t.communication()) + "}";
}

template <class E>
void run_block(sl::Context& ctx, const Config& cfg, bool quick, bool profile, const Plan* plan) {
  const int n = ctx.num_devices();
  const MD mesh(ctx, {1, n});  // tensor parallel over the one GPU's virtual devices
  Layer<E> layer(mesh, cfg);
  const char* dtype = std::is_same_v<E, float> ? (tf32() ? "float32+tf32" : "float32") : "bf16";
  auto fwd_bwd = [&] { layer.step(); };
  auto fwd = [&] { auto y = layer.forward().value(); };
  for (int i = 0; i < 3; ++i) fwd_bwd();  // cuDNN's graphs, the block cache's blocks
  fence(ctx);
  if (profile) {
    gpubench::profile_step(ctx, std::string("block ") + cfg.name + " " + dtype + " fwd+bwd", fwd_bwd);
    return;
  }
  // Steady state: what two steps ask of the GPU's memory and how often they wait for it.
  const sl::BlockCacheStats c0 = sl::block_cache_stats<Mem>(ctx);
  const sl::kernels::SyncCount s0 = sl::kernels::sync_count();
  fwd_bwd();
  fwd_bwd();
  fence(ctx);  // (not counted below: the benchmark's own)
  const sl::BlockCacheStats c1 = sl::block_cache_stats<Mem>(ctx);
  const std::uint64_t waits = sl::kernels::sync_count().device - s0.device - (on_gpu ? 1 : 0);
  const double allocs = double(c1.space_allocations - c0.space_allocations) / 2, frees = double(c1.space_frees - c0.space_frees) / 2;
  const auto& st = sl::attention_stats(ctx);
  const std::string kernel = st.fused_forward > 0 ? "cudnn fused" : "unfused ops";
  for (const bool backward : {true, false}) {
    std::function<void()> g = backward ? std::function<void()>(fwd_bwd) : std::function<void()>(fwd);
    const double one = batch_seconds(ctx, g, 1);
    const int iters = quick ? 1 : std::clamp(static_cast<int>(0.2 / std::max(one, 1e-6)), 2, 50);
    std::vector<double> t;
    for (int r = 0; r < (quick ? 2 : 7); ++r) t.push_back(batch_seconds(ctx, g, iters));
    const double secs = bench::median(t), tflops = layer.flops(backward) / secs * 1e-12;
    const std::string name = std::string(cfg.name) + (backward ? " fwd+bwd" : " fwd");
    record(ctx, "\"part\": \"block\", \"name\": \"" + name + "\", \"dtype\": \"" + dtype + "\", \"mesh\": \"" + mesh.to_string() +
                    "\", \"shape\": \"B" + std::to_string(cfg.b) + " S" + std::to_string(cfg.s) + " D" + std::to_string(cfg.d) +
                    " H" + std::to_string(cfg.h) + " K" + std::to_string(cfg.k) + " F" + std::to_string(cfg.f) +
                    "\", \"seconds\": " + num(secs) + ", \"tflops\": " + num(tflops) + ", \"attention_kernel\": \"" + kernel +
                    "\", \"attention_fallback\": \"" + st.fallback + "\", \"allocations_per_step\": " + num(allocs) +
                    ", \"frees_per_step\": " + num(frees) + ", \"waits_per_step\": " + num(double(waits) / 2) +
                    (plan ? plan_fields(*plan, backward, secs) : std::string()) +
                    ", \"baseline\": \"torch\", \"baseline_seconds\": null");
    say(ctx, "block " + name + " " + dtype + " on " + mesh.to_string() + ": " + num(secs * 1e3) + " ms, " + num(tflops) +
                 " TFLOP/s; attention: " + kernel + (st.fallback.empty() ? "" : " (" + st.fallback + ")") +
                 "; per step " + num(allocs) + " allocations, " + num(frees) + " frees, " + num(double(waits) / 2) + " waits");
    if (plan && plan->profile) {
      const double p = sl::plan::predict(plan->work[backward ? 1 : 0], *plan->profile).total();
      say(ctx, "  the cost model on " + plan->profile->name + ": " + num(p * 1e3) + " ms predicted, " + num(p / secs) +
                   " of the measured");
    }
  }
}

using bench::has_flag;
using bench::text_arg;

/// --plan's profile (see the file comment): `arg` a preset, a file or "none"; "" the default.
/// `preset` says whether it is one (then only bf16 steps are predicted).
std::optional<sl::plan::Profile> plan_profile(const std::string& arg, bool& preset) {
  preset = false;
  if (arg == "none") return std::nullopt;
  std::string name = arg;
  if (arg.empty()) {
    if (!on_gpu) return std::nullopt;
    const std::string gpu = gpubench::gpu_name();
    name = gpu.find("H200") != std::string::npos ? "h200" : gpu.find("H100") != std::string::npos ? "h100" : "";
    if (name.empty()) {
      std::fprintf(stderr, "bench_gpu_block: no device profile for '%s': the records have the step's work, no "
                           "prediction (--plan NAME|FILE gives one)\n", gpu.c_str());
      return std::nullopt;
    }
  }
  const auto presets = sl::plan::Profile::presets();
  if (std::find(presets.begin(), presets.end(), name) != presets.end()) {
    preset = true;
    return sl::plan::Profile::preset(name);
  }
  try {
    return sl::plan::Profile::load(name);
  } catch (const std::exception& e) {
    std::string known;
    for (const auto& n : presets) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("--plan is a preset (" + known + "), a profile file or none: " + e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
    bench::check_args(argc, argv,
                      {{"--config", bench::Takes::word, "gpt2|large|small"},
                       {"--dtype", bench::Takes::word, "bf16|f32|tf32"},
                       {"--plan", bench::Takes::word},
                       {"--quick"},
                       {"--profile-step"},
                       {"--host"}});
    if (!on_gpu && !has_flag(argc, argv, "--host")) {
      std::fprintf(stderr, "bench_gpu_block: this build has no CUDA-enabled Kokkos (--host runs it on host memory)\n");
      return 77;
    }
    const Config cfg = config_named(text_arg(argc, argv, "--config", on_gpu ? "gpt2" : "small"));
    const std::string dtype = text_arg(argc, argv, "--dtype", "bf16");
    const bool quick = has_flag(argc, argv, "--quick"), profile = has_flag(argc, argv, "--profile-step");
#if defined(KOKKOS_ENABLE_CUDA)
    if (dtype == "tf32") sl::kernels::set_allow_tf32(true);
#endif
    auto rt = sl::Runtime::from_args(argc, argv, 1);
    bool preset = false;
    auto chosen = plan_profile(text_arg(argc, argv, "--plan", ""), preset);
    if (preset && dtype != "bf16") chosen.reset();  // (the presets' GEMM rate is bf16's)
    std::optional<Plan> plan;  // 1 device: virtual devices share the GPU, which a profile does not model
    if (rt.num_devices() == 1 && !profile)
      plan = dtype == "bf16" ? plan_block<sl::bf16>(cfg, chosen) : plan_block<float>(cfg, chosen);
    rt.spmd([&](sl::Context& ctx) {
      const Plan* p = plan ? &*plan : nullptr;
      if (dtype == "bf16") run_block<sl::bf16>(ctx, cfg, quick, profile, p);
      else run_block<float>(ctx, cfg, quick, profile, p);
    });
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_block: %s\n", e.what());
    return 1;
  }
}
