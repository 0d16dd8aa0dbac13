// SPDX-License-Identifier: Apache-2.0
// Gradients of whole small models on sharded layouts equal the one-device gradients (the same
// model on a mesh of one device's worth of layout: everything replicated), and the backward
// pass's collectives are exactly the transposes of the forward's plus one reduction per
// parameter bucket: data parallelism (one all_reduce per bucket), FSDP (one reduce_scatter per
// parameter), Megatron's column/row-parallel pair (one all_reduce in the backward as in the
// forward). Runs on 1..8 threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/autodiff.hpp>

#include "../collectives/harness.hpp"
#include "../ops/oracle.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace sl = shardlib;
namespace oracle = shardlib::test::oracle;
using sl::none;
using sl::Spec;
using Kind = sl::coll::Kind;

namespace {
using M = sl::Mesh<"data", "model">;
template <class S, class T = float>
using Ten = sl::DistributedTensor<T, M, S>;

/// Checks that two tensors hold the same global values within `tol` (relative).
template <class A, class B>
void expect_close(const A& a, const B& b, double tol, const std::string& what) {
  const auto x = a.to_host();
  const auto y = b.to_host();
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(double(x[i]) - double(y[i])) / (1e-3 + std::abs(double(y[i]))));
  CHECK_MESSAGE(worst <= tol, what << ": relative difference " << worst);
}

/// A two-layer MLP with biases: mean((relu(x w1 + b1) w2 + b2 - y)^2).
template <class X, class W1, class B1, class W2, class B2, class Y>
auto mlp_loss(const X& x, const W1& w1, const B1& b1, const W2& w2, const B2& b2, const Y& y) {
  auto h = sl::relu(sl::matmul(x, w1) + b1);
  return sl::mse_loss(sl::matmul(h, w2) + b2, y);
}

/// A pre-LN transformer block (attention with heads, layer norms with scale and bias, a GELU
/// MLP, residuals); `Hidden` is the spec the row-parallel partial sums resolve to.
template <class Hidden, class X, class P3, class PO, class P1, class P2, class PV, class Y>
auto block_loss(const X& x, const P3& wq, const P3& wk, const P3& wv, const PO& wo, const P1& w1, const P2& w2,
                const PV& g1, const PV& b1, const PV& g2, const PV& b2, const Y& target) {
  auto a = sl::layer_norm<2>(x) * g1 + b1;
  auto q = sl::einsum<"bsd,dhk->bshk">(a, wq);
  auto k = sl::einsum<"bsd,dhk->bshk">(a, wk);
  auto v = sl::einsum<"bsd,dhk->bshk">(a, wv);
  auto p = sl::softmax<3>(sl::einsum<"bqhk,bshk->bhqs">(q, k) * 0.5f);
  auto att = sl::einsum<"bhqs,bshk->bqhk">(p, v);
  auto h = x + sl::reshard<Hidden>(sl::einsum<"bqhk,hkd->bqd">(att, wo));
  auto f = sl::gelu(sl::einsum<"bsd,df->bsf">(sl::layer_norm<2>(h) * g2 + b2, w1));
  auto out = h + sl::reshard<Hidden>(sl::einsum<"bsf,fd->bsd">(f, w2));
  return sl::mse_loss(out, target);
}

TEST_SUITE("autodiff_models") {
TEST_CASE("transformer block: data and tensor parallel gradients equal the one-device gradients") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const int model = ctx.num_devices() % 2 == 0 ? 2 : 1;
    M mesh(ctx, {ctx.num_devices() / model, model});
    constexpr std::int64_t B = 4, S = 3, D = 8, H = 2, K = 4, F = 12;
    using Hidden = Spec<"data", none, none>;
    using Rep3 = Spec<none, none, none>;
    const auto x = Ten<Hidden>::random(mesh, {B, S, D}, 1, -1.f, 1.f);
    const auto y = Ten<Hidden>::random(mesh, {B, S, D}, 2, -1.f, 1.f);
    sl::Param wq(Ten<Spec<none, "model", none>>::random(mesh, {D, H, K}, 3, -0.4f, 0.4f));
    sl::Param wk(Ten<Spec<none, "model", none>>::random(mesh, {D, H, K}, 4, -0.4f, 0.4f));
    sl::Param wv(Ten<Spec<none, "model", none>>::random(mesh, {D, H, K}, 5, -0.4f, 0.4f));
    sl::Param wo(Ten<Spec<"model", none, none>>::random(mesh, {H, K, D}, 6, -0.4f, 0.4f));
    sl::Param w1(Ten<Spec<none, "model">>::random(mesh, {D, F}, 7, -0.4f, 0.4f));
    sl::Param w2(Ten<Spec<"model", none>>::random(mesh, {F, D}, 8, -0.4f, 0.4f));
    sl::Param g1(Ten<Spec<none>>::random(mesh, {D}, 9, 0.5f, 1.5f)), b1(Ten<Spec<none>>::random(mesh, {D}, 10, -0.1f, 0.1f));
    sl::Param g2(Ten<Spec<none>>::random(mesh, {D}, 11, 0.5f, 1.5f)), b2(Ten<Spec<none>>::random(mesh, {D}, 12, -0.1f, 0.1f));
    sl::coll::CommRecorder fwd;
    auto loss = block_loss<Hidden>(x, wq, wk, wv, wo, w1, w2, g1, b1, g2, b2, y);
    CHECK(fwd[Kind::all_reduce].calls == (model > 1 ? 2u : 0u));  // Megatron's two
    CHECK(fwd.total_calls() == fwd[Kind::all_reduce].calls);
    sl::coll::CommRecorder bwd;
    sl::backward(loss);
    // Backward: the two input gradients of the column-parallel products (Megatron's f), and one
    // bucket for the replicated parameters' pending sums over "data".
    const unsigned want = (model > 1 ? 2u : 0u) + (ctx.num_devices() / model > 1 ? 1u : 0u);
    CHECK(bwd[Kind::all_reduce].calls == want);
    CHECK(bwd.total_calls() == bwd[Kind::all_reduce].calls);

    sl::Param rq(sl::reshard<Rep3>(wq.value())), rk(sl::reshard<Rep3>(wk.value())), rv(sl::reshard<Rep3>(wv.value()));
    sl::Param ro(sl::reshard<Rep3>(wo.value()));
    sl::Param r1(sl::reshard<Spec<none, none>>(w1.value())), r2(sl::reshard<Spec<none, none>>(w2.value()));
    sl::Param rg1(g1.value().clone()), rb1(b1.value().clone()), rg2(g2.value().clone()), rb2(b2.value().clone());
    sl::backward(block_loss<Rep3>(sl::reshard<Rep3>(x), rq, rk, rv, ro, r1, r2, rg1, rb1, rg2, rb2, sl::reshard<Rep3>(y)));
    expect_close(wq.grad(), rq.grad(), 5e-5, "wq");
    expect_close(wk.grad(), rk.grad(), 5e-5, "wk");
    expect_close(wv.grad(), rv.grad(), 5e-5, "wv");
    expect_close(wo.grad(), ro.grad(), 5e-5, "wo");
    expect_close(w1.grad(), r1.grad(), 5e-5, "w1");
    expect_close(w2.grad(), r2.grad(), 5e-5, "w2");
    expect_close(g1.grad(), rg1.grad(), 5e-5, "g1");
    expect_close(b1.grad(), rb1.grad(), 5e-5, "b1");
    expect_close(g2.grad(), rg2.grad(), 5e-5, "g2");
    expect_close(b2.grad(), rb2.grad(), 5e-5, "b2");
  });
}

TEST_CASE("data parallel MLP: one-device gradients, one all_reduce per bucket") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1});
    using Rep2 = Spec<none, none>;
    using Rep1 = Spec<none>;
    using Batch = Spec<"data", none>;
    const auto x = Ten<Batch>::random(mesh, {16, 8}, 1, -1.f, 1.f);
    const auto y = Ten<Batch>::random(mesh, {16, 4}, 2, -1.f, 1.f);
    sl::Param w1(Ten<Rep2>::random(mesh, {8, 12}, 3, -0.5f, 0.5f));
    sl::Param b1(Ten<Rep1>::random(mesh, {12}, 4, -0.1f, 0.1f));
    sl::Param w2(Ten<Rep2>::random(mesh, {12, 4}, 5, -0.5f, 0.5f));
    sl::Param b2(Ten<Rep1>::random(mesh, {4}, 6, -0.1f, 0.1f));
    sl::coll::CommRecorder fwd;
    auto loss = mlp_loss(x, w1, b1, w2, b2, y);
    const auto forward_calls = fwd.total_calls();
    CHECK(forward_calls == 0);  // the loss stays partial over "data"
    {
      sl::coll::CommRecorder rec;
      sl::backward(loss);
      const bool many = ctx.num_devices() > 1;
      CHECK(rec[Kind::all_reduce].calls == (many ? 1u : 0u));  // the four gradients in one bucket
      CHECK(rec.total_calls() == rec[Kind::all_reduce].calls);
    }
    {  // bucket_bytes = 0: one all_reduce per parameter
      auto l2 = mlp_loss(x, w1, b1, w2, b2, y);
      sl::coll::CommRecorder rec;
      sl::backward(l2, {.bucket_bytes = 0});
      CHECK(rec[Kind::all_reduce].calls == (ctx.num_devices() > 1 ? 4u : 0u));
    }
    // One device's worth: the same model replicated (no mesh axis splits anything).
    const auto xr = sl::reshard<Rep2>(x);
    const auto yr = sl::reshard<Rep2>(y);
    sl::Param v1(w1.value().clone()), v2(w2.value().clone());
    sl::Param c1(b1.value().clone()), c2(b2.value().clone());
    sl::backward(mlp_loss(xr, v1, c1, v2, c2, yr));
    sl::backward(mlp_loss(xr, v1, c1, v2, c2, yr));
    expect_close(w1.grad(), v1.grad(), 5e-5, "w1");
    expect_close(b1.grad(), c1.grad(), 5e-5, "b1");
    expect_close(w2.grad(), v2.grad(), 5e-5, "w2");
    expect_close(b2.grad(), c2.grad(), 5e-5, "b2");
  });
}

TEST_CASE("buckets with empty blocks: a weight whose columns leave some devices none resolves on every device") {
  // w [3, 4] split over "model" by columns: 4 over 3 devices are 2, 2 and 0, so the devices of
  // the last "model" coordinate hold an empty block and their bucket of its gradient (partial
  // over "data") has no bytes. Making the "data" group is a collective of every device: before,
  // those devices skipped it with their empty all_reduce and went on to the next collective
  // while the others waited in it (found as a hang of moe's traffic test on 6 devices, 2 x 3).
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const int n = ctx.num_devices();
        M mesh(ctx, {n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n});
        const auto x = Ten<Spec<"data", none>>::random(mesh, {4, 3}, 1, -1.f, 1.f);
        sl::Param w(Ten<Spec<none, "model">>::random(mesh, {3, 4}, 2, -1.f, 1.f));
        sl::coll::CommRecorder rec;
        sl::backward(sl::sum_all(sl::square(sl::matmul(x, w))));
        // w's bucket over "data", where it has more than one device and bytes (an empty bucket is
        // empty on its whole group, which skips it)
        const bool empty = w.value().block().num_elements() == 0;
        CHECK(rec[Kind::all_reduce].calls == (mesh.shape().size(0) > 1 && !empty ? 1u : 0u));
        // Every device out of the backward, at the same collective (a device still making the
        // group would meet this one instead).
        int one = 1;
        ctx.world().all_reduce(&one, &one, 1, sl::coll::dtype_of<int>(), sl::coll::Op::sum);
        CHECK(one == n);
        // One device's worth.
        const auto xr = sl::reshard<Spec<none, none>>(x);
        sl::Param v(sl::reshard<Spec<none, none>>(w.value()));
        sl::backward(sl::sum_all(sl::square(sl::matmul(xr, v))));
        expect_close(sl::reshard<Spec<none, none>>(w.grad()), v.grad(), 1e-5, "w");
      },
      {1, 3, 5, 6});
}

TEST_CASE("FSDP: the all_gather of a split weight transposes to one reduce_scatter per parameter") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1});
    using Rep2 = Spec<none, none>;
    using Shard = Spec<"data", none>;
    using Batch = Spec<"data", none>;
    const auto x = Ten<Batch>::random(mesh, {12, 8}, 1, -1.f, 1.f);
    const auto y = Ten<Batch>::random(mesh, {12, 4}, 2, -1.f, 1.f);
    sl::Param w1(Ten<Shard>::random(mesh, {8, 10}, 3, -0.5f, 0.5f));
    sl::Param w2(Ten<Shard>::random(mesh, {10, 4}, 5, -0.5f, 0.5f));
    auto loss_of = [&](const auto& a, const auto& b, const auto& xs, const auto& ys) {
      auto h = sl::tanh(sl::matmul(xs, sl::reshard<Rep2>(a)));  // all_gather of the weight
      return sl::mse_loss(sl::matmul(h, sl::reshard<Rep2>(b)), ys);
    };
    sl::coll::CommRecorder fwd;
    auto loss = loss_of(w1, w2, x, y);
    const bool many = ctx.num_devices() > 1;
    CHECK(fwd[Kind::all_gather].calls + fwd[Kind::all_to_all].calls == (many ? 2u : 0u));
    sl::coll::CommRecorder rec;
    sl::backward(loss);
    CHECK(rec[Kind::reduce_scatter].calls == (many ? 2u : 0u));
    CHECK(rec.total_calls() == rec[Kind::reduce_scatter].calls);
    CHECK(std::is_same_v<decltype(w1.grad()), Ten<Shard>>);
    sl::Param v1(sl::reshard<Rep2>(w1.value())), v2(sl::reshard<Rep2>(w2.value()));
    sl::backward(loss_of(v1, v2, sl::reshard<Rep2>(x), sl::reshard<Rep2>(y)));
    expect_close(w1.grad(), v1.grad(), 5e-5, "w1");
    expect_close(w2.grad(), v2.grad(), 5e-5, "w2");
  });
}

TEST_CASE("Megatron MLP: one all_reduce in the forward, one in the backward") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {1, ctx.num_devices()});
    using Rep2 = Spec<none, none>;
    sl::Param x(Ten<Rep2>::random(mesh, {6, 8}, 1, -1.f, 1.f));
    const auto y = Ten<Rep2>::random(mesh, {6, 8}, 2, -1.f, 1.f);
    sl::Param w1(Ten<Spec<none, "model">>::random(mesh, {8, 16}, 3, -0.5f, 0.5f));
    sl::Param w2(Ten<Spec<"model", none>>::random(mesh, {16, 8}, 4, -0.5f, 0.5f));
    auto loss_of = [&](const auto& xs, const auto& a, const auto& b) {
      auto h = sl::gelu(sl::matmul(xs, a));           // column-parallel: no communication
      auto out = sl::reshard<Rep2>(sl::matmul(h, b));  // row-parallel: the all_reduce
      return sl::mse_loss(out, y);
    };
    const bool many = ctx.num_devices() > 1;
    sl::coll::CommRecorder fwd;
    auto loss = loss_of(x, w1, w2);
    CHECK(fwd[Kind::all_reduce].calls == (many ? 1u : 0u));
    CHECK(fwd.total_calls() == fwd[Kind::all_reduce].calls);
    sl::coll::CommRecorder rec;
    sl::backward(loss);
    CHECK(rec[Kind::all_reduce].calls == (many ? 1u : 0u));  // the input's gradient
    CHECK(rec.total_calls() == rec[Kind::all_reduce].calls);
    sl::Param x1(x.value().clone()), v1(sl::reshard<Rep2>(w1.value())), v2(sl::reshard<Rep2>(w2.value()));
    sl::backward(loss_of(x1, v1, v2));
    expect_close(x.grad(), x1.grad(), 5e-5, "x");
    expect_close(w1.grad(), v1.grad(), 5e-5, "w1");
    expect_close(w2.grad(), v2.grad(), 5e-5, "w2");
  });
}

TEST_CASE("backward: accumulation, deferred resolution, buckets, value_and_grad") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1});
    using Rep2 = Spec<none, none>;
    using Rep1 = Spec<none>;
    using Batch = Spec<"data", none>;
    const bool many = ctx.num_devices() > 1;
    const auto x = Ten<Batch>::random(mesh, {16, 8}, 1, -1.f, 1.f);
    const auto y = Ten<Batch>::random(mesh, {16, 4}, 2, -1.f, 1.f);
    sl::Param w1(Ten<Rep2>::random(mesh, {8, 12}, 3, -0.5f, 0.5f));
    sl::Param b1(Ten<Rep1>::random(mesh, {12}, 4, -0.1f, 0.1f));
    sl::Param w2(Ten<Rep2>::random(mesh, {12, 4}, 5, -0.5f, 0.5f));
    sl::Param b2(Ten<Rep1>::random(mesh, {4}, 6, -0.1f, 0.1f));
    sl::backward(mlp_loss(x, w1, b1, w2, b2, y));
    const auto once = w1.grad().to_host();
    // Two micro-batches with the resolution deferred: no collective until sync_grads, then one.
    w1.zero_grad(), b1.zero_grad(), w2.zero_grad(), b2.zero_grad();
    {
      sl::coll::CommRecorder rec;
      sl::backward(mlp_loss(x, w1, b1, w2, b2, y), {.sync = false});
      sl::backward(mlp_loss(x, w1, b1, w2, b2, y), {.sync = false});
      CHECK(rec.total_calls() == 0);
      CHECK_THROWS_WITH_AS(w1.grad(), doctest::Contains("call sync_grads first"), std::logic_error);
      sl::sync_grads(w1, b1, w2, b2);
      CHECK(rec[Kind::all_reduce].calls == (many ? 1u : 0u));
    }
    const auto twice = w1.grad().to_host();
    for (std::size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == doctest::Approx(2 * once[i]).epsilon(1e-5));
    // Buckets of at most the size of w1's gradient: w1 alone, then b1 + w2 + b2 do not fit one.
    {
      auto l = mlp_loss(x, w1, b1, w2, b2, y);
      sl::coll::CommRecorder rec;
      sl::backward(l, {.bucket_bytes = 8 * 12 * sizeof(float)});
      CHECK(rec[Kind::all_reduce].calls == (many ? 2u : 0u));
    }
    // keep_graph: a second backward through the same graph; without it, a clear error.
    {
      w1.zero_grad();
      auto l = mlp_loss(x, w1, b1, w2, b2, y);
      sl::backward(l, {.keep_graph = true});
      sl::backward(l);
      const auto g = w1.grad().to_host();
      for (std::size_t i = 0; i < once.size(); ++i) CHECK(g[i] == doctest::Approx(2 * once[i]).epsilon(1e-5));
      CHECK_THROWS_WITH_AS(sl::backward(l), doctest::Contains("whose saved tensors a previous backward freed"),
                           std::logic_error);
    }
    // value_and_grad: JAX's functional form.
    auto [loss, grads] = sl::value_and_grad(
        [&](const auto& a, const auto& b) { return mlp_loss(x, a, b1.value(), b, b2.value(), y); }, w1.value(),
        w2.value());
    CHECK(std::is_same_v<std::remove_cvref_t<decltype(std::get<0>(grads))>, Ten<Rep2>>);
    const auto g0 = std::get<0>(grads).to_host();
    for (std::size_t i = 0; i < once.size(); ++i) CHECK(g0[i] == doctest::Approx(once[i]).epsilon(1e-5));
    // The loss comes back resolved (no partial clause: replicated), its number on every device.
    static_assert(!std::remove_cvref_t<decltype(loss)>::sharding.is_partial());
    CHECK(loss.item() > 0);
    CHECK(loss.item() == doctest::Approx(mlp_loss(x, w1, b1, w2, b2, y).value().to_host()[0]));
    // Nothing recorded for constants.
    const sl::Var<Ten<Rep2>> c(w1.value());
    CHECK(!(sl::exp(c) * 2.f).requires_grad());
    CHECK((sl::exp(c) * w1).requires_grad());
  });
}

TEST_CASE("backward: each node's saved tensors are freed once its rule ran: the activations shrink as the gradients grow") {
  // Six [64, 64] weights in a chain over 8 rows: a layer's saved activation (its tanh's output,
  // the next matmul's input: 2 KiB) is smaller than its weight's gradient (16 KiB), pending
  // until the pass resolves it at the end. Freed as the pass goes, the high point holds the
  // gradients and no layer's activations but the last one (which the caller holds); with
  // keep_graph, every layer's too. The gradients are equal, bit for bit.
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1});
    using W = Ten<Spec<none, none>>;
    constexpr int K = 6;
    constexpr std::int64_t A = 8 * 64 * sizeof(float);  // one layer's activation
    std::vector<sl::Param<W>> w;
    for (int k = 0; k < K; ++k) w.emplace_back(W::random(mesh, {64, 64}, 10 + k, -0.2f, 0.2f));
    const auto x = W::random(mesh, {8, 64}, 3, -1.f, 1.f);
    auto run = [&](bool keep, std::vector<std::vector<float>>& grads) {
      for (auto& p : w) p.zero_grad();
      auto h = sl::tanh(sl::matmul(x, w[0]));
      for (int k = 1; k < K; ++k) h = sl::tanh(sl::matmul(h, w[static_cast<std::size_t>(k)]));
      auto loss = sl::sum_all(h);
      sl::reset_peak_memory(ctx);
      const std::int64_t start = sl::memory_usage(ctx).total();
      sl::backward(loss, {.keep_graph = keep});
      const std::int64_t high = sl::memory_usage(ctx).peak - start;
      for (auto& p : w) grads.push_back(p.grad().to_host());
      return high;
    };
    std::vector<std::vector<float>> kept_grads, freed_grads;
    const std::int64_t kept = run(true, kept_grads), freed = run(false, freed_grads);
    INFO("the backward's high point: " << kept << " bytes with keep_graph, " << freed << " without; an activation is " << A);
    CHECK(kept - freed >= (K - 2) * A);  // without freeing as it goes: 0
    CHECK(freed_grads == kept_grads);
  });
}

TEST_CASE("backward: errors leave the gradients as they were") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1});
    using Rows = Spec<"data", none>;
    sl::Param w(Ten<Rows>::random(mesh, {6, 4}, 1, 0.5f, 1.f));
    sl::backward(sl::sum_all(sl::log(w)));
    const auto before = w.grad().to_host();
    // A NaN in a gradient, found by check_finite, names the op; the gradient did not change.
    auto bad = sl::sum_all(sl::sqrt(w - 1.f));  // sqrt(negative) = NaN, its derivative too
    CHECK_THROWS_WITH_AS(sl::backward(bad, {.check_finite = true}), doctest::Contains("op 'sqrt'"), std::runtime_error);
    CHECK(w.grad().to_host() == before);
    // A seed of another shape.
    auto v = sl::exp(w);
    const auto seed = Ten<Rows>::zeros(mesh, {6, 3});
    CHECK_THROWS_WITH_AS(sl::backward(v, seed), doctest::Contains("does not have the shape of y"),
                         std::invalid_argument);
    // A seed of the right shape: d/dw sum(seed * exp(w)) = seed * exp(w).
    w.zero_grad();
    sl::backward(v, Ten<Rows>::full(mesh, {6, 4}, 2.f));
    const auto g = w.grad().to_host();
    const auto e = sl::exp(w.value()).to_host();
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(2 * e[i]));
    // A parameter used with a tensor on another mesh (of the same type): the op names both.
    if (ctx.num_devices() > 1) {
      M other(ctx, {1, ctx.num_devices()});
      const auto t = Ten<Rows>::random(other, {6, 4}, 2);
      CHECK_THROWS_WITH_AS((void)(w * t), doctest::Contains("operands on different meshes"), std::invalid_argument);
    }
  });
}
}
}  // namespace
