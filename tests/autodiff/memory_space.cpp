// SPDX-License-Identifier: Apache-2.0
// Gradients and optimizer steps of tensors in the memory of Kokkos's default execution space:
// Kokkos::CudaSpace with a CUDA-enabled Kokkos (the GPU suite, docs/12_gpus.md), host memory
// otherwise (CI). Each program runs twice, on tensors in that memory and on tensors in host memory,
// on 1..4 devices (1..8 on a GPU), and the gradients and parameters must agree: the host run is the
// oracle of the device one. Covered: the backward of the elementwise ops, of matmul with tensor
// parallelism (the partial sums' all_reduce and reduce_scatter), of broadcasting (sum_to_shape, with
// the summed dims first and not), of sum and mean (expand_dim), of a cast (a bf16 parameter's float32
// gradient converted); gradients resolved in buckets (backward with sync = false, then step);
// AdamW with DP and ZeRO-1 layouts and clipping, SGD with momentum over bf16 parameters (float32
// master weights); cross_entropy (vocabulary-parallel) and layer_norm's backward; check_finite;
// and that a training step waits for no GPU stream. Also cross_entropy's device form against its
// host form, run on host memory (so that CI runs the device kernels' code).
#include <doctest/doctest.h>
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
  TEST_CASE("a training step on tensors in the default execution space's memory waits for no GPU stream") {
    on_devices(check_syncs);
  }
}
