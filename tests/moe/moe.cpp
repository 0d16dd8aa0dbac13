// SPDX-License-Identifier: Apache-2.0
// sl::moe: the layer's output and load-balancing loss against GShard's dense form (one-hot
// dispatch and combine tensors [T, E, C], einsums), computed here in double per group, for E =
// 2, 4, 8 experts, top-1 and top-2, capacity factors that drop choices and that do not, tokens
// that the groups do not divide; on 1 to 8 devices with the experts over "expert" and the tokens
// over ("data", "expert"), and with each expert's hidden dim split over "model" (tensor
// parallel); gradients against central differences and, with nothing dropped, against one
// device; the all-to-alls counted (one each way, of the slots' bytes); the drops reported; a
// plan's (shapes alone) balanced routing against a real balanced router; bad input.
#include <doctest/doctest.h>
#include <shardlib/moe.hpp>

#include "../autodiff/gradcheck.hpp"
#include "../collectives/harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {
using M2 = sl::Mesh<"data", "expert">;
template <class S>
using Ten = sl::DistributedTensor<double, M2, S>;
using TokS = sl::Spec<sl::axes<"data", "expert">, none>;  // tokens over every device
using WS = sl::Spec<"expert", none, none>;                // experts over "expert"
using Rep2 = sl::Spec<none, none>;
using Rep3 = sl::Spec<none, none, none>;

M2 mesh_of(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 2 == 0 ? M2(ctx, {2, n / 2}) : M2(ctx, {1, n});
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = a.size() == b.size() ? 0.0 : std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

struct Dense {
  std::vector<double> y;
  double aux = 0;
  std::int64_t dropped = 0;
};

// GShard's dense form, per group of tokens (the devices' blocks of T), in double: softmax router,
// top-k (ties to the lower expert), slots filled first choices first in token order, a [T, E, C]
// dispatch mask and combine weights, the experts' MLPs on the dispatched [E, C, D], the combine.
Dense dense(const std::vector<double>& x, const std::vector<double>& r, const std::vector<double>& w1, const std::vector<double>& w2,
            std::int64_t T, std::int64_t D, std::int64_t E, std::int64_t F, int k, double cf, int groups, bool normalize) {
  Dense out;
  out.y.assign(static_cast<std::size_t>(T * D), 0.0);
  std::vector<double> p(static_cast<std::size_t>(T * E));
  for (std::int64_t t = 0; t < T; ++t) {
    double mx = -std::numeric_limits<double>::infinity();
    for (std::int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (std::int64_t d = 0; d < D; ++d) s += x[static_cast<std::size_t>(t * D + d)] * r[static_cast<std::size_t>(d * E + e)];
      p[static_cast<std::size_t>(t * E + e)] = s;
      mx = std::max(mx, s);
    }
    double z = 0;
    for (std::int64_t e = 0; e < E; ++e) z += (p[static_cast<std::size_t>(t * E + e)] = std::exp(p[static_cast<std::size_t>(t * E + e)] - mx));
    for (std::int64_t e = 0; e < E; ++e) p[static_cast<std::size_t>(t * E + e)] /= z;
  }
  const std::int64_t tg = (T + groups - 1) / groups;  // torch.chunk: the largest group
  const auto C = static_cast<std::int64_t>(std::max(1.0, std::ceil(k * tg * cf / static_cast<double>(E))));
  std::vector<std::int64_t> first(static_cast<std::size_t>(E), 0);
  for (std::int64_t g0 = 0; g0 < T; g0 += tg) {
    const std::int64_t g1 = std::min(T, g0 + tg), n = g1 - g0;
    // choices
    std::vector<std::int64_t> ch(static_cast<std::size_t>(n * k));
    std::vector<double> gate(static_cast<std::size_t>(n * k));
    for (std::int64_t t = 0; t < n; ++t) {
      double total = 0;
      for (int j = 0; j < k; ++j) {
        std::int64_t best = -1;
        for (std::int64_t e = 0; e < E; ++e) {
          bool used = false;
          for (int i = 0; i < j; ++i) used = used || ch[static_cast<std::size_t>(t * k + i)] == e;
          if (!used && (best < 0 || p[static_cast<std::size_t>((g0 + t) * E + e)] > p[static_cast<std::size_t>((g0 + t) * E + best)])) best = e;
        }
        ch[static_cast<std::size_t>(t * k + j)] = best;
        gate[static_cast<std::size_t>(t * k + j)] = p[static_cast<std::size_t>((g0 + t) * E + best)];
        total += gate[static_cast<std::size_t>(t * k + j)];
      }
      if (normalize && k > 1)
        for (int j = 0; j < k; ++j) gate[static_cast<std::size_t>(t * k + j)] /= total;
      ++first[static_cast<std::size_t>(ch[static_cast<std::size_t>(t * k)])];
    }
    // dispatch [n, E, C] one-hot, combine [n, E, C]
    std::vector<double> mask(static_cast<std::size_t>(n * E * C), 0.0), comb(static_cast<std::size_t>(n * E * C), 0.0);
    std::vector<std::int64_t> fill(static_cast<std::size_t>(E), 0);
    for (int j = 0; j < k; ++j)
      for (std::int64_t t = 0; t < n; ++t) {
        const std::int64_t e = ch[static_cast<std::size_t>(t * k + j)];
        if (fill[static_cast<std::size_t>(e)] >= C) {
          ++out.dropped;
          continue;
        }
        const std::int64_t c = fill[static_cast<std::size_t>(e)]++;
        mask[static_cast<std::size_t>((t * E + e) * C + c)] = 1;
        comb[static_cast<std::size_t>((t * E + e) * C + c)] = gate[static_cast<std::size_t>(t * k + j)];
      }
    // experts: in[e, c, :] = sum_t mask x; out = w2^T gelu(w1^T in); y = sum_{e,c} comb out
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t c = 0; c < C; ++c) {
        std::vector<double> in(static_cast<std::size_t>(D), 0.0), h(static_cast<std::size_t>(F), 0.0), o(static_cast<std::size_t>(D), 0.0);
        for (std::int64_t t = 0; t < n; ++t)
          for (std::int64_t d = 0; d < D; ++d)
            in[static_cast<std::size_t>(d)] += mask[static_cast<std::size_t>((t * E + e) * C + c)] * x[static_cast<std::size_t>((g0 + t) * D + d)];
        for (std::int64_t f = 0; f < F; ++f) {
          double s = 0;
          for (std::int64_t d = 0; d < D; ++d) s += in[static_cast<std::size_t>(d)] * w1[static_cast<std::size_t>((e * D + d) * F + f)];
          h[static_cast<std::size_t>(f)] = 0.5 * s * (1 + std::erf(s / std::sqrt(2.0)));
        }
        for (std::int64_t d = 0; d < D; ++d)
          for (std::int64_t f = 0; f < F; ++f) o[static_cast<std::size_t>(d)] += h[static_cast<std::size_t>(f)] * w2[static_cast<std::size_t>((e * F + f) * D + d)];
        for (std::int64_t t = 0; t < n; ++t)
          for (std::int64_t d = 0; d < D; ++d)
            out.y[static_cast<std::size_t>((g0 + t) * D + d)] += comb[static_cast<std::size_t>((t * E + e) * C + c)] * o[static_cast<std::size_t>(d)];
      }
  }
  for (std::int64_t e = 0; e < E; ++e) {
    double pe = 0;
    for (std::int64_t t = 0; t < T; ++t) pe += p[static_cast<std::size_t>(t * E + e)];
    out.aux += static_cast<double>(E) * (static_cast<double>(first[static_cast<std::size_t>(e)]) / static_cast<double>(T)) * (pe / static_cast<double>(T));
  }
  return out;
}

struct Layer {
  Ten<TokS> x;
  Ten<Rep2> r;
  Ten<WS> w1, w2;
};
Layer layer(const M2& mesh, std::int64_t T, std::int64_t D, std::int64_t E, std::int64_t F, double router_amp = 1.0) {
  return {Ten<TokS>::random(mesh, {T, D}, 1, -1.0, 1.0), Ten<Rep2>::random(mesh, {D, E}, 2, -router_amp, router_amp),
          Ten<WS>::random(mesh, {E, D, F}, 3, -0.5, 0.5), Ten<WS>::random(mesh, {E, F, D}, 4, -0.5, 0.5)};
}

void check_against_dense(sl::Context& ctx, std::int64_t T, std::int64_t E, int k, double cf) {
  CAPTURE(T);
  CAPTURE(E);
  CAPTURE(k);
  CAPTURE(cf);
  const M2 mesh = mesh_of(ctx);
  const std::int64_t D = 4, F = 6;
  const Layer l = layer(mesh, T, D, E, F, 2.0);
  const auto res = sl::moe(l.x, l.r, l.w1, l.w2, {.top_k = k, .capacity_factor = cf});
  const Dense want = dense(l.x.to_host(), l.r.to_host(), l.w1.to_host(), l.w2.to_host(), T, D, E, F, k, cf, ctx.num_devices(), true);
  CHECK(max_abs_diff(res.y.to_host(), want.y) < 1e-12);
  CHECK(std::abs(res.aux_loss.to_host()[0] - want.aux) < 1e-12);
  CHECK(res.dropped == want.dropped);
  const sl::MoeStats& s = sl::moe_stats(ctx);
  CHECK(s.dropped == want.dropped);
  CHECK(s.tokens == T);
  CHECK(s.choices == T * k);
}
}  // namespace

TEST_SUITE("moe") {
TEST_CASE("moe equals GShard's dense form per group: 2, 4, 8 experts, top-1 and top-2, with and without drops") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        for (std::int64_t E : {2, 4, 8})
          for (int k : {1, 2}) {
            check_against_dense(ctx, 16 * ctx.num_devices(), E, k, 0.5);  // drops
            check_against_dense(ctx, 16 * ctx.num_devices(), E, k, 8.0);  // none
          }
        check_against_dense(ctx, 7 * ctx.num_devices() + 3, 4, 2, 1.0);  // uneven groups
        check_against_dense(ctx, 3, 2, 1, 1.0);                          // fewer tokens than devices
      },
      {1, 2, 4, 8});
}

TEST_CASE("moe's traffic: one all-gather of the counts, one all-to-all each way of the filled slots' bytes, nothing of the empty ones") {
  using Kind = sl::coll::Kind;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const int n = ctx.num_devices(), ex = mesh.shape().size(1);
        const std::int64_t T = 8 * n, D = 4, E = 4, F = 6;
        const Layer l = layer(mesh, T, D, E, F);
        sl::Param<Ten<TokS>> x(l.x);
        sl::Param<Ten<Rep2>> r(l.r);
        sl::Param<Ten<WS>> w1(l.w1), w2(l.w2);
        sl::coll::CommRecorder fwd;
        const auto res = sl::moe(x, r, w1, w2, {.top_k = 2, .capacity_factor = 1.0});
        const sl::coll::CommStats f = fwd.stats();
        const std::uint64_t C = sl::moe_stats(ctx).capacity;
        CHECK(C == 4);  // ceil(2 * 8 * 1.0 / 4)
        // Out: this group's filled slots of the other devices' experts; back: the filled slots of
        // this device's experts from the other ex - 1 groups of its expert group (the groups of
        // its "data" row). Nothing of the empty slots.
        const sl::MoeStats& st = sl::moe_stats(ctx);
        REQUIRE(st.kept.size() == static_cast<std::size_t>(n * E));
        const int me = ctx.device(), row = mesh.shape().coords(me)[0];
        const sl::BlockRange my_experts = sl::block_of(E, ex, mesh.shape().group_rank(me, {1}));
        std::uint64_t rows = 0, all = 0;
        for (std::int64_t e = 0; e < E; ++e) {
          const bool ours = e >= my_experts.offset && e < my_experts.offset + my_experts.size;
          if (!ours) rows += static_cast<std::uint64_t>(st.kept[static_cast<std::size_t>(me * E + e)]);
          for (int g = row * ex; g < (row + 1) * ex; ++g)
            if (ours && g != me) rows += static_cast<std::uint64_t>(st.kept[static_cast<std::size_t>(g * E + e)]);
        }
        for (std::int64_t v : st.kept) all += static_cast<std::uint64_t>(v);
        CHECK(all == static_cast<std::uint64_t>(2 * T) - static_cast<std::uint64_t>(res.dropped));  // every kept choice a slot
        const std::uint64_t slot_row = D * sizeof(double);
        CHECK(f[Kind::all_to_all].calls == (ex > 1 ? 2u : 0u));
        CHECK(f[Kind::all_to_all].bytes_sent == rows * slot_row);
        CHECK(f[Kind::all_gather].calls == 1);
        CHECK(f[Kind::all_reduce].calls == 0);
        sl::coll::CommRecorder bwd;
        sl::backward(sl::sum_all(res.y) + res.aux_loss);
        CHECK(bwd.stats()[Kind::all_to_all].calls == (ex > 1 ? 2u : 0u));
        CHECK(bwd.stats()[Kind::all_to_all].bytes_sent == rows * slot_row);  // the same rows, the other way
        CHECK(bwd.stats()[Kind::all_gather].calls == 0);
      },
      {1, 2, 4, 8});
}

TEST_CASE("moe's gradients: central differences (drops included); with nothing dropped, one device's") {
  namespace gc = sl::test::grad;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = sl::test::oracle::rng_for(ctx, 5);
        const M2 mesh = mesh_of(ctx);
        const std::int64_t T = 6 * ctx.num_devices(), D = 4, E = 4, F = 5;
        const Layer l = layer(mesh, T, D, E, F);
        const auto w = Ten<TokS>::random(mesh, {T, D}, 9, -1.0, 1.0);
        for (int k : {1, 2})
          for (double cf : {0.75, 4.0}) {
            CAPTURE(k);
            CAPTURE(cf);
            CHECK(gc::check(
                [&](const auto& x, const auto& r, const auto& a, const auto& b) {
                  const auto res = sl::moe(x, r, a, b, {.top_k = k, .capacity_factor = cf});
                  return sl::sum_all(res.y * w) + res.aux_loss;
                },
                rng, "moe", 1e-6, 4, l.x, l.r, l.w1, l.w2));
          }
        // Nothing dropped: the groups do not matter, and one device gives the same gradients.
        sl::Param<Ten<TokS>> x(l.x);
        sl::Param<Ten<Rep2>> r(l.r);
        sl::Param<Ten<WS>> w1(l.w1), w2(l.w2);
        const auto res = sl::moe(x, r, w1, w2, {.top_k = 2, .capacity_factor = 8.0});
        CHECK(res.dropped == 0);
        sl::backward(sl::sum_all(res.y * w) + res.aux_loss);
        using RepT = sl::Spec<none, none>;
        sl::Param<Ten<RepT>> x1(Ten<RepT>(l.x));
        sl::Param<Ten<Rep2>> r1(l.r);
        sl::Param<Ten<Rep3>> a1(Ten<Rep3>(l.w1)), b1(Ten<Rep3>(l.w2));
        const auto one = sl::moe(x1, r1, a1, b1, {.top_k = 2, .capacity_factor = 8.0});
        sl::backward(sl::sum_all(one.y * Ten<RepT>(w)) + one.aux_loss);
        CHECK(max_abs_diff(res.y.value().to_host(), one.y.value().to_host()) < 1e-12);
        CHECK(max_abs_diff(x.grad().to_host(), x1.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(r.grad().to_host(), r1.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(w1.grad().to_host(), a1.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(w2.grad().to_host(), b1.grad().to_host()) < 1e-12);
      },
      {1, 2, 4});
}

TEST_CASE("moe's router z-loss (ST-MoE): the mean squared log-sum-exp of the logits, its gradient; off: 0 and no collective") {
  namespace gc = sl::test::grad;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = sl::test::oracle::rng_for(ctx, 7);
        const M2 mesh = mesh_of(ctx);
        const std::int64_t T = 6 * ctx.num_devices() + 1, D = 4, E = 4, F = 5;
        const Layer l = layer(mesh, T, D, E, F, 30.0);  // large logits: a naive exp would lose them
        const auto x = l.x.to_host(), r = l.r.to_host();
        double want = 0;
        for (std::int64_t t = 0; t < T; ++t) {
          std::vector<double> z(static_cast<std::size_t>(E), 0.0);
          for (std::int64_t e = 0; e < E; ++e)
            for (std::int64_t d = 0; d < D; ++d) z[static_cast<std::size_t>(e)] += x[static_cast<std::size_t>(t * D + d)] * r[static_cast<std::size_t>(d * E + e)];
          const double m = *std::max_element(z.begin(), z.end());
          double sum = 0;
          for (double v : z) sum += std::exp(v - m);
          want += (m + std::log(sum)) * (m + std::log(sum)) / static_cast<double>(T);
        }
        const auto res = sl::moe(l.x, l.r, l.w1, l.w2, {.top_k = 2, .z_loss = true});
        CHECK(std::abs(res.z_loss.to_host()[0] - want) < 1e-9 * want);
        CHECK(want > 100);  // (the logits are large: the check means something)
        // Off: 0, and the layer's collectives are those without it.
        {
          sl::coll::CommRecorder rec;
          const auto on = sl::moe(l.x, l.r, l.w1, l.w2, {.top_k = 2, .z_loss = true});
          const auto n_on = rec.stats().total_calls();
          sl::coll::CommRecorder rec2;
          const auto off = sl::moe(l.x, l.r, l.w1, l.w2, {.top_k = 2});
          CHECK(rec2.stats().total_calls() == n_on);  // (the z-loss's sum over the tokens is resolved when read)
          CHECK(off.z_loss.to_host()[0] == 0.0);
          CHECK(max_abs_diff(on.y.to_host(), off.y.to_host()) == 0);
        }
        // Its gradient (x and the router; the experts get none) against central differences.
        const Layer s = layer(mesh, T, D, E, F);
        CHECK(gc::check([&](const auto& xx, const auto& rr) { return sl::moe(xx, rr, s.w1, s.w2, {.top_k = 1, .z_loss = true}).z_loss; },
                        rng, "moe z-loss", 1e-6, 4, s.x, s.r));
      },
      {1, 2, 4});
}

TEST_CASE("moe's router jitter (Switch): the router's input times noise in [1 - j, 1 + j]; the same on any mesh; 0 is off") {
  namespace gc = sl::test::grad;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = sl::test::oracle::rng_for(ctx, 8);
        const M2 mesh = mesh_of(ctx);
        const std::int64_t T = 8 * ctx.num_devices(), D = 4, E = 4, F = 5;
        const Layer l = layer(mesh, T, D, E, F, 2.0);
        const sl::MoeOptions plain{.top_k = 2, .capacity_factor = 8.0};
        sl::MoeOptions jit = plain;
        jit.router_jitter = 0.3, jit.jitter_seed = 11;
        const auto a = sl::moe(l.x, l.r, l.w1, l.w2, plain);
        const auto b = sl::moe(l.x, l.r, l.w1, l.w2, jit);
        // The oracle: the router applied to x times the same noise (a tensor drawn from the seed),
        // the experts to x itself. With nothing dropped the output is the gated sum per token, so
        // compare the aux loss, which sees the probabilities.
        const auto noise = Ten<TokS>::random(mesh, {T, D}, 11, 0.7, 1.3);
        const auto xr = (l.x * noise).to_host(), rh = l.r.to_host();
        std::vector<double> p(static_cast<std::size_t>(T * E));
        std::vector<std::int64_t> first(static_cast<std::size_t>(E), 0);
        for (std::int64_t t = 0; t < T; ++t) {
          double m = -1e300, z = 0;
          for (std::int64_t e = 0; e < E; ++e) {
            double v = 0;
            for (std::int64_t d = 0; d < D; ++d) v += xr[static_cast<std::size_t>(t * D + d)] * rh[static_cast<std::size_t>(d * E + e)];
            p[static_cast<std::size_t>(t * E + e)] = v, m = std::max(m, v);
          }
          std::int64_t best = 0;
          for (std::int64_t e = 0; e < E; ++e) {
            z += (p[static_cast<std::size_t>(t * E + e)] = std::exp(p[static_cast<std::size_t>(t * E + e)] - m));
            if (p[static_cast<std::size_t>(t * E + e)] > p[static_cast<std::size_t>(t * E + best)]) best = e;
          }
          for (std::int64_t e = 0; e < E; ++e) p[static_cast<std::size_t>(t * E + e)] /= z;
          ++first[static_cast<std::size_t>(best)];
        }
        double aux = 0;
        for (std::int64_t e = 0; e < E; ++e) {
          double pe = 0;
          for (std::int64_t t = 0; t < T; ++t) pe += p[static_cast<std::size_t>(t * E + e)];
          aux += static_cast<double>(E) * static_cast<double>(first[static_cast<std::size_t>(e)]) / static_cast<double>(T) * pe / static_cast<double>(T);
        }
        CHECK(std::abs(b.aux_loss.to_host()[0] - aux) < 1e-12);
        CHECK(std::abs(a.aux_loss.to_host()[0] - b.aux_loss.to_host()[0]) > 1e-6);  // the noise changed the router
        // 0 is off (any seed); the gradients with the jitter on, against central differences.
        sl::MoeOptions zero = plain;
        zero.jitter_seed = 5;
        CHECK(max_abs_diff(sl::moe(l.x, l.r, l.w1, l.w2, zero).y.to_host(), a.y.to_host()) == 0);
        const auto w = Ten<TokS>::random(mesh, {T, D}, 9, -1.0, 1.0);
        CHECK(gc::check([&](const auto& xx, const auto& rr) {
                          const auto res = sl::moe(xx, rr, l.w1, l.w2, jit);
                          return sl::sum_all(res.y * w) + res.aux_loss;
                        },
                        rng, "moe jitter", 1e-6, 4, l.x, l.r));
        CHECK_THROWS_WITH_AS(sl::moe(l.x, l.r, l.w1, l.w2, {.router_jitter = 1.0}), doctest::Contains("router jitter"), std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::moe(l.x, l.r, l.w1, l.w2, {.router_jitter = -0.1}), doctest::Contains("router jitter"), std::invalid_argument);
      },
      {1, 2, 4});
}

TEST_CASE("moe with each expert's hidden dim split over \"model\" (tensor parallel): GShard's dense form, one device's gradients, one all-reduce each way") {
  namespace gc = sl::test::grad;
  using Kind = sl::coll::Kind;
  using MT = sl::Mesh<"data", "model">;
  using Tok = sl::DistributedTensor<double, MT, sl::Spec<"data", none>>;
  using W1 = sl::DistributedTensor<double, MT, sl::Spec<"data", none, "model">>;
  using W2 = sl::DistributedTensor<double, MT, sl::Spec<"data", "model", none>>;
  using R = sl::DistributedTensor<double, MT, Rep2>;
  using One2 = sl::DistributedTensor<double, MT, Rep2>;
  using One3 = sl::DistributedTensor<double, MT, Rep3>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const int n = ctx.num_devices(), m = n % 2 == 0 ? 2 : 1, d = n / m;
        const MT mesh(ctx, {d, m});
        CAPTURE(n);
        auto rng = sl::test::oracle::rng_for(ctx, 12);
        const std::int64_t T = 8 * d + 3, D = 4, E = 4, F = 6;
        const auto x = Tok::random(mesh, {T, D}, 1, -1.0, 1.0);
        const auto r = R::random(mesh, {D, E}, 2, -2.0, 2.0);
        const auto w1 = W1::random(mesh, {E, D, F}, 3, -0.5, 0.5);
        const auto w2 = W2::random(mesh, {E, F, D}, 4, -0.5, 0.5);
        // Forward: GShard's dense form over the "data" groups, with and without drops.
        for (int k : {1, 2})
          for (double cf : {0.5, 8.0}) {
            CAPTURE(k);
            CAPTURE(cf);
            const auto res = sl::moe(x, r, w1, w2, {.top_k = k, .capacity_factor = cf});
            const Dense want = dense(x.to_host(), r.to_host(), w1.to_host(), w2.to_host(), T, D, E, F, k, cf, d, true);
            CHECK(max_abs_diff(res.y.to_host(), want.y) < 1e-12);
            CHECK(std::abs(res.aux_loss.to_host()[0] - want.aux) < 1e-12);
            CHECK(res.dropped == want.dropped);
          }
        // Traffic: the all-to-alls over "data" only (each "model" row moves its own copy of the
        // tokens), and one all-reduce over "model" of the experts' block [G, E / d, C, D] each way.
        sl::Param<Tok> px(x);
        sl::Param<R> pr(r);
        sl::Param<W1> p1(w1);
        sl::Param<W2> p2(w2);
        const auto wy = Tok::random(mesh, {T, D}, 9, -1.0, 1.0);
        sl::coll::CommRecorder fwd;
        const auto res = sl::moe(px, pr, p1, p2, {.top_k = 2, .capacity_factor = 8.0});
        const sl::coll::CommStats f = fwd.stats();
        CHECK(res.dropped == 0);
        const auto C = static_cast<std::uint64_t>(sl::moe_stats(ctx).capacity);
        // (this device's experts: E / d, or as the "data" rows split them where d does not divide
        // E: 4 over 3 are 2, 2 and 0 under mpirun -np 6)
        const std::int64_t mine = sl::block_of(E, d, mesh.shape().coords(ctx.device())[0]).size;
        const std::uint64_t block = static_cast<std::uint64_t>(d) * static_cast<std::uint64_t>(mine) * C * D * sizeof(double);
        const auto ar = [](int g, std::uint64_t bytes) { return 2 * static_cast<std::uint64_t>(g - 1) * bytes / static_cast<std::uint64_t>(g); };
        CHECK(f[Kind::all_to_all].calls == (d > 1 ? 2u : 0u));
        CHECK(f[Kind::all_reduce].calls == (m > 1 ? 1u : 0u));
        CHECK(f[Kind::all_reduce].bytes_sent == ar(m, block));
        sl::coll::CommRecorder bwd;
        sl::backward(sl::sum_all(res.y * wy) + res.aux_loss);
        CHECK(bwd.stats()[Kind::all_to_all].calls == (d > 1 ? 2u : 0u));
        CHECK(bwd.stats()[Kind::all_gather].calls == 0);
        // Backward: the slots' gradient over "model" (the column-parallel einsum's partial sums)
        // and the router's over "data".
        CHECK(bwd.stats()[Kind::all_reduce].calls == (m > 1 ? 1u : 0u) + (d > 1 ? 1u : 0u));
        CHECK(bwd.stats()[Kind::all_reduce].bytes_sent == ar(m, block) + ar(d, D * E * sizeof(double)));
        // Nothing dropped: one device's gradients (everything replicated, one group).
        sl::Param<One2> x1{One2(x)}, r1{One2(r)};
        sl::Param<One3> a1{One3(w1)}, b1{One3(w2)};
        const auto one = sl::moe(x1, r1, a1, b1, {.top_k = 2, .capacity_factor = 8.0});
        sl::backward(sl::sum_all(one.y * One2(wy)) + one.aux_loss);
        CHECK(max_abs_diff(res.y.value().to_host(), one.y.value().to_host()) < 1e-12);
        CHECK(max_abs_diff(px.grad().to_host(), x1.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(pr.grad().to_host(), r1.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(p1.grad().to_host(), a1.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(p2.grad().to_host(), b1.grad().to_host()) < 1e-12);
        // With drops: central differences.
        CHECK(gc::check(
            [&](const auto& xx, const auto& rr, const auto& a, const auto& b) {
              const auto o = sl::moe(xx, rr, a, b, {.top_k = 2, .capacity_factor = 0.75});
              return sl::sum_all(o.y * wy) + o.aux_loss;
            },
            rng, "moe tp", 1e-6, 4, x, r, w1, w2));
      },
      {1, 2, 4, 8});
}

TEST_CASE("moe on shapes alone (a plan) routes as a balanced router: a real run with a balanced router moves the same bytes") {
  if (sl::test::mpi_runtime()) return;  // (threads and simulated runtimes of its own)
  using Kind = sl::coll::Kind;
  using M1 = sl::Mesh<"expert">;
  using Tok = sl::DistributedTensor<float, M1, sl::Spec<"expert", none>>;
  using W = sl::DistributedTensor<float, M1, sl::Spec<"expert", none, none>>;
  using R = sl::DistributedTensor<float, M1, sl::Spec<none, none>>;
  struct Seen {
    std::uint64_t fwd_sent = 0, fwd_received = 0, bwd_sent = 0, fwd_calls = 0, gathers = 0;
    std::int64_t dropped = 0;
    std::vector<std::int64_t> kept;
  };
  for (int n : {2, 4})
    for (int k : {1, 2})
      for (double cf : {1.0, 0.5}) {
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(cf);
        // E = D = 4, the router the identity, token t's row 10 at t mod E and 5 at t + 1 mod E: its
        // first choice t mod E, its second the next; 8 tokens a group, so every expert's share
        // of each group's choices is even, as on shapes alone.
        const std::int64_t E = 4, D = 4, F = 6, T = 8 * n;
        std::vector<float> xs(static_cast<std::size_t>(T * D), 0.f), rs(static_cast<std::size_t>(D * E), 0.f);
        for (std::int64_t t = 0; t < T; ++t) xs[static_cast<std::size_t>(t * D + t % E)] = 10.f, xs[static_cast<std::size_t>(t * D + (t + 1) % E)] = 5.f;
        for (std::int64_t e = 0; e < E; ++e) rs[static_cast<std::size_t>(e * E + e)] = 1.f;
        std::vector<Seen> real(static_cast<std::size_t>(n)), planned(static_cast<std::size_t>(n));
        auto step = [&](std::vector<Seen>& out) {
          return [&](sl::Context& ctx) {
            const M1 mesh(ctx, {n});
            sl::Param x(Tok::from_host(mesh, {T, D}, xs));
            sl::Param r(R::from_host(mesh, {D, E}, rs));
            sl::Param w1(W::random(mesh, {E, D, F}, 3)), w2(W::random(mesh, {E, F, D}, 4));
            sl::coll::CommRecorder fwd;
            const auto res = sl::moe(x, r, w1, w2, {.top_k = k, .capacity_factor = cf});
            const sl::coll::CommStats f = fwd.stats();
            sl::coll::CommRecorder bwd;
            sl::backward(sl::sum_all(res.y) + res.aux_loss);
            Seen& s = out[static_cast<std::size_t>(ctx.device())];
            s.fwd_sent = f[Kind::all_to_all].bytes_sent, s.fwd_received = f[Kind::all_to_all].bytes_received;
            s.fwd_calls = f[Kind::all_to_all].calls, s.gathers = f[Kind::all_gather].calls;
            s.bwd_sent = bwd.stats()[Kind::all_to_all].bytes_sent;
            s.dropped = res.dropped, s.kept = sl::moe_stats(ctx).kept;
          };
        };
        sl::Runtime::threads(n).spmd(step(real));
        for (int d = 0; d < n; ++d) sl::Runtime::simulate(n, d).spmd(step(planned));
        for (int d = 0; d < n; ++d) {
          CAPTURE(d);
          const Seen &a = real[static_cast<std::size_t>(d)], &b = planned[static_cast<std::size_t>(d)];
          CHECK(a.fwd_sent > 0);
          CHECK(b.fwd_sent == a.fwd_sent);
          CHECK(b.fwd_received == a.fwd_received);
          CHECK(b.bwd_sent == a.bwd_sent);
          CHECK(b.fwd_calls == a.fwd_calls);
          CHECK(b.gathers == a.gathers);
          CHECK(b.dropped == a.dropped);
          CHECK(b.kept == a.kept);
        }
        CHECK((cf < 1 ? real[0].dropped > 0 : real[0].dropped == 0));
      }
}

TEST_CASE("moe: every token to one expert drops and reports; bad input named; NaN logits an error on every device") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const std::int64_t T = 8 * ctx.num_devices(), D = 4, E = 4, F = 3;
        Layer l = layer(mesh, T, D, E, F);
        // A router that sends every token to expert 2: its capacity (2 per group) is all that runs.
        std::vector<double> rw(static_cast<std::size_t>(D * E), 0.0);
        for (std::int64_t d = 0; d < D; ++d) rw[static_cast<std::size_t>(d * E + 2)] = 50.0;
        const auto xs = Ten<TokS>::full(mesh, {T, D}, 1.0);
        const auto one = sl::moe(xs, Ten<Rep2>::from_host(mesh, {D, E}, rw), l.w1, l.w2, {.top_k = 1, .capacity_factor = 1.0});
        CHECK(one.dropped == T - 2 * ctx.num_devices());
        CHECK(sl::moe_stats(ctx).first_choice == std::vector<std::int64_t>{0, 0, T, 0});
        CHECK(std::abs(one.aux_loss.to_host()[0] - 4.0) < 1e-9);  // E * 1 * ~1: all on one expert
        // Bad input: named.
        CHECK_THROWS_WITH_AS(sl::moe(l.x, l.r, l.w1, l.w2, {.top_k = 5}), doctest::Contains("top-k 5 with 4 experts"), std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::moe(l.x, l.r, l.w1, l.w2, {.capacity_factor = 0}), doctest::Contains("capacity factor"), std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::moe(l.x, l.r, l.w2, l.w1), doctest::Contains("the shapes do not fit"), std::invalid_argument);
        // NaN router logits: every device throws (no device left waiting in a collective).
        std::vector<double> bad(static_cast<std::size_t>(T * D), 0.5);
        bad[3] = std::numeric_limits<double>::quiet_NaN();
        const auto xn = Ten<TokS>::from_host(mesh, {T, D}, bad);
        CHECK_THROWS_WITH_AS(sl::moe(xn, l.r, l.w1, l.w2), doctest::Contains("NaN or infinite for 1 of"), std::domain_error);
        // Still usable after: the next call runs.
        CHECK(sl::moe(l.x, l.r, l.w1, l.w2).y.shape() == l.x.shape());
      },
      {1, 2, 4});
}
}
