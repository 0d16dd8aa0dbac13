// SPDX-License-Identifier: Apache-2.0
// GPU benchmark: a transformer layer's training step (forward + backward) on one GPU, beside
// PyTorch running the same layer on the same GPU (benchmarks/peers/block_torch.py; the two are run
// by scripts/gpu-check.sh and `benchmarks/run gpu`). One JSON record per case on stdout, progress
// on stderr.
//
//   bench_gpu_block [--devices N] [--config gpt2|large|small] [--dtype bf16|f32] [--quick]
//                   [--profile-step] [--host]
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
// --profile-step: one step alone between cudaProfilerStart and cudaProfilerStop, with its fenced
// wall time as a {"part": "profile"} record (what scripts/gpu-check.sh --profile hands to ncu).
// --host runs on host memory (CI keeps the program compiling and running; its figures are no GPU
// figures).
#include <shardlib/attention.hpp>
#include <shardlib/shardlib.hpp>

#include "gpu_common.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
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
  throw std::invalid_argument("bench_gpu_block: --config is gpt2, large or small, not '" + n + "'");
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

template <class E>
void run_block(sl::Context& ctx, const Config& cfg, bool quick, bool profile) {
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
                    ", \"baseline\": \"torch\", \"baseline_seconds\": null");
    say(ctx, "block " + name + " " + dtype + " on " + mesh.to_string() + ": " + num(secs * 1e3) + " ms, " + num(tflops) +
                 " TFLOP/s; attention: " + kernel + (st.fallback.empty() ? "" : " (" + st.fallback + ")") +
                 "; per step " + num(allocs) + " allocations, " + num(frees) + " frees, " + num(double(waits) / 2) + " waits");
  }
}

using gpubench::has_flag;
using gpubench::text_arg;

}  // namespace

int main(int argc, char** argv) {
  try {
    if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const bool value = a == "--devices" || a == "--config" || a == "--dtype" || a == "--backend";
      const bool flag = a == "--quick" || a == "--profile-step" || a == "--host";
      if (!value && !flag) throw std::invalid_argument("bench_gpu_block: unknown argument '" + a + "'");
      if (value && ++i >= argc) throw std::invalid_argument("bench_gpu_block: " + a + " needs a value");
    }
    if (!on_gpu && !has_flag(argc, argv, "--host")) {
      std::fprintf(stderr, "bench_gpu_block: this build has no CUDA-enabled Kokkos (--host runs it on host memory)\n");
      return 77;
    }
    const Config cfg = config_named(text_arg(argc, argv, "--config", on_gpu ? "gpt2" : "small"));
    const std::string dtype = text_arg(argc, argv, "--dtype", "bf16");
    if (dtype != "bf16" && dtype != "f32" && dtype != "tf32")
      throw std::invalid_argument("bench_gpu_block: --dtype is bf16, f32 or tf32, not '" + dtype + "'");
    const bool quick = has_flag(argc, argv, "--quick"), profile = has_flag(argc, argv, "--profile-step");
#if defined(KOKKOS_ENABLE_CUDA)
    if (dtype == "tf32") sl::kernels::set_allow_tf32(true);
#endif
    auto rt = sl::Runtime::from_args(argc, argv, 1);
    rt.spmd([&](sl::Context& ctx) {
      if (dtype == "bf16") run_block<sl::bf16>(ctx, cfg, quick, profile);
      else run_block<float>(ctx, cfg, quick, profile);
    });
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_block: %s\n", e.what());
    return 1;
  }
}
