// SPDX-License-Identifier: Apache-2.0
// Calibration: measures what the cost model (include/shardlib/plan/cost.hpp) needs of the devices
// at hand and writes it as a profile (plan/profile.hpp) that `gpt --backend simulate --profile F`
// and sl::plan::Profile::load read (docs/16_planning.md, "Calibrating"):
//   bench_calibrate [--devices N] [--backend threads|mpi] [--node K] [--out FILE] [--name NAME] [--quick]
//   mpirun -np 16 bench_calibrate --backend mpi --node 8 --out cluster.json
// Every device measures at once, as in a training step (on a host, in-process devices share its
// cores): each figure is timed from a barrier before to a barrier after every device's calls,
// the median of --reps (5) repetitions.
// - GEMMs: float32 matmul of replicated [m, k] x [k, n] tensors (each device its own, no
//   collective) at 64^3, 192^3, 384^3 (--quick: 32^3, 96^3, 192^3): gemm_rate and gemm_call,
//   seconds = FLOPs / rate + calls x call.
// - Memory-bound kernels: a + b, gelu(a), softmax<1>(a) on float32 tensors of 4 Ki and 4 Mi
//   elements (--quick: 1 Mi), each call's bytes and count from kernels::flop_count():
//   memory_bandwidth and kernel_call, the same fit.
//   The fit (`fit` below): the rate from the larger sizes, the per-call cost from what the smaller
//   ones take beyond their work at that rate.
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
/// timed as they share them), `inner` calls between the barriers (as many as take about 2 ms,
/// 1 to 200, the same on every device), the median of `reps` (collective).
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
  const double first = block(1);
  const int inner = static_cast<int>(std::clamp(2e-3 / std::max(first, 1e-9), 1.0, 200.0));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(block(inner) / inner);
  return bench::median(t);
}

/// The rate and the per-call cost of work points (amount x, calls c, seconds y), y = x / rate +
/// c × call: the rate from the points of the larger amounts (the median of x / y over those at
/// least half the largest: there the per-call cost is small), the per-call cost from the others
/// (the median of what their time leaves after x / rate, per call, 0 at least). Returns {rate, call}.
std::pair<double, double> fit(const std::vector<std::array<double, 3>>& pts) {
  double largest = 0;
  for (const auto& p : pts) largest = std::max(largest, p[0]);
  std::vector<double> rates, calls;
  for (const auto& [x, c, y] : pts)
    if (x >= largest / 2) rates.push_back(x / y);
  const double rate = bench::median(rates);
  for (const auto& [x, c, y] : pts)
    if (x < largest / 2 && c > 0) calls.push_back(std::max(0.0, (y - x / rate) / c));
  return {rate, calls.empty() ? 0.0 : bench::median(calls)};
}

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
  bool quick = false;
  std::string out = "profile.json", name = "host";
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    if (i + 1 < argc && std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
    if (i + 1 < argc && std::strcmp(argv[i], "--name") == 0) name = argv[i + 1];
  }
  const int reps = static_cast<int>(bench::arg(argc, argv, "--reps", 5));
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
    if (ctx.device() == 0) std::fprintf(stderr, "calibrate: GEMMs on %d devices ...\n", n);
    std::vector<std::array<double, 3>> gemm_pts;
    for (std::int64_t s : quick ? std::vector<std::int64_t>{32, 96, 192} : std::vector<std::int64_t>{64, 256, 512}) {
      const M a = M::random(mesh, {s, s}, 1), b = M::random(mesh, {s, s}, 2);
      const auto f0 = sl::kernels::flop_count();
      (void)sl::matmul(a, b);
      const auto f1 = sl::kernels::flop_count();
      const double flops = static_cast<double>(f1.gemm - f0.gemm), calls = static_cast<double>(f1.gemm_calls - f0.gemm_calls);
      const double t = timed(ctx, reps, [&] { (void)sl::matmul(a, b); });
      gemm_pts.push_back({flops, calls, t});
      record(ctx, "gemm", "matmul " + std::to_string(s) + "^3", t,
             "\"flops\": " + std::to_string(flops) + ", \"gflops\": " + std::to_string(flops / t * 1e-9));
    }
    const auto [gemm_rate, gemm_call] = fit(gemm_pts);
    if (ctx.device() == 0) std::fprintf(stderr, "calibrate: memory-bound kernels ...\n");
    std::vector<std::array<double, 3>> mem_pts;
    for (std::int64_t elems : {std::int64_t{4096}, quick ? std::int64_t{1} << 20 : std::int64_t{4} << 20}) {
      const M a = M::random(mesh, {elems / 256, 256}, 3), b = M::random(mesh, {elems / 256, 256}, 4);
      auto one = [&](int which) {
        if (which == 0) (void)(a + b);
        else if (which == 1) (void)sl::gelu(a);
        else (void)sl::softmax<1>(a);
      };
      for (int which = 0; which < 3; ++which) {
        const auto f0 = sl::kernels::flop_count();
        (void)one(which);
        const auto f1 = sl::kernels::flop_count();
        const double bytes = static_cast<double>(f1.kernel_bytes - f0.kernel_bytes);
        const double calls = static_cast<double>(f1.kernel_calls - f0.kernel_calls);
        const double t = timed(ctx, reps, [&] { (void)one(which); });
        mem_pts.push_back({bytes, calls, t});
        const char* op = which == 0 ? "a + b" : which == 1 ? "gelu" : "softmax<1>";
        record(ctx, "kernels", std::string(op) + " " + std::to_string(elems), t,
               "\"bytes\": " + std::to_string(bytes) + ", \"calls\": " + std::to_string(calls) +
                   ", \"GBps\": " + std::to_string(bytes / t * 1e-9));
      }
    }
    const auto [memory_bandwidth, kernel_call] = fit(mem_pts);
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
           "\"gemm_rate\": " + std::to_string(gemm_rate) + ", \"gemm_call\": " + std::to_string(gemm_call) +
               ", \"memory_bandwidth\": " + std::to_string(memory_bandwidth) + ", \"kernel_call\": " +
               std::to_string(kernel_call) + ", \"intra_latency\": " + std::to_string(intra.latency) +
               ", \"intra_bandwidth\": " + std::to_string(intra.bandwidth) + ", \"inter_latency\": " +
               std::to_string(inter.latency) + ", \"inter_bandwidth\": " + std::to_string(inter.bandwidth));
    if (ctx.device() != 0) return;
    p.gemm_rate = gemm_rate;
    p.gemm_call = gemm_call;
    p.memory_bandwidth = memory_bandwidth;
    p.kernel_call = kernel_call;
    const std::string how = std::string("measured by bench_calibrate on ") + std::to_string(n) + " " +
                            std::string(ctx.backend()) + " devices, " + std::to_string(node) + " to a node";
    p.source = how + " (float32 matmul, a + b, gelu, softmax<1>; kernels/" + sl::kernels::blas_info().kernel() + ")";
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
                 "calibrate: GEMMs %.3g GFLOP/s + %.3g us a call; kernels %.3g GB/s + %.3g us a call; the profile: %s\n",
                 p.gemm_rate * 1e-9, p.gemm_call * 1e6, p.memory_bandwidth * 1e-9, p.kernel_call * 1e6, out.c_str());
  }
  return 0;
}
