// SPDX-License-Identifier: Apache-2.0
// A user's translation unit, compiled as a user compiles theirs: -O2 -march=native -Wall -Wextra
// and -Werror (tests/meson.build). Every umbrella header, and the ops, gradients, optimizer,
// attention, stencil and pipeline code it instantiates, must be free of warnings under g++ >= 12
// and clang >= 14 — including third-party noise from the SIMD code our headers inline (g++ 12's
// AVX-512 intrinsics, GCC bug 105593: detail/attributes.hpp's SHARDLIB_SIMD_WARNINGS_OFF).
// It runs too, and checks its results are finite.
#include <shardlib/attention.hpp>
#include <shardlib/autodiff.hpp>
#include <shardlib/optim.hpp>
#include <shardlib/pipeline.hpp>
#include <shardlib/shardlib.hpp>
#include <shardlib/stencil.hpp>

#include <cmath>
#include <cstdio>

namespace sl = shardlib;
using sl::none;
using sl::Spec;

int main(int argc, char** argv) {
  auto rt = sl::Runtime::from_args(argc, argv, /*default_devices=*/4);
  int bad = 0;
  rt.spmd([&](sl::Context& ctx) {
    using M = sl::Mesh<"data", "model">;
    const M mesh(ctx, {ctx.num_devices() % 2 == 0 ? ctx.num_devices() / 2 : ctx.num_devices(), ctx.num_devices() % 2 == 0 ? 2 : 1});
    using X = sl::DistributedTensor<float, M, Spec<"data", none>>;
    using W1 = sl::DistributedTensor<float, M, Spec<none, "model">>;
    using W2 = sl::DistributedTensor<float, M, Spec<"model", none>>;
    using G = sl::DistributedTensor<float, M, Spec<none>>;
    const auto x = X::random(mesh, {8, 16}, 1, -1.f, 1.f);
    sl::Param w1(W1::random(mesh, {16, 32}, 2, -0.5f, 0.5f));
    sl::Param w2(W2::random(mesh, {32, 16}, 3, -0.5f, 0.5f));
    sl::Param g(G::full(mesh, {16}, 1.f));
    auto f = [&](const auto& a, const auto& b) {
      auto h = sl::gelu(sl::matmul(sl::layer_norm<1>(sl::Var<X>(x)) * g, a));
      auto s = sl::softmax<1>(h) + sl::log_softmax<1>(h) * 0.1f;
      return sl::mean_all(sl::square(sl::matmul(s * sl::exp(h) + sl::tanh(h) + sl::sigmoid(h), b)));
    };
    const auto [loss, grads] = sl::value_and_grad(f, w1.value(), w2.value());
    sl::optim::AdamW opt({.lr = 1e-3, .clip_norm = 1.0});
    opt.add(w1, w2, g);
    sl::backward(f(w1, w2));
    opt.step();
    const auto y = sl::rms_norm<1>(x) + sl::sqrt(sl::abs(x)) * sl::relu(x);
    const auto z = sl::sum<0>(y) + sl::max<0>(y) + sl::mean<0>(sl::log(sl::exp(y)));
    // Attention (heads over "model"), its gradient.
    using QKV = sl::DistributedTensor<float, M, Spec<"data", none, "model", none>>;
    sl::Param q(QKV::random(mesh, {2, 8, 2, 4}, 4)), k(QKV::random(mesh, {2, 8, 2, 4}, 5)), v(QKV::random(mesh, {2, 8, 2, 4}, 6));
    sl::backward(sl::sum_all(sl::attention(q, k, v, {.causal = true})));
    // A stencil sweep.
    using Grid = sl::DistributedTensor<double, M, Spec<"data", "model">>;
    auto u = Grid::random(mesh, {16, 16}, 7), w = Grid::zeros(mesh, {16, 16});
    auto gu = sl::ghosted(u, {1, 1}, {{{sl::Boundary::zero(), sl::Boundary::zero()}, {sl::Boundary::zero(), sl::Boundary::zero()}}});
    sl::stencil_for(w, gu, [](const sl::Index<2>&, const auto& nb) { return 0.25 * (nb(-1, 0) + nb(1, 0) + nb(0, -1) + nb(0, 1)); });
    // A pipeline schedule, printed.
    const auto table = sl::pipeline::schedule(sl::pipeline::Schedule::one_f_one_b, 2, 4);
    const double l = loss.to_host()[0], zz = z.to_host()[0], ww = w.to_host()[0], dq = q.grad().to_host()[0];
    if (ctx.device() == 0) {
      std::printf("loss %g, z %g, stencil %g, dq %g, bubble %.3f\n", l, zz, ww, dq, table.bubble());
      bad = !(std::isfinite(l) && std::isfinite(zz) && std::isfinite(ww) && std::isfinite(dq) && std::isfinite(std::get<0>(grads).to_host()[0]));
    }
  });
  return bad;
}
