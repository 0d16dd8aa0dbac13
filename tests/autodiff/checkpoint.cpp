// SPDX-License-Identifier: Apache-2.0
// Activation recomputation (sl::checkpoint): the gradients of a residual stack equal those of the
// stack recorded, bit for bit (data and tensor parallel layouts, nested checkpoints, parameters
// passed in or captured), the bytes held between forward and backward shrink to the stage
// inputs (the memory account), the backward's collectives are the recorded backward's plus the
// forward's once more, and the bad inputs (a captured Var, an output that depends on no input)
// fail clearly or give the right gradients. ZeRO-3's weights gathered with
// reshard(w, sl::recompute): the same gradients bit for bit, freed after the forward (the
// memory account), gathered again in the backward, float32 and a bf16 weight cast to float32.
// Runs on 1..8 threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/autodiff.hpp>

#include "../collectives/harness.hpp"

#include <cstring>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;
using sl::Spec;
using Kind = sl::coll::Kind;

namespace {
using M = sl::Mesh<"data", "model">;
template <class S>
using Ten = sl::DistributedTensor<float, M, S>;
using Act = Spec<"data", none>;  // [B, D]
using Col = Spec<none, "model">;  // [D, F]: column-parallel
using Row = Spec<"model", none>;  // [F, D]: row-parallel

struct Layer {
  sl::Param<Ten<Spec<none>>> g;
  sl::Param<Ten<Col>> w1;
  sl::Param<Ten<Row>> w2;
};

std::vector<Layer> make_layers(const M& mesh, int n, std::int64_t D, std::int64_t F) {
  std::vector<Layer> ls;
  for (int l = 0; l < n; ++l) {
    const std::uint64_t s = 10 * static_cast<std::uint64_t>(l + 1);
    ls.push_back(Layer{sl::Param(Ten<Spec<none>>::random(mesh, {D}, s, 0.5f, 1.5f)),
                       sl::Param(Ten<Col>::random(mesh, {D, F}, s + 1, -0.5f, 0.5f)),
                       sl::Param(Ten<Row>::random(mesh, {F, D}, s + 2, -0.5f, 0.5f))});
  }
  return ls;
}

/// x + gelu(layer_norm(x) g w1) w2: Megatron's MLP pair (an all_reduce in the forward, one in the
/// backward) in a pre-LN residual block.
template <class X>
auto block(const X& x, const Layer& l) {
  auto h = sl::gelu(sl::matmul(sl::layer_norm<1>(x) * l.g, l.w1));
  return x + sl::reshard<Act>(sl::matmul(h, l.w2));
}

/// The bits of a tensor's global values.
template <class T>
std::vector<std::uint32_t> bits(const T& t) {
  const auto v = t.to_host();
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

enum class How { recorded, each_layer, nested, params_passed };

/// The stack's loss, the layers recomputed as `how` says; returns the gradients' bits (x's, then
/// every parameter's) and the activation bytes held after the forward.
std::vector<std::vector<std::uint32_t>> run(sl::Context& ctx, How how, std::int64_t* held, sl::coll::CommStats* fwd_stats,
                                            sl::coll::CommStats* bwd_stats) {
  const int model = ctx.num_devices() % 2 == 0 ? 2 : 1;
  M mesh(ctx, {ctx.num_devices() / model, model});
  constexpr std::int64_t B = 6, D = 8, F = 16;
  std::vector<Layer> layers = make_layers(mesh, 4, D, F);
  sl::Param x(Ten<Act>::random(mesh, {B, D}, 1, -1.f, 1.f));
  const auto y = Ten<Act>::random(mesh, {B, D}, 2, -1.f, 1.f);
  const std::int64_t before = sl::memory_usage(ctx).activations();
  sl::coll::CommRecorder fwd;
  sl::Var<Ten<Act>> h = x;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const Layer& L = layers[l];
    switch (how) {
      case How::recorded: h = block(h, L); break;
      case How::each_layer: h = sl::checkpoint([&L](const auto& in) { return block(in, L); }, h); break;
      case How::params_passed:
        h = sl::checkpoint(
            [](const auto& in, const auto& g, const auto& w1, const auto& w2) {
              auto a = sl::gelu(sl::matmul(sl::layer_norm<1>(in) * g, w1));
              return in + sl::reshard<Act>(sl::matmul(a, w2));
            },
            h, L.g, L.w1, L.w2);
        break;
      case How::nested:  // two layers per outer checkpoint, each its own inner one
        if (l % 2 == 1) break;
        h = sl::checkpoint(
            [&layers, l](const auto& in) {
              auto a = sl::checkpoint([&](const auto& z) { return block(z, layers[l]); }, in);
              return sl::checkpoint([&](const auto& z) { return block(z, layers[l + 1]); }, a);
            },
            h);
        break;
    }
  }
  auto loss = sl::mse_loss(h, y);
  if (fwd_stats) *fwd_stats = fwd.stats();
  if (held) {  // over the devices: a device whose batch block is empty holds the loss alone
    *held = sl::memory_usage(ctx).activations() - before;
    ctx.world().all_reduce(held, held, 1, sl::coll::dtype_of<std::int64_t>(), sl::coll::Op::sum);
  }
  sl::coll::CommRecorder bwd;
  sl::backward(loss);
  if (bwd_stats) *bwd_stats = bwd.stats();
  std::vector<std::vector<std::uint32_t>> out{bits(x.grad())};
  for (const Layer& L : layers) {
    out.push_back(bits(L.g.grad()));
    out.push_back(bits(L.w1.grad()));
    out.push_back(bits(L.w2.grad()));
  }
  return out;
}

}  // namespace

TEST_SUITE("autodiff_checkpoint") {
TEST_CASE("checkpoint: the gradients of the recorded stack, bit for bit, for the stage inputs' bytes") {
  sl::test::for_each_run([](sl::Context& ctx) {
    std::int64_t held_rec = 0, held_ckpt = 0;
    sl::coll::CommStats fwd_rec, bwd_rec, fwd_ckpt, bwd_ckpt;
    const auto want = run(ctx, How::recorded, &held_rec, &fwd_rec, &bwd_rec);
    const auto got = run(ctx, How::each_layer, &held_ckpt, &fwd_ckpt, &bwd_ckpt);
    REQUIRE(got.size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) CHECK_MESSAGE(got[k] == want[k], "gradient " << k);
    // Held after the forward: the recorded stack keeps every layer's saved tensors; the
    // checkpointed one each layer's input (the loss's saved tensors in both). Measured on one
    // device: 5.4 KiB recorded, 0.9 KiB checkpointed.
    CHECK(held_ckpt > 0);
    CHECK_MESSAGE(held_ckpt * 4 < held_rec, held_ckpt << " bytes held checkpointed, " << held_rec << " recorded");
    // The forward moves what it moved; the backward also runs each layer's forward again.
    CHECK(fwd_ckpt.total_calls() == fwd_rec.total_calls());
    CHECK(bwd_ckpt[Kind::all_reduce].calls == bwd_rec[Kind::all_reduce].calls + fwd_rec[Kind::all_reduce].calls);
    CHECK(bwd_ckpt.total_calls() == bwd_rec.total_calls() + fwd_rec.total_calls());
  });
}

TEST_CASE("checkpoint: nested, and with the parameters passed as inputs, the same gradients") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const auto want = run(ctx, How::recorded, nullptr, nullptr, nullptr);
    CHECK(run(ctx, How::nested, nullptr, nullptr, nullptr) == want);
    CHECK(run(ctx, How::params_passed, nullptr, nullptr, nullptr) == want);
  }, {1, 2, 4});
}

TEST_CASE("checkpoint: a captured Var that is not an input is an error naming its op; nothing is recorded") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1});
    sl::Param w(Ten<Act>::random(mesh, {4, 3}, 1, -1.f, 1.f));
    auto t = sl::exp(w);  // a Var: the output of op "exp"
    try {
      (void)sl::checkpoint([&](const auto& in) { return in * t; }, w);
      FAIL("no error");
    } catch (const std::logic_error& e) {
      const std::string m = e.what();
      CHECK_MESSAGE(m.find("checkpoint") != std::string::npos, m);
      CHECK_MESSAGE(m.find("'exp'") != std::string::npos, m);
      CHECK_MESSAGE(m.find("pass it to checkpoint as an input") != std::string::npos, m);
    }
    // Recording is back on after the error; passing it in works.
    auto y = sl::checkpoint([](const auto& in, const auto& c) { return in * c; }, w, t);
    sl::backward(sl::sum_all(y));
    const auto g = w.grad().to_host();
    const auto wv = w.value().to_host();
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx((1 + wv[i]) * std::exp(wv[i])).epsilon(1e-5));  // d(w e^w)
  }, {1, 3});
}

TEST_CASE("NoGrad: an evaluation's forward records nothing, keeps no saved tensor, and leaves the gradients alone") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1});
    auto layers = make_layers(mesh, 3, 8, 16);
    const auto x = Ten<Act>::random(mesh, {8, 8}, 7, -1.f, 1.f);
    auto forward = [&] {
      sl::Var<Ten<Act>> h(x);
      for (const Layer& l : layers) h = block(h, l);
      return sl::mean_all(sl::square(h));
    };
    sl::backward(forward());  // the reference gradient: a recorded forward and its backward alone
    const auto want = layers[0].w1.grad().to_host();
    for (Layer& l : layers) l.g.zero_grad(), l.w1.zero_grad(), l.w2.zero_grad();
    const std::int64_t before = sl::memory_usage(ctx).activations();
    auto recorded = forward();
    const std::int64_t held_recorded = sl::memory_usage(ctx).activations() - before;
    CHECK(recorded.requires_grad());
    float value = 0;
    std::int64_t held = 0;
    {
      sl::NoGrad no_grad;
      auto evaluated = forward();
      held = sl::memory_usage(ctx).activations() - before - held_recorded;
      CHECK(!evaluated.requires_grad());
      value = evaluated.value().item();
      // A recorded Var may be read inside: its value, no error (a checkpoint's forward would refuse it).
      CHECK(!(recorded * 2.f).requires_grad());
    }
    CHECK(value == recorded.value().item());  // the same kernels on the same values
    // (A device whose block of x has no rows, 8 rows over 5 devices, holds the scalar loss alone either way.)
    if (x.block().num_elements() > 0)
      CHECK_MESSAGE(held * 8 < held_recorded, held << " bytes held by the evaluation, " << held_recorded << " recorded");
    else
      CHECK(held <= held_recorded);
    // The evaluation in between changed no gradient: the recorded forward's backward gives the reference's.
    sl::backward(recorded);
    CHECK(layers[0].w1.grad().to_host() == want);
    // Recording is on again after the scope.
    CHECK(forward().requires_grad());
  }, {1, 2, 4});
}

TEST_CASE("checkpoint: an output that depends on no input gives the input a zero gradient, the parameters theirs") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1});
    sl::Param x(Ten<Act>::random(mesh, {4, 3}, 1, -1.f, 1.f));
    sl::Param w(Ten<Act>::random(mesh, {4, 3}, 2, -1.f, 1.f));
    auto y = sl::checkpoint([&](const auto&) { return w * 3.f; }, x);
    sl::backward(sl::sum_all(y + x));
    for (float v : x.grad().to_host()) CHECK(v == 1.f);
    for (float v : w.grad().to_host()) CHECK(v == 3.f);
    // Nothing needs a gradient: a constant, no node.
    const auto c = Ten<Act>::random(mesh, {4, 3}, 3, -1.f, 1.f);
    auto k = sl::checkpoint([](const auto& in) { return in * 2.f; }, c);
    CHECK(!k.requires_grad());
  }, {1, 2});
}

namespace {
/// A ZeRO-3 stack: each layer's weights stored split over "data" along their first dim and
/// gathered for use (reshard<Spec<none, none>>), `Recompute` as reshard(w, sl::recompute), the
/// weights of element type `W` cast to float32 for the matmuls. Returns the gradients' bits and
/// fills the bytes held after the forward and the forward's and backward's collectives.
template <class W, bool Recompute>
std::vector<std::vector<std::uint32_t>> zero3_run(sl::Context& ctx, std::int64_t* held, sl::coll::CommStats* fwd_stats,
                                                  sl::coll::CommStats* bwd_stats) {
  M mesh(ctx, {ctx.num_devices(), 1});
  using Stored = Spec<"data", none>;
  using Full = Spec<none, none>;
  using P = sl::Param<sl::DistributedTensor<W, M, Stored>>;
  constexpr std::int64_t B = 6, D = 8, F = 16;
  std::vector<std::pair<P, P>> layers;
  for (std::uint64_t l = 0; l < 3; ++l)
    layers.emplace_back(P(sl::DistributedTensor<W, M, Stored>::random(mesh, {D, F}, 10 * l + 1, -0.5f, 0.5f)),
                        P(sl::DistributedTensor<W, M, Stored>::random(mesh, {F, D}, 10 * l + 2, -0.5f, 0.5f)));
  auto use = [](const P& w) {
    auto full = [&] {
      if constexpr (Recompute) return sl::reshard<Full>(w, sl::recompute);
      else return sl::reshard<Full>(w);
    }();
    if constexpr (std::is_same_v<W, float>) return full;
    else return sl::cast<float>(full);
  };
  sl::Param x(Ten<Act>::random(mesh, {B, D}, 1, -1.f, 1.f));
  const auto y = Ten<Act>::random(mesh, {B, D}, 2, -1.f, 1.f);
  const std::int64_t before = sl::memory_usage(ctx).activations();
  sl::coll::CommRecorder fwd;
  sl::Var<Ten<Act>> h = x;
  for (const auto& [w1, w2] : layers) h = h + sl::matmul(sl::gelu(sl::matmul(h, use(w1))), use(w2));
  auto loss = sl::mse_loss(h, y);
  *fwd_stats = fwd.stats();
  *held = sl::memory_usage(ctx).activations() - before;
  sl::coll::CommRecorder bwd;
  sl::backward(loss);
  *bwd_stats = bwd.stats();
  std::vector<std::vector<std::uint32_t>> out{bits(x.grad())};
  for (const auto& [w1, w2] : layers) {
    for (const P* w : {&w1, &w2}) {
      const auto v = w->grad().to_host();
      std::vector<std::uint32_t> b;
      for (const W e : v) {
        float f = static_cast<float>(e);
        std::uint32_t u;
        std::memcpy(&u, &f, sizeof u);
        b.push_back(u);
      }
      out.push_back(b);
    }
  }
  return out;
}

template <class W>
void check_zero3_recompute(sl::Context& ctx) {
  std::int64_t held_kept = 0, held_recomputed = 0;
  sl::coll::CommStats fwd_kept, bwd_kept, fwd_re, bwd_re;
  const auto want = zero3_run<W, false>(ctx, &held_kept, &fwd_kept, &bwd_kept);
  const auto got = zero3_run<W, true>(ctx, &held_recomputed, &fwd_re, &bwd_re);
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < want.size(); ++k) CHECK_MESSAGE(got[k] == want[k], "gradient " << k);
  // Held after the forward: the kept stack also holds each gathered weight (its float32 copy
  // under a cast) for its matmul's backward: 6 of 8 x 16 floats a device.
  const std::int64_t gathered = 6 * 8 * 16 * static_cast<std::int64_t>(sizeof(float));
  CHECK_MESSAGE(held_kept - held_recomputed == gathered, held_kept << " bytes held kept, " << held_recomputed << " recomputed");
  // The forward gathers each weight once either way; the backward again when recomputed.
  const std::uint64_t gathers = ctx.num_devices() > 1 ? 6 : 0;
  CHECK(fwd_re.total_calls() == fwd_kept.total_calls());
  CHECK(fwd_kept[Kind::all_gather].calls == gathers);
  CHECK(bwd_kept[Kind::all_gather].calls == 0);
  CHECK(bwd_re[Kind::all_gather].calls == gathers);
  CHECK(bwd_re[Kind::all_gather].bytes_received == fwd_re[Kind::all_gather].bytes_received);
  CHECK(bwd_re.total_calls() == bwd_kept.total_calls() + gathers);
}
}  // namespace

TEST_CASE("reshard(w, sl::recompute): ZeRO-3's gathered weights freed after the forward, gathered again in the backward, the same gradients") {
  sl::test::for_each_run([](sl::Context& ctx) { check_zero3_recompute<float>(ctx); });
}

TEST_CASE("reshard(w, sl::recompute) of a bf16 weight cast to float32: the cast is recomputed too") {
  sl::test::for_each_run([](sl::Context& ctx) { check_zero3_recompute<sl::bf16>(ctx); }, {1, 2, 4});
}
}
