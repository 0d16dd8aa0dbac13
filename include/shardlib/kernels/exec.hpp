// SPDX-License-Identifier: Apache-2.0
/// @file
/// Where a kernel runs: every kernel in kernels/ takes a Kokkos execution-space instance; on a
/// host one it takes the host paths (memcpy, Eigen's packets, BLAS) and returns when its output is
/// written (it fences); on a device one (Kokkos::Cuda) it queues one-element-per-thread kernels on
/// the instance's stream and returns at once.
///
/// Every wait shardlib makes for an instance's work goes through `fence` below, which counts it
/// in `sync_count()`: the hook by which a test checks that an op in steady state waits for no
/// GPU stream (docs/13_gpus.md).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace shardlib::kernels {

/// Whether kernels on execution space `Exec` run on the host (its memory is host memory).
template <class Exec>
inline constexpr bool is_host_exec_v =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;

/// The waits for an execution-space instance's work that shardlib made on the calling thread
/// (kernels, transfers, ops, reshards; each in-process device runs on a thread of its own, so
/// these are that device's): `host`, fences of host instances (the host kernels fence before
/// they return); `device`, fences of device instances, each a host wait for a GPU stream. Read it
/// before and after an op to count what the op waited for. Not counted: the waits inside Kokkos
/// (a `parallel_reduce` into a host value, a `View`'s allocation) and inside NCCL or cuBLAS.
struct SyncCount {
  std::uint64_t host = 0;
  std::uint64_t device = 0;
};

/// This thread's SyncCount (see above); a test may reset it.
inline SyncCount& sync_count() noexcept {
  thread_local SyncCount count;
  return count;
}

/// The work this thread's kernels were asked for (each in-process device runs on a thread of its
/// own, so these are that device's), by kind: `gemm`, 2·M·N·K floating-point operations per
/// product of every GEMM (host BLAS or Eigen, cuBLAS), `gemm_calls` the GEMM calls (a batch counts
/// once) and `gemm_products` their products (a batch counts each: a host BLAS runs a batch as
/// one call a matrix, cuBLAS as one strided-batched call); the memory-bound kernels as calls and
/// the bytes they move, which a cost model turns into time with a memory bandwidth and a per-call
/// overhead. Counted before a kernel runs (a GEMM after
/// its shape checks), in shape-only mode too, so a shape-only step (detail/shape_only.hpp) counts
/// what the real step does. Read it before and after a step; a test or a planner may reset it.
/// A fused kernel that multiplies matrices inside (cuDNN's attention) adds its products' FLOPs to
/// `gemm` without a GEMM call (count_fused_products), its bytes as a kernel's.
struct FlopCount {
  std::uint64_t gemm = 0;
  std::uint64_t gemm_calls = 0;
  std::uint64_t gemm_products = 0;
  /// The part of `gemm` in calls of more than one product (a batch: attention's per-head
  /// products), which run well below a large product's rate (plan::Profile::batched_gemm_rate).
  std::uint64_t batched_gemm = 0;
  /// Calls of the other (memory-bound) kernels: elementwise, layout, reductions, rows, optimizer,
  /// attention rows, moe, and the block copies, fills and loops of execute/block.hpp.
  std::uint64_t kernel_calls = 0;
  std::uint64_t kernel_bytes = 0;  ///< bytes those kernels read and write (each input and output element once)

  /// What was counted since `before` (an earlier reading of the same count), field by field.
  FlopCount operator-(const FlopCount& before) const noexcept {
    return {gemm - before.gemm, gemm_calls - before.gemm_calls, gemm_products - before.gemm_products,
            batched_gemm - before.batched_gemm, kernel_calls - before.kernel_calls, kernel_bytes - before.kernel_bytes};
  }
  /// Adds `times` times `more` (the work of one pass that `times` more would repeat).
  FlopCount& add(const FlopCount& more, std::uint64_t times = 1) noexcept {
    gemm += more.gemm * times;
    gemm_calls += more.gemm_calls * times;
    gemm_products += more.gemm_products * times;
    batched_gemm += more.batched_gemm * times;
    kernel_calls += more.kernel_calls * times;
    kernel_bytes += more.kernel_bytes * times;
    return *this;
  }
  bool operator==(const FlopCount&) const = default;
};

/// This thread's FlopCount (see above).
inline FlopCount& flop_count() noexcept {
  thread_local FlopCount count;
  return count;
}

/// Counts a batch of `batch` products of [m, k] by [k, n] in flop_count().
inline void count_gemm(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k) noexcept {
  FlopCount& f = flop_count();
  const std::uint64_t flops = 2 * static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(m) *
                              static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(k);
  f.gemm += flops;
  if (batch > 1) f.batched_gemm += flops;
  ++f.gemm_calls;
  f.gemm_products += static_cast<std::uint64_t>(batch);
}

/// Counts the matrix products inside a fused kernel (`flops` FLOPs, 2·M·N·K each) in
/// flop_count().gemm: no GEMM call or product (the kernel itself is counted by count_kernel).
inline void count_fused_products(std::uint64_t flops) noexcept { flop_count().gemm += flops; }

/// Counts a call of a memory-bound kernel that reads and writes `bytes` in flop_count().
inline void count_kernel(std::uint64_t bytes) noexcept {
  FlopCount& f = flop_count();
  ++f.kernel_calls;
  f.kernel_bytes += bytes;
}

/// Waits until the work queued on `exec` has finished (`exec.fence()`), counted in sync_count().
template <class Exec>
void fence(const Exec& exec) {
  if constexpr (is_host_exec_v<Exec>) ++sync_count().host;
  else ++sync_count().device;
  exec.fence();
}

/// The threads of a team that works along one row of `n` elements (the kernels with a team per
/// row): 32 to 256 on a GPU, the smallest power of two covering the row; 1 on a host instance.
template <class Exec>
constexpr int row_team_size(std::int64_t n) noexcept {
  if constexpr (is_host_exec_v<Exec>) {
    return 1;
  } else {
    int team = 32;
    while (team < 256 && team < n) team *= 2;
    return team;
  }
}

namespace detail::portable {
/// Runs `kernel(k)` for k in [0, count) on `exec` (the device forms of the kernels, which any
/// execution space runs); fences a host instance, as every host kernel does.
template <class Exec, class Kernel>
void run(const Exec& exec, const char* label, std::int64_t count, const Kernel& kernel) {
  if (count > 0) Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, count), kernel);
  if constexpr (is_host_exec_v<Exec>) kernels::fence(exec);
}
}  // namespace detail::portable

}  // namespace shardlib::kernels
