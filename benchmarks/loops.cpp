// SPDX-License-Identifier: Apache-2.0
// Loops benchmark: one JSON record per case on stdout, progress on stderr. Driven by
// `benchmarks/run loops`; run alone as
//   bench_loops --backend threads --devices 1|8 [--rows 2048] [--cols 2048]
//
// A double tensor of rows x cols (2048 x 2048, 32 MiB) split by rows over the devices
// (Spec<"x", none>). Each case is a shardlib loop next to the hand-written loop over local() that
// does the same (`baseline`: two nested plain loops over the Kokkos views, `i` then `j`):
//   add    parallel_for(out, a, b, f): out = a + b (the data movement of a 5-point-like update
//          written as a loop over several tensors); bytes: 2 read + 1 written per element
//   axpy   parallel_for(y, x, f): y += alpha * x; bytes: 2 read + 1 written per element
//   dot    parallel_reduce(a, b, f): the sum of a * b over the global tensor, on every device (the
//          baseline sums its block and all_reduces the scalar as well); bytes: 2 read per element
//   add_boundary  the add with the global index in use, as a 5-point update uses it: the interior
//          gets a + b, the global boundary keeps a
// and, for the record, two other ways to walk a block (`part` "alternatives", same baseline):
//   add_boundary mdrange      as a hand-written Kokkos::MDRangePolicy<Rank<2>> kernel
//   add_boundary flat divide  as a flat RangePolicy that turns each linear index into a global
//                             index with a divide and a modulo per dim (what parallel_for did up
//                             to issue 15)
// seconds: the slowest device's, median of 7 repetitions alternating with the baseline
// (bench::time_ops). GBps: the bytes all devices move over seconds; copy_GBps: the same for a
// memcpy of one block into another on every device at once (the bytes read and written by a copy
// of the local block: 2 per element), measured in the same run; fraction_of_copy = GBps / copy_GBps.
#include <shardlib/shardlib.hpp>

#include "common.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {

using M1 = sl::Mesh<"x">;
using Rows = sl::Spec<"x", none>;
using Tensor = sl::DistributedTensor<double, M1, Rows>;

using bench::num;

struct Bandwidth {
  double copy_gbps = 0;  // memcpy of every device's block at once, bytes read + written
};

/// One record: `op` next to `base`, `bytes_per_element` over all devices' elements.
template <class Op, class Base>
void run_case(sl::Context& ctx, const char* part, const char* name, std::int64_t elements, int bytes_per_element,
              const Bandwidth& bw, Op&& op, Base&& base, const char* baseline) {
  const auto [ours, theirs] = bench::time_ops(ctx.world(), op, &base);
  const double bytes = static_cast<double>(elements) * bytes_per_element;
  const double gbps = bytes / ours * 1e-9, base_gbps = bytes / theirs * 1e-9;
  if (ctx.device() == 0) {
    std::printf("{\"bench\": \"loops\", \"part\": \"%s\", \"name\": \"%s\", \"backend\": \"%s\", \"devices\": %d, "
                "\"seconds\": %s, \"baseline\": \"%s\", \"baseline_seconds\": %s, \"ratio_to_baseline\": %s, "
                "\"bytes\": %s, \"GBps\": %s, \"baseline_GBps\": %s, \"copy_GBps\": %s, \"fraction_of_copy\": %s, "
                "\"baseline_fraction_of_copy\": %s}\n",
                part, name, std::string(ctx.backend()).c_str(), ctx.num_devices(), num(ours).c_str(), baseline,
                num(theirs).c_str(), num(theirs / ours).c_str(), num(bytes).c_str(), num(gbps).c_str(),
                num(base_gbps).c_str(), num(bw.copy_gbps).c_str(), num(gbps / bw.copy_gbps).c_str(),
                num(base_gbps / bw.copy_gbps).c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "  %-16s %d dev  %8.3f ms  hand loop %8.3f ms  (hand/ours %.3f)  %6.2f GB/s = %.2f of copy\n", name,
                 ctx.num_devices(), ours * 1e3, theirs * 1e3, theirs / ours, gbps, gbps / bw.copy_gbps);
  }
}

void loops(sl::Context& ctx, std::int64_t rows, std::int64_t cols) {
  M1 mesh(ctx, {ctx.num_devices()});
  auto a = Tensor::random(mesh, {rows, cols}, 1), b = Tensor::random(mesh, {rows, cols}, 2);
  auto out = Tensor::zeros(mesh, {rows, cols}), y = Tensor::random(mesh, {rows, cols}, 3);
  const std::int64_t elements = rows * cols;
  const auto A = a.local(), B = b.local(), O = out.local(), Y = y.local();
  const auto n0 = static_cast<std::int64_t>(A.extent(0)), n1 = static_cast<std::int64_t>(A.extent(1));

  // The copy bandwidth: a memcpy of the block (into out), on every device at once.
  Bandwidth bw;
  {
    const std::size_t block = static_cast<std::size_t>(n0 * n1) * sizeof(double);
    auto copy = [&] { std::memcpy(O.data(), A.data(), block); };
    const auto [t, unused] = bench::time_ops(ctx.world(), copy, static_cast<decltype(copy)*>(nullptr));
    (void)unused;
    bw.copy_gbps = 2.0 * static_cast<double>(elements) * sizeof(double) / t * 1e-9;
    if (ctx.device() == 0) std::fprintf(stderr, "  memcpy of the blocks: %.2f GB/s (read + written)\n", bw.copy_gbps);
  }

  run_case(ctx, "for", "add", elements, 3 * sizeof(double), bw,
           [&] { sl::parallel_for(out, a, b, [](const sl::Index<2>&, double& o, double x, double z) { o = x + z; }); },
           [&] {
             for (std::int64_t i = 0; i < n0; ++i)
               for (std::int64_t j = 0; j < n1; ++j) O(i, j) = A(i, j) + B(i, j);
           },
           "hand loop over local()");
  const double alpha = 1e-3;
  run_case(ctx, "for", "axpy", elements, 3 * sizeof(double), bw,
           [&] { sl::parallel_for(y, a, [=](const sl::Index<2>&, double& yv, double x) { yv += alpha * x; }); },
           [&] {
             for (std::int64_t i = 0; i < n0; ++i)
               for (std::int64_t j = 0; j < n1; ++j) Y(i, j) += alpha * A(i, j);
           },
           "hand loop over local()");
  double sink = 0;
  run_case(ctx, "reduce", "dot", elements, 2 * sizeof(double), bw,
           [&] { sink += sl::parallel_reduce(a, b, [](const sl::Index<2>&, double x, double z) { return x * z; }); },
           [&] {
             double s = 0;
             for (std::int64_t i = 0; i < n0; ++i)
               for (std::int64_t j = 0; j < n1; ++j) s += A(i, j) * B(i, j);
             ctx.world().all_reduce(&s, &s, 1, sl::coll::DType::f64, sl::ReduceOp::sum);
             sink += s;
           },
           "hand loop over local() + all_reduce");

  // The add again, with the global index in use as a 5-point update uses it: the interior gets
  // a + b, the global boundary keeps a.
  const std::int64_t off0 = a.block().offset[0], off1 = a.block().offset[1];
  const auto boundary_add = [rows, cols](const sl::Index<2>& i, double& o, double x, double z) {
    o = i[0] > 0 && i[0] < rows - 1 && i[1] > 0 && i[1] < cols - 1 ? x + z : x;
  };
  const auto hand_boundary = [&] {
    for (std::int64_t i = 0; i < n0; ++i) {
      const std::int64_t gi = off0 + i;
      for (std::int64_t j = 0; j < n1; ++j) {
        const std::int64_t gj = off1 + j;
        O(i, j) = gi > 0 && gi < rows - 1 && gj > 0 && gj < cols - 1 ? A(i, j) + B(i, j) : A(i, j);
      }
    }
  };
  run_case(ctx, "for", "add_boundary", elements, 3 * sizeof(double), bw,
           [&] { sl::parallel_for(out, a, b, boundary_add); }, hand_boundary, "hand loop over local()");

  // Other ways to walk a block, for the record (why parallel_for walks chunks of rows).
  run_case(ctx, "alternatives", "add_boundary mdrange", elements, 3 * sizeof(double), bw,
           [&] {
             Kokkos::parallel_for("bench::mdrange",
                                  Kokkos::MDRangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::Rank<2>>(
                                      ctx.exec(), {0, 0}, {n0, n1}),
                                  [=](std::int64_t i, std::int64_t j) {
                                    sl::Index<2> g;
                                    g.i[0] = off0 + i;
                                    g.i[1] = off1 + j;
                                    boundary_add(g, O(i, j), A(i, j), B(i, j));
                                  });
             ctx.exec().fence();
           },
           hand_boundary, "hand loop over local()");
  run_case(ctx, "alternatives", "add_boundary flat divide", elements, 3 * sizeof(double), bw,
           [&] {
             const double* pa = A.data();
             const double* pb = B.data();
             double* po = O.data();
             Kokkos::parallel_for("bench::flat",
                                  Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(ctx.exec(), 0, n0 * n1),
                                  [=](std::int64_t k) {
                                    sl::Index<2> g;
                                    g.i[1] = off1 + k % n1;
                                    g.i[0] = off0 + k / n1 % n0;
                                    boundary_add(g, po[k], pa[k], pb[k]);
                                  });
             ctx.exec().fence();
           },
           hand_boundary, "hand loop over local()");
  if (sink == 42.0) std::fprintf(stderr, "(unlikely)\n");  // keeps the reductions alive
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
  bench::check_args(argc, argv,
                    {{"--rows", bench::Takes::integer},
                     {"--cols", bench::Takes::integer}});
  auto rt = sl::Runtime::from_args(argc, argv, 1);
  const auto rows = static_cast<std::int64_t>(bench::arg(argc, argv, "--rows", 2048));
  const auto cols = static_cast<std::int64_t>(bench::arg(argc, argv, "--cols", 2048));
  rt.spmd([&](sl::Context& ctx) {
    bench::warm_up(ctx.world());
    loops(ctx, rows, cols);
  });
  return 0;
}
