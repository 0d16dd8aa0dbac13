// SPDX-License-Identifier: Apache-2.0
// Optimizers (optim/*.hpp) against a scalar host reference of PyTorch's formulas (torch.optim.SGD
// with dampening 0, torch.optim.AdamW, torch.nn.utils.clip_grad_norm_), on every layout of the
// state: data parallelism (state in the parameter's spec), ZeRO-1 (state split over "data",
// gradient resolved by the backward; add_zero, and add<StateSpec> splitting another dim), ZeRO-2 (the pending gradient resolved by a reduce_scatter
// into the state's spec), ZeRO-3 (the parameter split too). The gradients are known exactly: the
// loss is sum(w * c) over a batch split over "data", so w's gradient is c summed over the batch,
// a fresh c each step. Also: the collectives of one step, the per-device memory of each layout
// (the ZeRO paper's formulas, byte for byte), and the errors (bad options, a bad learning rate,
// a non-finite gradient norm, a parameter added twice). Runs on 1..8 threads devices and under
// mpirun.
#include <doctest/doctest.h>
#include <shardlib/optim.hpp>

#include "../collectives/harness.hpp"
#include "../errors.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;
using sl::Spec;
using Kind = sl::coll::Kind;

namespace {
using M = sl::Mesh<"data">;
template <class S>
using Ten = sl::DistributedTensor<float, M, S>;
using Rep2 = Ten<Spec<none, none>>;       // a replicated weight
using Rep1 = Ten<Spec<none>>;             // a replicated bias
using Split2 = Ten<Spec<"data", none>>;   // a weight split over "data" (ZeRO-3); a batch of rows
using Split1 = Ten<Spec<"data">>;         // a bias split over "data" (ZeRO-3)
using Batch3 = Ten<Spec<"data", none, none>>;  // a batch of weight-shaped constants
using Host = std::vector<double>;
constexpr double qnan = std::numeric_limits<double>::quiet_NaN();

/// Where the state lives and how the gradient gets there.
enum class Layout {
  dp,            // parameter replicated, state in its spec, backward resolves (all_reduce)
  dp_nosync,     // the same, backward(sync = false): step() runs the bucketed all_reduce
  zero1,         // add_zero<"data">, backward resolves: the state split, the gradient replicated
  zero1_dim1,    // add<StateSpec>: the same with the state split along dim 1 (w) instead of dim 0
  zero2,         // add_zero<"data">, backward(sync = false): reduce_scatter into the state's spec
  zero3,         // the parameter split over "data" (its state too), backward resolves
  zero3_nosync,  // the same, backward(sync = false)
};
const char* name(Layout l) {
  switch (l) {
    case Layout::dp: return "DP";
    case Layout::dp_nosync: return "DP (sync = false)";
    case Layout::zero1: return "ZeRO-1";
    case Layout::zero1_dim1: return "ZeRO-1 (state split along dim 1)";
    case Layout::zero2: return "ZeRO-2";
    case Layout::zero3: return "ZeRO-3";
    case Layout::zero3_nosync: return "ZeRO-3 (sync = false)";
  }
  return "?";
}
bool split_param(Layout l) { return l == Layout::zero3 || l == Layout::zero3_nosync; }
bool synced(Layout l) { return l != Layout::dp_nosync && l != Layout::zero2 && l != Layout::zero3_nosync; }
constexpr Layout all_layouts[] = {Layout::dp,    Layout::dp_nosync, Layout::zero1,       Layout::zero1_dim1,
                                  Layout::zero2, Layout::zero3,     Layout::zero3_nosync};

/// The optimizers' formulas on plain doubles, one vector per parameter (written from PyTorch's
/// documentation, not from the kernels).
struct Reference {
  bool adamw = false;
  double momentum = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0, clip_norm = 0;
  bool nesterov = false;
  std::vector<Host> p, buf, m, v;
  std::int64_t t = 0;
  double norm = qnan;

  Reference(const sl::optim::SGDOptions& o, std::vector<Host> params)
      : momentum(o.momentum), weight_decay(o.weight_decay), clip_norm(o.clip_norm), nesterov(o.nesterov),
        p(std::move(params)) {
    for (auto& x : p) buf.emplace_back(x.size(), 0.0);
  }
  Reference(const sl::optim::AdamWOptions& o, std::vector<Host> params)
      : adamw(true), weight_decay(o.weight_decay), beta1(o.beta1), beta2(o.beta2), eps(o.eps),
        clip_norm(o.clip_norm), p(std::move(params)) {
    for (auto& x : p) m.emplace_back(x.size(), 0.0), v.emplace_back(x.size(), 0.0);
  }

  static double norm_of(const std::vector<Host>& g) {
    double sq = 0;
    for (auto& gi : g)
      for (double x : gi) sq += x * x;
    return std::sqrt(sq);
  }

  void step(std::vector<Host> g, double lr) {
    ++t;
    norm = qnan;
    if (clip_norm > 0) {
      double sq = 0;
      for (auto& gi : g)
        for (double x : gi) sq += x * x;
      norm = std::sqrt(sq);
      const double scale = std::min(1.0, clip_norm / (norm + 1e-6));
      for (auto& gi : g)
        for (double& x : gi) x *= scale;
    }
    for (std::size_t k = 0; k < p.size(); ++k)
      for (std::size_t i = 0; i < p[k].size(); ++i) {
        double& w = p[k][i];
        const double gi = g[k][i];
        if (adamw) {
          w *= 1 - lr * weight_decay;
          m[k][i] = beta1 * m[k][i] + (1 - beta1) * gi;
          v[k][i] = beta2 * v[k][i] + (1 - beta2) * gi * gi;
          const double mhat = m[k][i] / (1 - std::pow(beta1, double(t)));
          const double vhat = v[k][i] / (1 - std::pow(beta2, double(t)));
          w -= lr * mhat / (std::sqrt(vhat) + eps);
        } else {
          const double d = gi + weight_decay * w;
          double dir = d;
          if (momentum != 0) {
            buf[k][i] = t == 1 ? d : momentum * buf[k][i] + d;  // torch: the first buffer is d
            dir = nesterov ? d + momentum * buf[k][i] : buf[k][i];
          }
          w -= lr * dir;
        }
      }
  }
};

Host host_of(const std::vector<float>& x) { return Host(x.begin(), x.end()); }

/// `x` holds the global values `want` to `tol`, relative to max(|want|, 1).
template <class Tensor>
void expect_values(const Tensor& x, const Host& want, double tol, const std::string& what) {
  const auto got = x.to_host();
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(1.0, std::abs(want[i])));
  CHECK_MESSAGE(worst <= tol, what << ": worst difference " << worst);
}

/// The constants of one step: w's gradient is c3 summed over the batch (dim 0), b's c2's.
struct Batch {
  Batch3 c3;
  Split2 c2;
  /// The gradients of loss() as the reference sees them.
  std::vector<Host> grads() const {
    const auto a = c3.to_host(), b = c2.to_host();
    const std::int64_t B = c3.shape()[0], R = c3.shape()[1], C = c3.shape()[2];
    Host gw(static_cast<std::size_t>(R * C), 0.0), gb(static_cast<std::size_t>(C), 0.0);
    for (std::int64_t n = 0; n < B; ++n) {
      for (std::int64_t i = 0; i < R * C; ++i) gw[std::size_t(i)] += a[std::size_t(n * R * C + i)];
      for (std::int64_t i = 0; i < C; ++i) gb[std::size_t(i)] += b[std::size_t(n * C + i)];
    }
    return {gw, gb};
  }
};
Batch make_batch(const M& mesh, std::int64_t B, std::int64_t R, std::int64_t C, std::uint64_t seed) {
  return {Batch3::random(mesh, {B, R, C}, seed, -1.f, 1.f), Split2::random(mesh, {B, C}, seed + 1, -1.f, 1.f)};
}

/// sum(w * c3) + sum(b * c2), w and b broadcast over the batch: the gradients are pending sums
/// over "data" (a ZeRO-3 parameter is gathered first: its gradient resolves by a reduce_scatter).
template <class W, class Bias>
auto loss_of(const sl::Param<W>& w, const sl::Param<Bias>& b, const Batch& x) {
  const sl::Var<Rep2> wr = [&] {
    if constexpr (std::is_same_v<W, Rep2>) return sl::Var<Rep2>(w);
    else return sl::reshard<Spec<none, none>>(w);
  }();
  const sl::Var<Rep1> br = [&] {
    if constexpr (std::is_same_v<Bias, Rep1>) return sl::Var<Rep1>(b);
    else return sl::reshard<Spec<none>>(b);
  }();
  return sl::sum_all(wr * x.c3) + sl::sum_all(br * x.c2);
}

/// Adds w and b to `opt` as `layout` wants.
template <class Opt, class W, class Bias>
void add_to(Opt& opt, Layout layout, const sl::Param<W>& w, const sl::Param<Bias>& b) {
  if (layout == Layout::zero1 || layout == Layout::zero2) {
    opt.template add_zero<"data">(w, b);
  } else if (layout == Layout::zero1_dim1) {
    if constexpr (std::is_same_v<typename W::spec_type, Spec<none, none>>) {
      opt.template add<Spec<none, "data">>(w);
      opt.template add<Spec<"data">>(b);
    }
  } else {
    opt.add(w, b);
  }
}

/// The collectives one step() runs with two parameters on a group of `n` devices.
struct Expected {
  unsigned all_gather = 0, reduce_scatter = 0, all_reduce = 0;
};
Expected expected_step_collectives(Layout layout, int n, bool clip, std::size_t bucket_bytes) {
  Expected e;
  if (n == 1) return e;  // a group of one device: nothing at all
  switch (layout) {
    case Layout::dp: break;                                                // resolved by the backward
    case Layout::dp_nosync: e.all_reduce = bucket_bytes == 0 ? 2 : 1; break;  // one per bucket
    case Layout::zero1: e.all_gather = 2; break;                            // the values back
    case Layout::zero1_dim1: e.all_gather = 2; break;                       // or all_to_all
    case Layout::zero2: e.all_gather = 2; break;  // reduce-scattered by the backward already
    case Layout::zero3: break;                                              // all local
    case Layout::zero3_nosync: e.reduce_scatter = 2; break;                 // the pending sums
  }
  if (clip) e.all_reduce += 1;  // the global norm: one double for every parameter
  return e;
}

/// Trains w [R, C] and b [C] on `layout` for `steps` steps (a fresh batch each step) and checks
/// after each step the values against the reference, the gradient norm and the step's
/// collectives. `accumulate`: no zero_grad between steps (the gradients add up, as in PyTorch).
template <class Opt, class W, class Bias>
void train_and_compare(sl::Context& ctx, Layout layout, const typename Opt::Options& o, std::int64_t R,
                       std::int64_t C, int steps, bool accumulate = false) {
  const int n = ctx.num_devices();
  M mesh(ctx, {n});
  sl::Param w(W::random(mesh, {R, C}, 1, -1.f, 1.f));
  sl::Param b(Bias::random(mesh, {C}, 2, -1.f, 1.f));
  Opt opt(o);
  add_to(opt, layout, w, b);
  CHECK(opt.num_parameters() == R * C + C);
  Reference ref(o, {host_of(w.value().to_host()), host_of(b.value().to_host())});
  std::vector<Host> g_sum;
  const std::string what = std::string(name(layout)) + " on " + std::to_string(n) + " devices";
  for (int s = 0; s < steps; ++s) {
    if (!accumulate) opt.zero_grad();
    const Batch x = make_batch(mesh, 5, R, C, 100 + 10 * std::uint64_t(s));
    {
      // ZeRO-2: the pending gradients are reduce-scattered into the state's shards by the
      // backward, as soon as it is done with each parameter; the other layouts' backward
      // resolves (synced) or leaves everything to the step.
      sl::coll::CommRecorder bwd;
      sl::backward(loss_of(w, b, x), {.sync = synced(layout)});
      if (layout == Layout::zero2) CHECK_MESSAGE(bwd[Kind::reduce_scatter].calls == (n > 1 ? 2u : 0u), what);
      if (layout == Layout::dp_nosync || layout == Layout::zero3_nosync) CHECK(bwd[Kind::reduce_scatter].calls == 0);
    }
    sl::coll::CommRecorder rec;
    opt.step();
    const Expected e = expected_step_collectives(layout, n, o.clip_norm > 0, o.bucket_bytes);
    // Gathering along dim 1 may be an all_to_all (the reshard's choice); everywhere else an all_gather.
    CHECK_MESSAGE(rec[Kind::all_gather].calls + rec[Kind::all_to_all].calls == e.all_gather,
                  what << "\n" << rec.to_string());
    if (layout != Layout::zero1_dim1) CHECK_MESSAGE(rec[Kind::all_to_all].calls == 0, what << "\n" << rec.to_string());
    CHECK_MESSAGE(rec[Kind::reduce_scatter].calls == e.reduce_scatter, what << "\n" << rec.to_string());
    CHECK_MESSAGE(rec[Kind::all_reduce].calls == e.all_reduce, what << "\n" << rec.to_string());
    CHECK_MESSAGE(rec.total_calls() == e.all_gather + e.reduce_scatter + e.all_reduce, what << "\n" << rec.to_string());
    auto g = x.grads();
    if (accumulate && s > 0)
      for (std::size_t k = 0; k < g.size(); ++k)
        for (std::size_t i = 0; i < g[k].size(); ++i) g[k][i] += g_sum[k][i];
    g_sum = g;
    ref.step(g, o.lr);
    const std::string at = what + ", step " + std::to_string(s + 1);
    expect_values(w.value(), ref.p[0], 1e-5, at + ": w");
    expect_values(b.value(), ref.p[1], 1e-5, at + ": b");
    if (o.clip_norm > 0) {
      CHECK_MESSAGE(std::abs(opt.last_grad_norm() - ref.norm) <= 1e-5 * ref.norm,
                    at << ": norm " << opt.last_grad_norm() << ", want " << ref.norm);
      CHECK(ref.norm > o.clip_norm);  // the clipping is active (the test is about it)
    } else {
      CHECK(std::isnan(opt.last_grad_norm()));
    }
  }
  CHECK(opt.steps() == steps);
}

template <class Opt>
void train_every_layout(sl::Context& ctx, const typename Opt::Options& o, std::int64_t R, std::int64_t C, int steps,
                        bool accumulate = false) {
  for (Layout l : all_layouts) {
    if (split_param(l)) train_and_compare<Opt, Split2, Split1>(ctx, l, o, R, C, steps, accumulate);
    else train_and_compare<Opt, Rep2, Rep1>(ctx, l, o, R, C, steps, accumulate);
  }
}

sl::optim::SGDOptions sgd(double lr, double momentum, bool nesterov, double weight_decay, double clip = 0) {
  sl::optim::SGDOptions o;
  o.lr = lr, o.momentum = momentum, o.nesterov = nesterov, o.weight_decay = weight_decay, o.clip_norm = clip;
  return o;
}
sl::optim::AdamWOptions adamw(double lr, double beta1, double beta2, double weight_decay, double clip = 0) {
  sl::optim::AdamWOptions o;
  o.lr = lr, o.beta1 = beta1, o.beta2 = beta2, o.weight_decay = weight_decay, o.clip_norm = clip;
  return o;
}

/// This device's bytes of parameters, gradients and optimizer state since `before`, for Ψ = `psi`
/// parameters of `param`, `grad` and `state` bytes each, as `layout` divides them over the
/// devices (ZeRO's formulas; even shapes): the state split from ZeRO-1 on, the gradients from
/// ZeRO-2 on, the parameters in ZeRO-3; the three add up to (param + grad + state) Ψ under DP
/// and a 1/N of it under ZeRO-3.
void check_memory(sl::Context& ctx, const sl::MemoryUsage& before, Layout layout, std::int64_t psi, std::int64_t param,
                  std::int64_t grad, std::int64_t state, const std::string& what) {
  const std::int64_t n = ctx.num_devices();
  const auto u = sl::memory_usage(ctx);
  const std::int64_t p = u.parameters() - before.parameters();
  const std::int64_t g = u.gradients() - before.gradients();
  const std::int64_t s = u.optimizer_state() - before.optimizer_state();
  INFO(what << ": " << u.to_string());
  const bool zero_any = layout != Layout::dp && layout != Layout::dp_nosync;
  CHECK(p == (split_param(layout) ? param * psi / n : param * psi));
  CHECK(g == (layout == Layout::zero2 || split_param(layout) ? grad * psi / n : grad * psi));
  CHECK(s == (zero_any ? state * psi / n : state * psi));
  if (!zero_any) CHECK(p + g + s == (param + grad + state) * psi);
  if (split_param(layout)) CHECK(p + g + s == (param + grad + state) * psi / n);
}

// -- mixed precision ---------------------------------------------------------------------------------

template <class E, class S>
using HTen = sl::DistributedTensor<E, M, S>;

/// A batch whose constants are multiples of 1/2 in [-1, 1]: every gradient (a sum of at most 8
/// of them, partial or whole) and every power-of-two multiple of one is exact in f16 and bf16,
/// so the optimizer sees the reference's gradients exactly.
Batch exact_batch(const M& mesh, std::int64_t B, std::int64_t R, std::int64_t C, std::uint64_t seed) {
  auto half = [](float v) { return std::round(v * 2) / 2; };
  return {sl::map(Batch3::random(mesh, {B, R, C}, seed, -1.f, 1.f), half),
          sl::map(Split2::random(mesh, {B, C}, seed + 1, -1.f, 1.f), half)};
}

/// loss_of for 16-bit parameters: each cast to float32 where it is used (its gradient cast back).
template <class S, class P>
auto replicated_var(const sl::Param<P>& p) {
  if constexpr (std::is_same_v<typename P::spec_type, S>) return sl::Var<P>(p);
  else return sl::reshard<S>(p);
}
template <class W, class Bias>
auto mixed_loss_of(const sl::Param<W>& w, const sl::Param<Bias>& b, const Batch& x, double scale = 1) {
  auto wr = sl::cast<float>(replicated_var<Spec<none, none>>(w));
  auto br = sl::cast<float>(replicated_var<Spec<none>>(b));
  return (sl::sum_all(wr * x.c3) + sl::sum_all(br * x.c2)) * scale;
}

/// `x`'s 16-bit values are `want` rounded to E (within one step of E where float32 and double
/// round differently).
template <class E, class Tensor>
void expect_rounded(const Tensor& x, const Host& want, const std::string& what) {
  const auto got = x.to_host();
  REQUIRE(got.size() == want.size());
  int bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<float>(got[i]), r = static_cast<float>(E(static_cast<float>(want[i])));
    const double ulp = std::abs(r) * std::ldexp(1.0, 1 - std::numeric_limits<E>::digits);
    if (std::abs(g - r) > ulp) ++bad;
    worst = std::max(worst, std::abs(g - want[i]));
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " values are not the reference rounded; worst difference " << worst);
}

/// Trains 16-bit w [R, C] and b [C] with AdamW on `layout` and checks every step against the
/// double reference: the parameters are its values rounded, although each step's update (lr
/// 1e-3 on values near 1) is below half a step of bf16 there: only float32 master weights
/// accumulate it. Then the memory: 2 + 2 + 12 bytes per parameter (ZeRO's mixed-precision
/// Adam), divided as the layout divides it.
template <class E, class W, class Bias>
void mixed_train_and_compare(sl::Context& ctx, Layout layout) {
  const int n = ctx.num_devices();
  M mesh(ctx, {n});
  constexpr std::int64_t R = 8, C = 16;
  const auto before = sl::memory_usage(ctx);
  sl::Param w(W::random(mesh, {R, C}, 1, 0.5f, 1.f));
  sl::Param b(Bias::random(mesh, {C}, 2, 0.5f, 1.f));
  sl::optim::AdamWOptions o = adamw(1e-3, 0.9, 0.999, 0.0, 0.0);
  sl::optim::AdamW opt(o);
  add_to(opt, layout, w, b);
  const auto host = [](const auto& t) {
    const auto v = t.to_host();
    return Host(v.begin(), v.end());
  };
  Reference ref(o, {host(w.value()), host(b.value())});
  const Host w0 = ref.p[0];
  const std::string what = std::string(name(layout)) + ", " + sl::element_name<E>() + ", " + std::to_string(n) + " devices";
  for (int s = 0; s < 6; ++s) {
    opt.zero_grad();
    const Batch x = exact_batch(mesh, 4, R, C, 300);  // one batch: the updates add up in one direction
    sl::backward(mixed_loss_of(w, b, x), {.sync = synced(layout)});
    opt.step();
    ref.step(x.grads(), o.lr);
    expect_rounded<E>(w.value(), ref.p[0], what + ", step " + std::to_string(s + 1) + ": w");
    expect_rounded<E>(b.value(), ref.p[1], what + ", step " + std::to_string(s + 1) + ": b");
  }
  // The parameters moved by about 6 lr in all: without master weights, most would not have.
  int moved = 0;
  const auto wh = w.value().to_host();
  for (std::size_t i = 0; i < wh.size(); ++i) moved += static_cast<float>(wh[i]) != static_cast<float>(E(float(w0[i])));
  CHECK_MESSAGE(moved > static_cast<int>(wh.size()) / 2, what << ": " << moved << " of " << wh.size() << " moved");
  if (8 % n != 0) return;  // memory formulas for even splits only
  check_memory(ctx, before, layout, R * C + C, 2, 2, 12, what);  // 16 bits; float32 master weights and moments
}

using shardlib::test::message_of;

/// The setup of the two "reduce-scattered during the backward" tests: `weights` [64, 64] weights
/// stored as `W` (seeds 10, 11, ...), and a batch `x` of 8 rows a device.
template <class W>
struct SixWeights {
  static constexpr int count = 6;
  static constexpr std::int64_t bytes = 64 * 64 * sizeof(float);  // one weight's
  std::vector<sl::Param<W>> w;
  Split2 x;
  explicit SixWeights(const M& mesh) : x(Split2::random(mesh, {8 * mesh.context().num_devices(), 64}, 3, -1.f, 1.f)) {
    for (int k = 0; k < count; ++k) w.emplace_back(W::random(mesh, {64, 64}, 10 + k, -1.f, 1.f));
  }
  /// The bytes of one weight's shard over "data" on this device (its rows: 16 of 64 on 4
  /// devices; 13 or 12 on 5, as the mesh splits them).
  static std::int64_t shard_bytes(const M& mesh) {
    const std::int64_t shape[2] = {64, 64};
    return sl::shard_box(Split2::sharding, mesh.shape(), shape, mesh.context().device()).num_elements() *
           static_cast<std::int64_t>(sizeof(float));
  }
};

}  // namespace

TEST_SUITE("optim") {

TEST_CASE("kernels::sum_of_squares: every length around its chunks and lanes, exact on small integers; NaN and inf stay") {
  const Kokkos::DefaultHostExecutionSpace exec;
  for (std::int64_t n : {0, 1, 15, 16, 17, 4095, 4096, 4097, 3 * 4096 + 5, 100000}) {
    std::vector<float> g(static_cast<std::size_t>(n));
    std::vector<sl::bf16> h(static_cast<std::size_t>(n));
    double want = 0;  // (i % 7 - 3)^2 summed: exact in double whatever the order
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(i % 7 - 3);
      g[static_cast<std::size_t>(i)] = x;
      h[static_cast<std::size_t>(i)] = sl::bf16(x);
      want += static_cast<double>(x) * x;
    }
    INFO("n = " << n);
    CHECK(sl::kernels::sum_of_squares(exec, n, g.data()) == want);
    CHECK(sl::kernels::sum_of_squares(exec, n, h.data()) == want);
    if (n > 0) {  // one NaN or inf anywhere, the last element too (a lane's tail)
      for (std::int64_t at : {std::int64_t{0}, n / 2, n - 1}) {
        std::vector<float> bad = g;
        bad[static_cast<std::size_t>(at)] = std::numeric_limits<float>::quiet_NaN();
        CHECK(std::isnan(sl::kernels::sum_of_squares(exec, n, bad.data())));
        bad[static_cast<std::size_t>(at)] = -std::numeric_limits<float>::infinity();
        CHECK(sl::kernels::sum_of_squares(exec, n, bad.data()) == std::numeric_limits<double>::infinity());
      }
    }
  }
}
/// Steps `steps` of AdamW on float or double state of `n` elements by kernels::adamw_update (on a
/// host: its SIMD chunks) and by the element form (AdamWKernel run per element, as a GPU does),
/// and returns the largest difference of p, m, v relative to max(|value|, 1e-3), or -1 where
/// only one of the two is NaN.
template <class T>
double adamw_forms_differ(std::int64_t n, int steps) {
  const Kokkos::DefaultHostExecutionSpace exec;
  const auto N = static_cast<std::size_t>(n);
  std::vector<T> p(N), g(N), m(N), v(N);
  for (std::size_t i = 0; i < N; ++i) {
    p[i] = static_cast<T>(0.01 * static_cast<double>(i % 101) - 0.3);
    m[i] = static_cast<T>(1e-4 * static_cast<double>(i % 7));
    v[i] = static_cast<T>(i % 13 == 0 ? 0.0 : 1e-6 * static_cast<double>(i % 13));  // v = 0: sqrt at 0
  }
  std::vector<T> p2 = p, m2 = m, v2 = v;
  for (int t = 1; t <= steps; ++t) {
    for (std::size_t i = 0; i < N; ++i)  // g = 0 (where v was 0 too: the update is the decay alone), then both signs
      g[i] = static_cast<T>(i % 13 == 0 ? 0.0 : 1e-3 * static_cast<double>((i * 7 + static_cast<std::size_t>(t)) % 89) - 0.04);
    if (n > 2) g[N / 2] = std::numeric_limits<T>::quiet_NaN();  // stays NaN in both
    sl::kernels::AdamWStep st;
    st.lr = 1e-3;
    st.weight_decay = 0.01;
    st.grad_scale = 0.5;
    st.step = t;
    sl::kernels::adamw_update(exec, n, p.data(), g.data(), m.data(), v.data(), st);
    const double tt = static_cast<double>(t);
    sl::kernels::detail::portable::run(
        exec, "adamw (element form)", n,
        sl::kernels::AdamWKernel<T, T>{p2.data(), g.data(), m2.data(), v2.data(), static_cast<T>(1 - st.lr * st.weight_decay),
                                       static_cast<T>(st.beta1), static_cast<T>(st.beta2), static_cast<T>(st.eps),
                                       static_cast<T>(st.grad_scale), static_cast<T>(st.lr / (1 - std::pow(st.beta1, tt))),
                                       static_cast<T>(std::sqrt(1 - std::pow(st.beta2, tt)))});
  }
  double worst = 0;
  for (const auto* pair : {&p, &m, &v}) {
    const std::vector<T>& a = *pair;
    const std::vector<T>& b = pair == &p ? p2 : pair == &m ? m2 : v2;
    for (std::size_t i = 0; i < N; ++i) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return -1;
      if (std::isnan(a[i])) continue;
      const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
      worst = std::max(worst, d / std::max(std::abs(static_cast<double>(b[i])), 1e-3));
    }
  }
  return worst;
}

TEST_CASE("kernels::adamw_update on a host: its SIMD chunks take the element form's steps, every length around a chunk, wherever an element sits") {
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{2047}, sl::kernels::vmath::chunk,
                         sl::kernels::vmath::chunk + 1, 3 * sl::kernels::vmath::chunk + 17}) {
    INFO("n = " << n);
    const double f = adamw_forms_differ<float>(n, 5), d = adamw_forms_differ<double>(n, 5);
    CHECK(f >= 0);
    CHECK(f < 2e-6);  // the packet sqrt: a few float ulps
    CHECK(d >= 0);
    CHECK(d < 1e-13);
  }
  // Where an element sits does not change its step: DP's and ZeRO's blocks of one parameter start
  // at other elements, and their steps must be bit-identical.
  const Kokkos::DefaultHostExecutionSpace exec;
  for (const std::size_t shift : {1u, 3u, 7u, 17u}) {
    const std::size_t n = 2 * static_cast<std::size_t>(sl::kernels::vmath::chunk) + 45;
    std::vector<float> p(n + shift), g(n + shift), m(n + shift), v(n + shift);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = 0.37f * static_cast<float>(i % 29) - 3.f;
      g[i] = 0.013f * static_cast<float>(i % 31) - 0.2f;
      m[i] = 0.001f * static_cast<float>(i % 5);
      v[i] = 1e-5f * static_cast<float>(i % 11);
    }
    std::vector<float> ps(n + shift), ms(n + shift), vs(n + shift), gs(n + shift);
    std::copy_n(p.begin(), n, ps.begin() + static_cast<std::ptrdiff_t>(shift));
    std::copy_n(g.begin(), n, gs.begin() + static_cast<std::ptrdiff_t>(shift));
    std::copy_n(m.begin(), n, ms.begin() + static_cast<std::ptrdiff_t>(shift));
    std::copy_n(v.begin(), n, vs.begin() + static_cast<std::ptrdiff_t>(shift));
    sl::kernels::AdamWStep st;
    st.lr = 0.05;
    st.weight_decay = 0.5;
    for (st.step = 1; st.step <= 3; ++st.step) {
      sl::kernels::adamw_update(exec, static_cast<std::int64_t>(n), p.data(), g.data(), m.data(), v.data(), st);
      sl::kernels::adamw_update(exec, static_cast<std::int64_t>(n), ps.data() + shift, gs.data() + shift, ms.data() + shift,
                                vs.data() + shift, st);
    }
    INFO("shift " << shift);
    CHECK(std::equal(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(n), ps.begin() + static_cast<std::ptrdiff_t>(shift)));
    CHECK(std::equal(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(n), ms.begin() + static_cast<std::ptrdiff_t>(shift)));
    CHECK(std::equal(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n), vs.begin() + static_cast<std::ptrdiff_t>(shift)));
  }
}

TEST_CASE("SGD: momentum, Nesterov and weight decay follow torch.optim.SGD") {
  sl::test::for_each_run([](sl::Context& ctx) {
    for (const auto& o : {sgd(0.1, 0, false, 0), sgd(0.1, 0.9, false, 0), sgd(0.1, 0.9, true, 0),
                          sgd(0.05, 0.9, false, 0.1), sgd(0.05, 0.9, true, 0.1)}) {
      INFO("momentum " << o.momentum << ", nesterov " << o.nesterov << ", weight_decay " << o.weight_decay);
      train_and_compare<sl::optim::SGD, Rep2, Rep1>(ctx, Layout::dp, o, 4, 3, 4);
    }
  });
}

TEST_CASE("AdamW: defaults and decoupled weight decay follow torch.optim.AdamW") {
  sl::test::for_each_run([](sl::Context& ctx) {
    for (const auto& o : {sl::optim::AdamWOptions{}, adamw(0.05, 0.8, 0.95, 0.1)}) {
      INFO("lr " << o.lr << ", betas " << o.beta1 << " " << o.beta2 << ", weight_decay " << o.weight_decay);
      train_and_compare<sl::optim::AdamW, Rep2, Rep1>(ctx, Layout::dp, o, 4, 3, 5);
    }
  });
}

TEST_CASE("AdamW with clipping: DP, ZeRO-1, ZeRO-2 and ZeRO-3 take the reference's steps, uneven shapes") {
  // [7, 5] and [5] on up to 8 devices: uneven blocks, empty ones from 6 devices on.
  sl::test::for_each_run([](sl::Context& ctx) {
    train_every_layout<sl::optim::AdamW>(ctx, adamw(0.05, 0.9, 0.999, 0.1, 1.0), 7, 5, 4);
  });
}

TEST_CASE("SGD with momentum and clipping on every layout (clipping changes the step's size)") {
  sl::test::for_each_run([](sl::Context& ctx) {
    train_every_layout<sl::optim::SGD>(ctx, sgd(0.1, 0.9, true, 0.05, 2.0), 7, 5, 3);
  });
}

TEST_CASE("collectives of a step without clipping, and one all_reduce per parameter with bucket_bytes = 0") {
  sl::test::for_each_run([](sl::Context& ctx) {
    train_every_layout<sl::optim::AdamW>(ctx, adamw(0.05, 0.9, 0.999, 0.1), 7, 5, 2);
    auto o = adamw(0.05, 0.9, 0.999, 0.1, 1.0);
    o.bucket_bytes = 0;
    train_and_compare<sl::optim::AdamW, Rep2, Rep1>(ctx, Layout::dp_nosync, o, 7, 5, 2);
  });
}

TEST_CASE("without zero_grad the gradients add up on every layout, as in PyTorch") {
  sl::test::for_each_run([](sl::Context& ctx) {
    train_every_layout<sl::optim::SGD>(ctx, sgd(0.1, 0.9, false, 0), 7, 5, 3, /*accumulate=*/true);
  });
}

TEST_CASE("ZeRO-2: gradients add up until zero_grad (a synchronised backward after a step, micro-batches)") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices()});
    sl::Param w(Rep2::random(mesh, {7, 5}, 1, -1.f, 1.f));
    sl::Param b(Rep1::random(mesh, {5}, 2, -1.f, 1.f));
    const sl::optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
    sl::optim::SGD opt(o);
    opt.add_zero<"data">(w, b);
    Reference ref(o, {host_of(w.value().to_host()), host_of(b.value().to_host())});
    const Batch x1 = make_batch(mesh, 5, 7, 5, 500), x2 = make_batch(mesh, 5, 7, 5, 510),
                x3 = make_batch(mesh, 5, 7, 5, 520), x4 = make_batch(mesh, 5, 7, 5, 530);
    sl::backward(loss_of(w, b, x1), {.sync = false});  // held by the optimizer after the step
    opt.step();
    ref.step(x1.grads(), o.lr);
    sl::backward(loss_of(w, b, x2));  // resolved into the parameter's own spec
    opt.step();
    auto g = x1.grads();
    const auto g2 = x2.grads();
    for (std::size_t k = 0; k < g.size(); ++k)
      for (std::size_t i = 0; i < g[k].size(); ++i) g[k][i] += g2[k][i];
    ref.step(g, o.lr);
    expect_values(w.value(), ref.p[0], 1e-5, "w after g1 + g2");
    expect_values(b.value(), ref.p[1], 1e-5, "b after g1 + g2");
    opt.step();  // no backward since: the same gradient again
    ref.step(g, o.lr);
    expect_values(w.value(), ref.p[0], 1e-5, "w after the same gradient again");
    // Then two micro-batches: each backward reduce-scatters its gradients into the shards, where
    // they add up (DeepSpeed's ZeRO-2 reduces every micro-batch too: no full-size gradient is
    // kept); the step only gathers the updated values.
    opt.zero_grad();
    const unsigned want = ctx.num_devices() > 1 ? 2u : 0u;
    for (const Batch* x : {&x3, &x4}) {
      sl::coll::CommRecorder rec;
      sl::backward(loss_of(w, b, *x), {.sync = false});
      CHECK(rec[Kind::reduce_scatter].calls == want);
      CHECK(rec.total_calls() == want);
    }
    {
      sl::coll::CommRecorder rec;
      opt.step();
      CHECK(rec[Kind::reduce_scatter].calls == 0);
      CHECK(rec[Kind::all_gather].calls == want);
      CHECK(rec.total_calls() == want);
    }
    g = x3.grads();
    const auto g4 = x4.grads();
    for (std::size_t k = 0; k < g.size(); ++k)
      for (std::size_t i = 0; i < g[k].size(); ++i) g[k][i] += g4[k][i];
    ref.step(g, o.lr);
    expect_values(w.value(), ref.p[0], 1e-5, "w after zero_grad and g3 + g4");
    expect_values(b.value(), ref.p[1], 1e-5, "b after zero_grad and g3 + g4");
  });
}

TEST_CASE("memory per device: DP 16 bytes per parameter, ZeRO-1, -2 and -3 split 8, 12 and 16 of them") {
  // Ψ = 8 * 16 + 16 parameters of float32 with AdamW (two moments), every dim divisible by the
  // device count. Measured after step() (before zero_grad), as deltas of the device's ledger.
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const int n = ctx.num_devices();
        if (8 % n != 0) return;  // mpirun with a count that does not divide the shapes
        M mesh(ctx, {n});
        const std::int64_t psi = 8 * 16 + 16, f = sizeof(float);
        for (Layout layout : all_layouts) {
          const std::string what = std::string(name(layout)) + " on " + std::to_string(n) + " devices";
          const Batch x = make_batch(mesh, 2 * n, 8, 16, 7);
          auto run = [&](auto w, auto b) {
            const auto before = sl::memory_usage(ctx);
            {
              sl::Param pw(std::move(w));
              sl::Param pb(std::move(b));
              sl::optim::AdamW opt(adamw(0.01, 0.9, 0.999, 0.01, 1.0));
              add_to(opt, layout, pw, pb);
              REQUIRE(opt.num_parameters() == psi);
              sl::backward(loss_of(pw, pb, x), {.sync = synced(layout)});
              opt.step();
              check_memory(ctx, before, layout, psi, f, f, 2 * f, what);  // float32, two moments
              opt.zero_grad();  // ZeRO-2's gradient was held by the optimizer
              CHECK(sl::memory_usage(ctx).gradients() == before.gradients());
            }
            const auto after = sl::memory_usage(ctx);  // nothing left behind
            CHECK(after.parameters() == before.parameters());
            CHECK(after.gradients() == before.gradients());
            CHECK(after.optimizer_state() == before.optimizer_state());
          };
          if (split_param(layout)) run(Split2::random(mesh, {8, 16}, 1, -1.f, 1.f), Split1::random(mesh, {16}, 2, -1.f, 1.f));
          else run(Rep2::random(mesh, {8, 16}, 1, -1.f, 1.f), Rep1::random(mesh, {16}, 2, -1.f, 1.f));
        }
      },
      {1, 2, 4, 8});
}

TEST_CASE("ZeRO-2: the pending gradients are reduce-scattered during the backward, one full-size addend at a time") {
  // Six replicated [64, 64] weights, each used once: a backward with sync = false and buckets of
  // 0 bytes reduce-scatters each weight's addend into its state's shard as soon as the pass is
  // done with the weight, so the pass's high point holds one full addend and the shards (not all
  // six addends until the step, as it would without the optimizer's layout). With buckets of two
  // weights' bytes, two at a time (and with the default 25 MiB, all at the end of the pass).
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        M mesh(ctx, {ctx.num_devices()});
        SixWeights<Rep2> six(mesh);
        constexpr int K = SixWeights<Rep2>::count;
        constexpr std::int64_t S = SixWeights<Rep2>::bytes;
        auto& w = six.w;
        const auto& x = six.x;
        sl::optim::AdamW opt(sl::optim::AdamWOptions{});
        for (auto& p : w) opt.add_zero<"data">(p);
        auto loss = sl::sum_all(sl::matmul(x, w[0]));
        for (int k = 1; k < K; ++k) loss = loss + sl::sum_all(sl::matmul(x, w[k]));
        sl::reset_peak_memory(ctx);
        const std::int64_t before = sl::memory_usage(ctx).total();
        sl::coll::CommRecorder rec;
        sl::backward(loss, {.sync = false, .bucket_bytes = 0});  // each weight's gradient at once
        CHECK(rec[Kind::reduce_scatter].calls == K);                // in the backward, not at the step
        const std::int64_t high = sl::memory_usage(ctx).peak - before;
        INFO("the backward's high point is " << high << " bytes above its start; one weight is " << S);
        if (ctx.num_devices() >= 4) CHECK(high < K * S / 2);  // without it: K * S
        CHECK(sl::memory_usage(ctx).gradients() == K * six.shard_bytes(mesh));  // the shards, held pending
        sl::coll::CommRecorder step;
        opt.step();
        CHECK(step[Kind::reduce_scatter].calls == 0);
        CHECK(step[Kind::all_gather].calls == K);
        for (const std::size_t bucket : {std::size_t(2 * S), std::size_t{25} << 20}) {
          opt.zero_grad();
          auto again = sl::sum_all(sl::matmul(x, w[0]));
          for (int k = 1; k < K; ++k) again = again + sl::sum_all(sl::matmul(x, w[k]));
          sl::reset_peak_memory(ctx);
          const std::int64_t start = sl::memory_usage(ctx).total();
          sl::coll::CommRecorder r;
          sl::backward(again, {.sync = false, .bucket_bytes = bucket});
          CHECK(r[Kind::reduce_scatter].calls == K);
          const std::int64_t top = sl::memory_usage(ctx).peak - start;
          INFO("buckets of " << bucket << " bytes: the high point is " << top << " bytes above the start");
          if (ctx.num_devices() >= 4 && bucket == 2 * S) CHECK(top < K * S * 3 / 4);  // two or three addends
          if (bucket > K * S) CHECK(top >= K * S);  // every addend until the end of the pass
        }
      },
      {4, 8});
}

TEST_CASE("ZeRO-3: a split weight's gradient is reduce-scattered during the backward, one full-size addend at a time") {
  // Six weights stored split over "data", gathered for their matmuls (a weight's gradient
  // arrives as a full-size addend, partial over "data"): a backward that resolves (sync = true) with
  // buckets of 0 bytes reduce-scatters each weight's gradient into its shard as soon as the pass
  // is done with the weight, so the pass's high point holds one weight's addends and the shards,
  // not every full-size addend until the end of the pass. The gradients are those resolved at
  // the end, bit for bit (buckets of 25 MiB: every weight at the end, as before).
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        M mesh(ctx, {ctx.num_devices()});
        SixWeights<Split2> six(mesh);
        constexpr int K = SixWeights<Split2>::count;
        constexpr std::int64_t S = SixWeights<Split2>::bytes;
        auto& w = six.w;
        const auto& x = six.x;
        auto run = [&](std::size_t bucket, std::int64_t* high) {
          for (auto& p : w) p.zero_grad();
          auto loss = sl::sum_all(sl::matmul(x, sl::reshard<Spec<none, none>>(w[0], sl::recompute)));
          for (int k = 1; k < K; ++k) loss = loss + sl::sum_all(sl::matmul(x, sl::reshard<Spec<none, none>>(w[k], sl::recompute)));
          sl::reset_peak_memory(ctx);
          const std::int64_t before = sl::memory_usage(ctx).total();
          sl::coll::CommRecorder rec;
          sl::backward(loss, {.bucket_bytes = bucket});
          CHECK(rec[Kind::reduce_scatter].calls == K);
          *high = sl::memory_usage(ctx).peak - before;
          CHECK(sl::memory_usage(ctx).gradients() == K * six.shard_bytes(mesh));  // the shards
          std::vector<std::vector<float>> g;
          for (const auto& p : w) g.push_back(p.grad().to_host());
          return g;
        };
        std::int64_t at_once = 0, at_end = 0;
        const auto got = run(0, &at_once);
        const auto want = run(std::size_t{25} << 20, &at_end);
        CHECK(got == want);
        INFO("the backward's high point: " << at_once << " bytes above its start with buckets of 0 bytes, " << at_end
                                           << " with 25 MiB; one weight is " << S);
        if (ctx.num_devices() >= 4) CHECK(at_once < K * S / 2);  // without it: every weight's addend
        CHECK(at_end >= K * S);                                  // every weight's addend until the end of the pass
      },
      {4, 8});
}

TEST_CASE("a backward that leaves gradients pending counts them as gradients, its own bytes as temporaries; each role keeps its own peak") {
  // A pipeline's micro-batches (backward with sync = false) hold each parameter's partial sums
  // between passes: they are gradients in the memory account from the pass that makes them on,
  // not activations until the step resolves them. What else the pass makes (the activations'
  // gradients) is temporaries, so the activations' peak is the forward's. Each role's peak is its
  // own high point.
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        M mesh(ctx, {ctx.num_devices()});
        constexpr std::int64_t S = 128 * 128 * sizeof(float);  // the weight's bytes (a cached block)
        sl::Param w(Rep2::random(mesh, {128, 128}, 1, -1.f, 1.f));
        const auto x = Split2::random(mesh, {8 * ctx.num_devices(), 128}, 3, -1.f, 1.f);
        const auto before = sl::memory_usage(ctx);
        for (int pass = 0; pass < 2; ++pass) {
          sl::reset_peak_memory(ctx);
          std::int64_t forward_peak = 0;
          {
            auto loss = sl::sum_all(sl::matmul(x, w));
            forward_peak = sl::memory_usage(ctx).peak_of(sl::MemoryRole::activations);
            sl::backward(loss, {.sync = false});
          }
          const auto after = sl::memory_usage(ctx);
          INFO("pass " << pass << ": " << after.to_string());
          CHECK(after.gradients() - before.gradients() == S);  // one full-size partial sum, pending
          CHECK(after.activations() == before.activations());  // the pass kept nothing else
          CHECK(after.temporaries() == before.temporaries());  // and freed what it made
          CHECK(after.peak_of(sl::MemoryRole::gradients) >= after.gradients());
          CHECK(after.peak_of(sl::MemoryRole::parameters) == after.parameters());
          CHECK(forward_peak > after.activations());  // the forward's product and sum
          CHECK(after.peak_of(sl::MemoryRole::activations) == forward_peak);  // nothing of the backward's
          CHECK(after.peak_of(sl::MemoryRole::temporaries) > after.temporaries());  // the product's gradient
          CHECK(after.peak_of(sl::MemoryRole::activations) < after.peak);
        }
        sl::sync_grads(w);  // resolved: the parameter's gradient, replicated
        CHECK(sl::memory_usage(ctx).gradients() - before.gradients() == S);
        w.zero_grad();
        CHECK(sl::memory_usage(ctx).gradients() == before.gradients());
        // Peaks by role, directly: a block under one role, freed, then one under another.
        sl::reset_peak_memory(ctx);
        const auto start = sl::memory_usage(ctx);
        { auto a = Rep2::zeros(mesh, {256, 256}); }
        {
          sl::MemoryRoleScope role(sl::MemoryRole::optimizer_state);
          auto b = Rep2::zeros(mesh, {128, 256});
          sl::tag_memory(b, sl::MemoryRole::gradients);  // moved: the gradients' own peak rises
        }
        const auto u = sl::memory_usage(ctx);
        CHECK(u.peak_of(sl::MemoryRole::activations) - start.activations() == 256 * 256 * 4);
        CHECK(u.peak_of(sl::MemoryRole::optimizer_state) - start.optimizer_state() == 128 * 256 * 4);
        CHECK(u.peak_of(sl::MemoryRole::gradients) - start.gradients() == 128 * 256 * 4);
        CHECK(u.peak - start.total() == 256 * 256 * 4);  // one at a time: the total's own peak
      },
      {1, 2, 4});
}

TEST_CASE("a bad learning rate from the schedule throws and changes nothing") {
  sl::test::for_each_run([](sl::Context& ctx) {
    for (Layout layout : {Layout::dp_nosync, Layout::zero2}) {
      M mesh(ctx, {ctx.num_devices()});
      sl::Param w(Rep2::random(mesh, {7, 5}, 1, -1.f, 1.f));
      sl::Param b(Rep1::random(mesh, {5}, 2, -1.f, 1.f));
      double bad = 0;  // the schedule's answer when not 0
      auto o = adamw(0, 0.9, 0.999, 0.1);
      o.schedule = [&bad](std::int64_t t) { return bad != 0 ? bad : 0.01 * double(t); };
      sl::optim::AdamW opt(o);
      add_to(opt, layout, w, b);
      Reference ref(o, {host_of(w.value().to_host()), host_of(b.value().to_host())});
      for (int s = 0; s < 3; ++s) {
        opt.zero_grad();
        const Batch x = make_batch(mesh, 5, 7, 5, 200 + std::uint64_t(s));
        sl::backward(loss_of(w, b, x), {.sync = synced(layout)});
        const auto w0 = w.value().to_host(), b0 = b.value().to_host();
        for (double v : {qnan, std::numeric_limits<double>::infinity(), -0.5}) {
          bad = v;
          const std::string msg = message_of<std::invalid_argument>([&] { opt.step(); });
          INFO(std::string(name(layout)) << ", schedule " << v << ": " << msg);
          CHECK(msg.find("learning rate") != std::string::npos);
          CHECK(msg.find("schedule") != std::string::npos);
          CHECK(w.value().to_host() == w0);
          CHECK(b.value().to_host() == b0);
          CHECK(opt.steps() == s);
        }
        bad = 0;
        opt.step();  // the pending gradient is still there; the step counter did not move
        ref.step(x.grads(), 0.01 * double(s + 1));
        expect_values(w.value(), ref.p[0], 1e-5, std::string(name(layout)) + ": w after the bad rates");
        expect_values(b.value(), ref.p[1], 1e-5, std::string(name(layout)) + ": b after the bad rates");
      }
    }
  });
}

TEST_CASE("a NaN in one gradient element with clipping throws on every device and changes nothing") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices()});
    for (Layout layout : all_layouts) {
      auto body = [&](auto w0, auto b0) {
        sl::Param w(std::move(w0));
        sl::Param b(std::move(b0));
        const auto o = adamw(0.05, 0.9, 0.999, 0.1, 1.0);
        sl::optim::AdamW opt(o);
        add_to(opt, layout, w, b);
        Reference ref(o, {host_of(w.value().to_host()), host_of(b.value().to_host())});
        for (int s = 0; s < 3; ++s) {
          opt.zero_grad();
          Batch x = make_batch(mesh, 5, 7, 5, 300 + std::uint64_t(s));
          if (s == 1) {  // one NaN, in the last batch row's block (one device's)
            auto h = x.c3.to_host();
            h[h.size() - 3] = std::numeric_limits<float>::quiet_NaN();
            x.c3 = Batch3::from_host(mesh, {5, 7, 5}, std::span<const float>(h));
            sl::backward(loss_of(w, b, x), {.sync = synced(layout)});
            const auto wh = w.value().to_host(), bh = b.value().to_host();
            const std::string msg = message_of<std::runtime_error>([&] { opt.step(); });
            INFO(std::string(name(layout)) << ": " << msg);
            CHECK(msg.find("norm") != std::string::npos);
            CHECK(w.value().to_host() == wh);
            CHECK(b.value().to_host() == bh);
            CHECK(opt.steps() == 1);
            continue;  // the next step is the reference's second
          }
          sl::backward(loss_of(w, b, x), {.sync = synced(layout)});
          opt.step();
          ref.step(x.grads(), o.lr);
          expect_values(w.value(), ref.p[0], 1e-5, std::string(name(layout)) + ": w");
          expect_values(b.value(), ref.p[1], 1e-5, std::string(name(layout)) + ": b");
        }
        CHECK(opt.steps() == 2);
      };
      if (split_param(layout)) body(Split2::random(mesh, {7, 5}, 1, -1.f, 1.f), Split1::random(mesh, {5}, 2, -1.f, 1.f));
      else body(Rep2::random(mesh, {7, 5}, 1, -1.f, 1.f), Rep1::random(mesh, {5}, 2, -1.f, 1.f));
    }
  });
}

TEST_CASE("a parameter no backward reached is left alone (no weight decay either)") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices()});
    sl::Param w(Rep2::random(mesh, {7, 5}, 1, -1.f, 1.f));
    sl::Param b(Rep1::random(mesh, {5}, 2, -1.f, 1.f));
    sl::Param unused(Rep1::random(mesh, {5}, 3, -1.f, 1.f));
    const auto o = adamw(0.05, 0.9, 0.999, 0.5);
    sl::optim::AdamW opt(o);
    opt.add_zero<"data">(w, b, unused);
    const auto u0 = unused.value().to_host();
    Reference ref(o, {host_of(w.value().to_host()), host_of(b.value().to_host())});
    for (int s = 0; s < 2; ++s) {
      opt.zero_grad();
      const Batch x = make_batch(mesh, 5, 7, 5, 400 + std::uint64_t(s));
      sl::backward(loss_of(w, b, x), {.sync = false});
      opt.step();
      ref.step(x.grads(), o.lr);
    }
    CHECK(unused.value().to_host() == u0);
    expect_values(w.value(), ref.p[0], 1e-5, "w");
    expect_values(b.value(), ref.p[1], 1e-5, "b");
  });
}

TEST_CASE("state() and set_steps(): a run continued by another optimizer from the first's state, on another layout, takes the same steps") {
  // Optimizer A steps 3 times with ZeRO-1 (state split over "data"); optimizer B, on parameters
  // with A's values and with A's moments copied into its state (replicated: DP) and its step
  // count set, then takes the same 2 further steps as A: what a checkpoint's resume does.
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices()});
    sl::Param w(Rep2::random(mesh, {7, 5}, 1, -1.f, 1.f));
    sl::Param b(Rep1::random(mesh, {5}, 2, -1.f, 1.f));
    const auto o = adamw(0.05, 0.9, 0.999, 0.5);
    sl::optim::AdamW a(o);
    a.add_zero<"data">(w, b);
    auto step = [&](sl::optim::AdamW& opt, sl::Param<Rep2>& pw, sl::Param<Rep1>& pb, int s) {
      opt.zero_grad();
      const Batch x = make_batch(mesh, 5, 7, 5, 900 + std::uint64_t(s));
      sl::backward(loss_of(pw, pb, x));
      opt.step();
    };
    for (int s = 0; s < 3; ++s) step(a, w, b, s);
    auto aw = a.state<sl::optim::zero_spec_t<Rep2, "data">>(w);
    auto ab = a.state<sl::optim::zero_spec_t<Rep1, "data">>(b);
    REQUIRE(aw.moments.size() == 2);  // AdamW: two moments
    CHECK(aw.master == nullptr);      // float32: no master weights
    sl::Param w2(w.value().clone());
    sl::Param b2(b.value().clone());
    sl::optim::AdamW c(o);
    c.add(w2, b2);  // DP: the state in the parameters' (replicated) specs
    auto cw = c.state<Spec<none, none>>(w2);
    auto cb = c.state<Spec<none>>(b2);
    for (std::size_t i = 0; i < 2; ++i) {
      cw.moments[i] = Rep2(aw.moments[i]);  // a reshard from split to replicated
      cb.moments[i] = Rep1(ab.moments[i]);
    }
    c.set_steps(a.steps());
    for (int s = 3; s < 5; ++s) {
      step(a, w, b, s);
      step(c, w2, b2, s);
    }
    CHECK(c.steps() == 5);
    CHECK(w2.value().to_host() == w.value().to_host());
    CHECK(b2.value().to_host() == b.value().to_host());
    // Bad calls, each naming what is wrong.
    CHECK(message_of<std::invalid_argument>([&] { (void)a.state<Spec<none, none>>(w); }).find("another state spec") !=
          std::string::npos);
    sl::Param other(Rep1::zeros(mesh, {5}));
    CHECK(message_of<std::invalid_argument>([&] { (void)a.state<Spec<none>>(other); }).find("was not added") !=
          std::string::npos);
    CHECK(message_of<std::invalid_argument>([&] { c.set_steps(-1); }).find("cannot be negative") != std::string::npos);
  });
}

TEST_CASE("a parameter added twice is refused") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices()});
    sl::Param w(Rep2::random(mesh, {7, 5}, 1, -1.f, 1.f));
    sl::Param b(Rep1::random(mesh, {5}, 2, -1.f, 1.f));
    const sl::Param<Rep2> w_copy = w;  // shares w's gradient: the same parameter
    sl::optim::AdamW opt(sl::optim::AdamWOptions{});
    opt.add(w);
    std::string msg = message_of<std::invalid_argument>([&] { opt.add(w); });
    CHECK(msg.find("already added") != std::string::npos);
    CHECK(message_of<std::invalid_argument>([&] { opt.add(w_copy); }).find("already added") != std::string::npos);
    CHECK(message_of<std::invalid_argument>([&] { opt.add_zero<"data">(w); }).find("already added") !=
          std::string::npos);
    CHECK(message_of<std::invalid_argument>([&] { opt.add(b, w); }).find("already added") != std::string::npos);
    CHECK(opt.size() == 2);  // b went in before w was refused
    CHECK(opt.num_parameters() == 7 * 5 + 5);
    sl::Param w_other(w.value().clone());  // another parameter with w's values: fine
    opt.add(w_other);
    CHECK(opt.size() == 3);
  });
}

TEST_CASE("bad options are refused, naming the option") {
  using sl::optim::AdamWOptions;
  using sl::optim::SGDOptions;
  auto sgd_error = [](SGDOptions o) { return message_of<std::invalid_argument>([&] { sl::optim::SGD opt(o); }); };
  auto adamw_error = [](AdamWOptions o) {
    return message_of<std::invalid_argument>([&] { sl::optim::AdamW opt(o); });
  };
  auto has = [](const std::string& msg, const char* words) {
    INFO(msg);
    CHECK(msg.find(words) != std::string::npos);
  };
  has(sgd_error(sgd(-0.1, 0, false, 0)), "lr is");
  has(sgd_error(sgd(qnan, 0, false, 0)), "lr is");
  has(sgd_error(sgd(0.1, 1.0, false, 0)), "momentum is");
  has(sgd_error(sgd(0.1, -0.5, false, 0)), "momentum is");
  has(sgd_error(sgd(0.1, 0, true, 0)), "Nesterov momentum needs momentum > 0");
  has(sgd_error(sgd(0.1, 0.9, false, -1)), "weight_decay is");
  has(sgd_error(sgd(0.1, 0.9, false, 0, -1)), "clip_norm is");
  has(adamw_error(adamw(-1e-3, 0.9, 0.999, 0)), "lr is");
  has(adamw_error(adamw(1e-3, 1.0, 0.999, 0)), "beta1 is");
  has(adamw_error(adamw(1e-3, -0.1, 0.999, 0)), "beta1 is");
  has(adamw_error(adamw(1e-3, 0.9, 1.0, 0)), "beta2 is");
  has(adamw_error(adamw(1e-3, 0.9, 0.999, -0.01)), "weight_decay is");
  has(adamw_error(adamw(1e-3, 0.9, 0.999, 0.01, qnan)), "clip_norm is");
  auto eps0 = adamw(1e-3, 0.9, 0.999, 0);
  eps0.eps = 0;
  has(adamw_error(eps0), "eps is");
  // A schedule replaces lr: then lr is not looked at.
  auto scheduled = adamw(qnan, 0.9, 0.999, 0);
  scheduled.schedule = [](std::int64_t) { return 1e-3; };
  CHECK(adamw_error(scheduled) == "no throw");
  CHECK(sgd_error(sgd(0.1, 0.9, true, 0.1)) == "no throw");
}

TEST_CASE("mixed precision: bf16 and f16 parameters step float32 master weights on every layout; 16 bytes per parameter") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        for (Layout l : all_layouts) {
          if (split_param(l)) {
            mixed_train_and_compare<sl::bf16, HTen<sl::bf16, Spec<"data", none>>, HTen<sl::bf16, Spec<"data">>>(ctx, l);
            mixed_train_and_compare<sl::f16, HTen<sl::f16, Spec<"data", none>>, HTen<sl::f16, Spec<"data">>>(ctx, l);
          } else {
            mixed_train_and_compare<sl::bf16, HTen<sl::bf16, Spec<none, none>>, HTen<sl::bf16, Spec<none>>>(ctx, l);
            mixed_train_and_compare<sl::f16, HTen<sl::f16, Spec<none, none>>, HTen<sl::f16, Spec<none>>>(ctx, l);
          }
        }
      },
      {1, 2, 4, 8});
}

TEST_CASE("mixed precision: 16-bit gradients are reduced in 16 bits (half the bytes), the values gathered back in 16 bits") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const int n = ctx.num_devices();
        if (n == 1 || 8 % n != 0) return;
        M mesh(ctx, {n});
        using W = HTen<sl::bf16, Spec<none, none>>;
        using Bias = HTen<sl::bf16, Spec<none>>;
        sl::Param w(W::random(mesh, {8, 16}, 1, -1.f, 1.f));
        sl::Param b(Bias::random(mesh, {16}, 2, -1.f, 1.f));
        sl::optim::AdamW opt(adamw(1e-3, 0.9, 0.999, 0.0, 0.0));
        opt.add_zero<"data">(w, b);  // ZeRO-2
        const Batch x = exact_batch(mesh, 2 * n, 8, 16, 5);
        sl::coll::CommRecorder bwd;
        sl::backward(mixed_loss_of(w, b, x), {.sync = false});
        // What a device sends: all but its own block, 2 bytes an element (float32 would be 4).
        const std::uint64_t sent = 2 * std::uint64_t(8 * 16 + 16) * std::uint64_t(n - 1) / std::uint64_t(n);
        CHECK_MESSAGE(bwd[Kind::reduce_scatter].calls == 2, bwd.to_string());
        CHECK(bwd[Kind::reduce_scatter].bytes_sent == sent);
        sl::coll::CommRecorder rec;
        opt.step();
        CHECK(rec[Kind::all_gather].calls == 2);
        CHECK(rec[Kind::all_gather].bytes_sent == sent);
      },
      {1, 2, 4, 8});
}

TEST_CASE("f16 loss scaling: an overflowing step is skipped whole and the scale backs off; the scale grows after good steps") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const int n = ctx.num_devices();
        M mesh(ctx, {n});
        using W = HTen<sl::f16, Spec<none, none>>;
        using Bias = HTen<sl::f16, Spec<none>>;
        sl::Param w(W::random(mesh, {8, 16}, 1, 0.5f, 1.f));
        sl::Param b(Bias::random(mesh, {16}, 2, 0.5f, 1.f));
        sl::optim::AdamWOptions o = adamw(1e-3, 0.9, 0.999, 0.0, 0.0);
        sl::optim::AdamW opt(o);
        opt.add(w, b);
        const auto host = [](const auto& t) {
          const auto v = t.to_host();
          return Host(v.begin(), v.end());
        };
        Reference ref(o, {host(w.value()), host(b.value())});
        // 2^30: every scaled gradient of at least 2^-14 overflows f16 (65504): the first steps overflow.
        sl::optim::LossScaler scaler({.init_scale = std::ldexp(1.0, 30), .growth_interval = 2});
        const Batch x = exact_batch(mesh, 4, 8, 16, 9);
        int skipped = 0;
        while (true) {
          opt.zero_grad();
          const double s = scaler.scale();
          sl::backward(mixed_loss_of(w, b, x, s));
          const Host w_before = host(w.value());
          if (opt.step(scaler)) break;
          ++skipped;
          CHECK(scaler.scale() == s / 2);
          CHECK(host(w.value()) == w_before);  // nothing changed
          CHECK(opt.steps() == 0);
          REQUIRE(skipped < 40);
        }
        // The gradients (at most 4 in magnitude, multiples of 1/2) fit by S = 2^13 at the latest
        // (and not before S = 2^16 at 1/2): each skip halved S.
        CHECK(skipped >= 14);
        CHECK(skipped <= 17);
        CHECK(scaler.scale() == std::ldexp(1.0, 30 - skipped));
        CHECK(scaler.skipped() == skipped);
        CHECK(opt.steps() == 1);
        ref.step(x.grads(), o.lr);  // the taken step used the unscaled gradients
        expect_rounded<sl::f16>(w.value(), ref.p[0], "f16 after the first taken step: w");
        expect_rounded<sl::f16>(b.value(), ref.p[1], "f16 after the first taken step: b");
        CHECK(std::abs(opt.last_grad_norm() - ref.norm_of(x.grads())) <= 1e-6 * ref.norm_of(x.grads()));
        // One more good step: two in a row, the scale doubles.
        opt.zero_grad();
        sl::backward(mixed_loss_of(w, b, x, scaler.scale()));
        CHECK(opt.step(scaler));
        CHECK(scaler.scale() == std::ldexp(1.0, 31 - skipped));
      },
      {1, 2, 4, 8});
}

TEST_CASE("LossScaler: bad options are refused, naming the option") {
  CHECK_THROWS_WITH_AS(sl::optim::LossScaler({.init_scale = 0}), doctest::Contains("init_scale is 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sl::optim::LossScaler({.growth_factor = 0.5}), doctest::Contains("growth_factor"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sl::optim::LossScaler({.backoff_factor = 1}), doctest::Contains("backoff_factor"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sl::optim::LossScaler({.growth_interval = 0}), doctest::Contains("growth_interval"), std::invalid_argument);
}

TEST_CASE("LossScaler: state() and set_state() continue a run as it would have gone on (checkpoints)") {
  sl::optim::LossScaler a({.growth_interval = 3}), b({.growth_interval = 3});
  for (bool finite : {true, false, true, true}) a.update(finite);
  b.set_state(a.state());
  for (bool finite : {true, true, false, true, true, true}) {  // (the second update grows S: 3 good in a row)
    a.update(finite);
    b.update(finite);
    CHECK(a.scale() == b.scale());
    CHECK(a.skipped() == b.skipped());
  }
  CHECK(b.state().good == a.state().good);
  const auto before = b.state();
  CHECK_THROWS_WITH_AS(b.set_state({0.0, 0, 0}), doctest::Contains("scale 0.000000"), std::invalid_argument);
  CHECK_THROWS_AS(b.set_state({1.0, -1, 0}), std::invalid_argument);
  CHECK(b.state().scale == before.scale);
}
}  // TEST_SUITE
