// SPDX-License-Identifier: Apache-2.0
// Ops benchmark: one JSON record per case on stdout, progress on stderr. Driven by
// `benchmarks/run ops`; run alone as
//   bench_ops --part peak --devices 1            the core's float32/float64 peak, copy bandwidth
//   bench_ops --part overhead --devices 1        per-op host overhead
//   bench_ops --part matmul --devices 1|2        sharded matmul against single-thread S/DGEMM
//   bench_ops --part kernels --devices 1         elementwise ops, softmax, norms against memcpy
//   bench_ops --part mlp --devices 1|8           the transformer MLP block
//
// peak: one core's float32 and float64 peak, from three things, each said in the record as
//   measured or derived: the clock (measured: a chain of dependent integer adds, one cycle each,
//   timed with steady_clock), the vector width (from the CPU: avx512f -> 512 bits, avx2 + fma ->
//   256, else 128 with separate multiply and add), and the FMA instructions per cycle (measured: 12
//   independent FMA chains of the widest vectors, in a function compiled for that ISA with
//   __attribute__((target)) and chosen at run time; flops per cycle / (2 x lanes), rounded). peak =
//   units x lanes x 2 x clock. Both are the best of 5 runs (the least disturbed on a shared
//   machine). Copy bandwidth: memcpy of 128 MiB (--copy-mib) into another buffer, far larger than the
//   caches, bytes = read + write (STREAM's count; a write-allocate's extra read is not counted), one
//   thread and one thread per core (each copying its slice), best of 5. x86-64 only (elsewhere
//   the peak is recorded as not measured).
// overhead: each op on a small tensor (float [32, 32], the default) next to the bare local kernel
//   it runs, called on raw pointers into buffers made once (`baseline`, the kernel the op
//   launches: kernels::elementwise, reduce_dim, gemm, permute, ...). overhead_us = op - kernel.
// matmul: `matmul(x, w)` with no communication (x rows over "x"; w columns over "y" on 2
//   devices), float32 (three shapes) and float64 (1024^3), next to `cblas_sgemm` / `cblas_dgemm`
//   on the same local shape and BLAS threads (`openblas_sgemm`, `openblas_dgemm`); without OpenBLAS
//   the baseline is Eigen's own kernel (`eigen_gemm`). peak_gflops = the core's peak (measured in the same process, as in the
//   peak part) x the threads the GEMM used (gemm_threads, asked of OpenBLAS: the device's share of
//   the cores, as the runtime sets it); fraction_of_peak for ours and baseline_fraction_of_peak for
//   the BLAS call. Then a residual folded into the GEMM before it (part "fusion" of the records): on
//   the transformer block's two residual projections (local 1024 x 512 x 512 and 1024 x 2048 x 512),
//   `matmul_add(o, w, x)` against `x + matmul(o, w)`, and `matmul_add(o, w, std::move(t))` (t a
//   fresh tensor, its block taken over) against `t + matmul(o, w)`; speedup = baseline / ours.
// kernels: on one device, float32 tensors of 2M elements ([4096, 512], the MLP's [B*S, d_ff]-like
//   shape; softmax and log_softmax over the last dim of [8192, 128], the attention scores of B=8,
//   H=8, S=128): gelu, gelu_tanh, exp, tanh, sigmoid, a + b, softmax, log_softmax, layer_norm,
//   rms_norm, and float64 gelu, exp, tanh, a + b, softmax, layer_norm; then float32 gelu, softmax
//   and layer_norm again on 32M elements ("beyond cache": 128 MiB in and out, so the memcpy beside
//   them runs at the memory's bandwidth, not the cache's). bytes = the tensors read + the one
//   written, once each (the least traffic the op needs); baseline: memcpy of the same bytes (half
//   read, half written) between two buffers made once, alternated with the op: copy_gbytes_per_second
//   and fraction_of_copy = the op's GB/s over it (target >= 0.5 for gelu, softmax and layer_norm).
//   The op makes its output tensor each call, as a user's call does.
// mlp: einsum (column-parallel), gelu, einsum (row-parallel), then the partial sum resolved to
//   replicated; seconds per block on the slowest device; collectives_per_block counted with a
//   CommRecorder (exactly 1 on a mesh whose "model" axis has more than one device); gemm_threads and
//   kernel_threads: the threads one device's GEMM and Kokkos kernels run on (the device's share of
//   the cores for the GEMM; Kokkos's Serial backend runs the kernels on 1).
#include <shardlib/shardlib.hpp>

#include "common.hpp"

#if defined(SHARDLIB_HAVE_OPENBLAS) && __has_include(<cblas.h>)
#include <cblas.h>
#define SHARDLIB_BENCH_CBLAS 1
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SHARDLIB_BENCH_PEAK 1
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {

using M1 = sl::Mesh<"x">;
using M2 = sl::Mesh<"x", "y">;
using Rows = sl::Spec<"x", none>;
template <class Mesh, class Spec, class T = float>
using Tensor = sl::DistributedTensor<T, Mesh, Spec>;

void record(sl::Context& ctx, const std::string& fields) {
  if (ctx.device() == 0) std::printf("{\"bench\": \"ops\", \"backend\": \"%s\", \"devices\": %d, %s}\n", std::string(ctx.backend()).c_str(),
                                     ctx.num_devices(), fields.c_str());
  std::fflush(stdout);
}

using bench::num;

/// `p` is treated as read and written by something the compiler cannot see (a copy into a buffer
/// that is never read again is not optimised away).
inline void clobber(void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __asm__ __volatile__("" : : "r"(p) : "memory");
#else
  (void)p;
#endif
}

template <class F>
double seconds_of(F&& f) {
  const auto t0 = bench::Clock::now();
  f();
  return std::chrono::duration<double>(bench::Clock::now() - t0).count();
}

// ---- the core's peak and the copy bandwidth ----------------------------------------------------------
/// One core's float32 and float64 peak and the copy bandwidth, with what was measured and what was
/// derived kept apart (see the file comment).
struct Peak {
  bool measured = false;           // false off x86-64: nothing below is known
  double clock_ghz = 0;            // measured (dependent integer adds)
  int vector_bits = 0;             // from the CPU (cpuid via __builtin_cpu_supports)
  const char* isa = "none";        // the FMA kernel's ISA
  double flops_per_cycle[2] = {};  // measured, float32 and float64 (the kernel's rate / clock)
  double kernel_gflops[2] = {};    // measured: the FMA kernel's own rate
  double kernel_seconds[2] = {};   // one timed run of the FMA kernel
  double kernel_flops[2] = {};     // its flops
  int fma_units[2] = {};           // derived: flops_per_cycle / (2 x lanes), rounded
  double peak_gflops[2] = {};      // derived: units x lanes x 2 x clock
  int lanes(int dt) const { return vector_bits / (dt == 0 ? 32 : 64); }
};

#ifdef SHARDLIB_BENCH_PEAK
/// `blocks` x 1000 dependent register adds: 1000 cycles per block on every x86-64 core (the loop's
/// own increment and branch run beside the chain). A register operand, not an immediate, so that no
/// core folds the adds at rename.
[[gnu::noinline]] std::uint64_t add_chain(std::int64_t blocks) {
  std::uint64_t x = 0, one = 1;
  for (std::int64_t i = 0; i < blocks; ++i) __asm__ __volatile__(".rept 1000\n\taddq %1, %0\n\t.endr" : "+r"(x) : "r"(one));
  return x;
}

// 12 independent multiply-add chains (SLB_MADD, defined before each kernel) of full vectors (enough to cover 2 units x 4-5 cycles of latency,
// and few enough for the 16 registers of AVX2), started from different values so the compiler cannot
// merge them. Returns a lane of their sum so nothing is dead.
#define SLB_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define SLB_FMA_KERNEL(NAME, TARGET, T, V, SET1, ADD, STORE, LANES)                            \
  __attribute__((target(TARGET), noinline)) T NAME(std::int64_t iters) {                       \
    const V b = SET1(static_cast<T>(0.999999)), c = SET1(static_cast<T>(1e-3));               \
    SLB_CHAINS(SLB_INIT_##V)                                                                   \
    for (std::int64_t i = 0; i < iters; ++i) {                                                 \
      SLB_CHAINS(SLB_STEP)                                                                     \
    }                                                                                          \
    const V s = ADD(ADD(ADD(ADD(r0, r1), ADD(r2, r3)), ADD(ADD(r4, r5), ADD(r6, r7))),        \
                    ADD(ADD(r8, r9), ADD(r10, r11)));                                          \
    alignas(64) T out[LANES];                                                                  \
    STORE(out, s);                                                                             \
    return out[0];                                                                             \
  }
#define SLB_STEP(i) r##i = SLB_MADD(r##i, b, c);

#define SLB_INIT___m512(i) __m512 r##i = _mm512_set1_ps(static_cast<float>(i));
#define SLB_INIT___m512d(i) __m512d r##i = _mm512_set1_pd(static_cast<double>(i));
#define SLB_INIT___m256(i) __m256 r##i = _mm256_set1_ps(static_cast<float>(i));
#define SLB_INIT___m256d(i) __m256d r##i = _mm256_set1_pd(static_cast<double>(i));
#define SLB_INIT___m128(i) __m128 r##i = _mm_set1_ps(static_cast<float>(i));
#define SLB_INIT___m128d(i) __m128d r##i = _mm_set1_pd(static_cast<double>(i));

#define SLB_MADD _mm512_fmadd_ps
SLB_FMA_KERNEL(fma_avx512_f32, "avx512f", float, __m512, _mm512_set1_ps, _mm512_add_ps, _mm512_store_ps, 16)
#undef SLB_MADD
#define SLB_MADD _mm512_fmadd_pd
SLB_FMA_KERNEL(fma_avx512_f64, "avx512f", double, __m512d, _mm512_set1_pd, _mm512_add_pd, _mm512_store_pd, 8)
#undef SLB_MADD
#define SLB_MADD _mm256_fmadd_ps
SLB_FMA_KERNEL(fma_avx2_f32, "avx2,fma", float, __m256, _mm256_set1_ps, _mm256_add_ps, _mm256_store_ps, 8)
#undef SLB_MADD
#define SLB_MADD _mm256_fmadd_pd
SLB_FMA_KERNEL(fma_avx2_f64, "avx2,fma", double, __m256d, _mm256_set1_pd, _mm256_add_pd, _mm256_store_pd, 4)
#undef SLB_MADD
// SSE2 (every x86-64): a multiply and an add, two instructions, counted as one multiply-add.
#define SLB_MADD(a, b, c) _mm_add_ps(_mm_mul_ps(a, b), c)
SLB_FMA_KERNEL(madd_sse2_f32, "sse2", float, __m128, _mm_set1_ps, _mm_add_ps, _mm_store_ps, 4)
#undef SLB_MADD
#define SLB_MADD(a, b, c) _mm_add_pd(_mm_mul_pd(a, b), c)
SLB_FMA_KERNEL(madd_sse2_f64, "sse2", double, __m128d, _mm_set1_pd, _mm_add_pd, _mm_store_pd, 2)
#undef SLB_MADD
#undef SLB_CHAINS
#undef SLB_FMA_KERNEL
#undef SLB_STEP

volatile double peak_sink = 0;

/// Repetitions of `run(n)` scaled to ~`target_s` each (from a first, short call); the best rate of
/// `reps` (work units per second), and the seconds of that run.
template <class F>
std::pair<double, double> best_rate(F&& run, std::int64_t n0, double target_s, int reps) {
  double t = seconds_of([&] { run(n0); });
  const auto n = std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(n0) * target_s / std::max(t, 1e-9)));
  double best = 0, best_t = 0;
  for (int r = 0; r < reps; ++r) {
    t = seconds_of([&] { run(n); });
    if (static_cast<double>(n) / t > best) best = static_cast<double>(n) / t, best_t = t;
  }
  return {best, best_t};
}
#endif

Peak measure_peak() {
  Peak p;
#ifdef SHARDLIB_BENCH_PEAK
  using Kernel = double (*)(std::int64_t);
  Kernel k32 = nullptr, k64 = nullptr;
  if (__builtin_cpu_supports("avx512f")) {
    p.vector_bits = 512, p.isa = "avx512f";
    k32 = [](std::int64_t n) { return static_cast<double>(fma_avx512_f32(n)); };
    k64 = [](std::int64_t n) { return fma_avx512_f64(n); };
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    p.vector_bits = 256, p.isa = "avx2+fma";
    k32 = [](std::int64_t n) { return static_cast<double>(fma_avx2_f32(n)); };
    k64 = [](std::int64_t n) { return fma_avx2_f64(n); };
  } else {
    p.vector_bits = 128, p.isa = "sse2 (multiply + add)";
    k32 = [](std::int64_t n) { return static_cast<double>(madd_sse2_f32(n)); };
    k64 = [](std::int64_t n) { return madd_sse2_f64(n); };
  }
  // The clock: 1000 adds per block, so blocks per second x 1000 = cycles per second. The clock is
  // measured before and after the FMA kernels and the best of both is kept.
  auto clock = [&] {
    return best_rate([](std::int64_t n) { peak_sink = static_cast<double>(add_chain(n)); }, 1000, 0.02, 5).first * 1000.0;
  };
  double hz = clock();
  for (int dt = 0; dt < 2; ++dt) {
    Kernel k = dt == 0 ? k32 : k64;
    const auto [iters_per_s, secs] = best_rate([&](std::int64_t n) { peak_sink = k(n); }, 10000, 0.02, 5);
    const double flops_per_iter = 12.0 * 2.0 * p.lanes(dt);
    p.kernel_gflops[dt] = iters_per_s * flops_per_iter * 1e-9;
    p.kernel_seconds[dt] = secs;
    p.kernel_flops[dt] = iters_per_s * secs * flops_per_iter;
  }
  hz = std::max(hz, clock());
  p.clock_ghz = hz * 1e-9;
  for (int dt = 0; dt < 2; ++dt) {
    p.flops_per_cycle[dt] = p.kernel_gflops[dt] / p.clock_ghz;
    p.fma_units[dt] = std::max(1, static_cast<int>(std::lround(p.flops_per_cycle[dt] / (2.0 * p.lanes(dt)))));
    p.peak_gflops[dt] = p.fma_units[dt] * p.lanes(dt) * 2.0 * p.clock_ghz;
  }
  p.measured = true;
#endif
  return p;
}

/// Copy bandwidth of memcpy over `bytes` (read + write counted: a copy of bytes / 2), `threads`
/// threads each copying its slice, best of `reps`; GB/s and the seconds of that copy.
std::pair<double, double> copy_bandwidth(std::size_t bytes, int threads, int reps) {
  const std::size_t half = bytes / 2;
  std::vector<char> src(half), dst(half);
  std::memset(src.data(), 1, half);  // every page touched before the timing
  std::memset(dst.data(), 2, half);
  auto copy = [&] {
    if (threads == 1) {
      std::memcpy(dst.data(), src.data(), half);
    } else {
      std::vector<std::thread> ts;
      const std::size_t each = (half + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
      for (int t = 0; t < threads; ++t) {
        const std::size_t lo = std::min(half, each * static_cast<std::size_t>(t)), hi = std::min(half, lo + each);
        ts.emplace_back([&, lo, hi] { std::memcpy(dst.data() + lo, src.data() + lo, hi - lo); });
      }
      for (auto& t : ts) t.join();
    }
    clobber(dst.data());
  };
  copy();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) best = std::min(best, seconds_of(copy));
  return {static_cast<double>(2 * half) / best * 1e-9, best};
}

void peak(sl::Context& ctx, const Peak& p, std::size_t copy_bytes) {
  if (ctx.device() != 0) return;
  const char* dtype[2] = {"float32", "float64"};
  if (!p.measured) {
    record(ctx, "\"part\": \"peak\", \"name\": \"core peak\", \"measured\": false, \"seconds\": null, \"baseline\": null, "
                "\"baseline_seconds\": null, \"why\": \"the peak is measured on x86-64 only\"");
    std::fprintf(stderr, "  peak: not measured (x86-64 only)\n");
  }
  for (int dt = 0; dt < 2 && p.measured; ++dt) {
    record(ctx, std::string("\"part\": \"peak\", \"name\": \"") + dtype[dt] + " peak of one core\", \"dtype\": \"" + dtype[dt] +
                    "\", \"seconds\": " + num(p.kernel_seconds[dt]) + ", \"flops\": " + num(p.kernel_flops[dt]) +
                    ", \"baseline\": null, \"baseline_seconds\": null, \"peak_gflops\": " + num(p.peak_gflops[dt]) +
                    ", \"clock_ghz\": " + num(p.clock_ghz) + ", \"vector_bits\": " + std::to_string(p.vector_bits) +
                    ", \"lanes\": " + std::to_string(p.lanes(dt)) + ", \"isa\": \"" + p.isa + "\", \"fma_units\": " +
                    std::to_string(p.fma_units[dt]) + ", \"flops_per_cycle\": " + num(p.flops_per_cycle[dt]) +
                    ", \"fma_kernel_gflops\": " + num(p.kernel_gflops[dt]) + ", \"fma_kernel_fraction_of_peak\": " +
                    num(p.kernel_gflops[dt] / p.peak_gflops[dt]) +
                    ", \"measured\": [\"clock_ghz (dependent integer adds, best of 5)\", \"flops_per_cycle (12 FMA chains, "
                    "best of 5, over the clock)\"], \"from_cpu\": [\"vector_bits\", \"isa\"], \"derived\": [\"fma_units = "
                    "round(flops_per_cycle / (2 x lanes))\", \"peak_gflops = fma_units x lanes x 2 x clock_ghz\"]");
    std::fprintf(stderr, "  %s peak of one core: %.1f GFLOP/s = %d FMA unit(s) x %d lanes (%s) x 2 x %.3f GHz; the FMA "
                         "kernel ran %.1f GFLOP/s, %.2f flops/cycle\n",
                 dtype[dt], p.peak_gflops[dt], p.fma_units[dt], p.lanes(dt), p.isa, p.clock_ghz, p.kernel_gflops[dt],
                 p.flops_per_cycle[dt]);
  }
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  for (int threads : {1, cores}) {
    const auto [gbps, secs] = copy_bandwidth(copy_bytes, threads, 5);
    record(ctx, "\"part\": \"peak\", \"name\": \"copy bandwidth, " + std::to_string(threads) + " thread" +
                    (threads > 1 ? "s" : "") + "\", \"threads\": " + std::to_string(threads) + ", \"bytes\": " +
                    std::to_string(copy_bytes) + ", \"seconds\": " + num(secs) + ", \"gbytes_per_second\": " + num(gbps) +
                    ", \"baseline\": null, \"baseline_seconds\": null, \"measured\": [\"gbytes_per_second (memcpy of bytes / 2 "
                    "into another buffer, read + write counted, best of 5)\"]");
    std::fprintf(stderr, "  copy bandwidth, %d thread(s): %.1f GB/s (memcpy of %.0f MiB, read + write counted)\n", threads,
                 gbps, static_cast<double>(copy_bytes / 2) / (1 << 20));
    if (cores == 1) break;
  }
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

// ---- matmul against single-thread SGEMM and DGEMM --------------------------------------------------
double gflops(std::int64_t m, std::int64_t k, std::int64_t nn, double s) { return 2.0 * m * k * nn / s * 1e-9; }

template <class T>
void matmul_case(sl::Context& ctx, const Peak& peak, const char* name, const auto& x, const auto& w) {
  constexpr bool f32 = std::is_same_v<T, float>;
  const std::int64_t m = x.local_shape()[0], k = x.local_shape()[1], nn = w.local_shape()[1];
  std::vector<T> c(static_cast<std::size_t>(m * nn));
  const T* px = x.local().data();
  const T* pw = w.local().data();
  sl::coll::CommRecorder rec;
  auto op = [&] { auto y = sl::matmul(x, w); };
#ifdef SHARDLIB_BENCH_CBLAS
  const char* baseline = f32 ? "openblas_sgemm" : "openblas_dgemm";
  auto base = [&] {
    const int im = static_cast<int>(m), in = static_cast<int>(nn), ik = static_cast<int>(k);
    if constexpr (f32)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, in, ik, 1.0f, px, ik, pw, in, 0.0f, c.data(), in);
    else
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, in, ik, 1.0, px, ik, pw, in, 0.0, c.data(), in);
  };
#else
  const char* baseline = "eigen_gemm";
  auto base = [&] { sl::kernels::gemm<T>(1, {px, m, k, k, 1, 0}, {pw, k, nn, nn, 1, 0}, {c.data(), m, nn, nn, 1, 0}); };
#endif
  const auto [ours, theirs] = bench::time_ops(ctx.world(), op, &base);
  const int threads = bench::gemm_threads();
  const int dt = f32 ? 0 : 1;
  const double peak_gflops = peak.measured ? peak.peak_gflops[dt] * threads : 0.0;
  const double g = gflops(m, k, nn, ours), gb = gflops(m, k, nn, theirs);
  const std::string peak_fields =
      peak.measured ? ", \"peak_gflops\": " + num(peak_gflops) + ", \"fraction_of_peak\": " + num(g / peak_gflops) +
                          ", \"baseline_fraction_of_peak\": " + num(gb / peak_gflops) + (f32 ? ", \"target_fraction_of_peak\": 0.8" : "")
                    : std::string(", \"peak_gflops\": null, \"fraction_of_peak\": null, \"baseline_fraction_of_peak\": null");
  record(ctx, "\"part\": \"matmul\", \"name\": \"" + std::string(name) + "\", \"dtype\": \"" + (f32 ? "float32" : "float64") +
                  "\", \"local_shape\": [" + std::to_string(m) + ", " + std::to_string(k) + ", " + std::to_string(nn) +
                  "], \"seconds\": " + num(ours) + ", \"gflops\": " + num(g) + ", \"baseline\": \"" + baseline +
                  "\", \"baseline_seconds\": " + num(theirs) + ", \"baseline_gflops\": " + num(gb) +
                  ", \"fraction_of_baseline\": " + num(theirs / ours) + peak_fields + ", \"gemm_threads\": " +
                  std::to_string(threads) + ", \"collectives\": " + std::to_string(rec.total_calls()) + ", \"gemm_backend\": \"" +
                  sl::kernels::gemm_backend() + "\"");
  if (ctx.device() == 0)
    std::fprintf(stderr, "  %-26s %s local %lldx%lldx%lld: %7.1f GFLOP/s, %s %7.1f GFLOP/s (%.3f); of peak %.1f: %.3f and %.3f\n",
                 name, f32 ? "f32" : "f64", static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(nn), g,
                 baseline, gb, theirs / ours, peak_gflops, peak.measured ? g / peak_gflops : 0.0,
                 peak.measured ? gb / peak_gflops : 0.0);
}

template <class T>
void matmul_dtype(sl::Context& ctx, const Peak& peak) {
  const int devices = ctx.num_devices();
  M2 mesh(ctx, {1, devices});
  // rows of x over "x" (size 1 here), columns of w over "y": the local product is M x K x N/devices.
  // float64: the square case only (DGEMM takes twice as long; the part stays a run of seconds).
  std::vector<std::array<std::int64_t, 3>> shapes{{1024, 1024, 1024}};
  if constexpr (std::is_same_v<T, float>) shapes.insert(shapes.end(), {{2048, 1024, 2048}, {512, 4096, 2048}});
  for (auto [m, k, nn] : shapes) {
    auto x = Tensor<M2, sl::Spec<"x", none>, T>::random(mesh, {m, k}, 1);
    auto w = Tensor<M2, sl::Spec<none, "y">, T>::random(mesh, {k, nn * devices}, 2);
    matmul_case<T>(ctx, peak, "matmul column-parallel", x, w);
  }
}

/// A residual folded into the GEMM before it: `matmul_add(o, w, x)` against the two ops it stands
/// for, `x + matmul(o, w)`, alternated; and with `x` an rvalue (a fresh tensor, moved in: its block
/// becomes the output's) against the same fresh tensor added after the product.
void fusion(sl::Context& ctx) {
  const int devices = ctx.num_devices();
  M1 mesh(ctx, {devices});
  // The transformer block's two residual projections (B*S = 1024 rows per device, d 512, d_ff 2048).
  for (const std::int64_t k : {512, 2048}) {
    const std::int64_t m = 1024, nn = 512;
    auto o = Tensor<M1, Rows>::random(mesh, {m * devices, k}, 1);
    auto w = Tensor<M1, sl::Spec<none, none>>::random(mesh, {k, nn}, 2);
    auto x = Tensor<M1, Rows>::random(mesh, {m * devices, nn}, 3);
    auto one = [&](const char* name, const char* baseline, auto&& ours, auto&& two_ops) {
      const auto [secs, base] = bench::time_ops(ctx.world(), ours, &two_ops);
      record(ctx, "\"part\": \"fusion\", \"name\": \"" + std::string(name) + "\", \"dtype\": \"float32\", \"local_shape\": [" +
                      std::to_string(m) + ", " + std::to_string(k) + ", " + std::to_string(nn) + "], \"seconds\": " +
                      num(secs) + ", \"gflops\": " + num(gflops(m, k, nn, secs)) + ", \"baseline\": \"" + baseline +
                      "\", \"baseline_seconds\": " + num(base) + ", \"speedup\": " + num(base / secs) +
                      ", \"gemm_threads\": " + std::to_string(bench::gemm_threads()));
      if (ctx.device() == 0)
        std::fprintf(stderr, "  %-34s local %lldx%lldx%lld: %7.3f ms, %s %7.3f ms (%.3fx)\n", name, static_cast<long long>(m),
                     static_cast<long long>(k), static_cast<long long>(nn), secs * 1e3, baseline, base * 1e3, base / secs);
    };
    one("matmul_add(o, w, x)", "x + matmul(o, w)", [&] { auto y = sl::matmul_add(o, w, x); },
        [&] { auto y = x + sl::matmul(o, w); });
    one("matmul_add(o, w, std::move(t))", "t + matmul(o, w)", [&] {
      auto t = sl::exp(x);  // a fresh tensor that nothing else holds (as a block's activations are)
      auto y = sl::matmul_add(o, w, std::move(t));
    }, [&] {
      auto t = sl::exp(x);
      auto y = t + sl::matmul(o, w);
    });
  }
}

void matmul(sl::Context& ctx, const Peak& peak) {
  matmul_dtype<float>(ctx, peak);
  matmul_dtype<double>(ctx, peak);
  fusion(ctx);
}

// ---- elementwise ops, softmax and the norms against memcpy ------------------------------------------
/// `op` on tensors of `elements` elements of `elem_bytes` each (per device), `tensors` of them read or
/// written once each, next to a memcpy of the same bytes.
template <class Op>
void kernel_case(sl::Context& ctx, const char* name, const char* dtype, std::array<std::int64_t, 2> local_shape,
                 std::size_t elem_bytes, int tensors, double target, Op&& op) {
  const auto elements = static_cast<std::size_t>(local_shape[0] * local_shape[1]);
  const std::size_t bytes = elements * elem_bytes * static_cast<std::size_t>(tensors), half = bytes / 2;
  std::vector<char> src(half), dst(half);
  std::memset(src.data(), 1, half);
  std::memset(dst.data(), 2, half);
  auto copy = [&] {
    std::memcpy(dst.data(), src.data(), half);
    clobber(dst.data());
  };
  const auto [ours, base] = bench::time_ops(ctx.world(), op, &copy);
  const double gbps = static_cast<double>(bytes) / ours * 1e-9, copy_gbps = static_cast<double>(2 * half) / base * 1e-9;
  record(ctx, "\"part\": \"kernels\", \"name\": \"" + std::string(name) + "\", \"dtype\": \"" + dtype + "\", \"local_shape\": [" +
                  std::to_string(local_shape[0]) + ", " + std::to_string(local_shape[1]) + "], \"bytes\": " +
                  std::to_string(bytes) + ", \"tensors_moved\": " + std::to_string(tensors) + ", \"seconds\": " + num(ours) +
                  ", \"gbytes_per_second\": " + num(gbps) + ", \"ns_per_element\": " +
                  num(ours / static_cast<double>(elements) * 1e9) + ", \"baseline\": \"memcpy (same bytes)\", \"baseline_seconds\": " +
                  num(base) + ", \"copy_gbytes_per_second\": " + num(copy_gbps) + ", \"fraction_of_copy\": " +
                  num(gbps / copy_gbps) + (target > 0 ? ", \"target_fraction_of_copy\": " + num(target) : std::string()) +
                  ", \"kernel_threads\": " + std::to_string(ctx.exec().concurrency()));
  if (ctx.device() == 0)
    std::fprintf(stderr, "  %-24s %s [%lld, %lld]: %7.3f ms, %6.2f ns/element, %6.1f GB/s; memcpy %6.1f GB/s: %.2f of copy\n",
                 name, dtype, static_cast<long long>(local_shape[0]), static_cast<long long>(local_shape[1]), ours * 1e3,
                 ours / static_cast<double>(elements) * 1e9, gbps, copy_gbps, gbps / copy_gbps);
}

template <class T>
void kernels_dtype(sl::Context& ctx, bool all) {
  const int devices = ctx.num_devices();
  M1 mesh(ctx, {devices});
  using T2 = Tensor<M1, Rows, T>;
  const char* dtype = std::is_same_v<T, float> ? "float32" : "float64";
  const std::int64_t rows = 4096 * devices, cols = 512;  // 2M elements per device
  const std::int64_t srows = 8 * 8 * 128 * devices, scols = 128;  // attention scores [B*H*S, S]
  auto a = T2::random(mesh, {rows, cols}, 1, T(-3), T(3)), b = T2::random(mesh, {rows, cols}, 2, T(-3), T(3));
  auto s = T2::random(mesh, {srows, scols}, 3, T(-3), T(3));
  const std::array<std::int64_t, 2> x{rows / devices, cols}, sx{srows / devices, scols};
  constexpr std::size_t e = sizeof(T);
  kernel_case(ctx, "gelu", dtype, x, e, 2, 0.5, [&] { auto c = sl::gelu(a); });
  if (all) kernel_case(ctx, "gelu_tanh", dtype, x, e, 2, 0, [&] { auto c = sl::gelu_tanh(a); });
  kernel_case(ctx, "exp", dtype, x, e, 2, 0, [&] { auto c = sl::exp(a); });
  kernel_case(ctx, "tanh", dtype, x, e, 2, 0, [&] { auto c = sl::tanh(a); });
  if (all) kernel_case(ctx, "sigmoid", dtype, x, e, 2, 0, [&] { auto c = sl::sigmoid(a); });
  kernel_case(ctx, "a + b", dtype, x, e, 3, 0, [&] { auto c = a + b; });
  kernel_case(ctx, "softmax (last dim)", dtype, sx, e, 2, 0.5, [&] { auto c = sl::softmax<1>(s); });
  if (all) kernel_case(ctx, "log_softmax (last dim)", dtype, sx, e, 2, 0, [&] { auto c = sl::log_softmax<1>(s); });
  kernel_case(ctx, "layer_norm (last dim)", dtype, x, e, 2, 0.5, [&] { auto c = sl::layer_norm<1>(a); });
  if (all) kernel_case(ctx, "rms_norm (last dim)", dtype, x, e, 2, 0, [&] { auto c = sl::rms_norm<1>(a); });
  if (!all) return;
  // The same three with 128 MiB in and 128 MiB out per device: past any cache, so the memcpy of
  // the same bytes runs at the memory's bandwidth (the in-cache cases above meet the core first).
  const std::int64_t big = 16;
  auto ab = T2::random(mesh, {rows * big, cols}, 4, T(-3), T(3));
  auto sb = T2::random(mesh, {srows * big * 2, scols}, 5, T(-3), T(3));
  const std::array<std::int64_t, 2> xb{x[0] * big, cols}, sxb{sx[0] * big * 2, scols};
  kernel_case(ctx, "gelu, beyond cache", dtype, xb, e, 2, 0, [&] { auto c = sl::gelu(ab); });
  kernel_case(ctx, "softmax (last dim), beyond cache", dtype, sxb, e, 2, 0, [&] { auto c = sl::softmax<1>(sb); });
  kernel_case(ctx, "layer_norm (last dim), beyond cache", dtype, xb, e, 2, 0, [&] { auto c = sl::layer_norm<1>(ab); });
}

void kernels(sl::Context& ctx) {
  kernels_dtype<float>(ctx, true);
  kernels_dtype<double>(ctx, false);  // gelu, exp, tanh, a + b, softmax, layer_norm
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
                  "], \"dtype\": \"float32\", \"seconds\": " + num(secs) + ", \"gflops\": " + num(flops / secs * 1e-9) +
                  ", \"collectives_per_block\": " + std::to_string(calls) + ", \"gemm_threads\": " +
                  std::to_string(bench::gemm_threads()) + ", \"kernel_threads\": " + std::to_string(ctx.exec().concurrency()) +
                  ", \"baseline\": null, \"baseline_seconds\": null");
  if (ctx.device() == 0)
    std::fprintf(stderr, "  mlp block on %s: %.2f ms, %.1f GFLOP/s, %llu collective(s) per block\n", mesh.to_string().c_str(),
                 secs * 1e3, flops / secs * 1e-9, static_cast<unsigned long long>(calls));
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
  bench::check_args(argc, argv,
                    {{"--part", bench::Takes::word, "peak|overhead|matmul|kernels|mlp"},
                     {"--size", bench::Takes::integer},
                     {"--model", bench::Takes::integer},
                     {"--copy-mib", bench::Takes::integer}});
  auto rt = sl::Runtime::from_args(argc, argv, 1);
  const std::string part = bench::text_arg(argc, argv, "--part", "overhead");
  const auto n = static_cast<std::int64_t>(bench::arg(argc, argv, "--size", 32));
  const int model = static_cast<int>(bench::arg(argc, argv, "--model", 2));
  const auto copy_bytes = static_cast<std::size_t>(bench::arg(argc, argv, "--copy-mib", 128)) << 21;  // read + write
  // The peak, measured before the devices start (nothing else of this process runs then).
  const Peak pk = part == "peak" || part == "matmul" ? measure_peak() : Peak{};
  rt.spmd([&](sl::Context& ctx) {
    bench::warm_up(ctx.world());
    if (part == "peak") peak(ctx, pk, copy_bytes);
    else if (part == "overhead") overhead(ctx, n);
    else if (part == "matmul") matmul(ctx, pk);
    else if (part == "kernels") kernels(ctx);
    else mlp(ctx, model);
  });
  return 0;
}
