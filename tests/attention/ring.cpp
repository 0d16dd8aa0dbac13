// SPDX-License-Identifier: Apache-2.0
// Ring attention (AttentionOptions::context = ContextParallel::ring and ring_zigzag): outputs
// and gradients against one device (everything replicated) for causal and not, a mask, uneven
// sequences, other query and key lengths, more devices than heads, a ring beside split heads and
// batch; central differences; the ring's traffic counted (p - 1 permutes of k and of v forward;
// the backward's p - 1 and p of dk and dv; the zig-zag's exchanges into its runs and back, nothing
// else); the zig-zag's balance (every device the same GEMM FLOPs under causal); its memory
// against the all-to-all form's; what ran; on shapes alone, the counts of a real run.
#include <doctest/doctest.h>
#include <shardlib/attention.hpp>
#include <shardlib/memory.hpp>

#include "../autodiff/gradcheck.hpp"
#include "../collectives/harness.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {
using M2 = sl::Mesh<"x", "y">;
template <class S, class T = double>
using Ten = sl::DistributedTensor<T, M2, S>;
using Rep4 = sl::Spec<none, none, none, none>;
using Ring = sl::Spec<none, sl::axes<"x", "y">, none, none>;  // the sequence over every device
using RingHeads = sl::Spec<none, "x", "y", none>;             // the ring over "x", heads over "y"
using RingBatch = sl::Spec<"y", "x", none, none>;             // the ring over "x", batch over "y"
using Mask = sl::Spec<none, none>;
constexpr sl::AttentionOptions ring_opts(bool causal, bool zigzag = false, std::int64_t block = 0) {
  return {.causal = causal, .context = zigzag ? sl::ContextParallel::ring_zigzag : sl::ContextParallel::ring, .block = block};
}

M2 mesh_of(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 2 == 0 ? M2(ctx, {n / 2, 2}) : M2(ctx, {n, 1});
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = a.size() == b.size() ? 0.0 : std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Output and gradients of the ring over spec S against one device, for [B, Sq, H, K] queries and
// [B, Sk, H, K/Kv] keys and values.
template <class S>
void check_against_one_device(sl::Context& ctx, std::int64_t B, std::int64_t Sq, std::int64_t Sk, std::int64_t H,
                              std::int64_t K, std::int64_t Kv, bool causal, bool masked, bool zigzag, std::int64_t block = 0) {
  CAPTURE(S::value.to_string());
  CAPTURE(block);
  CAPTURE(zigzag);
  CAPTURE(causal);
  CAPTURE(masked);
  CAPTURE(Sq);
  CAPTURE(Sk);
  const M2 mesh = mesh_of(ctx);
  const auto q = Ten<S>::random(mesh, {B, Sq, H, K}, 1, -1.0, 1.0);
  const auto k = Ten<S>::random(mesh, {B, Sk, H, K}, 2, -1.0, 1.0);
  const auto v = Ten<S>::random(mesh, {B, Sk, H, Kv}, 3, -1.0, 1.0);
  const auto w = Ten<S>::random(mesh, {B, Sq, H, Kv}, 4, -1.0, 1.0);
  const auto m = Ten<Mask>::random(mesh, {Sq, Sk}, 5, -2.0, 2.0);
  sl::Param<Ten<S>> pq(q), pk(k), pv(v);
  const auto o = masked ? sl::attention(pq, pk, pv, m, ring_opts(causal, zigzag, block))
                        : sl::attention(pq, pk, pv, ring_opts(causal, zigzag, block));
  static_assert(std::is_same_v<typename decltype(o)::spec_type, S>, "the output keeps q's layout");
  sl::backward(sl::sum_all(o * w));
  sl::Param<Ten<Rep4>> rq(q), rk(k), rv(v);
  const sl::AttentionOptions plain{.causal = causal};
  const auto ro = masked ? sl::attention(rq, rk, rv, m, plain) : sl::attention(rq, rk, rv, plain);
  sl::backward(sl::sum_all(ro * Ten<Rep4>(w)));
  CHECK(max_abs_diff(o.value().to_host(), ro.value().to_host()) < 1e-12);
  CHECK(max_abs_diff(pq.grad().to_host(), rq.grad().to_host()) < 1e-12);
  CHECK(max_abs_diff(pk.grad().to_host(), rk.grad().to_host()) < 1e-12);
  CHECK(max_abs_diff(pv.grad().to_host(), rv.grad().to_host()) < 1e-12);
}
}  // namespace

TEST_SUITE("attention") {
TEST_CASE("ring attention equals one device: in order and zig-zag, causal, masked, uneven, other lengths, more devices than heads") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        for (bool zigzag : {false, true}) {
          for (bool causal : {false, true})
            for (bool masked : {false, true}) {
              check_against_one_device<Ring>(ctx, 2, 8, 8, 3, 4, 4, causal, masked, zigzag);
              check_against_one_device<Ring>(ctx, 1, 9, 9, 1, 3, 2, causal, masked, zigzag);  // uneven; one head on every device
              check_against_one_device<RingHeads>(ctx, 2, 7, 7, 4, 2, 3, causal, masked, zigzag);
              check_against_one_device<RingBatch>(ctx, 3, 6, 6, 2, 4, 4, causal, masked, zigzag);
            }
          // Other lengths of queries and keys (the causal diagonal from the top left); a ring
          // longer than the sequence (empty blocks travel; zig-zag: empty runs).
          check_against_one_device<Ring>(ctx, 2, 5, 9, 2, 3, 3, false, true, zigzag);
          check_against_one_device<Ring>(ctx, 2, 9, 5, 2, 3, 3, true, false, zigzag);
          check_against_one_device<Ring>(ctx, 1, 3, 3, 2, 2, 2, true, false, zigzag);
          check_against_one_device<Ring>(ctx, 2, 13, 13, 2, 3, 2, true, true, zigzag);  // 2p runs uneven at every p
          // Each block in tiles (AttentionOptions::block): uneven ones, hidden ones skipped.
          check_against_one_device<Ring>(ctx, 2, 23, 23, 2, 3, 2, true, true, zigzag, 2);
          check_against_one_device<RingHeads>(ctx, 2, 17, 11, 4, 2, 3, false, true, zigzag, 3);
        }
        const auto& s = sl::attention_stats(ctx);
        CHECK(s.ring_forward == 2 * (4 * 4 + 6));
        CHECK(s.ring_backward == s.ring_forward);
      },
      {1, 2, 3, 4});
}

TEST_CASE("zig-zag ring attention balances the causal work: every device the same GEMM FLOPs, in order the last p times the first") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const int p = ctx.num_devices();
        const std::int64_t B = 2, S = 8 * p, H = 3, K = 4;
        const auto q = Ten<Ring>::random(mesh, {B, S, H, K}, 1), k = Ten<Ring>::random(mesh, {B, S, H, K}, 2),
                   v = Ten<Ring>::random(mesh, {B, S, H, K}, 3);
        // This device's GEMM FLOPs in one forward and backward; the least and the most over the devices.
        auto flops = [&](bool zigzag) {
          sl::Param<Ten<Ring>> pq(q), pk(k), pv(v);
          const std::uint64_t before = sl::kernels::flop_count().gemm;
          sl::backward(sl::sum_all(sl::attention(pq, pk, pv, ring_opts(true, zigzag))));
          const double mine = static_cast<double>(sl::kernels::flop_count().gemm - before);
          double most = mine, least = mine;
          ctx.world().all_reduce(&most, &most, 1, sl::coll::DType::f64, sl::coll::Op::max);
          ctx.world().all_reduce(&least, &least, 1, sl::coll::DType::f64, sl::coll::Op::min);
          return std::pair{least, most};
        };
        const auto [zl, zm] = flops(true);
        const auto [ol, om] = flops(false);
        CAPTURE(p);
        CHECK(zl == zm);
        // In order, device r computes r + 1 blocks of the causal triangle, each of 7 products
        // (two forward, five backward) of [S/p, S/p] by K; zig-zag 2p + 1 pairs of half-size
        // runs (a ring of one: its one block).
        const double block = 2.0 * B * H * 8 * 8 * K * 7;
        CHECK(ol == block);
        CHECK(om == p * block);
        CHECK(zm == (p > 1 ? (2 * p + 1) * block / 4 : block));
      },
      {1, 2, 3, 4});
}

TEST_CASE("ring attention's traffic: p - 1 permutes of k and of v forward, the ring again backward, nothing else") {
  using Kind = sl::coll::Kind;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const int p = ctx.num_devices();
        const std::int64_t B = 2, S = 8 * p, H = 3, K = 4, Kv = 2;
        sl::Param<Ten<Ring>> q(Ten<Ring>::random(mesh, {B, S, H, K}, 1)), k(Ten<Ring>::random(mesh, {B, S, H, K}, 2)),
            v(Ten<Ring>::random(mesh, {B, S, H, Kv}, 3));
        sl::coll::CommRecorder fwd;
        auto o = sl::attention(q, k, v, ring_opts(true));
        const sl::coll::CommStats f = fwd.stats();
        const auto u = static_cast<std::uint64_t>(p - 1);
        CHECK(f[Kind::permute].calls == 2 * u);
        CHECK(f.total_calls() == f[Kind::permute].calls);
        // Each permute sends one device's block of k or v: B * S/p * H * K elements.
        const std::uint64_t block = static_cast<std::uint64_t>(B * 8 * H) * sizeof(double);
        CHECK(f[Kind::permute].bytes_sent == u * block * (K + Kv));
        sl::coll::CommRecorder bwd;
        sl::backward(sl::sum_all(o));
        const sl::coll::CommStats b = bwd.stats();
        // k and v again (p - 1 each), their gradients' sums p each (the last one home).
        CHECK(b[Kind::permute].calls == (p > 1 ? 2 * u + 2 * static_cast<std::uint64_t>(p) : 0u));
        CHECK(b[Kind::permute].bytes_sent == (p > 1 ? (2 * u + 1) * block * (K + Kv) : 0u));
        CHECK(b.total_calls() == b[Kind::permute].calls);
      },
      {1, 2, 4});
}

TEST_CASE("zig-zag ring attention's traffic: the ring's permutes, and two exchanges per operand into its runs and per result back") {
  using Kind = sl::coll::Kind;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const int p = ctx.num_devices(), me = ctx.device();
        const std::int64_t B = 2, S = 8 * p, H = 3, K = 4, Kv = 2;
        sl::Param<Ten<Ring>> q(Ten<Ring>::random(mesh, {B, S, H, K}, 1)), k(Ten<Ring>::random(mesh, {B, S, H, K}, 2)),
            v(Ten<Ring>::random(mesh, {B, S, H, Kv}, 3));
        // The sequence in 2p runs of 4: run c is held in order by device c / 2, in the zig-zag by
        // c (c < p) or 2p - 1 - c. Positions this device sends away into the runs, and receives.
        auto zigzag_owner = [p](int c) { return c < p ? c : 2 * p - 1 - c; };
        std::uint64_t out_rows = 0, in_rows = 0;
        for (int c : {2 * me, 2 * me + 1}) out_rows += zigzag_owner(c) != me ? 4 : 0;
        for (int c : {me, 2 * p - 1 - me}) in_rows += c / 2 != me ? 4 : 0;
        const std::uint64_t row = static_cast<std::uint64_t>(B * H) * sizeof(double);  // one position's bytes per head dim
        const auto u = static_cast<std::uint64_t>(p - 1);
        const std::uint64_t block = static_cast<std::uint64_t>(B * 8 * H) * sizeof(double);
        sl::coll::CommRecorder fwd;
        auto o = sl::attention(q, k, v, ring_opts(true, true));
        const sl::coll::CommStats f = fwd.stats();
        CHECK(f[Kind::permute].calls == 2 * u);
        CHECK(f[Kind::permute].bytes_sent == u * block * (K + Kv));
        // q, k, v into the runs, the output back: two exchanges each.
        CHECK(f[Kind::all_to_all].calls == (p > 1 ? 8u : 0u));
        CHECK(f[Kind::all_to_all].bytes_sent == out_rows * row * (K + K + Kv) + in_rows * row * Kv);
        CHECK(f.total_calls() == f[Kind::permute].calls + f[Kind::all_to_all].calls);
        sl::coll::CommRecorder bwd;
        sl::backward(sl::sum_all(o));
        const sl::coll::CommStats b = bwd.stats();
        CHECK(b[Kind::permute].calls == (p > 1 ? 2 * u + 2 * static_cast<std::uint64_t>(p) : 0u));
        CHECK(b[Kind::permute].bytes_sent == (p > 1 ? (2 * u + 1) * block * (K + Kv) : 0u));
        // q, k, v, the output and its gradient into the runs; dq, dk, dv back.
        CHECK(b[Kind::all_to_all].calls == (p > 1 ? 16u : 0u));
        CHECK(b[Kind::all_to_all].bytes_sent == out_rows * row * (K + K + Kv + Kv + Kv) + in_rows * row * (K + K + Kv));
        CHECK(b.total_calls() == b[Kind::permute].calls + b[Kind::all_to_all].calls);
      },
      {1, 2, 3, 4});
}

TEST_CASE("ring attention against central differences, with the ring beside split heads") {
  namespace gc = sl::test::grad;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = sl::test::oracle::rng_for(ctx, 6);
        const M2 mesh = mesh_of(ctx);
        const auto w = Ten<RingHeads>::random(mesh, {2, 5, 4, 2}, 19, -1.0, 1.0);
        const auto m = Ten<Mask>::random(mesh, {5, 5}, 10, -1.0, 1.0);
        for (bool causal : {false, true})
          for (bool zigzag : {false, true}) {
            CAPTURE(causal);
            CAPTURE(zigzag);
            CHECK(gc::check([&](const auto& a, const auto& b, const auto& c) { return sl::sum_all(sl::attention(a, b, c, m, ring_opts(causal, zigzag)) * w); },
                            rng, "ring attention", 1e-6, 6, Ten<RingHeads>::random(mesh, {2, 5, 4, 3}, 21, -1.0, 1.0),
                            Ten<RingHeads>::random(mesh, {2, 5, 4, 3}, 22, -1.0, 1.0), Ten<RingHeads>::random(mesh, {2, 5, 4, 2}, 23, -1.0, 1.0)));
          }
      },
      {1, 2, 4});
}

TEST_CASE("ring attention holds one block of scores: less memory than the all-to-all form, the same result") {
  // [1, S, 4, 4] over p >= 4 devices: the all-to-all form holds every query's scores of its
  // head, [1, 4/p, S, S] (and the softmax's output, saved for the backward); the ring one block
  // of [1, 4, S/p, S/p] at a time, and saves only q, k, v, the output and the rows' lse.
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const int p = ctx.num_devices();
        if (p < 4) return;  // (under mpirun -np 2 or 3: the two forms' memory is alike on so few)
        const M2 mesh = mesh_of(ctx);
        const std::int64_t S = 128, H = 4, K = 4, block = (S + p - 1) / p;
        const auto q = Ten<Ring>::random(mesh, {1, S, H, K}, 1);
        const auto k = Ten<Ring>::random(mesh, {1, S, H, K}, 2);
        const auto v = Ten<Ring>::random(mesh, {1, S, H, K}, 3);
        auto peak = [&](sl::ContextParallel form) {
          sl::Param<Ten<Ring>> pq(q), pk(k), pv(v);
          const std::int64_t before = sl::memory_usage(ctx).total();
          sl::reset_peak_memory(ctx);
          sl::backward(sl::sum_all(sl::attention(pq, pk, pv, {.causal = true, .context = form})));
          return sl::memory_usage(ctx).peak - before;
        };
        const std::int64_t ring = peak(sl::ContextParallel::ring), zigzag = peak(sl::ContextParallel::ring_zigzag);
        // The all-to-all form's peak on the devices that hold heads (with 4 heads over 8 devices,
        // half hold none and attend nothing): the largest over the devices.
        double most = static_cast<double>(peak(sl::ContextParallel::all_to_all));
        ctx.world().all_reduce(&most, &most, 1, sl::coll::DType::f64, sl::coll::Op::max);
        const auto a2a = static_cast<std::int64_t>(most);
        MESSAGE("activation peak: ring " << ring << " B, zig-zag ring " << zigzag << " B, all-to-all (most) " << a2a << " B");
        // The ring's bound: two blocks of scores (probabilities and their gradient) of S/p x S/p
        // per head, and a few dozen [S/p, H, K] blocks (operands, outputs, buffers, gradients).
        const std::int64_t scores = 2 * H * block * block * 8, blocks = 40 * block * H * K * 8;
        CHECK(ring <= scores + blocks);
        CHECK(ring * 2 < a2a);
        CHECK(zigzag <= scores + blocks);  // (its runs' scores are a quarter of a block's; its operands are moved copies)
        CHECK(zigzag * 2 < a2a);
      },
      {4, 8});
}

TEST_CASE("on shapes alone the blockwise kernels count what a real run does, each sequence of the batch") {
  // A plan (Runtime::simulate) counts the first sequence's products and kernels of each tile for
  // every sequence of the batch rather than looping over them: the same GEMM FLOPs and calls and
  // the same other kernels' calls and bytes as the real run, on every device; the ring in order
  // and zig-zag, and the fused kernel after Ulysses' all-to-alls.
  struct Form {
    const char* name;
    sl::AttentionOptions opts;
  };
  const Form forms[] = {{"ring", ring_opts(true, false, 5)},
                        {"ring_zigzag", ring_opts(true, true, 3)},
                        {"fused", {.causal = true, .kernel = sl::AttentionKernel::fused, .block = 5}}};
  for (const Form& form : forms)
    for (int n : {1, 2, 4}) {
      CAPTURE(form.name);
      CAPTURE(n);
      std::vector<sl::kernels::FlopCount> real(static_cast<std::size_t>(n)), planned(static_cast<std::size_t>(n));
      auto step = [&](std::vector<sl::kernels::FlopCount>& out) {
        return [&](sl::Context& ctx) {
          const M2 mesh = mesh_of(ctx);
          const std::int64_t B = 5, S = 24, H = 4, K = 3;
          sl::Param<Ten<Ring>> q(Ten<Ring>::random(mesh, {B, S, H, K}, 1)), k(Ten<Ring>::random(mesh, {B, S, H, K}, 2)),
              v(Ten<Ring>::random(mesh, {B, S, H, K}, 3));
          const sl::kernels::FlopCount before = sl::kernels::flop_count();
          sl::backward(sl::sum_all(sl::attention(q, k, v, form.opts)));
          const sl::kernels::FlopCount after = sl::kernels::flop_count();
          out[static_cast<std::size_t>(ctx.device())] = after - before;
        };
      };
      sl::Runtime::threads(n).spmd(step(real));
      for (int d = 0; d < n; ++d) sl::Runtime::simulate(n, d).spmd(step(planned));
      for (int d = 0; d < n; ++d) {
        CAPTURE(d);
        const sl::kernels::FlopCount &a = real[static_cast<std::size_t>(d)], &b = planned[static_cast<std::size_t>(d)];
        CHECK(a.gemm > 0);
        CHECK(b.gemm == a.gemm);
        CHECK(b.gemm_calls == a.gemm_calls);
        CHECK(b.gemm_products == a.gemm_products);
        CHECK(b.kernel_calls == a.kernel_calls);
        CHECK(b.kernel_bytes == a.kernel_bytes);
      }
    }
}

TEST_CASE("ring attention: bad input named; a ring of one device is plain attention") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const auto q = Ten<Ring>::random(mesh, {2, 6, 2, 4}, 1);
        const auto k = Ten<Ring>::random(mesh, {2, 6, 2, 3}, 2);
        CHECK_THROWS_WITH_AS(sl::attention(q, k, q, ring_opts(false)), doctest::Contains("head dim"), std::invalid_argument);
        // 16-bit on the host: the all-to-all form takes it, the ring says so.
        using H16 = Ten<Ring, sl::bf16>;
        const H16 h = H16::random(mesh, {2, 6, 2, 4}, 1);
        CHECK_THROWS_WITH_AS(sl::attention(h, h, h, ring_opts(true)), doctest::Contains("ring attention on the host takes float or double"),
                               std::invalid_argument);
        // Nothing split along the sequence: the option changes nothing.
        const auto r = Ten<Rep4>(q);
        CHECK(max_abs_diff(sl::attention(r, r, r, ring_opts(true)).to_host(), sl::attention(r, r, r, {.causal = true}).to_host()) == 0);
      },
      {1, 2});
}
}
