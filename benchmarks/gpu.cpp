// SPDX-License-Identifier: Apache-2.0
// GPU benchmark: one JSON record per case on stdout, progress on stderr. Driven by
// `benchmarks/run gpu --kokkos DIR` (which compiles this file with DIR's nvcc_wrapper; it skips
// with a message where there is no GPU or no CUDA-enabled Kokkos); run alone as
//   bench_gpu --part elementwise --devices 1   elementwise ops against a device-to-device copy
//   bench_gpu --part rows --devices 1          row kernels (softmax, norms, backward, sums, casts) against a copy
//   bench_gpu --part matmul --devices 1|2      sharded matmul against cuBLAS called directly
//   bench_gpu --part overhead --devices 1      per-op host overhead against the bare kernel launch
//   bench_gpu --part mlp --devices 1..8        the MLP block's TFLOP/s against the GPU's peak
//   bench_gpu --part reshard --devices 2..8    reshards between virtual devices on one GPU
//   bench_gpu --part stencil --devices 1..8    stencil_for sweeps (2-D and 3-D) against a device-to-device copy
//   bench_gpu --part mlp --profile-step        one MLP block alone, for a profiler (below)
// Tensors live in the memory of Kokkos's default execution space (Kokkos::CudaSpace); the devices
// are the threads backend's in-process devices, each on its own CUDA stream. Built against a
// Kokkos without CUDA (as CI builds it, to keep it compiling) it refuses to run unless given
// --host, which runs the same cases on host memory with host baselines (memcpy, kernels::gemm):
// a check of the program, not a GPU figure.
//
// Timing: a case is `iters` calls queued back to back, then one fence of every device's stream,
// timed on the host (the slowest device's time, as all_reduce max), `iters` chosen for ~20 ms;
// 7 repetitions alternating ours and the baseline; medians. Per call, then.
// elementwise: float32 a + b, a * 2 + 1 (two ops), gelu, exp, and bf16 a + b, gelu, on 64M
//   elements (256 MiB of float; --mib), bytes = the tensors read + the one written; baseline:
//   cudaMemcpyAsync device to device of the same bytes (half read, half written) on the same
//   stream; fraction_of_copy = the op's GB/s over the copy's (target >= 0.8).
// rows: on [rows, n] float tensors of --mib each, n = 64, 256, 1024, 4096, 32768: softmax<1>,
//   log_softmax<1>, layer_norm<1>, rms_norm<1> (the ops), softmax's and layer_norm's backward
//   kernels (autodiff::detail's, on the blocks), sum<1>, cast<bf16>; bytes as elementwise's (each
//   tensor read or written once); target >= 0.8 of the copy (issue 40).
// matmul: matmul(x, w) with no communication (x's rows over "x" on 2 devices), bf16 and float32
//   (with and without TF32), next to cublasGemmEx on the same local shapes, pointers, compute type
//   and stream, with a handle of the benchmark's own (target >= 0.95 of its speed).
// overhead: each op on a float [32, 32] tensor, host time per call with the calls queued back to
//   back (the GPU keeps up, so this is the host's cost: shapes, rules, block cache, launch), next
//   to the bare Kokkos::parallel_for of the same size on the same instance; overhead_us = ours -
//   bare (target <= 5 us); and matmul once more next to the cublasGemmEx call it makes, on the
//   same operands (the product's own dispatch cost, cuBLAS's host time taken out).
// mlp: bf16 x [T, D] (rows over "data"), w1 [D, F] (columns over "model"), w2 [F, D] (rows over
//   "model"): gelu(x w1) w2, the partial sum resolved to x's layout; 4 T D F flops; TFLOP/s next
//   to the GPU's bf16 dense peak (NVIDIA's datasheet figure for the GPU's name, --peak-tflops to
//   give it) and to cublasGemmEx of an 8192^3 bf16 product measured here (every virtual device
//   calling it at once: the GPU's GEMM throughput) (target: >= 0.5 of the peak at large sizes).
// reshard: a float tensor (--reshard-mib, 64 MiB) through S0->R, R->S0, S0->S1, S1->S0 between the
//   virtual devices, next to the bare copies: each device's cudaMemcpyAsync of its whole output
//   block (the bytes every device must write; a reshard made of copies cannot do less).
// stencil: stencil_for of a 2-D 5-point Jacobi sweep over float blocks of --stencil-side (8192)
//   squared per device and of a 3-D 7-point one over --stencil-side-3d (512) cubed (mesh as square
//   as the device count allows, the 3-D grid's last dim whole; one ghost layer), the sweep
//   alone (ghosts current) and a step with the ghost exchange overlapped; bytes = the block read
//   and written, next to cudaMemcpyAsync D2D of the block (as many bytes read and written):
//   fraction_of_copy (recorded; the host goal is >= 0.60 of the copy limit). Each with the
//   default kernels, then with the interior as planes in shared memory ("kernel": "planes", names
//   ending in "(planes)"; SHARDLIB_STENCIL_PLANES, stencil/planes.hpp), which the goal leaves out.
// --profile-step (mlp, stencil): no benchmark; the block of the first size (stencil: one 2-D and
//   one 3-D sweep, ghosts current, the kernels SHARDLIB_STENCIL_PLANES selects) alone, for a profiler
//   (scripts/gpu-check.sh --profile): warmed up, its wall time per call (the median of 21 calls,
//   each fenced) as a record {"part": "profile"}, then one more call between cudaProfilerStart and
//   cudaProfilerStop, which is all that `ncu --profile-from-start off` profiles.
#include <shardlib/autodiff.hpp>
#include <shardlib/shardlib.hpp>
#include <shardlib/stencil.hpp>

#include "gpu_common.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {

using gpubench::batch_seconds;
using gpubench::Exec;
using gpubench::fence;
using gpubench::gpu_name;
using gpubench::Mem;
using gpubench::num;
using gpubench::on_gpu;
using gpubench::profile_step;
using gpubench::record;
using gpubench::say;

using M1 = sl::Mesh<"x">;
using MD = sl::Mesh<"data", "model">;
template <class T, class Spec, class Mesh = M1>
using Tensor = sl::DistributedTensor<T, Mesh, Spec, Mem>;

/// A View's allocation without Kokkos's fill: the fill runs on the default instance, and several
/// in-process devices using the default instance at once from their threads race (seen on an
/// H200: a fill's kernel wrote 1.8 GB outside its View). Buffers here are filled, where they need
/// values, with deep_copy on the device's own instance.
inline auto uninitialised(const char* label) { return Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)); }

/// Medians of seconds per call of `op` and `base` (7 repetitions, alternating which goes first).
template <class F, class G>
std::pair<double, double> time_pair(sl::Context& ctx, F&& op, G&& base) {
  op();
  base();
  const double one = std::max(batch_seconds(ctx, op, 1), batch_seconds(ctx, base, 1));
  const int iters = std::clamp(static_cast<int>(0.02 / std::max(one, 1e-7)), 1, 2000);
  std::vector<double> a, b;
  for (int r = 0; r < 7; ++r) {
    if (r % 2) b.push_back(batch_seconds(ctx, base, iters));
    a.push_back(batch_seconds(ctx, op, iters));
    if (r % 2 == 0) b.push_back(batch_seconds(ctx, base, iters));
  }
  return {bench::median(a), bench::median(b)};
}

/// Host seconds per call of `f` queued `calls` times back to back (the fence after is not timed),
/// median of 7.
template <class F>
double host_seconds(sl::Context& ctx, F& f, int calls) {
  std::vector<double> v;
  for (int r = 0; r < 7; ++r) {
    fence(ctx);
    const auto t0 = bench::Clock::now();
    for (int i = 0; i < calls; ++i) f();
    v.push_back(std::chrono::duration<double>(bench::Clock::now() - t0).count() / calls);
    fence(ctx);
  }
  return bench::median(v);
}

// ---- the baselines: the bare copy, the bare GEMM, the bare kernel ---------------------------------

/// `bytes` from `src` to `dst` on this device's stream (cudaMemcpyAsync device to device; memcpy on
/// host memory).
void bare_copy(sl::Context& ctx, void* dst, const void* src, std::size_t bytes) {
#if defined(KOKKOS_ENABLE_CUDA)
  if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx.exec_for<Mem>().cuda_stream()) != cudaSuccess)
    throw std::runtime_error("bench_gpu: cudaMemcpyAsync failed");
#else
  (void)ctx;
  std::memcpy(dst, src, bytes);
#endif
}
const char* copy_name() { return on_gpu ? "cudaMemcpyAsync D2D" : "memcpy (host)"; }

/// Row-major C[m, n] = A[m, k] B[k, n], called directly: cublasGemmEx on this device's stream with
/// a handle of its own (kernels::gemm on host memory).
class BareGemm {
 public:
  explicit BareGemm(sl::Context& ctx) : ctx_(ctx) {
#if defined(KOKKOS_ENABLE_CUDA)
    if (cublasCreate(&h_) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h_, ctx.exec_for<Mem>().cuda_stream()) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("bench_gpu: cublasCreate / cublasSetStream failed");
#endif
  }
  BareGemm(const BareGemm&) = delete;
  BareGemm& operator=(const BareGemm&) = delete;
  ~BareGemm() {
#if defined(KOKKOS_ENABLE_CUDA)
    cublasDestroy(h_);
#endif
  }
  template <class T>
  void operator()(const T* a, const T* b, T* c, std::int64_t m, std::int64_t n, std::int64_t k, bool tf32 = false) {
#if defined(KOKKOS_ENABLE_CUDA)
    constexpr cudaDataType_t t = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
    const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float alpha = 1, beta = 0;
    // Row-major C = A B is column-major C^T = B^T A^T.
    if (cublasGemmEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, t, int(n), a, t, int(k), &beta, c, t,
                     int(n), compute, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("bench_gpu: cublasGemmEx failed");
#else
    (void)tf32;
    static_assert(std::is_same_v<T, float>, "bench_gpu --host: float products only (the host GEMM has no bf16)");
    sl::kernels::gemm<Kokkos::DefaultHostExecutionSpace, T>(ctx_.exec(), 1, {a, m, k, k, 1, 0}, {b, k, n, n, 1, 0}, {c, m, n, n, 1, 0});
#endif
  }
  static const char* name() { return on_gpu ? "cublasGemmEx" : "kernels::gemm (host)"; }

 private:
  sl::Context& ctx_;
#if defined(KOKKOS_ENABLE_CUDA)
  cublasHandle_t h_ = nullptr;
#endif
};

/// The bare kernel an elementwise op launches: c = a + b over n floats on this device's instance.
void bare_add(const Exec& exec, const float* a, const float* b, float* c, std::int64_t n) {
  Kokkos::parallel_for("bench_gpu::bare_add", Kokkos::RangePolicy<Exec>(exec, 0, n),
                       KOKKOS_LAMBDA(std::int64_t i) { c[i] = a[i] + b[i]; });
}

template <class T>
const char* dtype() {
  return std::is_same_v<T, float> ? "float32" : "bf16";
}

// ---- elementwise -----------------------------------------------------------------------------

/// One case of the elementwise or rows part: `op` moves `tensors` arrays of `n` T's (read or
/// written once each), against a copy of half as many bytes (as many read and written).
/// `part` and `extra` (more JSON fields, each ", \"key\": value") name the record.
template <class T, class F>
void elementwise_case(sl::Context& ctx, const char* name, int tensors, std::int64_t n, F&& op, void* dst, const void* src,
                      std::size_t capacity, const char* part = "elementwise", const std::string& extra = "") {
  const std::size_t bytes = static_cast<std::size_t>(tensors) * static_cast<std::size_t>(n) * sizeof(T);
  if (bytes / 2 > capacity) throw std::logic_error("bench_gpu: the copy buffers are too small for " + std::string(name));
  auto base = [&] { bare_copy(ctx, dst, src, bytes / 2); };
  const auto [secs, base_secs] = time_pair(ctx, op, base);
  const double gbs = bytes / secs * 1e-9, base_gbs = bytes / base_secs * 1e-9;
  record(ctx, std::string("\"part\": \"") + part + "\", \"name\": \"" + name + "\", \"dtype\": \"" + dtype<T>() + "\"" + extra +
                  ", \"elements\": " + std::to_string(n) + ", \"bytes\": " + std::to_string(bytes) + ", \"seconds\": " + num(secs) +
                  ", \"gbytes_per_second\": " + num(gbs) + ", \"baseline\": \"" + copy_name() + "\", \"baseline_seconds\": " +
                  num(base_secs) + ", \"copy_gbytes_per_second\": " + num(base_gbs) + ", \"fraction_of_copy\": " + num(gbs / base_gbs));
  say(ctx, std::string(name) + " " + dtype<T>() + ": " + num(gbs) + " GB/s, copy " + num(base_gbs) + " GB/s (" +
               num(gbs / base_gbs) + ")");
}

void elementwise(sl::Context& ctx, std::int64_t mib) {
  M1 mesh(ctx, {ctx.num_devices()});
  const std::int64_t n = (mib << 20) / 4, cols = 4096, rows = n / cols;
  // The copy baseline moves half of a case's bytes; the most a case counts is 4 float tensors.
  const std::size_t most = static_cast<std::size_t>(4 * rows * cols) * sizeof(float);
  Kokkos::View<char*, Mem> src(uninitialised("bench_gpu src"), most / 2), dst(uninitialised("bench_gpu dst"), most / 2);
  using F2 = Tensor<float, sl::Spec<"x", none>>;
  const auto a = F2::random(mesh, {rows, cols}, 1), b = F2::random(mesh, {rows, cols}, 2);
  const auto ha = sl::cast<sl::bf16>(a), hb = sl::cast<sl::bf16>(b);
  const std::int64_t m = rows * cols;
  elementwise_case<float>(ctx, "a + b", 3, m, [&] { auto c = a + b; }, dst.data(), src.data(), most / 2);
  elementwise_case<float>(ctx, "a * 2 + 1", 4, m, [&] { auto c = a * 2.0f + 1.0f; }, dst.data(), src.data(), most / 2);
  elementwise_case<float>(ctx, "gelu", 2, m, [&] { auto c = sl::gelu(a); }, dst.data(), src.data(), most / 2);
  elementwise_case<float>(ctx, "exp", 2, m, [&] { auto c = sl::exp(a); }, dst.data(), src.data(), most / 2);
  elementwise_case<sl::bf16>(ctx, "a + b", 3, m, [&] { auto c = ha + hb; }, dst.data(), src.data(), most / 2);
  elementwise_case<sl::bf16>(ctx, "gelu", 2, m, [&] { auto c = sl::gelu(ha); }, dst.data(), src.data(), most / 2);
}

// ---- rows ----------------------------------------------------------------------------------------

/// The row kernels of a transformer's step on [rows, n] float blocks (n from 64 to 32k, `mib` MiB
/// a tensor): softmax, log_softmax, layer_norm and rms_norm forward (the ops), their backward
/// kernels (softmax's, the norms'), the sum along the rows and a cast to bf16, each against a copy
/// of as many bytes.
void rows(sl::Context& ctx, std::int64_t mib, bool quick) {
  M1 mesh(ctx, {ctx.num_devices()});
  const std::int64_t total = (mib << 20) / 4;
  const std::size_t most = static_cast<std::size_t>(4 * total) * sizeof(float);
  Kokkos::View<char*, Mem> src(uninitialised("bench_gpu src"), most / 2), dst(uninitialised("bench_gpu dst"), most / 2);
  using F2 = Tensor<float, sl::Spec<"x", none>>;
  const auto& exec = ctx.exec_for<Mem>();
  const std::vector<std::int64_t> lengths = quick ? std::vector<std::int64_t>{64, 1024} : std::vector<std::int64_t>{64, 256, 1024, 4096, 32768};
  for (const std::int64_t n : lengths) {
    const std::int64_t rows = std::max<std::int64_t>(total / n / ctx.num_devices(), 1) * ctx.num_devices(), m = rows * n;
    const auto a = F2::random(mesh, {rows, n}, 1), g = F2::random(mesh, {rows, n}, 2);
    const auto y = sl::softmax<1>(a);
    auto out = F2::zeros(mesh, {rows, n});
    const std::int64_t lr = a.local().extent(0), lm = lr * n;
    const std::string extra = ", \"row_length\": " + std::to_string(n);
    const std::string tag = " [" + std::to_string(lr) + ", " + std::to_string(n) + "]";
    auto run = [&](const char* name, int tensors, auto&& op) {
      elementwise_case<float>(ctx, (name + tag).c_str(), tensors, lm, op, dst.data(), src.data(), most / 2, "rows", extra);
    };
    run("softmax", 2, [&] { auto r = sl::softmax<1>(a); });
    run("log_softmax", 2, [&] { auto r = sl::log_softmax<1>(a); });
    run("layer_norm", 2, [&] { auto r = sl::layer_norm<1>(a); });
    run("rms_norm", 2, [&] { auto r = sl::rms_norm<1>(a); });
    run("softmax backward", 3, [&] {
      sl::autodiff::detail::softmax_backward_rows(exec, y.local().data(), g.local().data(), out.local().data(), lr, n, 1.0);
    });
    run("layer_norm backward", 4, [&] {
      sl::autodiff::detail::norm_backward_rows(exec, a.local().data(), y.local().data(), g.local().data(), out.local().data(), lr,
                                               n, static_cast<double>(n), 1e-5, true);
    });
    run("sum along rows", 1, [&] { auto r = sl::sum<1>(a); });
    elementwise_case<sl::bf16>(ctx, ("cast to bf16" + tag).c_str(), 3, lm, [&] { auto r = sl::cast<sl::bf16>(a); }, dst.data(),
                               src.data(), most / 2, "rows", extra);
    (void)m;
  }
}

// ---- matmul ----------------------------------------------------------------------------------

/// shardlib's TF32 switch (products of float on tensor cores; CUDA only).
void set_tf32(bool on) {
#if defined(KOKKOS_ENABLE_CUDA)
  sl::kernels::set_allow_tf32(on);
#else
  (void)on;
#endif
}

template <class T>
void matmul_case(sl::Context& ctx, BareGemm& gemm, std::int64_t m, std::int64_t k, std::int64_t n, bool tf32) {
  M1 mesh(ctx, {ctx.num_devices()});
  using X = Tensor<T, sl::Spec<"x", none>>;
  using W = Tensor<T, sl::Spec<none, none>>;
  const auto x = X::random(mesh, {m, k}, 3, T(-1.0f), T(1.0f));
  const auto w = W::random(mesh, {k, n}, 4, T(-1.0f), T(1.0f));
  const std::int64_t lm = x.local().extent(0);
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> c(uninitialised("bench_gpu c"), lm, n);
  set_tf32(tf32);
  auto ours = [&] { auto y = sl::matmul(x, w); };
  auto base = [&] { gemm(x.local().data(), w.local().data(), c.data(), lm, n, k, tf32); };
  const auto [secs, base_secs] = time_pair(ctx, ours, base);
  set_tf32(false);
  const double tflops = 2.0 * lm * n * k / secs * 1e-12, base_tflops = 2.0 * lm * n * k / base_secs * 1e-12;
  const std::string dt = std::string(dtype<T>()) + (tf32 ? " (tf32)" : "");
  record(ctx, "\"part\": \"matmul\", \"name\": \"matmul " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) +
                  "\", \"dtype\": \"" + dt + "\", \"local_shape\": [" + std::to_string(lm) + ", " + std::to_string(k) + ", " +
                  std::to_string(n) + "], \"seconds\": " + num(secs) + ", \"tflops\": " + num(tflops) + ", \"baseline\": \"" +
                  BareGemm::name() + "\", \"baseline_seconds\": " + num(base_secs) + ", \"baseline_tflops\": " + num(base_tflops) +
                  ", \"fraction_of_baseline\": " + num(base_secs / secs));
  say(ctx, "matmul " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) + " " + dt + ": " + num(tflops) +
               " TFLOP/s per device, direct " + num(base_tflops) + " (" + num(base_secs / secs) + ")");
}

/// The 16-bit type of the products: bf16 on a GPU; float on host memory (--host), whose GEMM
/// has no bf16.
using H = std::conditional_t<on_gpu, sl::bf16, float>;

void matmul(sl::Context& ctx, bool quick) {
  BareGemm gemm(ctx);
  const std::int64_t f = quick ? 16 : 1;
  for (const std::int64_t s : {2048, 4096, 8192}) matmul_case<H>(ctx, gemm, s / f, s / f, s / f, false);
  matmul_case<H>(ctx, gemm, 16384 / f, 4096 / f, 16384 / f, false);
  matmul_case<float>(ctx, gemm, 4096 / f, 4096 / f, 4096 / f, false);
  if (on_gpu) matmul_case<float>(ctx, gemm, 4096 / f, 4096 / f, 4096 / f, true);
}

// ---- per-op host overhead --------------------------------------------------------------------

/// One overhead record. `stands_for`: the op whose overhead goal this record counts for instead
/// of the op's own record (matmul's, measured above the cuBLAS call the op makes).
template <class F>
void overhead_case(sl::Context& ctx, const char* name, std::int64_t size, int calls, double base, F&& op,
                   const char* baseline = "Kokkos::parallel_for (bare launch)", const char* stands_for = nullptr) {
  op();
  const double secs = host_seconds(ctx, op, calls);
  record(ctx, std::string("\"part\": \"overhead\", \"name\": \"") + name + "\", \"shape\": [" + std::to_string(size) + ", " +
                  std::to_string(size) + "], \"seconds\": " + num(secs) + ", \"baseline\": \"" + baseline +
                  "\", \"baseline_seconds\": " + num(base) + ", \"overhead_us\": " + num((secs - base) * 1e6) +
                  (stands_for ? std::string(", \"stands_for\": \"") + stands_for + "\"" : std::string()));
  say(ctx, std::string(name) + ": " + num(secs * 1e6) + " us per call on the host, " + baseline + " " + num(base * 1e6) + " us");
}

void overhead(sl::Context& ctx, std::int64_t size) {
  M1 mesh(ctx, {ctx.num_devices()});
  using F2 = Tensor<float, sl::Spec<"x", none>>;
  using R2 = Tensor<float, sl::Spec<none, none>>;
  const auto a = F2::random(mesh, {size, size}, 5), b = F2::random(mesh, {size, size}, 6);
  const auto w = R2::random(mesh, {size, size}, 7);
  const std::int64_t n = a.local().size();
  Kokkos::View<float*, Mem> c(uninitialised("bench_gpu c"), static_cast<std::size_t>(n));
  const Exec& exec = ctx.exec_for<Mem>();
  auto bare = [&] { bare_add(exec, a.local().data(), b.local().data(), c.data(), n); };
  const int calls = 200;  // far from CUDA's queue of ~1000 launches: the host never waits
  bare();
  const double base = host_seconds(ctx, bare, calls);
  overhead_case(ctx, "a + b", size, calls, base, [&] { auto r = a + b; });
  overhead_case(ctx, "gelu", size, calls, base, [&] { auto r = sl::gelu(a); });
  overhead_case(ctx, "a * 2", size, calls, base, [&] { auto r = a * 2.0f; });
  overhead_case(ctx, "sum<1>", size, calls, base, [&] { auto r = sl::sum<1>(a); });
  overhead_case(ctx, "softmax<1>", size, calls, base, [&] { auto r = sl::softmax<1>(a); });
  overhead_case(ctx, "transpose", size, calls, base, [&] { auto r = sl::transpose<0, 1>(w); });
  overhead_case(ctx, "matmul", size, calls, base, [&] { auto r = sl::matmul(a, w); });
  // The product's own dispatch: matmul against the cuBLAS call it makes, on the same operands.
  BareGemm gemm(ctx);
  Kokkos::View<float*, Mem> d(uninitialised("bench_gpu d"), static_cast<std::size_t>(a.local().extent(0) * size));
  auto direct = [&] { gemm(a.local().data(), w.local().data(), d.data(), a.local().extent(0), size, size); };
  direct();
  const double gemm_base = host_seconds(ctx, direct, calls);
  overhead_case(ctx, "matmul (over the GEMM)", size, calls, gemm_base, [&] { auto r = sl::matmul(a, w); },
                on_gpu ? "cublasGemmEx (direct call)" : "kernels::gemm (direct call)", "matmul");
}

// ---- the MLP block ---------------------------------------------------------------------------

/// NVIDIA's dense bf16 tensor-core peak for the GPU's name (TFLOP/s), or 0 when unknown.
double datasheet_bf16_peak(const std::string& name) {
  const auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H100 NVL") || has("H200 NVL")) return 835.5;
  if (has("H100 PCIe")) return 756.5;
  if (has("H100") || has("H200") || has("GH200")) return 989.4;  // SXM
  if (has("A100")) return 312.0;
  return 0.0;
}

void mlp(sl::Context& ctx, int model, double peak_arg, bool quick, bool profile) {
  const int devices = ctx.num_devices();
  if (devices % model) model = 1;
  MD mesh(ctx, {devices / model, model});
  struct Size {
    std::int64_t t, d, f;
  };
  const std::vector<Size> sizes = quick ? std::vector<Size>{{256, 64, 256}}
                                         : std::vector<Size>{{4096, 1024, 4096}, {8192, 4096, 16384}, {8192, 8192, 32768}};
  using X = Tensor<H, sl::Spec<"data", none>, MD>;
  using W1 = Tensor<H, sl::Spec<none, "model">, MD>;
  using W2 = Tensor<H, sl::Spec<"model", none>, MD>;
  if (profile) {
    const Size sz = sizes.front();
    const auto x = X::random(mesh, {sz.t, sz.d}, 1, H(-1.0f), H(1.0f));
    const auto w1 = W1::random(mesh, {sz.d, sz.f}, 2, H(-0.05f), H(0.05f));
    const auto w2 = W2::random(mesh, {sz.f, sz.d}, 3, H(-0.05f), H(0.05f));
    profile_step(ctx, "mlp T" + std::to_string(sz.t) + " D" + std::to_string(sz.d) + " F" + std::to_string(sz.f) + " step", [&] {
      auto y = sl::matmul(sl::gelu(sl::matmul(x, w1)), w2);
      auto out = sl::reshard<sl::Spec<"data", none>>(y);
    });
    return;
  }
  // The measured bound: one bf16 GEMM of 8192^3 called directly.
  BareGemm gemm(ctx);
  double cublas_tflops = 0;
  {
    const std::int64_t s = quick ? 512 : 8192;
    // Replicated tensors: each device's own s x s blocks, filled by shardlib's kernel on its stream
    // (Kokkos's ViewFill of bf16 wrote outside its View on an H200; see uninitialised).
    using R2 = Tensor<H, sl::Spec<none, none>, MD>;
    const auto a = R2::full(mesh, {s, s}, H(0.5f)), b = R2::full(mesh, {s, s}, H(0.25f));
    auto c = R2::full(mesh, {s, s}, H(0.0f));
    auto g = [&] { gemm(a.local().data(), b.local().data(), c.local().data(), s, s, s); };
    g();
    const double secs = batch_seconds(ctx, g, 10);
    cublas_tflops = 2.0 * s * s * s * devices / secs * 1e-12;  // every device's at once: the GPU's
  }
  const double peak = peak_arg > 0 ? peak_arg : datasheet_bf16_peak(gpu_name());
  const std::string peak_text = peak > 0 ? num(peak) : "null";
  const char* peak_source = peak_arg > 0 ? "--peak-tflops" : peak > 0 ? "NVIDIA datasheet, dense bf16" : "unknown GPU";
  for (const Size sz : sizes) {
    const auto x = X::random(mesh, {sz.t, sz.d}, 1, H(-1.0f), H(1.0f));
    const auto w1 = W1::random(mesh, {sz.d, sz.f}, 2, H(-0.05f), H(0.05f));
    const auto w2 = W2::random(mesh, {sz.f, sz.d}, 3, H(-0.05f), H(0.05f));
    auto block = [&] {
      auto h = sl::matmul(x, w1);
      auto y = sl::matmul(sl::gelu(h), w2);
      auto out = sl::reshard<sl::Spec<"data", none>>(y);
    };
    auto nothing = [] {};
    const auto [secs, unused] = time_pair(ctx, block, nothing);
    (void)unused;
    // Where the time goes: each stage alone, on the same operands.
    const auto h = sl::matmul(x, w1);
    const auto g = sl::gelu(h);
    const auto y = sl::matmul(g, w2);
    const auto [matmul1, gelu] = time_pair(ctx, [&] { auto r = sl::matmul(x, w1); }, [&] { auto r = sl::gelu(h); });
    const auto [matmul2, resolve] =
        time_pair(ctx, [&] { auto r = sl::matmul(g, w2); }, [&] { auto r = sl::reshard<sl::Spec<"data", none>>(y); });
    const std::string stages = "\"matmul1_seconds\": " + num(matmul1) + ", \"gelu_seconds\": " + num(gelu) +
                               ", \"matmul2_seconds\": " + num(matmul2) + ", \"reshard_seconds\": " + num(resolve);
    const double flops = 4.0 * sz.t * sz.d * sz.f;
    const double tflops = flops / secs * 1e-12 / devices;  // per GPU share: all devices are on one GPU
    const double on_gpu_total = flops / secs * 1e-12;
    record(ctx, "\"part\": \"mlp\", \"name\": \"mlp T" + std::to_string(sz.t) + " D" + std::to_string(sz.d) + " F" +
                    std::to_string(sz.f) + "\", \"mesh\": \"" + mesh.to_string() + "\", \"dtype\": \"" + dtype<H>() + "\", \"seconds\": " +
                    num(secs) + ", \"tflops\": " + num(on_gpu_total) + ", \"peak_tflops\": " + peak_text + ", \"peak_source\": \"" +
                    peak_source + "\", \"fraction_of_peak\": " + (peak > 0 ? num(on_gpu_total / peak) : "null") +
                    ", \"cublas_tflops\": " + num(cublas_tflops) + ", \"fraction_of_cublas\": " + num(on_gpu_total / cublas_tflops) +
                    ", " + stages + ", \"baseline\": null, \"baseline_seconds\": null");
    say(ctx, "mlp T" + std::to_string(sz.t) + " D" + std::to_string(sz.d) + " F" + std::to_string(sz.f) + " on " +
                 mesh.to_string() + ": " + num(on_gpu_total) + " TFLOP/s on the GPU (" + num(tflops) + " per device), peak " +
                 peak_text + ", one cuBLAS GEMM " + num(cublas_tflops));
    say(ctx, "  stages alone: matmul " + num(matmul1 * 1e3) + " ms, gelu " + num(gelu * 1e3) + " ms, matmul " +
                 num(matmul2 * 1e3) + " ms, reshard to Spec<data, none> " + num(resolve * 1e3) + " ms");
  }
}

// ---- reshards between virtual devices ------------------------------------------------------------

template <class To, class From>
void reshard_case(sl::Context& ctx, const char* name, const Tensor<float, From>& t) {
  const std::int64_t out_elems = sl::reshard<To>(t).local().size();
  const std::size_t bytes = static_cast<std::size_t>(out_elems) * 4;
  Kokkos::View<char*, Mem> src(uninitialised("bench_gpu src"), std::max<std::size_t>(bytes, 1)),
      dst(uninitialised("bench_gpu dst"), std::max<std::size_t>(bytes, 1));
  auto ours = [&] { auto r = sl::reshard<To>(t); };
  auto base = [&] { bare_copy(ctx, dst.data(), src.data(), bytes); };
  const auto [secs, base_secs] = time_pair(ctx, ours, base);
  const std::size_t global = static_cast<std::size_t>(t.shape()[0] * t.shape()[1]) * 4;
  record(ctx, std::string("\"part\": \"reshard\", \"name\": \"") + name + "\", \"bytes\": " + std::to_string(global) +
                  ", \"output_block_bytes\": " + std::to_string(bytes) + ", \"seconds\": " + num(secs) + ", \"baseline\": \"" +
                  copy_name() + " of each output block\", \"baseline_seconds\": " + num(base_secs) +
                  ", \"ratio_to_baseline\": " + num(secs / base_secs));
  say(ctx, std::string(name) + ": " + num(secs * 1e6) + " us, bare copies " + num(base_secs * 1e6) + " us (" +
               num(secs / base_secs) + "x)");
}

void reshard(sl::Context& ctx, std::int64_t mib) {
  M1 mesh(ctx, {ctx.num_devices()});
  const std::int64_t cols = 1024, rows = (mib << 20) / 4 / cols;
  const auto s0 = Tensor<float, sl::Spec<"x", none>>::random(mesh, {rows, cols}, 1);
  const auto r = Tensor<float, sl::Spec<none, none>>::random(mesh, {rows, cols}, 2);
  const auto s1 = Tensor<float, sl::Spec<none, "x">>::random(mesh, {rows, cols}, 3);
  reshard_case<sl::Spec<none, none>>(ctx, "S0->R", s0);
  reshard_case<sl::Spec<"x", none>>(ctx, "R->S0", r);
  reshard_case<sl::Spec<none, "x">>(ctx, "S0->S1", s0);
  reshard_case<sl::Spec<"x", none>>(ctx, "S1->S0", s1);
}

// ---- stencil ---------------------------------------------------------------------------------

using M2 = sl::Mesh<"x", "y">;

/// The 5-point Jacobi sweep: a struct (nvcc has no generic __host__ __device__ lambdas).
struct Jacobi5 {
  template <class Nb>
  KOKKOS_INLINE_FUNCTION float operator()(const sl::Index<2>&, const Nb& nb) const {
    return 0.25f * (nb(-1, 0) + nb(1, 0) + nb(0, -1) + nb(0, 1));
  }
};

/// The 7-point Jacobi sweep in 3-D.
struct Jacobi7 {
  template <class Nb>
  KOKKOS_INLINE_FUNCTION float operator()(const sl::Index<3>&, const Nb& nb) const {
    return (1.0f / 6) * (nb(-1, 0, 0) + nb(1, 0, 0) + nb(0, -1, 0) + nb(0, 1, 0) + nb(0, 0, -1) + nb(0, 0, 1));
  }
};

/// One stencil's sweep (ghosts current) and step (exchange overlapped) on a grid of `side`^R
/// points per device, split over a mesh as square as the device count allows (the last dim of a
/// 3-D grid whole), against a device-to-device copy of the block.
template <std::size_t R, class Stencil>
void stencil_case(sl::Context& ctx, std::int64_t side, const char* what, bool profile) {
  const int n = ctx.num_devices();
  int px = 1;
  for (int d = 1; d * d <= n; ++d)
    if (n % d == 0) px = d;
  const M2 mesh(ctx, {px, n / px});
  using SpecT = std::conditional_t<R == 2, sl::Spec<"x", "y">, sl::Spec<"x", "y", none>>;
  using Grid = Tensor<float, SpecT, M2>;
  std::int64_t shape[R];
  shape[0] = side * px;
  shape[1] = side * (n / px);
  if constexpr (R == 3) shape[2] = side;
  auto u = Grid::random(mesh, shape, 5, 0.0f, 1.0f), v = Grid::zeros(mesh, shape);
  std::array<int, R> widths;
  widths.fill(1);
  auto g = sl::ghosted(u, widths);
  const std::size_t block_bytes = static_cast<std::size_t>(u.local().size()) * sizeof(float);
  Kokkos::View<char*, Mem> src(uninitialised("bench_gpu src"), block_bytes), dst(uninitialised("bench_gpu dst"), block_bytes);
  auto base = [&] { bare_copy(ctx, dst.data(), src.data(), block_bytes); };
  std::string shape_text = "[";
  for (std::size_t d = 0; d < R; ++d) shape_text += (d ? ", " : "") + std::to_string(side);
  shape_text += "]";
  if (profile) {  // one sweep (ghosts current) alone, for a profiler
    g.exchange();
    profile_step(ctx, std::string(what) + " sweep " + shape_text, [&] { sl::stencil_for(v, g, Stencil{}, sl::GhostRefresh::none); });
    return;
  }
  // The default kernels, then the interior as planes in shared memory (SHARDLIB_STENCIL_PLANES,
  // stencil/planes.hpp: not the default until it measures faster; its records' names end in
  // "(planes)", which the goal's rows leave out). The setting is a process's: every device sets it
  // (the same value; one process's devices, or each MPI rank its own) between barriers.
  for (const bool planes : {false, true}) {
    ctx.world().barrier();
    sl::detail::set_stencil_planes(planes);
    ctx.world().barrier();
    for (const auto refresh : {sl::GhostRefresh::none, sl::GhostRefresh::overlap}) {
      const bool step = refresh == sl::GhostRefresh::overlap;
      const std::string name = std::string(what) + (step ? " step (exchange overlapped)" : " sweep") + (planes ? " (planes)" : "");
      if (!step) g.exchange();
      auto ours = [&] { sl::stencil_for(v, g, Stencil{}, refresh); };
      const auto [secs, base_secs] = time_pair(ctx, ours, base);
      const double bytes = 2.0 * static_cast<double>(block_bytes), gbs = bytes / secs * 1e-9, base_gbs = bytes / base_secs * 1e-9;
      record(ctx, "\"part\": \"stencil\", \"name\": \"" + name + "\", \"kernel\": \"" + (planes ? "planes" : "default") +
                      "\", \"dtype\": \"float32\", \"block_shape\": \"" + shape_text + "\", \"mesh\": \"" + mesh.to_string() +
                      "\", \"bytes\": " + num(bytes) + ", \"seconds\": " + num(secs) + ", \"gbytes_per_second\": " + num(gbs) +
                      ", \"baseline\": \"" + copy_name() + " of the block\", \"baseline_seconds\": " + num(base_secs) +
                      ", \"copy_gbytes_per_second\": " + num(base_gbs) + ", \"fraction_of_copy\": " + num(gbs / base_gbs));
      say(ctx, name + ", block " + shape_text + ": " + num(gbs) + " GB/s, copy " + num(base_gbs) + " GB/s (" +
                   num(gbs / base_gbs) + ")");
    }
  }
  ctx.world().barrier();
  sl::detail::set_stencil_planes(false);
  ctx.world().barrier();
}

void stencil(sl::Context& ctx, std::int64_t side, std::int64_t side3, bool profile) {
  stencil_case<2, Jacobi5>(ctx, side, "jacobi5", profile);
  stencil_case<3, Jacobi7>(ctx, side3, "jacobi7", profile);
}

using bench::has_flag;

}  // namespace

int main(int argc, char** argv) {
  try {
    if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
    bench::check_args(argc, argv,
                      {{"--part", bench::Takes::word, "elementwise|rows|matmul|overhead|mlp|reshard|stencil"},
                       {"--mib", bench::Takes::integer},
                       {"--reshard-mib", bench::Takes::integer},
                       {"--size", bench::Takes::integer},
                       {"--stencil-side", bench::Takes::integer},
                       {"--stencil-side-3d", bench::Takes::integer},
                       {"--model", bench::Takes::integer},
                       {"--peak-tflops", bench::Takes::integer},
                       {"--quick"},
                       {"--profile-step"},
                       {"--host"}});
    if (!on_gpu && !has_flag(argc, argv, "--host")) {
      std::fprintf(stderr,
                   "bench_gpu: skipped: this build's Kokkos has no CUDA (its default execution space runs on the host); "
                   "build it with a CUDA-enabled Kokkos's nvcc_wrapper (benchmarks/run gpu --kokkos DIR), or give --host "
                   "to check the program on host memory\n");
      return 77;
    }
    const std::string part = bench::text_arg(argc, argv, "--part", "elementwise");
    const bool profile = has_flag(argc, argv, "--profile-step");
    if (profile && part != "mlp" && part != "stencil")
      throw std::invalid_argument("--profile-step is for --part mlp or stencil, not " + part);
    auto rt = sl::Runtime::from_args(argc, argv, 1);
    const bool quick = has_flag(argc, argv, "--quick");
    const auto mib = bench::arg(argc, argv, "--mib", quick ? 4 : 256);
    const auto reshard_mib = bench::arg(argc, argv, "--reshard-mib", quick ? 4 : 64);
    const auto size = bench::arg(argc, argv, "--size", 32);
    const auto stencil_side = bench::arg(argc, argv, "--stencil-side", quick ? 256 : 8192);
    const auto stencil_side3 = bench::arg(argc, argv, "--stencil-side-3d", quick ? 32 : 512);
    const int model = static_cast<int>(bench::arg(argc, argv, "--model", 1));
    const double peak = static_cast<double>(bench::arg(argc, argv, "--peak-tflops", 0));
    rt.spmd([&](sl::Context& ctx) {
      bench::warm_up(ctx.world());
      say(ctx, "bench_gpu " + part + " on " + gpu_name() + ", " + std::to_string(ctx.num_devices()) + " device(s)");
      if (part == "elementwise") elementwise(ctx, mib);
      else if (part == "rows") rows(ctx, mib, quick);
      else if (part == "matmul") matmul(ctx, quick);
      else if (part == "overhead") overhead(ctx, size);
      else if (part == "mlp") mlp(ctx, model, peak, quick, profile);
      else if (part == "reshard") reshard(ctx, reshard_mib);
      else stencil(ctx, stencil_side, stencil_side3, profile);
    });
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
}
