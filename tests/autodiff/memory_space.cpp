// SPDX-License-Identifier: Apache-2.0
// Gradients and optimizer steps of tensors in the memory of Kokkos's default execution space:
// Kokkos::CudaSpace with a CUDA-enabled Kokkos (the GPU suite, docs/13_gpus.md), host memory
// otherwise (CI). Each program runs twice, on tensors in that memory and on tensors in host memory,
// on 1..4 devices (1..8 on a GPU), and the gradients and parameters must agree: the host run is the
// oracle of the device one. Covered: the backward of the elementwise ops, of matmul with tensor
// parallelism (the partial sums' all_reduce and reduce_scatter), of broadcasting (sum_to_shape, with
// the summed dims first and not), of sum and mean (expand_dim), of a cast (a bf16 parameter's float32
// gradient converted); gradients resolved in buckets (backward with sync = false, then step);
// AdamW with DP and ZeRO-1 layouts and clipping, SGD with momentum over bf16 parameters (float32
// master weights); cross_entropy (vocabulary-parallel) and layer_norm's backward; check_finite;
// and that a training step waits for no GPU stream. Also cross_entropy's device form against its
// host form, run on host memory (so that CI runs the device kernels' code); attention (cuDNN's
// fused kernel on a GPU in 16 bits) against the ops' form in float32 on host memory, forward and
// backward; and that a transformer layer's training step in steady state allocates nothing from
// the memory space and waits for no GPU stream.
#include <doctest/doctest.h>
#include <shardlib/attention.hpp>
#include <shardlib/autodiff.hpp>
#include <shardlib/optim.hpp>

#include "../collectives/harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {
using Mem = Kokkos::DefaultExecutionSpace::memory_space;
using M2 = sl::Mesh<"x", "y">;
template <class Spec, class Space, class T = float>
using T2 = sl::DistributedTensor<T, M2, Spec, Space>;
using Batch = sl::Spec<"x", none>;    // rows split over "x" (data parallelism)
using ColSplit = sl::Spec<none, "y">;  // a weight split by columns over "y" (tensor parallelism)
using RowSplit = sl::Spec<"y", none>;  // the next weight split by rows over "y"
using Rep = sl::Spec<none, none>;
using Bias = sl::Spec<none>;

M2 mesh_of(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 2 == 0 ? M2(ctx, {n / 2, 2}) : M2(ctx, {n, 1});
}

/// `got` against `want` elementwise, relative to 1e-3 + |want| (cuBLAS and the GPU's math differ
/// from the host's in the last bits; on host memory both runs are the same code).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what);
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / (1e-3 + std::abs(double(want[i]))));
  CHECK_MESSAGE(worst <= tol, what << ": relative difference " << worst);
}

/// A two-layer MLP with tensor-parallel weights and a broadcast bias: mean((gelu(x w1 + b1) w2 -
/// y)^2) + 0.1 mean(sum_1(w1)) + sum(s * b1) with s of shape [1, k] broadcast over rows (its sum
/// over the rows is summed dims first; a [rows, 1] broadcast is not). Returns the gradients.
template <class Space>
std::vector<std::vector<float>> mlp_gradients(sl::Context& ctx, bool sync, std::size_t bucket_bytes) {
  const M2 mesh = mesh_of(ctx);
  sl::Param w1(T2<ColSplit, Space>::random(mesh, {6, 8}, 1, -1.f, 1.f));
  sl::Param b1(sl::DistributedTensor<float, M2, Bias, Space>::random(mesh, {8}, 2, -0.5f, 0.5f));
  sl::Param w2(T2<RowSplit, Space>::random(mesh, {8, 5}, 3, -1.f, 1.f));
  sl::Param c(T2<Rep, Space>::random(mesh, {10, 1}, 4, -1.f, 1.f));
  const auto x = T2<Batch, Space>::random(mesh, {10, 6}, 5, -1.f, 1.f);
  const auto y = T2<Batch, Space>::random(mesh, {10, 5}, 6, -1.f, 1.f);
  auto h = sl::gelu(sl::matmul(x, w1) + b1);
  auto loss = sl::mse_loss(sl::matmul(h, w2), y) + sl::mean_all(sl::sum<1>(w1)) * 0.1f +
              sl::mean_all(sl::reshard<Batch>(h) * c);  // c [10, 1] broadcast along dim 1
  sl::backward(loss, {.sync = sync, .bucket_bytes = bucket_bytes});
  if (!sync) sl::sync_grads(bucket_bytes, w1, b1, w2, c);
  return {w1.grad().to_host(), b1.grad().to_host(), w2.grad().to_host(), c.grad().to_host()};
}

void check_gradients(sl::Context& ctx) {
  const std::string on = std::to_string(ctx.num_devices()) + " devices";
  for (const bool sync : {true, false}) {
    for (const std::size_t bucket : {std::size_t{0}, std::size_t{1} << 20}) {
      const auto got = mlp_gradients<Mem>(ctx, sync, bucket);
      const auto want = mlp_gradients<Kokkos::HostSpace>(ctx, sync, bucket);
      const std::string what = on + (sync ? ", synced" : ", sync_grads") + ", buckets of " + std::to_string(bucket);
      for (std::size_t k = 0; k < got.size(); ++k) expect_close(got[k], want[k], 1e-4, what + ", parameter " + std::to_string(k));
    }
  }
}

using Vocab = sl::Spec<"x", "y">;  // logits: rows over "x", classes over "y" (vocabulary-parallel)
using Rows1 = sl::Spec<"x">;

/// cross_entropy of vocabulary-split logits (a Param) and layer_norm along the split dim: the loss
/// and the gradients.
template <class Space>
std::vector<std::vector<float>> loss_gradients(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  sl::Param z(T2<Vocab, Space>::random(mesh, {7, 10}, 8, -3.f, 3.f));
  sl::Param a(T2<Vocab, Space>::random(mesh, {7, 10}, 9, -1.f, 2.f));
  const auto t = sl::DistributedTensor<std::int32_t, M2, Rows1, Space>::random(mesh, {7}, 10, 0, 9);
  auto loss = sl::cross_entropy(z, t) + sl::mean_all(sl::square(sl::layer_norm<1>(a) - z));
  sl::backward(loss);
  return {sl::DistributedTensor<float, M2, sl::Spec<>, Space>(loss.value()).to_host(), z.grad().to_host(),
          a.grad().to_host()};
}

void check_losses(sl::Context& ctx) {
  const auto got = loss_gradients<Mem>(ctx);
  const auto want = loss_gradients<Kokkos::HostSpace>(ctx);
  for (std::size_t k = 0; k < got.size(); ++k)
    expect_close(got[k], want[k], 1e-4, std::to_string(ctx.num_devices()) + " devices, value " + std::to_string(k));
}

/// The device form of cross_entropy (cross_entropy_run_in, cross_entropy_grad_in) run on host
/// memory against the host form, on the same blocks: the loss's addend, the log-sum-exp rows and
/// the gradient; and the bad target's error.
void check_cross_entropy_device_form(sl::Context& ctx) {
  namespace ad = sl::autodiff::detail;
  using H = Kokkos::HostSpace;
  const M2 mesh = mesh_of(ctx);
  const auto z = T2<Vocab, H>::random(mesh, {9, 13}, 11, -4.f, 4.f);
  for (const bool bad : {false, true}) {
    auto t = sl::DistributedTensor<std::int32_t, M2, Rows1, H>::random(mesh, {9}, 12, 0, 12);
    if (bad) t = sl::DistributedTensor<std::int32_t, M2, Rows1, H>::full(mesh, {9}, 13);
    sl::Sharding rows;
    rows.rank = 1;
    rows.dims[0] = T2<Vocab, H>::sharding.dims[0];
    const sl::detail::Block<std::int32_t> tb = sl::detail::block_as(t, rows);
    const sl::detail::Block<float> zb{nullptr, z.local().data(), z.block()};
    float host_out = -1, device_out = -1;
    ad::CrossEntropySaved<float> hs;
    ad::CrossEntropyRows ds;
    auto host_form = [&] {
      ad::cross_entropy_run<float, std::int32_t, H>(ctx, mesh.shape(), T2<Vocab, H>::sharding, z.shape(), zb, tb,
                                                     sl::detail::info(z), sl::detail::info(t), &host_out, hs);
    };
    auto device_form = [&] {
      ad::cross_entropy_run_in<float, std::int32_t, H>(ctx, mesh.shape(), T2<Vocab, H>::sharding, z.shape(), zb, tb,
                                                        sl::detail::info(z), sl::detail::info(t), &device_out, ds);
    };
    if (bad) {  // every device holding a row throws, naming its first row
      if (z.block().extent[0] > 0) {
        const std::string row = "target 13 of row " + std::to_string(z.block().offset[0]) + " is outside [0, 13)";
        CHECK_THROWS_WITH_AS(host_form(), doctest::Contains(row.c_str()), std::out_of_range);
        CHECK_THROWS_WITH_AS(device_form(), doctest::Contains(row.c_str()), std::out_of_range);
      }
      continue;
    }
    host_form();
    device_form();
    CHECK(device_out == doctest::Approx(host_out).epsilon(1e-5));
    const auto rows_here = static_cast<std::size_t>(z.block().extent[0]);
    const auto* lse = static_cast<const float*>(ds.lse.get());
    const auto* target = static_cast<const std::int64_t*>(ds.target.get());
    for (std::size_t r = 0; r < rows_here; ++r) {
      CHECK(lse[r] == doctest::Approx(hs.lse[r]).epsilon(1e-6));
      CHECK(target[r] == hs.target[r]);
    }
    const std::size_t n = static_cast<std::size_t>(z.block().num_elements());
    std::vector<float> gh(n), gd(n);
    const float g = 0.75f;
    ad::cross_entropy_grad<float>(zb, 9, hs, g, gh.data());
    ad::cross_entropy_grad_in<float, H>(ctx, zb, 9, ds, &g, gd.data());
    expect_close(gd, gh, 1e-6, "cross_entropy's gradient, device form");
  }
}

/// d/dw of sum(cast<float>(w)^2) for a bf16 w: the float32 gradient converted to bf16 (CastNode).
template <class Space>
std::vector<float> cast_gradient(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  sl::Param w(T2<Batch, Space, sl::bf16>::random(mesh, {9, 4}, 7, -2.f, 2.f));
  sl::backward(sl::sum_all(sl::square(sl::cast<float>(w))));
  return sl::cast<float>(w.grad()).to_host();
}

void check_cast(sl::Context& ctx) {
  CHECK(cast_gradient<Mem>(ctx) == cast_gradient<Kokkos::HostSpace>(ctx));
}

/// Three AdamW steps (clipped by the global norm; w1 in ZeRO-1 layout, the others DP) on the MLP,
/// then the parameters.
template <class Space>
std::vector<std::vector<float>> adamw_steps(sl::Context& ctx, double clip, bool sync) {
  const M2 mesh = mesh_of(ctx);
  sl::Param w1(T2<Rep, Space>::random(mesh, {6, 8}, 1, -1.f, 1.f));
  sl::Param b1(sl::DistributedTensor<float, M2, Bias, Space>::random(mesh, {8}, 2, -0.5f, 0.5f));
  sl::Param w2(T2<RowSplit, Space>::random(mesh, {8, 5}, 3, -1.f, 1.f));
  sl::optim::AdamWOptions o;
  o.lr = 0.05;
  o.clip_norm = clip;
  sl::optim::AdamW opt(o);
  opt.template add_zero<"x">(w1);
  opt.add(b1, w2);
  for (int s = 0; s < 3; ++s) {
    opt.zero_grad();
    const auto x = T2<Batch, Space>::random(mesh, {10, 6}, 10 + std::uint64_t(s), -1.f, 1.f);
    const auto y = T2<Batch, Space>::random(mesh, {10, 5}, 20 + std::uint64_t(s), -1.f, 1.f);
    sl::backward(sl::mse_loss(sl::matmul(sl::tanh(sl::matmul(x, w1) + b1), w2), y), {.sync = sync});
    opt.step();
  }
  return {w1.value().to_host(), b1.value().to_host(), w2.value().to_host()};
}

/// Two SGD steps with momentum of bf16 parameters (float32 master weights and momentum).
template <class Space>
std::vector<float> sgd_bf16_steps(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  sl::Param w(T2<Rep, Space, sl::bf16>::random(mesh, {6, 4}, 1, -1.f, 1.f));
  sl::optim::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 0.01;
  sl::optim::SGD opt(o);
  opt.add(w);
  for (int s = 0; s < 2; ++s) {
    opt.zero_grad();
    const auto x = T2<Batch, Space, sl::bf16>::random(mesh, {8, 6}, 30 + std::uint64_t(s), -1.f, 1.f);
    sl::backward(sl::mean_all(sl::square(sl::cast<float>(sl::matmul(x, w)))));
    opt.step();
  }
  return sl::cast<float>(w.value()).to_host();
}

void check_optimizers(sl::Context& ctx) {
  const std::string on = std::to_string(ctx.num_devices()) + " devices";
  for (const double clip : {0.0, 0.05}) {
    for (const bool sync : {true, false}) {
      const auto got = adamw_steps<Mem>(ctx, clip, sync);
      const auto want = adamw_steps<Kokkos::HostSpace>(ctx, clip, sync);
      for (std::size_t k = 0; k < got.size(); ++k)
        expect_close(got[k], want[k], 1e-4,
                     on + ", AdamW, clip " + std::to_string(clip) + (sync ? "" : ", sync = false") + ", parameter " +
                         std::to_string(k));
    }
  }
  expect_close(sgd_bf16_steps<Mem>(ctx), sgd_bf16_steps<Kokkos::HostSpace>(ctx), 1e-2, on + ", SGD over bf16");
}

/// check_finite finds a NaN in a gradient in device memory and names the op, on every device.
void check_finite(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  sl::Param w(T2<Batch, Mem>::random(mesh, {6, 4}, 1, 0.5f, 1.f));
  sl::backward(sl::sum_all(sl::log(w)), {.check_finite = true});  // finite: no throw
  const auto before = w.grad().to_host();
  auto bad = sl::sum_all(sl::sqrt(w - 1.f));  // sqrt(negative) = NaN, its derivative too
  CHECK_THROWS_WITH_AS(sl::backward(bad, {.check_finite = true}), doctest::Contains("op 'sqrt'"), std::runtime_error);
  CHECK(w.grad().to_host() == before);
}

/// A training step (forward, backward, AdamW without clipping) in steady state waits for no GPU
/// stream: every kernel, copy and collective is queued on the devices' streams.
void check_syncs(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  sl::Param w1(T2<ColSplit, Mem>::random(mesh, {6, 8}, 1, -1.f, 1.f));
  sl::Param w2(T2<RowSplit, Mem>::random(mesh, {8, 5}, 3, -1.f, 1.f));
  sl::optim::AdamW opt(sl::optim::AdamWOptions{});
  opt.add(w1, w2);
  const auto x = T2<Batch, Mem>::random(mesh, {10, 6}, 5, -1.f, 1.f);
  const auto y = T2<Batch, Mem>::random(mesh, {10, 5}, 6, -1.f, 1.f);
  auto step = [&] {
    opt.zero_grad();
    sl::backward(sl::mse_loss(sl::matmul(sl::gelu(sl::matmul(x, w1)), w2), y));
    opt.step();
  };
  step();  // the first step allocates the state and fills the block cache
  const sl::kernels::SyncCount before = sl::kernels::sync_count();
  step();
  if constexpr (!sl::detail::host_memory_v<Mem>) CHECK(sl::kernels::sync_count().device == before.device);
  CHECK(w1.value().to_host().size() == 48);
}

/// The one-launch backward of layer_norm and rms_norm over whole rows (NormBackwardRows, a team
/// per row: the device form) on a host instance, against the two-kernel form (NormBackwardSums
/// and NormBackwardApply, a row per work item), on the same blocks.
void check_norm_backward_rows(sl::Context& ctx) {
  namespace ad = sl::autodiff::detail;
  if (ctx.device() != 0) return;  // local kernels only
  const std::int64_t rows = 37, n = 50;
  auto data = [&](std::uint64_t seed) {
    std::vector<double> v(static_cast<std::size_t>(rows * n));
    std::uint64_t x = seed;
    for (auto& e : v) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      e = static_cast<double>(x >> 11) / 9007199254740992.0 * 2 - 1;
    }
    return v;
  };
  const auto x = data(1), g = data(2);
  for (const bool layer : {true, false}) {
    std::vector<double> y(x.size()), one(x.size()), two(x.size()), st(static_cast<std::size_t>(rows * 4));
    for (std::int64_t r = 0; r < rows; ++r) {  // the forward, row by row
      double m = 0, q = 0;
      for (std::int64_t j = 0; j < n; ++j) m += x[static_cast<std::size_t>(r * n + j)], q += x[static_cast<std::size_t>(r * n + j)] * x[static_cast<std::size_t>(r * n + j)];
      const double mu = layer ? m / n : 0, inv = 1 / std::sqrt((layer ? q / n - mu * mu : q / n) + 1e-5);
      for (std::int64_t j = 0; j < n; ++j) y[static_cast<std::size_t>(r * n + j)] = (x[static_cast<std::size_t>(r * n + j)] - mu) * inv;
    }
    ad::norm_backward_rows(ctx.exec(), x.data(), y.data(), g.data(), one.data(), rows, n, double(n), 1e-5, layer);
    // the tile of 32 elements a thread (rows up to 32 in registers, longer ones in chunks)
    std::vector<double> three(x.size(), -1);
    ad::norm_backward_rows(ctx.exec(), x.data(), y.data(), g.data(), three.data(), rows, n, double(n), 1e-5, layer,
                           sl::kernels::RowGroups{1, 1, 32});
    CHECK(three == one);
    for (std::int64_t r = 0; r < rows; ++r) {
      ad::NormBackwardSums<double>{x.data(), y.data(), g.data(), st.data(), n, 1, layer}(r);
      ad::NormBackwardApply<double>{y.data(), g.data(), st.data(), two.data(), n, 1, double(n), 1e-5, layer}(r);
    }
    double worst = 0;
    for (std::size_t i = 0; i < one.size(); ++i) worst = std::max(worst, std::abs(one[i] - two[i]));
    CHECK_MESSAGE(worst < 1e-12, (layer ? "layer_norm" : "rms_norm") << ": " << worst);
  }
}

/// The one-launch backwards (softmax's, the norms') in the default execution space's memory at
/// every row length a layout change of the GPU's row groups falls on (1 to 1024 threads a row,
/// rows in chunks past 8192, rows not a multiple of 16 bytes), float and bf16, against the same
/// kernels on the host (a thread a row, in order).
void check_backward_row_lengths(sl::Context& ctx) {
  namespace ad = sl::autodiff::detail;
  if (ctx.device() != 0) return;  // local kernels only
  const auto& exec = ctx.exec_for<Mem>();
  auto run = [&]<class T>(T, std::int64_t n) {
    const std::int64_t rows = std::max<std::int64_t>(3, 60000 / n), m = rows * n;
    std::vector<T> x(static_cast<std::size_t>(m)), y(x.size()), g(x.size());
    for (std::int64_t i = 0; i < m; ++i) {
      x[static_cast<std::size_t>(i)] = T(static_cast<float>((i * 37) % 101) / 25.0f - 2.0f);
      y[static_cast<std::size_t>(i)] = T(static_cast<float>((i * 53) % 97) / 97.0f);
      g[static_cast<std::size_t>(i)] = T(static_cast<float>((i * 29) % 89) / 30.0f - 1.5f);
    }
    Kokkos::View<T*, Mem> dx("x", x.size()), dy("y", x.size()), dg("g", x.size()), dout("out", x.size());
    auto up = [&](const std::vector<T>& h, const Kokkos::View<T*, Mem>& d) {
      Kokkos::deep_copy(d, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(h.data(), h.size()));
    };
    up(x, dx), up(y, dy), up(g, dg);
    auto down = [&] {
      exec.fence();
      std::vector<T> h(x.size());
      Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(h.data(), h.size()), dout);
      return h;
    };
    auto same = [&](const std::vector<T>& got, const std::vector<T>& want, const char* what) {
      const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-2;  // bf16: one rounding apart
      bool ok = true;
      for (std::size_t i = 0; ok && i < got.size(); ++i) {
        const double a = static_cast<float>(got[i]), b = static_cast<float>(want[i]);
        ok = std::abs(a - b) <= tol * (1 + std::abs(b));
      }
      CHECK_MESSAGE(ok, what << " of rows of " << n << (std::is_same_v<T, float> ? " (float)" : " (bf16)"));
    };
    std::vector<T> want(x.size());
    ad::softmax_backward_rows(exec, dy.data(), dg.data(), dout.data(), rows, n, 0.5);
    const auto sgot = down();
    ad::softmax_backward_rows(ctx.exec(), y.data(), g.data(), want.data(), rows, n, 0.5);
    same(sgot, want, "softmax's backward");
    for (const bool layer : {true, false}) {
      ad::norm_backward_rows(exec, dx.data(), dy.data(), dg.data(), dout.data(), rows, n, double(n), 1e-5, layer);
      const auto got = down();
      ad::norm_backward_rows(ctx.exec(), x.data(), y.data(), g.data(), want.data(), rows, n, double(n), 1e-5, layer);
      same(got, want, layer ? "layer_norm's backward" : "rms_norm's backward");
    }
  };
  for (const std::int64_t n : {1, 5, 8, 64, 100, 256, 257, 1024, 3001, 8192, 8200, 20000}) {
    run(0.0f, n);
    run(sl::bf16(0.0f), n);
  }
}

/// softmax's one-launch backward over whole rows (SoftmaxBackwardRows, the device form) on a host
/// instance, against scale y (g - sum(g y)) in double.
void check_softmax_backward_rows(sl::Context& ctx) {
  namespace ad = sl::autodiff::detail;
  if (ctx.device() != 0) return;  // local kernels only
  const std::int64_t rows = 23, n = 41;
  std::vector<double> y(static_cast<std::size_t>(rows * n)), g(y.size()), got(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    y[i] = 0.01 * static_cast<double>((i * 37) % 97);
    g[i] = 0.1 * static_cast<double>((i * 53) % 31) - 1.5;
  }
  for (const double scale : {1.0, 0.125}) {
    ad::softmax_backward_rows(ctx.exec(), y.data(), g.data(), got.data(), rows, n, scale);
    std::vector<double> lanes(y.size(), -1);  // the tile of 32 a thread (rows up to 32 in registers)
    ad::softmax_backward_rows(ctx.exec(), y.data(), g.data(), lanes.data(), rows, n, scale, sl::kernels::RowGroups{1, 1, 32});
    CHECK(lanes == got);
    double worst = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::int64_t j = 0; j < n; ++j) s += g[static_cast<std::size_t>(r * n + j)] * y[static_cast<std::size_t>(r * n + j)];
      for (std::int64_t j = 0; j < n; ++j) {
        const auto k = static_cast<std::size_t>(r * n + j);
        worst = std::max(worst, std::abs(got[k] - scale * y[k] * (g[k] - s)));
      }
    }
    CHECK_MESSAGE(worst < 1e-12, "scale " << scale << ": " << worst);
  }
}

/// The GPU's column sums of a gradient over its leading dims (SumRowsPartKernel, then
/// SumPartsKernel: partial sums over row ranges) on a host instance, against SumRowsKernel's.
void check_sum_rows_parts(sl::Context& ctx) {
  namespace ad = sl::autodiff::detail;
  if (ctx.device() != 0) return;  // local kernels only
  for (const std::int64_t m : {1, 7, 300}) {
    const std::int64_t n = 37;
    std::vector<float> g(static_cast<std::size_t>(m * n));
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 7919) % 17) - 8.f;
    for (const std::int64_t parts : {std::int64_t{1}, std::int64_t{3}, m}) {
      const std::int64_t each = (m + parts - 1) / parts;
      std::vector<float> partial(static_cast<std::size_t>(parts * n)), got(static_cast<std::size_t>(n)), want(got.size());
      for (std::int64_t i = 0; i < parts * n; ++i) ad::SumRowsPartKernel<float>{partial.data(), g.data(), n, m, each}(i);
      for (std::int64_t k = 0; k < n; ++k) ad::SumPartsKernel<float>{got.data(), partial.data(), n, parts}(k);
      for (std::int64_t k = 0; k < n; ++k) ad::SumRowsKernel<float, 1>{want.data(), g.data(), n, m}(k);
      CAPTURE(m);
      CAPTURE(parts);
      CHECK(got == want);  // integers: the sums are exact in any order
    }
  }
}

// ---- attention and a transformer layer ------------------------------------------------------------

template <class T, class Space>
using T4 = sl::DistributedTensor<T, M2, sl::Spec<"x", none, "y", none>, Space>;  // [B, S, H, K]

/// The largest |got - want| over the largest |want| (both to host, as float).
double relative_max(const std::vector<float>& got, const std::vector<float>& want) {
  double d = got.size() == want.size() ? 0.0 : 1e30, m = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    d = std::max(d, std::abs(double(got[i]) - double(want[i])));
    m = std::max(m, std::abs(double(want[i])));
  }
  return d / std::max(m, 1e-30);
}

/// attention of bf16 (or float) operands in `Space` with `kernel`: the output and q's, k's and v's
/// gradients of sum(float(o) w), as float on the host.
constexpr std::int64_t attention_b = 2, attention_s = 64, attention_h = 4, attention_k = 64;

/// (`products`: the matrix products' FLOPs this device counted in the forward and backward.)
template <class T, class Space>
std::vector<std::vector<float>> attention_run(const M2& mesh, bool causal, bool masked, sl::AttentionKernel kernel,
                                              std::uint64_t* products = nullptr) {
  const std::int64_t B = attention_b, S = attention_s, H = attention_h, K = attention_k;
  using F4 = T4<float, Space>;
  sl::Param q(T4<T, Space>(sl::cast<T>(F4::random(mesh, {B, S, H, K}, 1, -1.f, 1.f))));
  sl::Param k(T4<T, Space>(sl::cast<T>(F4::random(mesh, {B, S, H, K}, 2, -1.f, 1.f))));
  sl::Param v(T4<T, Space>(sl::cast<T>(F4::random(mesh, {B, S, H, K}, 3, -1.f, 1.f))));
  const auto w = F4::random(mesh, {B, S, H, K}, 4, -1.f, 1.f);
  const auto mask = sl::cast<T>(sl::DistributedTensor<float, M2, Rep, Space>::random(mesh, {S, S}, 5, -1.f, 1.f));
  const sl::AttentionOptions o{.causal = causal, .kernel = kernel};
  const sl::kernels::FlopCount f0 = sl::kernels::flop_count();
  auto out = masked ? sl::attention(q, k, v, mask, o) : sl::attention(q, k, v, o);
  sl::backward(sl::sum_all(sl::cast<float>(out) * w));
  if (products) *products = (sl::kernels::flop_count() - f0).gemm;
  return {sl::cast<float>(out.value()).to_host(), sl::cast<float>(q.grad()).to_host(), sl::cast<float>(k.grad()).to_host(),
          sl::cast<float>(v.grad()).to_host()};
}

/// attention in `Mem` on bf16 operands (cuDNN's fused kernel where the build and the machine have
/// it) against the ops' form in float32 on host memory: the output and q's, k's and v's gradients.
void check_attention(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  for (const bool causal : {false, true}) {
    for (const bool masked : {false, true}) {
      const std::string what = std::to_string(ctx.num_devices()) + " devices, causal " + std::to_string(causal) +
                               ", mask " + std::to_string(masked);
      const auto before = sl::attention_stats(ctx);
      std::uint64_t fused_products = 0;
      const auto got = attention_run<sl::bf16, Mem>(mesh, causal, masked, sl::AttentionKernel::automatic, &fused_products);
      const auto after = sl::attention_stats(ctx);
      const auto want = attention_run<float, Kokkos::HostSpace>(mesh, causal, masked, sl::AttentionKernel::unfused);
      const char* names[] = {"output", "q's gradient", "k's gradient", "v's gradient"};
      for (int i = 0; i < 4; ++i) {
        const double r = relative_max(got[static_cast<std::size_t>(i)], want[static_cast<std::size_t>(i)]);
        CHECK_MESSAGE(r < 3e-2, what << ", " << names[i] << ": bf16 in device memory against float32 on the host, "
                                     << r << " of the largest value");
      }
      // float32 through the ops in Mem (in GPU memory a causal mask alone is the softmax's own,
      // each row of the scores read up to its diagonal) against the same on the host
      const auto f32 = attention_run<float, Mem>(mesh, causal, masked, sl::AttentionKernel::unfused);
      for (int i = 0; i < 4; ++i) {
        const double r = relative_max(f32[static_cast<std::size_t>(i)], want[static_cast<std::size_t>(i)]);
        CHECK_MESSAGE(r < 1e-4, what << ", " << names[i] << ": float32 in device memory (the ops) against the host, "
                                     << r << " of the largest value");
      }
#if defined(SHARDLIB_HAVE_CUDNN) && defined(KOKKOS_ENABLE_CUDA)
      const std::string why = sl::kernels::cudnn::available();
      CHECK_MESSAGE((after.fused_forward > before.fused_forward || !why.empty()),
                    what << ": cuDNN loaded but the fused kernel did not run: " << after.fallback);
      if (!why.empty() && ctx.device() == 0) MESSAGE("cuDNN is not available here: " << why);
      if (why.empty()) {
        CHECK_MESSAGE(after.fused_backward > before.fused_backward, what << ": " << after.fallback);
        // The fused kernels' products counted (kernels::count_fused_products): 2 K a kept (query,
        // key) pair, twice in the forward and five times in the backward, on this device's block.
        const auto block = T4<float, Mem>::zeros(mesh, {attention_b, attention_s, attention_h, attention_k}).local_shape();
        const std::int64_t s = attention_s, pairs = causal ? s * (s + 1) / 2 : s * s;
        CHECK_MESSAGE(fused_products == static_cast<std::uint64_t>(2 * block[0] * block[2] * pairs * 7 * attention_k),
                      what << ": the fused kernels counted " << fused_products << " FLOPs of products");
      }
#else
      CHECK(after.unfused_forward > before.unfused_forward);
#endif
    }
  }
}

/// A pre-LN transformer layer (causal attention, a GELU MLP) with tensor-parallel weights over "y"
/// and the batch over "x", in element type E: its loss, mean(layer(x)^2).
template <class E>
struct Layer {
  template <class S>
  using P = sl::Param<sl::DistributedTensor<E, M2, S, Mem>>;
  using Act = sl::Spec<"x", none, none>;
  using Vec = sl::Spec<none>;
  P<Vec> g1, b1, g2, b2;
  P<sl::Spec<none, "y", none>> wq, wk, wv;
  P<sl::Spec<"y", none, none>> wo;
  P<ColSplit> w1;
  P<RowSplit> w2;
  static constexpr std::int64_t D = 64, H = 4, K = 16, F = 256;
  template <class S, std::size_t N>
  static P<S> init(const M2& mesh, const std::int64_t (&shape)[N], std::uint64_t seed) {
    return P<S>(sl::cast<E>(sl::DistributedTensor<float, M2, S, Mem>::random(mesh, shape, seed, -0.1f, 0.1f)));
  }
  explicit Layer(const M2& m)
      : g1(init<Vec>(m, {D}, 1)), b1(init<Vec>(m, {D}, 2)), g2(init<Vec>(m, {D}, 3)), b2(init<Vec>(m, {D}, 4)),
        wq(init<sl::Spec<none, "y", none>>(m, {D, H, K}, 5)), wk(init<sl::Spec<none, "y", none>>(m, {D, H, K}, 6)),
        wv(init<sl::Spec<none, "y", none>>(m, {D, H, K}, 7)), wo(init<sl::Spec<"y", none, none>>(m, {H, K, D}, 8)),
        w1(init<ColSplit>(m, {D, F}, 9)), w2(init<RowSplit>(m, {F, D}, 10)) {}
  template <class X>
  auto loss(const X& x) const {
    auto a = sl::layer_norm<2>(x) * g1 + b1;
    auto q = sl::einsum<"bsd,dhk->bshk">(a, wq);
    auto k = sl::einsum<"bsd,dhk->bshk">(a, wk);
    auto v = sl::einsum<"bsd,dhk->bshk">(a, wv);
    auto x1 = x + sl::reshard<Act>(sl::einsum<"bqhk,hkd->bqd">(sl::attention(q, k, v, {.causal = true}), wo));
    auto h = sl::layer_norm<2>(x1) * g2 + b2;
    auto y = x1 + sl::reshard<Act>(sl::einsum<"bsf,fd->bsd">(sl::gelu(sl::einsum<"bsd,df->bsf">(h, w1)), w2));
    return sl::mean_all(sl::square(sl::cast<float>(y)));
  }
};

/// A transformer layer's training step (forward, backward, AdamW) in steady state asks the block
/// cache's memory space for nothing and waits for no GPU stream, in float32 and in bf16.
template <class E>
void check_layer_step(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  Layer<E> layer(mesh);
  sl::optim::AdamW opt(sl::optim::AdamWOptions{});
  opt.add(layer.g1, layer.b1, layer.g2, layer.b2, layer.wq, layer.wk, layer.wv, layer.wo, layer.w1, layer.w2);
  const auto x = sl::cast<E>(sl::DistributedTensor<float, M2, typename Layer<E>::Act, Mem>::random(mesh, {4, 64, 64}, 11, -1.f, 1.f));
  auto step = [&] {
    opt.zero_grad();
    sl::backward(layer.loss(x));
    opt.step();
  };
  for (int s = 0; s < 3; ++s) step();  // the state, the cache's blocks, cuDNN's graphs
  const sl::BlockCacheStats before = sl::block_cache_stats<Mem>(ctx);
  const sl::kernels::SyncCount syncs = sl::kernels::sync_count();
  for (int s = 0; s < 2; ++s) step();
  const sl::BlockCacheStats after = sl::block_cache_stats<Mem>(ctx);
  const std::string what = std::string(sl::element_name<E>()) + ", " + std::to_string(ctx.num_devices()) + " devices";
  CHECK_MESSAGE(after.space_allocations == before.space_allocations,
                what << ": two steps allocated " << after.space_allocations - before.space_allocations << " blocks");
  CHECK_MESSAGE(after.space_frees == before.space_frees,
                what << ": two steps freed " << after.space_frees - before.space_frees << " blocks");
  CHECK(after.hits > before.hits);  // the step's blocks came from the cache
  if constexpr (!sl::detail::host_memory_v<Mem>)
    CHECK_MESSAGE(sl::kernels::sync_count().device == syncs.device,
                  what << ": two steps waited " << sl::kernels::sync_count().device - syncs.device << " times");
}

void on_devices(const std::function<void(sl::Context&)>& body) { sl::test::for_each_run_in<Mem>(body); }
}  // namespace

TEST_SUITE("autodiff_memory_space") {
  TEST_CASE("gradients of tensors in the default execution space's memory against host memory") {
    on_devices(check_gradients);
  }
  TEST_CASE("the gradient of a cast of a bf16 parameter in the default execution space's memory") {
    on_devices(check_cast);
  }
  TEST_CASE("AdamW and SGD steps of parameters in the default execution space's memory against host memory") {
    on_devices(check_optimizers);
  }
  TEST_CASE("cross_entropy and layer_norm's backward on tensors in the default execution space's memory") {
    on_devices(check_losses);
  }
  TEST_CASE("cross_entropy's device form against its host form, on host memory") {
    on_devices(check_cross_entropy_device_form);
  }
  TEST_CASE("check_finite on gradients in the default execution space's memory") { on_devices(check_finite); }
  TEST_CASE("layer_norm's and rms_norm's one-launch backward (a team per row) against the two-kernel form, on the host") {
    sl::test::for_each_run(check_norm_backward_rows, {1});
  }
  TEST_CASE("a bias's gradient summed over rows in two launches (the GPU's form) against one, on the host") {
    sl::test::for_each_run(check_sum_rows_parts, {1});
  }
  TEST_CASE("softmax's one-launch backward (a team per row, the GPU's form) against the formula, on the host") {
    sl::test::for_each_run(check_softmax_backward_rows, {1});
  }
  TEST_CASE("softmax's and the norms' one-launch backwards at every row length, in the default execution space's memory against the host") {
    sl::test::for_each_run(check_backward_row_lengths, {1});
  }
  TEST_CASE("a training step on tensors in the default execution space's memory waits for no GPU stream") {
    on_devices(check_syncs);
  }
  TEST_CASE("attention in the default execution space's memory (cuDNN's fused kernel on a GPU) against the ops") {
    on_devices(check_attention);
  }
  TEST_CASE("a transformer layer's training step in steady state allocates nothing and waits for no GPU stream") {
    on_devices(check_layer_step<float>);
    on_devices(check_layer_step<sl::bf16>);
  }
}
