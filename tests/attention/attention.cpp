// SPDX-License-Identifier: Apache-2.0
// sl::attention: the output against a one-device loop in float64 (causal, a mask, both, other
// lengths of queries and keys, a scale), on 1 to 4 devices with the batch and heads split, the
// sequence split (context parallelism, Ulysses' all-to-alls: counted, uneven, more devices than
// heads or positions), partial operands; gradients against central differences and against one
// device; bad input; what ran (attention_stats). On host memory the unfused form runs by default;
// the host's fused kernel (the blockwise one, AttentionKernel::fused) is checked against it here
// (cuDNN's: tests/autodiff/memory_space.cpp compares the two on a GPU).
#include <doctest/doctest.h>
#include <shardlib/attention.hpp>
#include <shardlib/memory.hpp>

#include "../autodiff/gradcheck.hpp"
#include "../collectives/harness.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {
using M2 = sl::Mesh<"x", "y">;
template <class S, class T = double>
using Ten = sl::DistributedTensor<T, M2, S>;
using Rep4 = sl::Spec<none, none, none, none>;
using Batch = sl::Spec<"x", none, none, none>;
using Heads = sl::Spec<none, none, "y", none>;
using Both = sl::Spec<"x", none, "y", none>;
using SeqSplit = sl::Spec<"x", "y", none, none>;  // the sequence split: context parallelism
using Context = sl::Spec<none, sl::axes<"x", "y">, none, none>;  // the sequence over every device
using SeqHeads = sl::Spec<none, "x", "y", none>;  // context parallelism beside heads over "y" (TP)
using Mask = sl::Spec<none, none>;

M2 mesh_of(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 2 == 0 ? M2(ctx, {n / 2, 2}) : M2(ctx, {n, 1});
}

// The one-device reference: o[b, i, h, :] for q [B, Sq, H, K], k [B, Sk, H, K], v [B, Sk, H, Kv].
std::vector<double> reference(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                              const std::vector<double>* mask, std::int64_t B, std::int64_t Sq, std::int64_t Sk,
                              std::int64_t H, std::int64_t K, std::int64_t Kv, double scale, bool causal) {
  std::vector<double> o(static_cast<std::size_t>(B * Sq * H * Kv), 0.0);
  std::vector<double> s(static_cast<std::size_t>(Sk));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < Sk; ++j) {
          double d = 0;
          for (std::int64_t c = 0; c < K; ++c)
            d += q[static_cast<std::size_t>(((b * Sq + i) * H + h) * K + c)] * k[static_cast<std::size_t>(((b * Sk + j) * H + h) * K + c)];
          d *= scale;
          if (mask) d += (*mask)[static_cast<std::size_t>(i * Sk + j)];
          if (causal && j > i) d = -std::numeric_limits<double>::infinity();
          s[static_cast<std::size_t>(j)] = d;
          mx = std::max(mx, d);
        }
        double sum = 0;
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (std::int64_t j = 0; j < Sk; ++j)
          for (std::int64_t c = 0; c < Kv; ++c)
            o[static_cast<std::size_t>(((b * Sq + i) * H + h) * Kv + c)] +=
                s[static_cast<std::size_t>(j)] / sum * v[static_cast<std::size_t>(((b * Sk + j) * H + h) * Kv + c)];
      }
  return o;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = a.size() == b.size() ? 0.0 : std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

template <class S>
void check_forward(sl::Context& ctx, std::int64_t B, std::int64_t Sq, std::int64_t Sk, std::int64_t H, std::int64_t K,
                   std::int64_t Kv, bool causal, bool masked, double scale) {
  const M2 mesh = mesh_of(ctx);
  const auto q = Ten<S>::random(mesh, {B, Sq, H, K}, 11, -1.0, 1.0);
  const auto k = Ten<S>::random(mesh, {B, Sk, H, K}, 12, -1.0, 1.0);
  const auto v = Ten<S>::random(mesh, {B, Sk, H, Kv}, 13, -1.0, 1.0);
  const auto m = Ten<Mask>::random(mesh, {Sq, Sk}, 14, -2.0, 2.0);
  const sl::AttentionOptions o{.causal = causal, .scale = scale};
  const auto out = masked ? sl::attention(q, k, v, m, o) : sl::attention(q, k, v, o);
  const auto mh = m.to_host();
  const auto want = reference(q.to_host(), k.to_host(), v.to_host(), masked ? &mh : nullptr, B, Sq, Sk, H, K, Kv,
                              scale != 0 ? scale : 1.0 / std::sqrt(double(K)), causal);
  CAPTURE(S::value.to_string());
  CAPTURE(causal);
  CAPTURE(masked);
  CAPTURE(Sq);
  CAPTURE(Sk);
  CHECK(out.shape() == std::array<std::int64_t, 4>{B, Sq, H, Kv});
  CHECK(max_abs_diff(out.to_host(), want) < 1e-12);
}
}  // namespace

TEST_SUITE("attention") {
TEST_CASE("attention equals the one-device formula: causal, masked, other lengths, any split of batch and heads") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        for (bool causal : {false, true})
          for (bool masked : {false, true}) {
            check_forward<Rep4>(ctx, 2, 5, 5, 3, 4, 4, causal, masked, 0);
            check_forward<Batch>(ctx, 5, 6, 6, 2, 3, 5, causal, masked, 0.7);
            check_forward<Heads>(ctx, 2, 4, 7, 5, 4, 2, causal, masked, 0);
            check_forward<Both>(ctx, 3, 7, 3, 4, 2, 3, causal, masked, 0);
            check_forward<SeqSplit>(ctx, 3, 6, 6, 2, 4, 4, causal, masked, 0);
            check_forward<Context>(ctx, 2, 7, 5, 3, 4, 2, causal, masked, 0);  // uneven; 3 heads on up to 4 devices
            check_forward<SeqHeads>(ctx, 2, 5, 5, 4, 2, 3, causal, masked, 0.5);
          }
        // One query, one key; no query at all.
        check_forward<Both>(ctx, 2, 1, 1, 2, 4, 4, true, false, 0);
        check_forward<Batch>(ctx, 2, 1, 5, 2, 4, 4, false, true, 0);
        check_forward<Heads>(ctx, 2, 0, 5, 2, 4, 4, false, false, 0);
      },
      {1, 2, 3, 4});
}

TEST_CASE("the output keeps q's batch and heads split; the sequence and a partial operand are resolved first") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    const auto q = Ten<SeqSplit>::random(mesh, {4, 6, 2, 4}, 1);
    const auto k = Ten<Heads>::random(mesh, {4, 6, 2, 4}, 2);
    const auto v = Ten<Rep4>::random(mesh, {4, 6, 2, 4}, 3);
    const auto o = sl::attention(q, k, v);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(o)>, Ten<SeqSplit>>, "batch over x, sequence over y");
    const auto o2 = sl::attention(Ten<Both>(q), Ten<Both>(k), Ten<Both>(v));
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(o2)>, Ten<Both>>);
    CHECK(max_abs_diff(o.to_host(), o2.to_host()) < 1e-12);
    // A partial q (an einsum over a split dim leaves addends): reduced before the kernel.
    using Part = sl::Spec<"x", none, none, none, sl::partial_sum<"y">>;
    const Ten<Part> qp{Ten<Batch>(q)};
    const auto op = sl::attention(qp, k, v);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(op)>, Ten<Batch>>);
    CHECK(max_abs_diff(op.to_host(), o.to_host()) < 1e-12);
  });
}

TEST_CASE("gradients of q, k and v against central differences and against one device") {
  namespace gc = sl::test::grad;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = sl::test::oracle::rng_for(ctx, 5);
        const M2 mesh = mesh_of(ctx);
        const auto w = Ten<Both>::random(mesh, {3, 5, 2, 3}, 9, -1.0, 1.0);
        const auto m = Ten<Mask>::random(mesh, {5, 4}, 10, -1.0, 1.0);
        auto q = Ten<Both>::random(mesh, {3, 5, 2, 4}, 1, -1.0, 1.0);
        auto k = Ten<Both>::random(mesh, {3, 4, 2, 4}, 2, -1.0, 1.0);
        auto v = Ten<Both>::random(mesh, {3, 4, 2, 3}, 3, -1.0, 1.0);
        for (bool causal : {false, true}) {
          CAPTURE(causal);
          CHECK(gc::check([&](const auto& a, const auto& b, const auto& c) { return sl::sum_all(sl::attention(a, b, c, {.causal = causal}) * w); },
                          rng, "attention", 1e-6, 6, q, k, v));
          CHECK(gc::check([&](const auto& a, const auto& b, const auto& c) { return sl::sum_all(sl::attention(a, b, c, m, {.causal = causal}) * w); },
                          rng, "attention with a mask", 1e-6, 6, q, k, v));
        }
        // The same gradients as on one device (everything replicated).
        sl::Param<Ten<Both>> pq(q), pk(k), pv(v);
        sl::backward(sl::sum_all(sl::attention(pq, pk, pv, m, {.causal = true}) * w));
        sl::Param<Ten<Rep4>> rq(q), rk(k), rv(v);
        sl::backward(sl::sum_all(sl::attention(rq, rk, rv, m, {.causal = true}) * Ten<Rep4>(w)));
        CHECK(max_abs_diff(pq.grad().to_host(), rq.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(pk.grad().to_host(), rk.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(pv.grad().to_host(), rv.grad().to_host()) < 1e-12);
        // Only q trains: k and v are constants.
        sl::Param<Ten<Both>> only(q);
        sl::backward(sl::sum_all(sl::attention(only, k, v) * w));
        CHECK(only.grad().shape() == q.shape());
      },
      {1, 2, 4});
}

TEST_CASE("context parallelism: a split sequence stays split; one all-to-all per operand each way; gradients as on one device") {
  // DeepSpeed-Ulysses: q, k and v move the sequence's axes onto the heads (an all-to-all each),
  // the kernel runs on whole sequences of a share of the heads, the output moves back (one
  // more). The backward is the same four all-to-alls the other way. Nothing is gathered.
  using Kind = sl::coll::Kind;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const int n = ctx.num_devices();
        const auto w = Ten<Context>::random(mesh, {2, 9, 4, 3}, 9, -1.0, 1.0);
        const auto q = Ten<Context>::random(mesh, {2, 9, 4, 4}, 1, -1.0, 1.0);
        const auto k = Ten<Context>::random(mesh, {2, 9, 4, 4}, 2, -1.0, 1.0);
        const auto v = Ten<Context>::random(mesh, {2, 9, 4, 3}, 3, -1.0, 1.0);
        sl::Param<Ten<Context>> pq(q), pk(k), pv(v);
        sl::coll::CommRecorder fwd;
        auto o = sl::attention(pq, pk, pv, {.causal = true});
        static_assert(std::is_same_v<typename decltype(o)::spec_type, Context>);
        const sl::coll::CommStats f = fwd.stats();
        CHECK(f[Kind::all_to_all].calls == (n > 1 ? 4u : 0u));
        CHECK(f.total_calls() == f[Kind::all_to_all].calls);  // no gather of the sequence
        // Each all-to-all moves what this device holds and does not keep: (1 - 1/p) of its
        // sequence block (or less, where the shares are uneven), never the whole sequence.
        const std::uint64_t whole = 2 * 9 * 4 * (4 + 4 + 3 + 3) * sizeof(double);
        CHECK(f[Kind::all_to_all].bytes_sent < whole);
        auto loss = sl::sum_all(o * w);
        sl::coll::CommRecorder bwd;
        sl::backward(loss);
        CHECK(bwd.stats()[Kind::all_to_all].calls == (n > 1 ? 4u : 0u));
        CHECK(bwd.stats()[Kind::all_gather].calls == 0);
        sl::Param<Ten<Rep4>> rq(q), rk(k), rv(v);
        sl::backward(sl::sum_all(sl::attention(rq, rk, rv, {.causal = true}) * Ten<Rep4>(w)));
        CHECK(max_abs_diff(o.value().to_host(), sl::attention(Ten<Rep4>(q), Ten<Rep4>(k), Ten<Rep4>(v), {.causal = true}).to_host()) < 1e-12);
        CHECK(max_abs_diff(pq.grad().to_host(), rq.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(pk.grad().to_host(), rk.grad().to_host()) < 1e-12);
        CHECK(max_abs_diff(pv.grad().to_host(), rv.grad().to_host()) < 1e-12);
        // Central differences, with the sequence split beside the heads split (TP x CP).
        namespace gc = sl::test::grad;
        auto rng = sl::test::oracle::rng_for(ctx, 6);
        const auto w2 = Ten<SeqHeads>::random(mesh, {2, 5, 4, 2}, 19, -1.0, 1.0);
        CHECK(gc::check([&](const auto& a, const auto& b, const auto& c) { return sl::sum_all(sl::attention(a, b, c, {.causal = true}) * w2); },
                        rng, "attention over a split sequence", 1e-6, 6, Ten<SeqHeads>::random(mesh, {2, 5, 4, 3}, 21, -1.0, 1.0),
                        Ten<SeqHeads>::random(mesh, {2, 5, 4, 3}, 22, -1.0, 1.0), Ten<SeqHeads>::random(mesh, {2, 5, 4, 2}, 23, -1.0, 1.0)));
      },
      {1, 2, 3, 4});
}

TEST_CASE("bad input: shapes named, the mask's shape, an empty key sequence, the fused kernel where it cannot run") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    const auto q = Ten<Batch>::zeros(mesh, {2, 4, 3, 8});
    const auto k = Ten<Batch>::zeros(mesh, {2, 5, 3, 8});
    const auto v = Ten<Batch>::zeros(mesh, {2, 5, 3, 6});
    CHECK_THROWS_WITH_AS(sl::attention(q, Ten<Batch>::zeros(mesh, {2, 5, 3, 16}), v),
                         "shardlib: attention: q and k differ in their head dim (dim 3) (q [2, 4, 3, 8], k [2, 5, 3, "
                         "16], v [2, 5, 3, 6]; each is [batch, seq, heads, head dim])",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::attention(q, k, Ten<Batch>::zeros(mesh, {2, 4, 3, 6})),
                         doctest::Contains("k and v differ in their sequence length (dim 1)"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::attention(q, k, Ten<Batch>::zeros(mesh, {2, 5, 4, 6})),
                         doctest::Contains("q, k and v differ in their heads (dim 2)"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::attention(Ten<Batch>::zeros(mesh, {3, 4, 3, 8}), k, v),
                         doctest::Contains("q, k and v differ in their batch (dim 0)"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::attention(q, k, v, Ten<Mask>::zeros(mesh, {5, 4})),
                         "shardlib: attention: the mask has shape [5, 4]; it is added to the scores of q's 4 queries "
                         "and k's 5 keys, so it must be [4, 5]",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::attention(q, Ten<Batch>::zeros(mesh, {2, 0, 3, 8}), Ten<Batch>::zeros(mesh, {2, 0, 3, 6})),
                         doctest::Contains("k and v have sequence length 0: a query has no key to attend to"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::attention(q, k, v, {.scale = std::numeric_limits<double>::infinity()}),
                         doctest::Contains("the scale is not finite"), std::invalid_argument);
    using H = Ten<Batch, sl::bf16>;
    CHECK_THROWS_WITH_AS(sl::attention(H::zeros(mesh, {2, 4, 3, 8}), H::zeros(mesh, {2, 5, 3, 8}), H::zeros(mesh, {2, 5, 3, 6}),
                                       {.kernel = sl::AttentionKernel::fused}),
                         "shardlib: attention: the fused kernel takes float or double tensors in host memory, or bf16 or "
                         "f16 tensors in GPU memory in a build with SHARDLIB_HAVE_CUDNN (cuDNN's); these are bf16 in host memory",
                         std::runtime_error);
    CHECK_THROWS_WITH_AS(sl::attention(q, k, v, {.kernel = sl::AttentionKernel::fused, .block = -2}),
                         "shardlib: attention: the block (AttentionOptions::block) is -2; it is the side of the tiles of "
                         "scores, positive, or 0 to pick one",
                         std::invalid_argument);
    // The same on the default (unfused) path, which has no tiles to use it on.
    CHECK_THROWS_WITH_AS(sl::attention(q, k, v, {.block = -1}),
                         doctest::Contains("the block (AttentionOptions::block) is -1"), std::invalid_argument);
    // What ran: the ops, on host memory.
    const auto before = sl::attention_stats(ctx);
    (void)sl::attention(q, k, v, {.causal = true});
    CHECK(sl::attention_stats(ctx).unfused_forward == before.unfused_forward + 1);
    CHECK(sl::attention_stats(ctx).fused_forward == 0);
  });
}

TEST_CASE("the host's fused kernel: the ops' results and gradients, tile by tile, with less memory") {
  // AttentionKernel::fused on host memory: the blockwise kernel (a ring of one device) on each
  // device's block, tiles of `block` queries and keys (uneven, hidden ones skipped under causal),
  // against the unfused ops on the same layout: outputs and gradients to round-off; with the
  // sequence split, the all-to-all moves as the ops' (Ulysses).
  using Kind = sl::coll::Kind;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const int n = ctx.num_devices();
        auto compare = [&]<class S>(S, std::int64_t B, std::int64_t Sq, std::int64_t Sk, std::int64_t H, bool causal, bool masked,
                                    std::int64_t block) {
          CAPTURE(S::value.to_string());
          CAPTURE(causal);
          CAPTURE(masked);
          CAPTURE(Sq);
          CAPTURE(Sk);
          CAPTURE(block);
          const auto q = Ten<S>::random(mesh, {B, Sq, H, 3}, 1, -1.0, 1.0);
          const auto k = Ten<S>::random(mesh, {B, Sk, H, 3}, 2, -1.0, 1.0);
          const auto v = Ten<S>::random(mesh, {B, Sk, H, 2}, 3, -1.0, 1.0);
          const auto w = Ten<S>::random(mesh, {B, Sq, H, 2}, 4, -1.0, 1.0);
          const auto m = Ten<Mask>::random(mesh, {Sq, Sk}, 5, -2.0, 2.0);
          auto run = [&](sl::AttentionKernel kernel) {
            sl::Param<Ten<S>> pq(q), pk(k), pv(v);
            const sl::AttentionOptions o{.causal = causal, .kernel = kernel, .block = block};
            sl::coll::CommRecorder rec;
            const auto out = masked ? sl::attention(pq, pk, pv, m, o) : sl::attention(pq, pk, pv, o);
            sl::backward(sl::sum_all(out * w));
            return std::tuple{out.value().to_host(), pq.grad().to_host(), pk.grad().to_host(), pv.grad().to_host(),
                              rec.stats()[Kind::all_to_all].calls, rec.stats().total_calls()};
          };
          const auto before = sl::attention_stats(ctx);
          const auto [o1, dq1, dk1, dv1, a2a1, calls1] = run(sl::AttentionKernel::fused);
          CHECK(sl::attention_stats(ctx).fused_forward == before.fused_forward + 1);
          CHECK(sl::attention_stats(ctx).fused_backward == before.fused_backward + 1);
          CHECK(sl::attention_stats(ctx).unfused_forward == before.unfused_forward);
          const auto [o0, dq0, dk0, dv0, a2a0, calls0] = run(sl::AttentionKernel::unfused);
          CHECK(max_abs_diff(o1, o0) < 1e-12);
          CHECK(max_abs_diff(dq1, dq0) < 1e-12);
          CHECK(max_abs_diff(dk1, dk0) < 1e-12);
          CHECK(max_abs_diff(dv1, dv0) < 1e-12);
          CHECK(a2a1 == a2a0);  // the sequence moved onto the heads and back as the ops' form does
          CHECK(calls1 == calls0);
        };
        for (std::int64_t block : {0, 1, 2, 3})
          for (bool causal : {false, true})
            for (bool masked : {false, true}) {
              compare(Both{}, 2, 7, 7, 4, causal, masked, block);
              compare(Context{}, 1, 9, 9, 4, causal, masked, block);  // Ulysses, uneven
            }
        compare(Rep4{}, 2, 5, 9, 2, false, true, 2);   // more keys than queries
        compare(Rep4{}, 2, 9, 5, 2, true, false, 4);   // more queries than keys, causal from the top left
        compare(SeqHeads{}, 2, 6, 6, 4, true, true, 0);
        // In float: the output to float round-off beside the ops'.
        const auto qf = Ten<Both, float>::random(mesh, {2, 33, 2, 8}, 7, -1.f, 1.f);
        const auto a = sl::attention(qf, qf, qf, {.causal = true, .kernel = sl::AttentionKernel::fused, .block = 5}).to_host();
        const auto b = sl::attention(qf, qf, qf, {.causal = true}).to_host();
        double worst = 0;
        for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
        CHECK(worst < 1e-5);
        // Memory: the fused kernel holds tiles of scores, the ops [B, H, S, S] of them (several).
        auto peak = [&](sl::AttentionKernel kernel) {
          const auto q = Ten<Rep4>::random(mesh, {1, 96, 2, 4}, 1, -1.0, 1.0);
          sl::Param<Ten<Rep4>> pq(q), pk(q), pv(q);
          const std::int64_t start = sl::memory_usage(ctx).total();
          sl::reset_peak_memory(ctx);
          sl::backward(sl::sum_all(sl::attention(pq, pk, pv, {.causal = true, .kernel = kernel, .block = 16})));
          return sl::memory_usage(ctx).peak - start;
        };
        const std::int64_t fused = peak(sl::AttentionKernel::fused), ops = peak(sl::AttentionKernel::unfused);
        CAPTURE(fused);
        CAPTURE(ops);
        CHECK(fused < ops / 2);
        CHECK(ops >= 2 * 96 * 96 * 2 * std::int64_t(sizeof(double)));  // (the ops' scores and probabilities)
        (void)n;
      },
      {1, 2, 3, 4});
}

TEST_CASE("automatic on the host: the ops while a device's scores fit in one 16 MiB tile, the fused kernel beyond") {
  // The scores of a head on a device: S^2 elements. In float S = 2048 is 16 MiB exactly (the ops),
  // 2049 more (fused); in double 1448 and 1449. Heads split over "y" divide the bytes per device.
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        auto ran_fused = [&]<class S, class T>(S, T, std::int64_t seq, std::int64_t heads) {
          const auto q = Ten<S, T>::random(mesh, {1, seq, heads, 2}, 1, T(-1), T(1));
          const sl::AttentionStats before = sl::attention_stats(ctx);
          (void)sl::attention(q, q, q, {.causal = true});
          const sl::AttentionStats& after = sl::attention_stats(ctx);
          const bool fused = after.fused_forward == before.fused_forward + 1;
          CHECK(fused != (after.unfused_forward == before.unfused_forward + 1));  // one or the other
          return fused;
        };
        CHECK(!ran_fused(Rep4{}, float{}, 2048, 1));
        CHECK(ran_fused(Rep4{}, float{}, 2049, 1));
        CHECK(!ran_fused(Rep4{}, double{}, 1448, 1));
        CHECK(ran_fused(Rep4{}, double{}, 1449, 1));
        const int y = mesh.shape().size(1);  // two heads on each device of "y": twice a head's scores
        CHECK(!ran_fused(Heads{}, float{}, 1448, 2 * y));
        CHECK(ran_fused(Heads{}, float{}, 1449, 2 * y));
      },
      {1, 2});
}

TEST_CASE("on the host a causal mask alone is the softmax's own: no [Sq, Sk] bias made or added, half the scores read") {
  // As in GPU memory: the unfused form's softmax reads each row of the scores up to its diagonal
  // and writes 0 beyond it. A bias took two kernels more (its fill and its add) and a pass over
  // the [B, H, Sq, Sk] scores. With a mask of the user's the bias stays (both apply).
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const std::int64_t S = 48;
        const auto q = Ten<Rep4, float>::random(mesh, {2, S, 2, 8}, 1, -1.f, 1.f);
        auto run = [&](bool causal) {
          const auto before = sl::kernels::flop_count();
          (void)sl::attention(q, q, q, {.causal = causal, .kernel = sl::AttentionKernel::unfused});
          const auto after = sl::kernels::flop_count();
          return std::pair{after.kernel_calls - before.kernel_calls, after.kernel_bytes - before.kernel_bytes};
        };
        const auto [calls, bytes] = run(false);
        const auto [causal_calls, causal_bytes] = run(true);
        CHECK(causal_calls == calls);
        // the softmax reads 1 + 2 + ... + S of each [S, S] matrix's elements, not S * S
        const std::uint64_t unread = 2 * 2 * (S * S - S * (S + 1) / 2) * sizeof(float);
        CHECK(bytes - causal_bytes == unread);
      },
      {1});
}

TEST_CASE("16-bit attention on the host: the ops in float32, rounded once per op") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const auto q = Ten<Both, float>::random(mesh, {2, 8, 2, 8}, 1, -1.f, 1.f);
        const auto k = Ten<Both, float>::random(mesh, {2, 8, 2, 8}, 2, -1.f, 1.f);
        const auto v = Ten<Both, float>::random(mesh, {2, 8, 2, 8}, 3, -1.f, 1.f);
        const auto want = sl::attention(q, k, v, {.causal = true}).to_host();
        using B = Ten<Both, sl::bf16>;
        const auto got = sl::attention(sl::cast<sl::bf16>(q), sl::cast<sl::bf16>(k), sl::cast<sl::bf16>(v), {.causal = true});
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(got)>, B>);
        const auto g = sl::cast<float>(got).to_host();
        double worst = 0;
        for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, double(std::abs(g[i] - want[i])));
        CHECK(worst < 3e-2);
      },
      {1, 2});
}
}
