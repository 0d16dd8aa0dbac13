// SPDX-License-Identifier: Apache-2.0
// Calibration: measures what the cost model (include/shardlib/plan/cost.hpp) needs of the devices
// at hand and writes it as a profile (plan/profile.hpp) that `gpt --backend simulate --profile F`
// and sl::plan::Profile::load read (docs/16_planning.md, "Calibrating"):
//   bench_calibrate [--devices N] [--backend threads|mpi] [--node K] [--out FILE] [--name NAME] [--quick]
//   mpirun -np 16 bench_calibrate --backend mpi --node 8 --out cluster.json
// Each compute figure is timed twice, from a barrier before to a barrier after the calls (less
// the barriers' own time; the median of --reps (7) repetitions of about 10 ms): on device 0 alone
// (the others wait asleep) and on every device at once. GEMMs are bound by the cores: when
// every device works at once, as in a step, devices that share a host's cores share their time,
// so the profile's GEMM rate is device 0's alone over the host's oversubscription (its devices'
// threads over its cores, runtime/host.hpp's share; 1 at least) and its per-call cost times it
// (GEMMs timed in lockstep ran 30-50 % slower than the same devices' training steps do).
// Memory-bound kernels are bound by the host's memory, shared whatever the cores: their figures
// are those of every device at once.
// - GEMMs: float32 products of replicated tensors (each device its own, no collective): squares
//   of 64, 256, 512; a transformer's linear layers 2048x256x1024 and 2048x1024x256 and their
//   backward products (dY W^T, X^T dY); attention's scores bshk,bthk->bhst and values
//   bhst,bthk->bshk on [4, 128, 8, 32] (--quick: half the rows, squares and batch):
//   gemm_rate and gemm_product from the unbatched ones, seconds = FLOPs / rate + products x
//   per-product cost (the host's BLAS runs a batch a matrix at a time; the profile's gemm_call is
//   0); batched_gemm_rate from attention's (`batched_rate` below): their small products ran at a
//   fifth to a quarter of a linear layer's rate, 16-22 us each where the per-product fit gave 8-9.
// - Memory-bound kernels: a + b, gelu(a), softmax<1>(a), a + bias (a row broadcast) and
//   layer_norm<1>(a) on float32 tensors of 4 Ki and 4 Mi elements (--quick: 1 Mi), each call's
//   bytes and count from kernels::flop_count(): memory_bandwidth and kernel_call, the bandwidth
//   from the large tensors (the small ones run from the caches), the per-call cost from what the
//   small ones take beyond their bytes at it (`fit_large` below). The large tensors, and the
//   linear layers' and attention's GEMM operands, come in sets that take turns so that a call
//   reads operands past the last-level cache, as a step's do (`cold_sets`).
//   The unbatched GEMMs' fit (`fit` below): least squares over their points on the relative error.
// - Links: all_reduce and all_gather of 8 B to 16 MiB (--quick: 4 MiB) over the devices of one
//   node (intra_node) and over one device of each node (inter_node, when there are 2 nodes or
//   more; --node K devices to a node, all of them by default): latency, the median seconds per
//   algorithm step of the calls of 1 KiB or less; bandwidth, the median bytes per second of
//   the calls of 1 MiB or more, after their latency.
// One JSON record per figure on stdout (bench "calibrate"), progress and the profile's path on
// stderr. A link kind not measured (one node) is left out of the file: the planner then takes
// the named default and says so.
#include "common.hpp"

#include <shardlib/ops.hpp>
#include <shardlib/plan/cost.hpp>
#include <shardlib/runtime/runtime.hpp>
#include <shardlib/tensor.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace sl = shardlib;

namespace {

/// Seconds per call of `f()` with every device calling it at once, as in a training step: from a
/// barrier before to a barrier after the last device's call (so devices that share cores are
/// timed as they share them), less the time of the barriers alone, `inner` calls between the
/// barriers (as many as take about 10 ms, 1 to 1000, the same on every device), the median of
/// `reps` (collective).
template <class F>
double timed(sl::Context& ctx, int reps, F&& f) {
  auto block = [&](int inner) {
    ctx.world().barrier();
    const auto t0 = bench::Clock::now();
    for (int k = 0; k < inner; ++k) f();
    ctx.world().barrier();
    double t = std::chrono::duration<double>(bench::Clock::now() - t0).count(), slowest = 0;
    ctx.world().all_reduce(&t, &slowest, 1, sl::coll::DType::f64, sl::coll::Op::max);
    return slowest;
  };
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) t.push_back(block(0));
  const double barriers = bench::median(t);  // (waking devices that share cores is not free)
  const double first = std::max(block(1) - barriers, 1e-7);
  const int inner = static_cast<int>(std::clamp(10e-3 / first, 1.0, 1000.0));
  t.clear();
  for (int r = 0; r < reps; ++r) t.push_back(std::max(block(inner) - barriers, 1e-9) / inner);
  return bench::median(t);
}

/// Seconds per call of `f()` on device 0 alone, the others waiting at the barrier after it (asleep:
/// the threads backend's waits yield their cores), as timed() otherwise (collective).
template <class F>
double timed_alone(sl::Context& ctx, int reps, F&& f) {
  const bool me = ctx.device() == 0;
  return timed(ctx, reps, [&] {
    if (me) f();
  });
}

/// The rate and the per-call cost of work points (amount x, calls c, seconds y), y = x / rate +
/// c × call, fitted to every point at once: least squares on the relative error (each point's
/// residual over its y, so a small call counts as much as a large one), the per-call cost 0 at
/// least (then the rate alone is fitted). Returns {rate, call}.
std::pair<double, double> fit(const std::vector<std::array<double, 3>>& pts) {
  // minimise sum ((a x + b c - y) / y)^2 over a = 1 / rate >= 0, b = call >= 0
  double xx = 0, xc = 0, cc = 0, x1 = 0, c1 = 0;
  for (const auto& [x, c, y] : pts) {
    xx += x * x / (y * y), xc += x * c / (y * y), cc += c * c / (y * y), x1 += x / y, c1 += c / y;
  }
  const double det = xx * cc - xc * xc;
  double a = 0, b = 0;
  if (det > 0) {
    a = (x1 * cc - c1 * xc) / det;
    b = (xx * c1 - xc * x1) / det;
  }
  if (det <= 0 || b < 0 || a <= 0) {
    b = 0;
    a = xx > 0 ? x1 / xx : 0;
  }
  return {a > 0 ? 1 / a : 0, b};
}

/// The rate of the products of batched GEMM calls (points as fit()'s, their calls the products):
/// their FLOPs over their time less `per_product` (fit()'s cost, from the unbatched points) a
/// product. Where that cost would take half their time or more (measured: a tenth; the timings
/// were disturbed, by another program on the cores), their FLOPs over their whole time; 0 without
/// points (the cost model then takes gemm_rate).
double batched_rate(const std::vector<std::array<double, 3>>& pts, double per_product) {
  double flops = 0, seconds = 0, left = 0;
  for (const auto& [x, c, y] : pts) flops += x, seconds += y, left += std::max(0.0, y - c * per_product);
  if (!(seconds > 0)) return 0;
  return flops / (left >= seconds / 2 ? left : seconds);
}

/// As fit(), for memory-bound kernels: the rate from the points of the larger amounts (the median
/// of x / y over those at least half the largest: the smaller ones run from the caches, faster
/// per byte than a step's operands), the per-call cost from the others (the median of what their
/// time leaves after x / rate, per call, 0 at least). Returns {rate, call}.
std::pair<double, double> fit_large(const std::vector<std::array<double, 3>>& pts) {
  double largest = 0;
  for (const auto& p : pts) largest = std::max(largest, p[0]);
  std::vector<double> rates, calls;
  for (const auto& [x, c, y] : pts)
    if (x >= largest / 2) rates.push_back(x / y);
  const double rate = rates.empty() ? 0 : bench::median(rates);
  for (const auto& [x, c, y] : pts)
    if (x < largest / 2 && c > 0 && rate > 0) calls.push_back(std::max(0.0, (y - x / rate) / c));
  return {rate, calls.empty() ? 0.0 : bench::median(calls)};
}

/// How many sets of operands of `set_bytes` a device cycles through so that a call reads
/// operands the calls before it have pushed out of the last-level cache, as a training step's
/// kernels do (they read what ops long before wrote): the host's devices (`devices_on_host`) with
/// their sets together twice the last-level cache (sysconf's, 32 MiB when it does not say), and
/// no more than 1/8 of the host's memory. Measured here (a + b on 4 Mi floats, one core of a
/// 2-core VM on a 480 MiB L3): 26 GB/s on one set, as the calibration took it before, 17.7 on two,
/// 12.6-13.3 on 4 to 32; the step's kernels ran at 8.8 (a Kokkos Tools timer).
int cold_sets(std::int64_t set_bytes, int devices_on_host) {
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const double target = 2.0 * static_cast<double>(llc > 0 ? llc : 32l << 20);
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const double per_device = std::min(target, memory / 8) / std::max(1, devices_on_host);
  return static_cast<int>(std::clamp(std::ceil(per_device / static_cast<double>(set_bytes)), 1.0, 64.0));
}

using bench::num;

void record(sl::Context& ctx, const char* part, const std::string& name, double seconds, const std::string& fields) {
  if (ctx.device() != 0) return;
  std::printf("{\"bench\": \"calibrate\", \"part\": \"%s\", \"name\": \"%s\", \"backend\": \"%s\", \"devices\": %d, "
              "\"seconds\": %.6g, \"baseline\": null, \"baseline_seconds\": null, %s}\n",
              part, name.c_str(), std::string(ctx.backend()).c_str(), ctx.num_devices(), seconds, fields.c_str());
  std::fflush(stdout);
}

/// {latency, bandwidth} of `comm`'s all_reduce and all_gather, measured (see the file comment).
sl::plan::Link measure_link(sl::Context& ctx, sl::coll::Communicator& comm, const char* which, std::int64_t max_bytes,
                            int reps) {
  struct Point {
    double bytes_sent, seconds;
    int steps;
  };
  std::vector<double> alphas;
  std::vector<Point> large;
  const int n = comm.size();
  std::vector<float> in, out;
  for (std::int64_t bytes = 8; bytes <= max_bytes; bytes *= 8) {
    const std::size_t count = static_cast<std::size_t>(std::max<std::int64_t>(1, bytes / 4));
    in.assign(count * static_cast<std::size_t>(n), 1.f);
    out.assign(count * static_cast<std::size_t>(n), 0.f);
    for (sl::coll::Kind kind : {sl::coll::Kind::all_reduce, sl::coll::Kind::all_gather}) {
      auto call = [&] {
        if (kind == sl::coll::Kind::all_reduce)
          comm.all_reduce(in.data(), out.data(), count, sl::coll::DType::f32, sl::coll::Op::sum);
        else
          comm.all_gather(in.data(), out.data(), count, sl::coll::DType::f32);
      };
      const sl::coll::CommTrace tr = sl::coll::trace(call);
      const sl::coll::CallRecord& rec = tr.calls.at(0);
      const double t = timed(ctx, reps, call);
      const int steps = sl::plan::steps_of(rec);
      if (bytes <= 1024 && steps > 0) alphas.push_back(t / steps);
      if (bytes >= (1 << 20)) large.push_back({static_cast<double>(rec.bytes_sent), t, steps});
      record(ctx, "link", std::string(which) + " " + std::string(sl::coll::name(kind)), t,
             "\"bytes\": " + std::to_string(bytes) + ", \"bytes_sent\": " + std::to_string(rec.bytes_sent) +
                 ", \"group\": " + std::to_string(n) + ", \"steps\": " + std::to_string(steps));
    }
  }
  sl::plan::Link l;
  l.latency = alphas.empty() ? 0 : bench::median(alphas);
  std::vector<double> bw;  // bytes over the time left after the latency (at least half the call's)
  for (const Point& q : large) bw.push_back(q.bytes_sent / std::max(q.seconds * 0.5, q.seconds - q.steps * l.latency));
  l.bandwidth = bw.empty() ? 0 : bench::median(bw);
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, true)) return 0;
  bench::check_args(argc, argv,
                    {{"--out", bench::Takes::word},
                     {"--name", bench::Takes::word},
                     {"--reps", bench::Takes::integer},
                     {"--node", bench::Takes::integer},
                     {"--quick"}});
  const bool quick = bench::has_flag(argc, argv, "--quick");
  const std::string out = bench::text_arg(argc, argv, "--out", "profile.json"),
                    name = bench::text_arg(argc, argv, "--name", "host");
  const int reps = static_cast<int>(bench::arg(argc, argv, "--reps", 7));
  const long long node_arg = bench::arg(argc, argv, "--node", 0);
  std::vector<char*> rest;  // the runtime's flags
  for (int i = 0; i < argc; ++i) {
    const bool ours = std::strcmp(argv[i], "--out") == 0 || std::strcmp(argv[i], "--name") == 0 ||
                      std::strcmp(argv[i], "--reps") == 0 || std::strcmp(argv[i], "--node") == 0;
    if (ours) {
      ++i;
      continue;
    }
    if (std::strcmp(argv[i], "--quick") != 0) rest.push_back(argv[i]);
  }
  int rest_argc = static_cast<int>(rest.size());
  rest.push_back(nullptr);
  auto rt = sl::Runtime::from_args(rest_argc, rest.data(), 1);
  const int n = rt.num_devices();
  const int node = node_arg > 0 ? static_cast<int>(node_arg) : n;
  if (node > n || n % node != 0) {
    std::fprintf(stderr, "bench_calibrate: --node %d does not divide the %d devices\n", node, n);
    return 2;
  }
  sl::plan::Profile p;
  p.name = name;
  p.node_size = node;
  p.memory = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / std::max(1, node);
  rt.spmd([&](sl::Context& ctx) {
    using Mesh = sl::Mesh<"node", "local">;
    Mesh mesh(ctx, {n / node, node});
    using M = sl::DistributedTensor<float, Mesh, sl::Spec<sl::none, sl::none>>;
    // Each point timed on device 0 alone and with every device at once (see the file comment):
    // [0] alone, [1] all at once.
    std::vector<std::array<double, 3>> gemm_pts[2], batched_pts[2], mem_pts[2];
    // A point of `part` "gemm" (its FLOPs) or of a memory-bound kernel (its bytes).
    int operand_sets = 1;  // how many sets of operands the next points' calls take in turn
    auto point = [&](const char* part, const std::string& what, auto&& f) {
      const auto f0 = sl::kernels::flop_count();
      f();
      const auto f1 = sl::kernels::flop_count();
      const bool gemm = std::strcmp(part, "gemm") == 0;
      const bool batched = gemm && f1.gemm_products - f0.gemm_products > f1.gemm_calls - f0.gemm_calls;
      std::vector<std::array<double, 3>>* pts = batched ? batched_pts : gemm ? gemm_pts : mem_pts;
      const double amount = static_cast<double>(gemm ? f1.gemm - f0.gemm : f1.kernel_bytes - f0.kernel_bytes);
      // a GEMM's per-call cost is paid by each product: the host's BLAS runs a batch a matrix at a time
      const double calls = static_cast<double>(gemm ? f1.gemm_products - f0.gemm_products : f1.kernel_calls - f0.kernel_calls);
      const double alone = timed_alone(ctx, reps, f), all = timed(ctx, reps, f);
      pts[0].push_back({amount, calls, alone});
      pts[1].push_back({amount, calls, all});
      const std::string rate = gemm ? "gflops" : "GBps";
      record(ctx, part, what, alone,
             std::string(gemm ? "\"flops\": " : "\"bytes\": ") + num(amount) + ", \"calls\": " +
                 num(calls) + ", \"" + rate + "\": " + num(amount / alone * 1e-9) +
                 ", \"all_at_once_seconds\": " + num(all) + ", \"all_at_once_" + rate +
                 "\": " + num(amount / all * 1e-9) + ", \"operand_sets\": " + std::to_string(operand_sets));
    };
    if (ctx.device() == 0) std::fprintf(stderr, "calibrate: GEMMs on %d devices ...\n", n);
    // Squares, a transformer's linear layers ([tokens, d] x [d, 4d] and back) and its attention
    // products (a batch of heads of [S, K] x [K, S] per sequence, read in place).
    const std::int64_t q = quick ? 2 : 1;
    for (std::int64_t e : {64 / q, 256 / q, 512 / q}) {
      const M a = M::random(mesh, {e, e}, 1), b = M::random(mesh, {e, e}, 2);
      point("gemm", "matmul " + std::to_string(e) + "^3", [&] { (void)sl::matmul(a, b); });
    }
    // The linear layers' and attention's operands in sets that take turns, as the large kernels'
    // below (cold_sets): a step's GEMMs read activations written long before.
    int turn = 0;
    auto next = [&](std::size_t sets) { return static_cast<std::size_t>(turn = (turn + 1) % static_cast<int>(sets)); };
    auto operands = [&](auto make, std::int64_t set_bytes) {
      std::vector<decltype(make(0))> v;
      for (int k = 0, sets = cold_sets(set_bytes, node); k < sets; ++k) v.push_back(make(static_cast<std::uint64_t>(k)));
      operand_sets = static_cast<int>(v.size());
      return v;
    };
    for (auto [m, k, nn] : {std::array<std::int64_t, 3>{2048 / q, 256, 1024}, std::array<std::int64_t, 3>{2048 / q, 1024, 256}}) {
      const auto ab = operands([&](std::uint64_t s) { return std::pair{M::random(mesh, {m, k}, 1 + 2 * s), M::random(mesh, {k, nn}, 2 + 2 * s)}; },
                               (m * k + k * nn) * 4);
      point("gemm", "matmul " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(nn), [&] {
        const auto& [a, b] = ab[next(ab.size())];
        (void)sl::matmul(a, b);
      });
    }
    {  // the linear layer's backward products: dX = dY W^T (NT), dW = X^T dY (TN)
      const std::int64_t t = 2048 / q;
      const M w = M::random(mesh, {256, 1024}, 3);
      const auto xdy = operands([&](std::uint64_t s) { return std::pair{M::random(mesh, {t, 256}, 1 + 2 * s), M::random(mesh, {t, 1024}, 2 + 2 * s)}; },
                                t * (256 + 1024) * 4);
      point("gemm", "linear dX tn,kn->tk " + std::to_string(t) + "x1024x256",
            [&] { (void)sl::einsum<"tn,kn->tk">(xdy[next(xdy.size())].second, w); });
      point("gemm", "linear dW tk,tn->kn 256x" + std::to_string(t) + "x1024", [&] {
        const auto& [x, dy] = xdy[next(xdy.size())];
        (void)sl::einsum<"tk,tn->kn">(x, dy);
      });
    }
    {  // attention's products, per sequence a batch of heads read in place
      using Q = sl::DistributedTensor<float, Mesh, sl::Spec<sl::none, sl::none, sl::none, sl::none>>;
      const std::int64_t bs = 4 / q, seq = 128, heads = 8, hd = 32;
      struct Att { Q q, k, p; };
      const auto att = operands([&](std::uint64_t s) {
        return Att{Q::random(mesh, {bs, seq, heads, hd}, 5 + 3 * s), Q::random(mesh, {bs, seq, heads, hd}, 6 + 3 * s),
                   Q::random(mesh, {bs, heads, seq, seq}, 7 + 3 * s)};
      }, bs * (2 * seq * heads * hd + heads * seq * seq) * 4);
      point("gemm", "attention scores bshk,bthk->bhst " + std::to_string(bs) + "x128x8x32", [&] {
        const Att& o = att[next(att.size())];
        (void)sl::einsum<"bshk,bthk->bhst">(o.q, o.k);
      });
      point("gemm", "attention values bhst,bthk->bshk " + std::to_string(bs) + "x8x128x128", [&] {
        const Att& o = att[next(att.size())];
        (void)sl::einsum<"bhst,bthk->bshk">(o.p, o.k);
      });
    }
    const auto [alone_rate, alone_call] = fit(gemm_pts[0]);
    const double alone_batched_rate = batched_rate(batched_pts[0], alone_call);
    if (ctx.device() == 0) std::fprintf(stderr, "calibrate: memory-bound kernels ...\n");
    for (std::int64_t elems : {std::int64_t{4096}, quick ? std::int64_t{1} << 20 : std::int64_t{4} << 20}) {
      // The small tensors run from the caches (the per-call cost); the large ones in sets that
      // take turns, so that each call reads operands past the last-level cache (cold_sets).
      const int sets = elems == 4096 ? 1 : cold_sets(2 * elems * static_cast<std::int64_t>(sizeof(float)), node);
      operand_sets = sets;
      std::vector<M> as, bs;
      for (int k = 0; k < sets; ++k) {
        as.push_back(M::random(mesh, {elems / 256, 256}, 3 + 2 * static_cast<std::uint64_t>(k)));
        bs.push_back(M::random(mesh, {elems / 256, 256}, 4 + 2 * static_cast<std::uint64_t>(k)));
      }
      const std::string size = " " + std::to_string(elems);
      point("kernels", "a + b" + size, [&] {
        const std::size_t k = next(as.size());
        (void)(as[k] + bs[k]);
      });
      point("kernels", "gelu" + size, [&] { (void)sl::gelu(as[next(as.size())]); });
      point("kernels", "softmax<1>" + size, [&] { (void)sl::softmax<1>(as[next(as.size())]); });
      using V = sl::DistributedTensor<float, Mesh, sl::Spec<sl::none>>;
      const V bias = V::random(mesh, {256}, 5);
      point("kernels", "a + bias[256]" + size, [&] { (void)(as[next(as.size())] + bias); });
      point("kernels", "layer_norm<1>" + size, [&] { (void)sl::layer_norm<1>(as[next(as.size())]); });
    }
    const auto [alone_bandwidth, alone_kernel_call] = fit_large(mem_pts[0]);
    // GEMMs are bound by the cores: when every device works at once, as in a step, devices that
    // share cores share their time, so a device's GEMM rate is its own alone over the host's
    // oversubscription (its devices' threads over its cores, 1 at least) and its per-call cost
    // times it. Memory-bound kernels are bound by the host's memory, which its devices share
    // whatever their cores: timed all at once.
    const sl::host::ThreadShare& share = rt.thread_share();
    const double shared =
        std::max(1.0, static_cast<double>(share.devices_on_host) * share.per_device / std::max(1, share.cores));
    const double gemm_rate = alone_rate / shared, gemm_product = alone_call * shared;
    const double batched_gemm_rate = alone_batched_rate / shared;
    const auto [memory_bandwidth, kernel_call] = fit_large(mem_pts[1]);
    const std::int64_t max_bytes = quick ? std::int64_t{4} << 20 : std::int64_t{16} << 20;
    sl::plan::Link intra, inter;
    if (node > 1) {
      if (ctx.device() == 0) std::fprintf(stderr, "calibrate: collectives within a node (%d devices) ...\n", node);
      intra = measure_link(ctx, ctx.group(mesh, {1}), "intra_node", max_bytes, reps);
    }
    if (n / node > 1) {
      if (ctx.device() == 0) std::fprintf(stderr, "calibrate: collectives across %d nodes ...\n", n / node);
      inter = measure_link(ctx, ctx.group(mesh, {0}), "inter_node", max_bytes, reps);
    }
    record(ctx, "profile", "fit", 0,
           "\"gemm_rate\": " + num(gemm_rate) + ", \"gemm_product\": " + num(gemm_product) +
               ", \"batched_gemm_rate\": " + num(batched_gemm_rate) +
               ", \"shared\": " + num(shared) + ", \"alone_rate\": " + num(alone_rate) +
               ", \"alone_call\": " + num(alone_call) + ", \"alone_bandwidth\": " +
               num(alone_bandwidth) + ", \"alone_kernel_call\": " + num(alone_kernel_call) +
               ", \"memory_bandwidth\": " + num(memory_bandwidth) + ", \"kernel_call\": " +
               num(kernel_call) + ", \"intra_latency\": " + num(intra.latency) +
               ", \"intra_bandwidth\": " + num(intra.bandwidth) + ", \"inter_latency\": " +
               num(inter.latency) + ", \"inter_bandwidth\": " + num(inter.bandwidth));
    if (ctx.device() != 0) return;
    p.gemm_rate = gemm_rate;
    p.gemm_product = gemm_product;  // fitted per product (see `point`); gemm_call stays 0
    p.batched_gemm_rate = batched_gemm_rate;
    p.shared = shared;
    p.memory_bandwidth = memory_bandwidth;
    p.kernel_call = kernel_call;
    const std::string how = std::string("measured by bench_calibrate on ") + std::to_string(n) + " " +
                            std::string(ctx.backend()) + " devices, " + std::to_string(node) + " to a node";
    p.source = how + " (float32 matmul, linear-layer and attention GEMMs on device 0 alone, " +
               (shared > 1 ? "over " + std::to_string(shared).substr(0, 4) + " devices to a core set (" + share.source + ")"
                           : "one device to a core set") +
               "; a + b, gelu, softmax<1> on every device at once; kernels/" + sl::kernels::blas_info().kernel() + ")";
    if (node > 1) {
      p.intra_node = intra;
      p.intra_node.source = how + " (all_reduce, all_gather within a node)";
    }
    if (n / node > 1) {
      p.inter_node = inter;
      p.inter_node.source = how + " (all_reduce, all_gather across nodes)";
    }
  });
  const std::string json = p.to_json();  // (a link kind not measured has no bandwidth: left out)
  if (rt.first_local_device() == 0) {
    std::ofstream f(out);
    f << json;
    if (!f) {
      std::fprintf(stderr, "bench_calibrate: cannot write %s\n", out.c_str());
      return 1;
    }
    std::fprintf(stderr,
                 "calibrate: GEMMs %.3g GFLOP/s + %.3g us a matrix (in batches %.3g GFLOP/s); kernels %.3g GB/s + %.3g us "
                 "a call; the profile: %s\n",
                 p.gemm_rate * 1e-9, p.gemm_product * 1e6, p.batched_gemm_rate * 1e-9, p.memory_bandwidth * 1e-9, p.kernel_call * 1e6, out.c_str());
  }
  return 0;
}
