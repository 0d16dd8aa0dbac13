// SPDX-License-Identifier: Apache-2.0
// Gradients benchmark: one JSON record per case on stdout, progress on stderr. Driven by
// `benchmarks/run grad`; run alone as
//   bench_grad --part block --devices 1 [--layout dp]   a pre-LN transformer block, 1 device
//   bench_grad --part block --devices 8 --layout dp     data parallel on a {8, 1} mesh
//   bench_grad --part block --devices 8 --layout tp     Megatron tensor parallel on a {4, 2} mesh
//   bench_grad --part tape --devices 1                  per-op cost of the tape
//   bench_grad --part context --devices 8               attention over a split sequence
//   bench_grad --part moe --devices 8 [--top-k 1] [--capacity-factor 1.0] [--layout tp]   a mixture-of-experts layer
// moe: forward + backward of sl::moe on the B * S tokens of [B, S, D] split over every device, 2 per
//   device of experts of d_ff / k hidden units (k = --top-k: k of them cost a dense MLP's FLOPs per
//   token), loss = sum_all(y * r) + aux; `baseline`: the dense MLP of d_ff on the same tokens, data
//   parallel (x W1, gelu, W2; the same FLOPs when the capacity factor is 1), no communication.
//   --layout tp: on a {n / m, m} mesh (m = --model), every expert's hidden dim and the dense MLP's
//   split over "model" (Megatron), the tokens over the n / m "expert" devices (2 experts each).
// Shapes: --batch 8 --seq 128 --dmodel 512 --heads 8 --dff 2048 (the defaults); --quick: small
// shapes (batch 8, seq 16, dmodel 64, 2 heads, dff 256) and fewer repetitions, a run of seconds.
// --reps N: repetitions (median; 7, --quick 3), --warmup N: untimed steps first (2, --quick 1),
// --model N: the "model" axis of tp (2), --size N: the tape's tensors (32), --chain N: the length
// of the chain of the backward-per-op case (64, --quick 16), --blockwise-only: the context part's
// forms that hold no [S, S] scores alone (the rings and the all-to-all form's fused kernel: lengths
// at which the unfused forms' scores per head do not fit in memory).
//
// block: forward + backward of a pre-LN transformer block (x -> layer_norm (gain, bias) -> q, k, v
//   projections -> attention over 'heads' heads: scores = q k^T / sqrt(head dim) by einsum, softmax
//   over the keys, weighted sum of v -> output projection -> residual -> layer_norm (gain, bias) ->
//   MLP with gelu -> residual (both residuals `einsum_add`: x folded into the projection's GEMM where
//   it lies as the product does); loss = sum_all(out * r), r a fixed tensor), every weight, gain, bias
//   and the input x a Param (the block as one layer in the middle of a stack: x needs its gradient),
//   next to the same block and loss on plain tensors (no tape): `baseline` "forward". One step of
//   the gradient pass is zero_grad of every Param, the recorded forward and backward(loss) (which
//   resolves the parameters' gradients: DP's all_reduce). ratio = seconds / baseline_seconds;
//   every contraction's backward runs two of its size, so the FLOP ratio is 3 (the target is
//   <= 3.2). Also timed: the recorded forward alone (the step without backward: graph built and
//   freed), so backward_seconds = seconds - recorded_forward_seconds. Times are the slowest
//   device's, medians over repetitions that rotate the three.
//   dp: batch over "data", weights replicated. tp: batch over "data"; Wq, Wk, Wv and W1 split by
//   columns over "model", Wo and W2 by rows; the row-parallel products' partial sums resolved by
//   the residual add to the replicated hidden spec (Megatron: one all_reduce each in the forward, and
//   one each at the layer norms' outputs in the backward).
//   gemm_threads and kernel_threads: the threads one device's GEMM and Kokkos kernels run on (the
//   device's share of the cores; 1 for the kernels on the Serial backend), for the side-by-side with benchmarks/peers/jax_blocks.py (the same
//   block, forward and gradient, in JAX on as many virtual CPU devices, whose XLA runs on every
//   core of the machine: benchmarks/run grad prints both).
// tape: a small op (float [32, 32] on 1 device) on Params, so a node is recorded (forward only;
//   the graph freed when the result goes) next to the same op on the plain tensors; overhead_us =
//   the difference. "backward per op": the backward pass of a chain of --chain ops from one Param,
//   seeded with ones, divided by the chain's length (the graph built outside the timed region), next
//   to the kernel that each node's rule runs (tanh chain: one elementwise kernel; add-a-constant
//   chain: none, the pass's own bookkeeping alone).
// context: forward + backward of causal attention (sl::attention, q, k and v Params, loss =
//   sum_all(o * r)) on [1, 8 seq, heads, dmodel / heads] with the sequence split over every
//   device: context parallelism (Ulysses' all-to-alls), next to the same attention with the heads
//   split (`baseline`: the same kernel work per device, nothing moved) and with the sequence
//   gathered before the op and sliced after (every device computing every head: what a split
//   sequence cost before the op moved it onto the heads; left out above 2048 tokens), and ring
//   attention (ContextParallel::ring: k and v passed around the devices; ring_zigzag: the same on
//   the sequence in zig-zag runs, the causal work balanced; vs_ring: its time over the ring's), and
//   the all-to-all form with the host's fused kernel (AttentionKernel::fused: the scores a tile at a
//   time, as the ring's). The collectives' bytes per device; `vs_all_to_all`: the case's time over
//   the all-to-all form's faster kernel in the run (`all_to_all_kernel` names it). `peak_bytes`:
//   the step's peak of bytes on device 0 over what it began with (the memory account's total).
#include <shardlib/attention.hpp>
#include <shardlib/autodiff.hpp>
#include <shardlib/memory.hpp>
#include <shardlib/moe.hpp>
#include <shardlib/shardlib.hpp>

#include "common.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {

using MD = sl::Mesh<"data", "model">;
template <class Spec, class T = float>
using Ten = sl::DistributedTensor<T, MD, Spec>;

using bench::num;

void record(sl::Context& ctx, const std::string& fields) {
  if (ctx.device() == 0)
    std::printf("{\"bench\": \"grad\", \"backend\": \"%s\", \"devices\": %d, %s}\n", std::string(ctx.backend()).c_str(),
                ctx.num_devices(), fields.c_str());
  std::fflush(stdout);
}

double now_s() { return std::chrono::duration<double>(bench::Clock::now().time_since_epoch()).count(); }

/// Seconds per call of `a` and of `b`, the slowest device's, median over `reps` repetitions that
/// alternate the two (odd repetitions: `b` first); each repetition runs enough calls for ~`min_s`.
/// Progress lines on stderr (device 0) when a repetition takes longer than a second.
template <class A, class B>
std::pair<double, double> time_pair(sl::Context& ctx, const char* label, A&& a, B&& b, int reps, int warmup,
                                    double min_s) {
  auto& comm = ctx.world();
  for (int i = 0; i < warmup; ++i) a(), b();
  comm.barrier();
  auto once = [&](auto& f) {
    comm.barrier();
    const double s = now_s();
    f();
    double t = now_s() - s;
    comm.all_reduce(&t, &t, 1, bench::DType::f64, bench::Op::max);
    return t;
  };
  const double ta = once(a), tb = once(b);
  const int ia = std::clamp(static_cast<int>(min_s / std::max(ta, 1e-9)), 1, 20000);
  const int ib = std::clamp(static_cast<int>(min_s / std::max(tb, 1e-9)), 1, 20000);
  auto rep = [&](auto& f, int iters) {
    comm.barrier();
    const double s = now_s();
    for (int i = 0; i < iters; ++i) f();
    double t = (now_s() - s) / iters;
    comm.all_reduce(&t, &t, 1, bench::DType::f64, bench::Op::max);
    return t;
  };
  std::vector<double> va, vb;
  const double start = now_s();
  const bool verbose = ta + tb > 0.2;
  for (int r = 0; r < reps; ++r) {
    if (r % 2) vb.push_back(rep(b, ib));
    va.push_back(rep(a, ia));
    if (r % 2 == 0) vb.push_back(rep(b, ib));
    if (verbose && ctx.device() == 0)
      std::fprintf(stderr, "    %s: rep %d/%d  %9.2f ms  baseline %9.2f ms  elapsed %5.1f s\n", label, r + 1, reps,
                   va.back() * 1e3, vb.back() * 1e3, now_s() - start);
  }
  return {bench::median(va), bench::median(vb)};
}

/// Seconds per call of each of `fs`, the slowest device's, median over `reps` repetitions; within a
/// repetition the functions run in an order rotated by one each time (drift and order effects hit
/// all alike), each enough calls for ~`min_s`. A progress line per repetition on stderr (device 0).
std::vector<double> time_rotating(sl::Context& ctx, const std::string& label, const std::vector<std::function<void()>>& fs,
                                  const std::vector<const char*>& names, int reps, int warmup, double min_s) {
  auto& comm = ctx.world();
  const std::size_t n = fs.size();
  for (int i = 0; i < warmup; ++i)
    for (const auto& f : fs) f();
  auto rep = [&](const std::function<void()>& f, int iters) {
    comm.barrier();
    const double s = now_s();
    for (int i = 0; i < iters; ++i) f();
    double t = (now_s() - s) / iters;
    comm.all_reduce(&t, &t, 1, bench::DType::f64, bench::Op::max);
    return t;
  };
  std::vector<int> iters(n);
  for (std::size_t k = 0; k < n; ++k) iters[k] = std::clamp(static_cast<int>(min_s / std::max(rep(fs[k], 1), 1e-9)), 1, 20000);
  std::vector<std::vector<double>> t(n);
  const double start = now_s();
  for (int r = 0; r < reps; ++r) {
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t k = (j + static_cast<std::size_t>(r)) % n;
      t[k].push_back(rep(fs[k], iters[k]));
    }
    if (ctx.device() == 0) {
      std::string line = "    " + label + ": rep " + std::to_string(r + 1) + "/" + std::to_string(reps);
      char b[96];
      for (std::size_t k = 0; k < n; ++k) {
        std::snprintf(b, sizeof b, "  %s %.2f ms", names[k], t[k].back() * 1e3);
        line += b;
      }
      std::snprintf(b, sizeof b, "  elapsed %.1f s", now_s() - start);
      std::fprintf(stderr, "%s%s\n", line.c_str(), b);
    }
  }
  std::vector<double> med(n);
  for (std::size_t k = 0; k < n; ++k) med[k] = bench::median(t[k]);
  return med;
}

// ---- the transformer block -----------------------------------------------------------------------
struct Dims {
  std::int64_t batch, seq, d, heads, ff;
  std::int64_t head_dim() const { return d / heads; }
  /// FLOPs of the forward's contractions (2 per multiply-add).
  double forward_flops() const {
    const double tokens = double(batch) * double(seq);
    return 2 * tokens * d * (3 * d)                                     // q, k, v
           + 2 * 2 * double(batch) * heads * seq * seq * head_dim()     // scores and weighted sum
           + 2 * tokens * d * d                                          // output projection
           + 2 * 2 * tokens * d * ff;                                    // MLP
  }
};

/// The layouts: the hidden activations' spec (batch over "data") and the weights'.
struct DataParallel {
  static constexpr const char* name = "dp";
  using Hidden = sl::Spec<"data", none, none>;
  using Vec = sl::Spec<none>;
  using Col = sl::Spec<none, none>;  // Wq, Wk, Wv [d, d], W1 [d, ff]
  using Row = sl::Spec<none, none>;  // Wo [d, d], W2 [ff, d]
};
struct TensorParallel {
  static constexpr const char* name = "tp";
  using Hidden = sl::Spec<"data", none, none>;
  using Vec = sl::Spec<none>;
  using Col = sl::Spec<none, "model">;
  using Row = sl::Spec<"model", none>;
};

/// The block and its loss, on Params/Vars (recorded) or on plain tensors (the same ops, no tape).
template <class L, class X, class V, class C, class Rw, class R>
auto block_loss(const Dims& dm, const X& x, const V& g1, const V& b1, const C& wq, const C& wk, const C& wv,
                const Rw& wo, const V& g2, const V& b2, const C& w1, const Rw& w2, const R& r) {
  const std::int64_t B = dm.batch, S = dm.seq, H = dm.heads, E = dm.head_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(E));
  auto h = sl::layer_norm<2>(x, g1, b1);  // gain and bias in the norm's pass
  auto q = sl::reshape<"b s (h e) -> b s h e">(sl::einsum<"bsd,de->bse">(h, wq), {B, S, H, E});
  auto k = sl::reshape<"b s (h e) -> b s h e">(sl::einsum<"bsd,de->bse">(h, wk), {B, S, H, E});
  auto v = sl::reshape<"b s (h e) -> b s h e">(sl::einsum<"bsd,de->bse">(h, wv), {B, S, H, E});
  auto att = sl::softmax<3>(sl::einsum<"bqhe,bkhe->bhqk">(q, k), scale);  // the scale in the softmax's pass
  auto o = sl::reshape<"b s h e -> b s (h e)">(sl::einsum<"bhqk,bkhe->bqhe">(att, v));
  // The residuals: x + the projection, folded into its GEMM where the product lies as x does (dp);
  // under tp the product is partial over "model", and the add resolves it (one all_reduce) first.
  auto x1 = sl::einsum_add<"bsd,de->bse">(o, wo, x);
  auto h2 = sl::layer_norm<2>(x1, g2, b2);
  auto f = sl::gelu(sl::einsum<"bsd,df->bsf">(h2, w1));
  auto out = sl::einsum_add<"bsf,fd->bsd">(f, w2, x1);
  return sl::sum_all(out * r);
}

template <class L>
void block_case(sl::Context& ctx, const Dims& dm, int model, int reps, int warmup) {
  const int devices = ctx.num_devices();
  if (devices % model) throw std::invalid_argument("bench_grad: --devices is not a multiple of the model axis");
  MD mesh(ctx, {devices / model, model});
  const std::int64_t B = dm.batch, S = dm.seq, D = dm.d, F = dm.ff;
  if (D % dm.heads) throw std::invalid_argument("bench_grad: --dmodel is not a multiple of --heads");
  using Hid = Ten<typename L::Hidden>;
  using Vec = Ten<typename L::Vec>;
  using Col = Ten<typename L::Col>;
  using Row = Ten<typename L::Row>;
  const float wd = 1.0f / std::sqrt(static_cast<float>(D)), wf = 1.0f / std::sqrt(static_cast<float>(F));
  sl::Param x(Hid::random(mesh, {B, S, D}, 1, -1.f, 1.f));
  sl::Param g1(Vec::full(mesh, {D}, 1.f)), b1(Vec::zeros(mesh, {D}));
  sl::Param g2(Vec::full(mesh, {D}, 1.f)), b2(Vec::zeros(mesh, {D}));
  sl::Param wq(Col::random(mesh, {D, D}, 2, -wd, wd)), wk(Col::random(mesh, {D, D}, 3, -wd, wd));
  sl::Param wv(Col::random(mesh, {D, D}, 4, -wd, wd)), w1(Col::random(mesh, {D, F}, 6, -wd, wd));
  sl::Param wo(Row::random(mesh, {D, D}, 5, -wd, wd)), w2(Row::random(mesh, {F, D}, 7, -wf, wf));
  const auto r = Hid::random(mesh, {B, S, D}, 8, -1.f, 1.f);

  auto forward = [&] {
    return block_loss<L>(dm, x.value(), g1.value(), b1.value(), wq.value(), wk.value(), wv.value(), wo.value(),
                         g2.value(), b2.value(), w1.value(), w2.value(), r);
  };
  auto recorded = [&] { return block_loss<L>(dm, x, g1, b1, wq, wk, wv, wo, g2, b2, w1, w2, r); };
  auto zero = [&] {
    x.zero_grad(), g1.zero_grad(), b1.zero_grad(), g2.zero_grad(), b2.zero_grad();
    wq.zero_grad(), wk.zero_grad(), wv.zero_grad(), wo.zero_grad(), w1.zero_grad(), w2.zero_grad();
  };
  auto step = [&] {
    zero();
    auto loss = recorded();
    sl::backward(loss);
  };
  auto fwd = [&] { auto loss = forward(); };
  auto recorded_fwd = [&] {  // the step without backward: the graph is built, then freed
    zero();
    auto loss = recorded();
  };

  // Once, outside the timing: the collectives of each pass, and the recorded loss against the plain one.
  std::uint64_t calls_fwd = 0, calls_recorded_fwd = 0, calls_bwd = 0;
  double loss_plain = 0, loss_recorded = 0;
  {
    sl::coll::CommRecorder rec;
    auto l = forward();
    calls_fwd = rec.total_calls();
    loss_plain = static_cast<double>(l.to_host()[0]);
  }
  {
    zero();
    sl::coll::CommRecorder rec;
    auto l = recorded();
    calls_recorded_fwd = rec.total_calls();
    sl::coll::CommRecorder rb;
    sl::backward(l);
    calls_bwd = rb.total_calls();
    loss_recorded = static_cast<double>(l.value().to_host()[0]);
  }
  const std::string label = std::string(L::name) + " on " + mesh.to_string();
  if (ctx.device() == 0)
    std::fprintf(stderr, "  block %s [B %lld, S %lld, D %lld, %lld heads, ff %lld]: %d warm-up step(s), %d repetitions\n",
                 label.c_str(), static_cast<long long>(B), static_cast<long long>(S), static_cast<long long>(D),
                 static_cast<long long>(dm.heads), static_cast<long long>(F), warmup, reps);
  const auto t = time_rotating(ctx, label, {step, fwd, recorded_fwd}, {"fwd+bwd", "forward", "recorded forward"}, reps,
                               warmup, 0.05);
  const double secs = t[0], base = t[1], rec_fwd = t[2];
  const double ff = dm.forward_flops();
  const std::string name = devices == 1 ? "1 device" : std::string(L::name) + " " + mesh.to_string();
  record(ctx, "\"part\": \"block\", \"name\": \"" + name + "\", \"layout\": \"" + L::name + "\", \"mesh\": \"" +
                  mesh.to_string() + "\", \"shape\": {\"batch\": " + std::to_string(B) + ", \"seq\": " +
                  std::to_string(S) + ", \"d_model\": " + std::to_string(D) + ", \"heads\": " + std::to_string(dm.heads) +
                  ", \"head_dim\": " + std::to_string(dm.head_dim()) + ", \"d_ff\": " + std::to_string(F) +
                  "}, \"dtype\": \"float32\", \"seconds\": " + num(secs) + ", \"baseline\": \"forward\", \"baseline_seconds\": " +
                  num(base) + ", \"ratio\": " + num(secs / base) + ", \"target_ratio\": 3.2, \"recorded_forward_seconds\": " + num(rec_fwd) +
                  ", \"backward_seconds\": " + num(secs - rec_fwd) + ", \"backward_over_forward\": " +
                  num((secs - rec_fwd) / base) + ", \"flops\": " + num(3 * ff) +
                  ", \"baseline_flops\": " + num(ff) + ", \"flop_ratio\": 3, \"gflops\": " + num(3 * ff / secs * 1e-9) +
                  ", \"baseline_gflops\": " + num(ff / base * 1e-9) + ", \"collectives_forward\": " +
                  std::to_string(calls_fwd) + ", \"collectives_recorded_forward\": " + std::to_string(calls_recorded_fwd) +
                  ", \"collectives_backward\": " + std::to_string(calls_bwd) + ", \"loss_relative_difference\": " +
                  num(std::abs(loss_recorded - loss_plain) / std::max(1e-30, std::abs(loss_plain))) +
                  ", \"reps\": " + std::to_string(reps) + ", \"gemm_backend\": \"" + sl::kernels::gemm_backend() +
                  "\", \"gemm_threads\": " + std::to_string(bench::gemm_threads()) + ", \"kernel_threads\": " +
                  std::to_string(ctx.exec().concurrency()));
  if (ctx.device() == 0)
    std::fprintf(stderr,
                 "  block %s: fwd+bwd %.2f ms (%.1f GFLOP/s), forward %.2f ms (%.1f GFLOP/s), ratio %.3f; recorded "
                 "forward %.2f ms, backward %.2f ms (%.3f x forward); collectives: forward %llu, recorded forward %llu, "
                 "backward %llu\n",
                 label.c_str(), secs * 1e3, 3 * ff / secs * 1e-9, base * 1e3, ff / base * 1e-9, secs / base, rec_fwd * 1e3,
                 (secs - rec_fwd) * 1e3, (secs - rec_fwd) / base,
                 static_cast<unsigned long long>(calls_fwd), static_cast<unsigned long long>(calls_recorded_fwd),
                 static_cast<unsigned long long>(calls_bwd));
}

// ---- the tape's cost per op ------------------------------------------------------------------------
template <class Op, class Plain>
void tape_case(sl::Context& ctx, const char* name, std::int64_t n, Op&& op, Plain&& plain, int reps) {
  const auto [ours, base] = time_pair(ctx, name, op, plain, reps, 2, 0.02);
  record(ctx, "\"part\": \"tape\", \"name\": \"" + std::string(name) + "\", \"shape\": [" + std::to_string(n) + ", " +
                  std::to_string(n) + "], \"seconds\": " + num(ours) + ", \"baseline\": \"the op on plain tensors\"" +
                  ", \"baseline_seconds\": " + num(base) + ", \"overhead_us\": " + num((ours - base) * 1e6) +
                  ", \"ratio\": " + num(ours / base) + ", \"target_overhead_us\": 1");
  if (ctx.device() == 0)
    std::fprintf(stderr, "  %-28s recorded %8.3f us  plain %8.3f us  overhead %7.3f us\n", name, ours * 1e6, base * 1e6,
                 (ours - base) * 1e6);
}

/// The backward pass of `chain` (a Var built from Param `a` by `len` ops), per node, over `reps`
/// repetitions of ~20 ms each (the graph built outside the timed region).
template <class P, class Build, class Seed>
double backward_per_node(sl::Context& ctx, P& a, Build&& chain, const Seed& seed, int len, int reps) {
  auto& comm = ctx.world();
  auto one = [&] {
    a.zero_grad();
    auto y = chain();
    comm.barrier();
    const double s = now_s();
    sl::backward(y, seed);
    return now_s() - s;
  };
  for (int i = 0; i < 3; ++i) one();
  double t1 = one();
  comm.all_reduce(&t1, &t1, 1, bench::DType::f64, bench::Op::max);
  const int iters = std::clamp(static_cast<int>(0.02 / std::max(t1, 1e-9)), 1, 20000);
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) {
    double t = 0;
    for (int i = 0; i < iters; ++i) t += one();
    t /= iters;
    comm.all_reduce(&t, &t, 1, bench::DType::f64, bench::Op::max);
    v.push_back(t / len);
  }
  return bench::median(v);
}

void tape(sl::Context& ctx, std::int64_t n, int len, int reps) {
  MD mesh(ctx, {ctx.num_devices(), 1});
  using T2 = Ten<sl::Spec<none, none>>;
  sl::Param a(T2::random(mesh, {n, n}, 1, -1.f, 1.f)), b(T2::random(mesh, {n, n}, 2, -1.f, 1.f));
  const T2 av = a.value(), bv = b.value();
  const sl::Var<T2> ca(av), cb(bv);  // constants: nothing recorded
  tape_case(ctx, "add", n, [&] { auto c = a + b; }, [&] { auto c = av + bv; }, reps);
  tape_case(ctx, "mul", n, [&] { auto c = a * b; }, [&] { auto c = av * bv; }, reps);
  tape_case(ctx, "exp", n, [&] { auto c = sl::exp(a); }, [&] { auto c = sl::exp(av); }, reps);
  tape_case(ctx, "scale", n, [&] { auto c = a * 2.0f; }, [&] { auto c = av * 2.0f; }, reps);
  tape_case(ctx, "matmul", n, [&] { auto c = sl::matmul(a, b); }, [&] { auto c = sl::matmul(av, bv); }, reps);
  tape_case(ctx, "add (constant Vars)", n, [&] { auto c = ca + cb; }, [&] { auto c = av + bv; }, reps);

  // Backward per node: a chain of `len` ops from Param a, seeded with ones.
  const T2 seed = T2::full(mesh, {n, n}, 1.f);
  auto tanh_chain = [&] {
    sl::Var<T2> y = sl::tanh(a);
    for (int i = 1; i < len; ++i) y = sl::tanh(y);
    return y;
  };
  auto add_chain = [&] {
    sl::Var<T2> y = a + bv;
    for (int i = 1; i < len; ++i) y = y + bv;
    return y;
  };
  const double tanh_node = backward_per_node(ctx, a, tanh_chain, seed, len, reps);
  const double add_node = backward_per_node(ctx, a, add_chain, seed, len, reps);
  // The kernel a tanh node's rule runs: g * (1 - y^2), one elementwise kernel of two operands.
  auto kernel = [&] { auto c = sl::zip(sl::fn::grad::tanh{}, av, bv); };
  const auto [kern, unused] = bench::time_ops(ctx.world(), kernel, static_cast<decltype(kernel)*>(nullptr));
  (void)unused;
  const std::string shape = "\"shape\": [" + std::to_string(n) + ", " + std::to_string(n) + "], \"chain\": " + std::to_string(len);
  record(ctx, "\"part\": \"tape\", \"name\": \"backward per op (tanh chain)\", " + shape + ", \"seconds\": " + num(tanh_node) +
                  ", \"baseline\": \"zip(fn::grad::tanh, g, y) on plain tensors (the rule's kernel)\", \"baseline_seconds\": " +
                  num(kern) + ", \"overhead_us\": " + num((tanh_node - kern) * 1e6) + ", \"ratio\": " + num(tanh_node / kern));
  record(ctx, "\"part\": \"tape\", \"name\": \"backward per op (add-constant chain)\", " + shape + ", \"seconds\": " +
                  num(add_node) + ", \"baseline\": \"none (the rule runs no kernel)\", \"baseline_seconds\": 0" +
                  ", \"overhead_us\": " + num(add_node * 1e6));
  if (ctx.device() == 0) {
    std::fprintf(stderr, "  backward per op, tanh chain of %d: %8.3f us per node (kernel %7.3f us, overhead %7.3f us)\n", len,
                 tanh_node * 1e6, kern * 1e6, (tanh_node - kern) * 1e6);
    std::fprintf(stderr, "  backward per op, add-constant chain of %d: %8.3f us per node (no kernel)\n", len, add_node * 1e6);
  }
}

/// The context part (see the file comment).
void context_case(sl::Context& ctx, const Dims& dm, int reps, int warmup, bool blockwise_only) {
  using MS = sl::Mesh<"seq">;
  MS mesh(ctx, {ctx.num_devices()});
  const std::int64_t S = 8 * dm.seq, H = dm.heads, K = dm.head_dim();
  if (dm.d % dm.heads) throw std::invalid_argument("bench_grad: --dmodel is not a multiple of --heads");
  using Seq = sl::Spec<none, "seq", none, none>;
  using Heads = sl::Spec<none, none, "seq", none>;
  using Rep = sl::Spec<none, none, none, none>;
  const auto causal = sl::AttentionOptions{.causal = true, .kernel = sl::AttentionKernel::unfused};  // (the ops)
  // One training step of attention on q, k, v of spec SpecT (its state kept by the function).
  auto make = [&]<class SpecT>(SpecT, auto attend) -> std::function<void()> {
    using T4 = sl::DistributedTensor<float, MS, SpecT>;
    struct State {
      sl::Param<T4> q, k, v;
      T4 r;
    };
    auto st = std::make_shared<State>(State{sl::Param(T4::random(mesh, {1, S, H, K}, 1, -1.f, 1.f)),
                                            sl::Param(T4::random(mesh, {1, S, H, K}, 2, -1.f, 1.f)),
                                            sl::Param(T4::random(mesh, {1, S, H, K}, 3, -1.f, 1.f)),
                                            T4::random(mesh, {1, S, H, K}, 4, -1.f, 1.f)});
    return [st, attend] {
      st->q.zero_grad(), st->k.zero_grad(), st->v.zero_grad();
      sl::backward(sl::sum_all(attend(st->q, st->k, st->v) * st->r));
    };
  };
  auto op = [causal](const auto& q, const auto& k, const auto& v) { return sl::attention(q, k, v, causal); };
  auto fused = [](const auto& q, const auto& k, const auto& v) {
    return sl::attention(q, k, v, {.causal = true, .kernel = sl::AttentionKernel::fused});
  };
  auto ring = [](const auto& q, const auto& k, const auto& v) {
    return sl::attention(q, k, v, {.causal = true, .context = sl::ContextParallel::ring});
  };
  auto zigzag = [](const auto& q, const auto& k, const auto& v) {
    return sl::attention(q, k, v, {.causal = true, .context = sl::ContextParallel::ring_zigzag});
  };
  auto gathered = [causal](const auto& q, const auto& k, const auto& v) {
    return sl::reshard<Seq>(sl::attention(sl::reshard<Rep>(q), sl::reshard<Rep>(k), sl::reshard<Rep>(v), causal));
  };
  const bool gather = S <= 2048 && !blockwise_only;  // (every device holding [H, S, S] scores, 3 copies: 1.5 GiB each at 4k)
  std::vector<std::function<void()>> steps;
  std::vector<const char*> labels, names;
  auto add = [&](std::function<void()> f, const char* label, const char* name) {
    steps.push_back(std::move(f)), labels.push_back(label), names.push_back(name);
    return steps.size() - 1;
  };
  constexpr std::size_t none_ = static_cast<std::size_t>(-1);
  std::size_t heads = none_, a2a = none_;
  if (!blockwise_only)
    heads = add(make(Heads{}, op), "heads split", "heads split"),
    a2a = add(make(Seq{}, op), "sequence split", "context parallel (all-to-all)");
  const std::size_t a2a_fused = add(make(Seq{}, fused), "all-to-all fused", "context parallel (all-to-all, fused)");
  const std::size_t in_order = add(make(Seq{}, ring), "ring", "context parallel (ring)");
  const std::size_t zz = add(make(Seq{}, zigzag), "ring zig-zag", "context parallel (ring, zig-zag)");
  if (gather) add(make(Seq{}, gathered), "sequence gathered", "sequence gathered");
  std::vector<sl::coll::CommStats> comm;
  // The step's peak of bytes on this device over what it began with: its activations, its
  // backward's temporaries and q, k, v's gradients (the memory account's total).
  std::vector<std::int64_t> peaks;
  for (const auto& f : steps) {
    sl::coll::CommRecorder rec;
    const std::int64_t before = sl::memory_usage(ctx).total();
    sl::reset_peak_memory(ctx);
    f();
    comm.push_back(rec.stats());
    peaks.push_back(sl::memory_usage(ctx).peak - before);
  }
  if (ctx.device() == 0)
    std::fprintf(stderr, "  context: causal attention [1, %lld, %lld, %lld] on %d devices, %d repetitions\n",
                 static_cast<long long>(S), static_cast<long long>(H), static_cast<long long>(K), ctx.num_devices(), reps);
  const auto t = time_rotating(ctx, "context", steps, labels, reps, warmup, 0.05);
  const double flops = 3 * 2 * 2 * double(S) * double(S) * double(H) * double(K);  // fwd + 2x bwd, both products
  const std::string shape = "\"shape\": {\"batch\": 1, \"seq\": " + std::to_string(S) + ", \"heads\": " + std::to_string(H) +
                            ", \"head_dim\": " + std::to_string(K) + "}, \"dtype\": \"float32\", \"causal\": true";
  // vs_all_to_all: against the all-to-all form's faster kernel in this run (the fused one alone
  // where the unfused one's [S, S] scores per head do not fit: --blockwise-only).
  const bool fused_best = a2a == none_ || t[a2a_fused] < t[a2a];
  const double best_a2a = fused_best ? t[a2a_fused] : t[a2a];
  const std::string a2a_ref = fused_best ? "fused" : "unfused";
  const std::string null = "null";
  for (std::size_t c = 0; c < steps.size(); ++c) {
    if (c == heads) continue;  // (the baseline itself)
    const bool based = heads != none_;
    record(ctx, "\"part\": \"context\", \"name\": \"" + std::string(names[c]) + "\", " + shape + ", \"seconds\": " + num(t[c]) +
                    ", \"baseline\": " + (based ? std::string("\"heads split\"") : null) +
                    ", \"baseline_seconds\": " + (based ? num(t[heads]) : null) + ", \"ratio\": " + (based ? num(t[c] / t[heads]) : null) +
                    ", \"gflops\": " + num(flops / t[c] / 1e9) + ", \"baseline_gflops\": " + (based ? num(flops / t[heads] / 1e9) : null) +
                    ", \"collective_calls\": " + std::to_string(comm[c].total_calls()) +
                    ", \"bytes\": " + std::to_string(comm[c].total_bytes_sent()) +
                    ", \"baseline_bytes\": " + (based ? std::to_string(comm[heads].total_bytes_sent()) : null) +
                    ", \"vs_all_to_all\": " + num(t[c] / best_a2a) + ", \"all_to_all_kernel\": \"" + a2a_ref + "\"" +
                    ", \"vs_ring\": " + (c == in_order || c == zz ? num(t[c] / t[in_order]) : null) +
                    ", \"peak_bytes\": " + std::to_string(peaks[c]));
  }
}

/// The moe part (see the file comment); `TP`: on a {n / model, model} mesh, each expert's and
/// the dense MLP's hidden dim split over "model" (the tokens over "expert" only).
template <bool TP>
void moe_case(sl::Context& ctx, const Dims& dm, int reps, int warmup, int top_k, double cf, int model) {
  using MS = std::conditional_t<TP, sl::Mesh<"expert", "model">, sl::Mesh<"expert">>;
  const int n = ctx.num_devices(), m = TP ? model : 1;
  if (m < 1 || n % m != 0)
    throw std::invalid_argument("bench_grad: --model " + std::to_string(m) + " does not divide the " + std::to_string(n) + " devices");
  const MS mesh = [&] {
    if constexpr (TP) return MS(ctx, {n / m, m});
    else return MS(ctx, {n});
  }();
  const std::int64_t T = dm.batch * dm.seq, D = dm.d, F = dm.ff, E = 2 * (n / m);
  using Tok = sl::DistributedTensor<float, MS, sl::Spec<"expert", none>>;
  using Rep2 = sl::DistributedTensor<float, MS, sl::Spec<none, none>>;
  using D1 = sl::DistributedTensor<float, MS, std::conditional_t<TP, sl::Spec<none, "model">, sl::Spec<none, none>>>;
  using D2 = sl::DistributedTensor<float, MS, std::conditional_t<TP, sl::Spec<"model", none>, sl::Spec<none, none>>>;
  using W1 = sl::DistributedTensor<float, MS, std::conditional_t<TP, sl::Spec<"expert", none, "model">, sl::Spec<"expert", none, none>>>;
  using W2 = sl::DistributedTensor<float, MS, std::conditional_t<TP, sl::Spec<"expert", "model", none>, sl::Spec<"expert", none, none>>>;
  struct State {
    sl::Param<Tok> x;
    sl::Param<Rep2> router;
    sl::Param<D1> d1;
    sl::Param<D2> d2;
    sl::Param<W1> w1;
    sl::Param<W2> w2;
    Tok r;
  };
  // Experts of F / top_k hidden units: top_k of them per token cost the dense MLP's FLOPs.
  const std::int64_t Fe = std::max<std::int64_t>(1, F / top_k);
  auto st = std::make_shared<State>(State{sl::Param(Tok::random(mesh, {T, D}, 1, -1.f, 1.f)), sl::Param(Rep2::random(mesh, {D, E}, 2, -1.f, 1.f)),
                                          sl::Param(D1::random(mesh, {D, F}, 3, -0.05f, 0.05f)), sl::Param(D2::random(mesh, {F, D}, 4, -0.05f, 0.05f)),
                                          sl::Param(W1::random(mesh, {E, D, Fe}, 5, -0.05f, 0.05f)), sl::Param(W2::random(mesh, {E, Fe, D}, 6, -0.05f, 0.05f)),
                                          Tok::random(mesh, {T, D}, 7, -1.f, 1.f)});
  std::int64_t dropped = 0;
  const std::vector<std::function<void()>> steps = {
      [st] {  // the dense MLP, data parallel (TP: Megatron's over "model"): the same FLOPs per token
        st->x.zero_grad(), st->d1.zero_grad(), st->d2.zero_grad();
        sl::backward(sl::sum_all(sl::matmul(sl::gelu(sl::matmul(st->x, st->d1)), st->d2) * st->r));
      },
      [st, top_k, cf, &dropped] {
        st->x.zero_grad(), st->router.zero_grad(), st->w1.zero_grad(), st->w2.zero_grad();
        const auto res = sl::moe(st->x, st->router, st->w1, st->w2, {.top_k = top_k, .capacity_factor = cf});
        dropped = res.dropped;
        sl::backward(sl::sum_all(res.y * st->r) + res.aux_loss);
      }};
  std::vector<sl::coll::CommStats> comm;
  for (const auto& f : steps) {
    sl::coll::CommRecorder rec;
    f();
    comm.push_back(rec.stats());
  }
  if (ctx.device() == 0)
    std::fprintf(stderr, "  moe%s: %lld tokens of %lld, %lld experts of %lld (top-%d, capacity factor %g) on %d devices, %d repetitions\n",
                 TP ? " tp" : "", static_cast<long long>(T), static_cast<long long>(D), static_cast<long long>(E), static_cast<long long>(Fe),
                 top_k, cf, n, reps);
  const auto t = time_rotating(ctx, "moe", steps, {"dense MLP", "moe"}, reps, warmup, 0.05);
  const double flops = 3 * 2 * 2 * double(T) * double(D) * double(F);  // fwd + 2x bwd, both products
  const sl::MoeStats& ms = sl::moe_stats(ctx);
  record(ctx, "\"part\": \"moe\", \"name\": \"moe " + std::string(TP ? "tp " : "") + "top-" + std::to_string(top_k) + ", cf " + num(cf) + "\", \"shape\": {\"tokens\": " +
                  std::to_string(T) + ", \"dmodel\": " + std::to_string(D) + ", \"experts\": " + std::to_string(E) +
                  ", \"expert_hidden\": " + std::to_string(Fe) + ", \"dense_hidden\": " + std::to_string(F) +
                  "}, \"dtype\": \"float32\", \"top_k\": " + std::to_string(top_k) + ", \"capacity_factor\": " + num(cf) +
                  ", \"capacity\": " + std::to_string(ms.capacity) + ", \"dropped\": " + std::to_string(dropped) +
                  ", \"choices\": " + std::to_string(ms.choices) + ", \"seconds\": " + num(t[1]) +
                  ", \"baseline\": \"" + std::string(TP ? "dense MLP, tensor parallel" : "dense MLP") +
                  ", same FLOPs per token\", \"model\": " + std::to_string(m) + ", \"baseline_seconds\": " + num(t[0]) + ", \"ratio\": " +
                  num(t[1] / t[0]) + ", \"gflops\": " + num(flops / t[1] / 1e9) + ", \"baseline_gflops\": " + num(flops / t[0] / 1e9) +
                  ", \"collective_calls\": " + std::to_string(comm[1].total_calls()) + ", \"bytes\": " +
                  std::to_string(comm[1].total_bytes_sent()) + ", \"baseline_bytes\": " + std::to_string(comm[0].total_bytes_sent()));
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
  bench::check_args(argc, argv,
                    {{"--part", bench::Takes::word, "block|tape|context|moe"},
                     {"--layout", bench::Takes::word, "dp|tp"},
                     {"--quick"},
                     {"--blockwise-only"},
                     {"--top-k", bench::Takes::integer},
                     {"--capacity-factor", bench::Takes::number},
                     {"--batch", bench::Takes::integer},
                     {"--seq", bench::Takes::integer},
                     {"--dmodel", bench::Takes::integer},
                     {"--heads", bench::Takes::integer},
                     {"--dff", bench::Takes::integer},
                     {"--reps", bench::Takes::integer},
                     {"--warmup", bench::Takes::integer},
                     {"--model", bench::Takes::integer},
                     {"--size", bench::Takes::integer},
                     {"--chain", bench::Takes::integer}});
  auto rt = sl::Runtime::from_args(argc, argv, 1);
  const std::string part = bench::text_arg(argc, argv, "--part", "block");
  const std::string layout = bench::text_arg(argc, argv, "--layout", "dp");
  const bool quick = bench::has_flag(argc, argv, "--quick");
  const bool blockwise_only = bench::has_flag(argc, argv, "--blockwise-only");
  const int top_k = static_cast<int>(bench::arg(argc, argv, "--top-k", 1));
  const double cf = std::stod(bench::text_arg(argc, argv, "--capacity-factor", "1.0"));
  Dims dm{bench::arg(argc, argv, "--batch", 8), bench::arg(argc, argv, "--seq", quick ? 16 : 128),
          bench::arg(argc, argv, "--dmodel", quick ? 64 : 512), bench::arg(argc, argv, "--heads", quick ? 2 : 8),
          bench::arg(argc, argv, "--dff", quick ? 256 : 2048)};
  const int reps = static_cast<int>(bench::arg(argc, argv, "--reps", quick ? 3 : 7));
  const int warmup = static_cast<int>(bench::arg(argc, argv, "--warmup", quick ? 1 : 2));
  const int model = static_cast<int>(bench::arg(argc, argv, "--model", 2));
  const auto n = static_cast<std::int64_t>(bench::arg(argc, argv, "--size", 32));
  const int chain = static_cast<int>(bench::arg(argc, argv, "--chain", quick ? 16 : 64));
  rt.spmd([&](sl::Context& ctx) {
    bench::warm_up(ctx.world());
    if (part == "block") {
      if (layout == "dp") block_case<DataParallel>(ctx, dm, 1, reps, warmup);
      else if (layout == "tp") block_case<TensorParallel>(ctx, dm, model, reps, warmup);
      else throw std::invalid_argument("bench_grad: --layout is dp or tp, not " + layout);
    } else if (part == "tape") {
      tape(ctx, n, chain, reps);
    } else if (part == "context") {
      context_case(ctx, dm, reps, warmup, blockwise_only);
    } else if (part == "moe") {
      if (layout == "dp") moe_case<false>(ctx, dm, reps, warmup, top_k, cf, 1);
      else if (layout == "tp") moe_case<true>(ctx, dm, reps, warmup, top_k, cf, model);
      else throw std::invalid_argument("bench_grad: --layout is dp or tp, not " + layout);
    } else {
      throw std::invalid_argument("bench_grad: --part is block, tape, context or moe, not " + part);
    }
  });
  return 0;
}
