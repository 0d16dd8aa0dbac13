// SPDX-License-Identifier: Apache-2.0
// What the GPU benchmarks share (benchmarks/gpu.cpp, benchmarks/gpu_block.cpp): the memory their
// tensors live in, the records they print (one JSON object a case, with the GPU's name), the
// fenced timer of queued calls, and --profile-step's step between cudaProfilerStart and Stop.
#pragma once

#include <shardlib/shardlib.hpp>

#include "common.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace gpubench {

namespace sl = shardlib;
using Mem = Kokkos::DefaultExecutionSpace::memory_space;  // Kokkos::CudaSpace with CUDA
using Exec = Kokkos::DefaultExecutionSpace;
inline constexpr bool on_gpu = !sl::detail::host_memory_v<Mem>;

using bench::num;

inline std::string gpu_name() {
#if defined(KOKKOS_ENABLE_CUDA)
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, Kokkos::Cuda().cuda_device()) == cudaSuccess) return p.name;
  return "unknown CUDA device";
#else
  return "none (host memory)";
#endif
}

inline void record(sl::Context& ctx, const std::string& fields) {
  if (ctx.device() != 0) return;
  std::printf("{\"bench\": \"gpu\", \"backend\": \"%s\", \"devices\": %d, \"gpu\": \"%s\", %s}\n",
              std::string(ctx.backend()).c_str(), ctx.num_devices(), gpu_name().c_str(), fields.c_str());
  std::fflush(stdout);
}

inline void say(sl::Context& ctx, const std::string& text) {
  if (ctx.device() == 0) std::fprintf(stderr, "  %s\n", text.c_str());
}

/// Waits for this device's queued work (counted as every shardlib wait is).
inline void fence(sl::Context& ctx) { sl::kernels::fence(ctx.exec_for<Mem>()); }

/// Seconds per call of `f`, the slowest device's: `iters` calls queued back to back, one fence.
template <class F>
double batch_seconds(sl::Context& ctx, F& f, int iters) {
  fence(ctx);
  ctx.world().barrier();
  const auto t0 = bench::Clock::now();
  for (int i = 0; i < iters; ++i) f();
  fence(ctx);
  double t = std::chrono::duration<double>(bench::Clock::now() - t0).count() / iters;
  ctx.world().all_reduce(&t, &t, 1, bench::DType::f64, bench::Op::max);
  return t;
}

/// --profile-step: `step` (a training-like step) alone, for a profiler. Warmed up; its wall time
/// per call, each call fenced (the median of 21), as a {"part": "profile"} record; then one more
/// call between cudaProfilerStart and cudaProfilerStop (what `ncu --profile-from-start off` sees).
template <class F>
void profile_step(sl::Context& ctx, const std::string& name, F&& step) {
  for (int i = 0; i < 3; ++i) step();
  std::vector<double> walls;
  for (int i = 0; i < 21; ++i) walls.push_back(batch_seconds(ctx, step, 1));
  const double wall = bench::median(walls);
  record(ctx, "\"part\": \"profile\", \"name\": \"" + name + "\", \"seconds\": " + num(wall) +
                  ", \"baseline\": null, \"baseline_seconds\": null");
  say(ctx, name + ": " + num(wall * 1e6) + " us per step (fenced), then one step for the profiler");
  fence(ctx);
  ctx.world().barrier();
#if defined(KOKKOS_ENABLE_CUDA)
  if (ctx.device() == 0) cudaProfilerStart();
#endif
  ctx.world().barrier();
  step();
  fence(ctx);
  ctx.world().barrier();
#if defined(KOKKOS_ENABLE_CUDA)
  if (ctx.device() == 0) cudaProfilerStop();
#endif
}

}  // namespace gpubench
