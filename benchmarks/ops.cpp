// SPDX-License-Identifier: Apache-2.0
// Ops benchmark: one JSON record per case on stdout, progress on stderr. Driven by
// `benchmarks/run ops`; run alone as
//   bench_ops --part overhead --devices 1        per-op host overhead
//   bench_ops --part matmul --devices 1|2        sharded matmul against single-thread SGEMM
//   bench_ops --part mlp --devices 1|8           the transformer MLP block
//
// overhead: each op on a small tensor (float [32, 32], the default) next to the bare local kernel
//   it runs, called on raw pointers into buffers made once (`baseline`, the kernel the op
//   launches: kernels::elementwise, reduce_dim, gemm, permute, ...). overhead_us = op - kernel.
// matmul: `matmul(x, w)` with no communication (x rows over "x"; w columns over "y" on 2
//   devices), next to `cblas_sgemm` on one thread on the same local shape (`openblas_sgemm`);
//   without OpenBLAS the baseline is Eigen's own kernel (`eigen_gemm`).
// mlp: einsum (column-parallel), gelu, einsum (row-parallel), then the partial sum resolved to
//   replicated; seconds per block on the slowest device; collectives_per_block counted with a
//   CommRecorder (exactly 1 on a mesh whose "model" axis has more than one device).
#include <shardlib/shardlib.hpp>

#include "common.hpp"

#if defined(SHARDLIB_HAVE_OPENBLAS) && __has_include(<cblas.h>)
#include <cblas.h>
#define SHARDLIB_BENCH_CBLAS 1
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {

using M1 = sl::Mesh<"x">;
using M2 = sl::Mesh<"x", "y">;
using Rows = sl::Spec<"x", none>;
template <class Mesh, class Spec, class T = float>
using Tensor = sl::DistributedTensor<T, Mesh, Spec>;

std::string part_of(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--part") == 0) return argv[i + 1];
  return "overhead";
}

void record(sl::Context& ctx, const std::string& fields) {
  if (ctx.device() == 0) std::printf("{\"bench\": \"ops\", \"backend\": \"%s\", \"devices\": %d, %s}\n", std::string(ctx.backend()).c_str(),
                                     ctx.num_devices(), fields.c_str());
  std::fflush(stdout);
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// ---- per-op host overhead ----------------------------------------------------------------------
template <class Op, class Kernel>
void overhead_case(sl::Context& ctx, const char* name, std::int64_t n, Op&& op, Kernel&& kernel, const char* baseline) {
  const auto [ours, base] = bench::time_ops(ctx.world(), op, &kernel);
  record(ctx, "\"part\": \"overhead\", \"name\": \"" + std::string(name) + "\", \"shape\": [" + std::to_string(n) + ", " +
                  std::to_string(n) + "], \"seconds\": " + num(ours) + ", \"baseline\": \"" + baseline +
                  "\", \"baseline_seconds\": " + num(base) + ", \"overhead_us\": " + num((ours - base) * 1e6) +
                  ", \"ratio_to_baseline\": " + num(ours / base));
  std::fprintf(stderr, "  %-22s op %8.3f us  kernel %8.3f us  overhead %7.3f us\n", name, ours * 1e6, base * 1e6,
               (ours - base) * 1e6);
}

void overhead(sl::Context& ctx, std::int64_t n) {
  const int devices = ctx.num_devices();
  M1 mesh(ctx, {devices});
  using T2 = Tensor<M1, Rows>;
  const std::int64_t rows = n * devices;  // each device holds an n x n block
  auto a = T2::random(mesh, {rows, n}, 1), b = T2::random(mesh, {rows, n}, 2);
  auto bias = Tensor<M1, sl::Spec<none>>::random(mesh, {n}, 3);
  auto w = Tensor<M1, sl::Spec<none, none>>::random(mesh, {n, n}, 4);
  const auto& exec = ctx.exec();
  const std::array<std::int64_t, 2> ext{n, n};
  const auto dense = sl::kernels::row_major_strides(ext);
  std::vector<float> out(static_cast<std::size_t>(n * n)), stats(static_cast<std::size_t>(2 * n));
  const float* pa = a.local().data();
  const float* pb = b.local().data();
  const float* pw = w.local().data();
  float* po = out.data();
  using S = sl::kernels::Strided<float, 2>;

  overhead_case(ctx, "add", n, [&] { auto c = a + b; }, [&] {
    sl::kernels::elementwise(exec, po, ext, sl::fn::add{}, S{pa, dense}, S{pb, dense});
  }, "kernels::elementwise");
  overhead_case(ctx, "scale", n, [&] { auto c = a * 2.0f; }, [&] {
    sl::kernels::elementwise(exec, po, ext, sl::fn::bind_scalar<sl::fn::mul, float, false>{{}, 2.0f}, S{pa, dense});
  }, "kernels::elementwise");
  overhead_case(ctx, "gelu", n, [&] { auto c = sl::gelu(a); }, [&] {
    sl::kernels::elementwise(exec, po, ext, sl::fn::gelu{}, S{pa, dense});
  }, "kernels::elementwise");
  overhead_case(ctx, "bias_add_broadcast", n, [&] { auto c = a + bias; }, [&] {
    sl::kernels::elementwise(exec, po, ext, sl::fn::add{}, S{pa, dense}, S{bias.local().data(), {0, 1}});
  }, "kernels::elementwise strided");
  overhead_case(ctx, "sum_dim1", n, [&] { auto c = sl::sum<1>(a); }, [&] {
    sl::kernels::reduce_dim(exec, pa, po, n, n, 1, sl::kernels::ReduceKind::sum);
  }, "kernels::reduce_dim");
  overhead_case(ctx, "softmax_dim1", n, [&] { auto c = sl::softmax<1>(a); }, [&] {
    sl::kernels::reduce_dim(exec, pa, stats.data(), n, n, 1, sl::kernels::ReduceKind::max);
    sl::kernels::exp_sum(exec, pa, stats.data(), stats.data() + n, n, n, 1);
    sl::kernels::softmax_apply(exec, pa, po, stats.data(), stats.data() + n, n, n, 1, false);
  }, "kernels::reduce_dim+exp_sum+softmax_apply");
  overhead_case(ctx, "matmul", n, [&] { auto c = sl::matmul(a, w); }, [&] {
    sl::kernels::gemm<float>(1, {pa, n, n, n, 1, 0}, {pw, n, n, n, 1, 0}, {po, n, n, n, 1, 0});
  }, "kernels::gemm");
  overhead_case(ctx, "transpose", n, [&] { auto c = sl::transpose<0, 1>(w); }, [&] {
    const std::int64_t e[2] = {n, n};
    const int p[2] = {1, 0};
    sl::kernels::permute(exec, pw, po, 2, e, p);
  }, "kernels::permute");
  overhead_case(ctx, "reshape_merge", n, [&] { auto c = sl::reshape<"a b -> (a b)">(a); }, [&] {}, "none (no kernel)");
}

// ---- matmul against single-thread SGEMM ----------------------------------------------------------
double gflops(std::int64_t m, std::int64_t k, std::int64_t nn, double s) { return 2.0 * m * k * nn / s * 1e-9; }

template <class X, class W>
void matmul_case(sl::Context& ctx, const char* name, const X& x, const W& w) {
  const std::int64_t m = x.local_shape()[0], k = x.local_shape()[1], nn = w.local_shape()[1];
  std::vector<float> c(static_cast<std::size_t>(m * nn));
  const float* px = x.local().data();
  const float* pw = w.local().data();
  sl::coll::CommRecorder rec;
  auto op = [&] { auto y = sl::matmul(x, w); };
#ifdef SHARDLIB_BENCH_CBLAS
  const char* baseline = "openblas_sgemm";
  auto base = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(nn), static_cast<int>(k), 1.0f,
                px, static_cast<int>(k), pw, static_cast<int>(nn), 0.0f, c.data(), static_cast<int>(nn));
  };
#else
  const char* baseline = "eigen_gemm";
  auto base = [&] { sl::kernels::gemm<float>(1, {px, m, k, k, 1, 0}, {pw, k, nn, nn, 1, 0}, {c.data(), m, nn, nn, 1, 0}); };
#endif
  const auto [ours, theirs] = bench::time_ops(ctx.world(), op, &base);
  record(ctx, "\"part\": \"matmul\", \"name\": \"" + std::string(name) + "\", \"local_shape\": [" + std::to_string(m) + ", " +
                  std::to_string(k) + ", " + std::to_string(nn) + "], \"seconds\": " + num(ours) + ", \"gflops\": " +
                  num(gflops(m, k, nn, ours)) + ", \"baseline\": \"" + baseline + "\", \"baseline_seconds\": " + num(theirs) +
                  ", \"baseline_gflops\": " + num(gflops(m, k, nn, theirs)) + ", \"fraction_of_baseline\": " +
                  num(theirs / ours) + ", \"collectives\": " + std::to_string(rec.total_calls()) +
                  ", \"gemm_backend\": \"" + sl::kernels::gemm_backend() + "\"");
  std::fprintf(stderr, "  %-26s local %lldx%lldx%lld: %7.1f GFLOP/s, %s %7.1f GFLOP/s (%.3f)\n", name,
               static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(nn), gflops(m, k, nn, ours),
               baseline, gflops(m, k, nn, theirs), theirs / ours);
}

void matmul(sl::Context& ctx) {
  const int devices = ctx.num_devices();
  M2 mesh(ctx, {1, devices});
  // rows of x over "x" (size 1 here), columns of w over "y": the local product is M x K x N/devices
  for (auto [m, k, nn] : {std::array<std::int64_t, 3>{1024, 1024, 1024}, {2048, 1024, 2048}, {512, 4096, 2048}}) {
    auto x = Tensor<M2, sl::Spec<"x", none>>::random(mesh, {m, k}, 1);
    auto w = Tensor<M2, sl::Spec<none, "y">>::random(mesh, {k, nn * devices}, 2);
    matmul_case(ctx, "matmul column-parallel", x, w);
  }
}

// ---- the MLP block ---------------------------------------------------------------------------------
void mlp(sl::Context& ctx, int model) {
  const int devices = ctx.num_devices();
  using MD = sl::Mesh<"data", "model">;
  if (devices % model) model = 1;
  MD mesh(ctx, {devices / model, model});
  const std::int64_t batch = 8, seq = 128, d = 512, f = 2048;
  auto x = Tensor<MD, sl::Spec<"data", none, none>>::random(mesh, {batch, seq, d}, 1);
  auto w1 = Tensor<MD, sl::Spec<none, "model">>::random(mesh, {d, f}, 2);
  auto w2 = Tensor<MD, sl::Spec<"model", none>>::random(mesh, {f, d}, 3);
  auto block = [&] {
    auto h = sl::einsum<"bsd,df->bsf">(x, w1);
    auto a = sl::gelu(h);
    auto y = sl::einsum<"bsf,fd->bsd">(a, w2);
    return sl::reshard<sl::Spec<"data", none, none>>(y);
  };
  std::uint64_t calls = 0;
  {
    sl::coll::CommRecorder rec;
    auto out = block();
    calls = rec.total_calls();
  }
  auto op = [&] { auto out = block(); };
  const auto [secs, unused] = bench::time_ops(ctx.world(), op, static_cast<decltype(op)*>(nullptr));
  (void)unused;
  const double flops = 2.0 * 2.0 * batch * seq * d * f;
  record(ctx, "\"part\": \"mlp\", \"name\": \"mlp block\", \"mesh\": \"" + mesh.to_string() + "\", \"shape\": [" +
                  std::to_string(batch) + ", " + std::to_string(seq) + ", " + std::to_string(d) + ", " + std::to_string(f) +
                  "], \"seconds\": " + num(secs) + ", \"gflops\": " + num(flops / secs * 1e-9) +
                  ", \"collectives_per_block\": " + std::to_string(calls));
  std::fprintf(stderr, "  mlp block on %s: %.2f ms, %.1f GFLOP/s, %llu collective(s) per block\n", mesh.to_string().c_str(),
               secs * 1e3, flops / secs * 1e-9, static_cast<unsigned long long>(calls));
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
  auto rt = sl::Runtime::from_args(argc, argv, 1);
  const std::string part = part_of(argc, argv);
  const auto n = static_cast<std::int64_t>(bench::arg(argc, argv, "--size", 32));
  const int model = static_cast<int>(bench::arg(argc, argv, "--model", 2));
  rt.spmd([&](sl::Context& ctx) {
    bench::warm_up(ctx.world());
    if (part == "overhead") overhead(ctx, n);
    else if (part == "matmul") matmul(ctx);
    else if (part == "mlp") mlp(ctx, model);
    else throw std::invalid_argument("bench_ops: --part is overhead, matmul or mlp, not " + part);
  });
  return 0;
}
