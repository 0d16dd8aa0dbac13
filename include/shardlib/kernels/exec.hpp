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

/// How a kernel with whole rows per team lays them out: a team per row (rows longer than 256,
/// its threads striding along the row: the team's reductions go through shared memory, a barrier
/// each) or, for shorter rows, a row per team thread, that thread's vector lanes (up to a warp's
/// 32 on a GPU) striding along it (its reductions are warp shuffles, with no barrier). Measured on
/// an H100 (bench_gpu --part rows, float rows of 256 MiB): softmax of rows of 256 at 0.17 of the
/// copy bandwidth with a team per row, 0.58 with a warp's lanes; of 64, 0.20 and 0.35; rows of
/// 1024 ran no faster per warp, and softmax's backward slower (0.54 against 0.75).
/// Default-constructed (all 0): `row_layout` picks it.
struct RowLayout {
  int team = 0;           ///< Kokkos team size
  int lanes = 0;          ///< Kokkos vector length (a row's lanes, in the per-thread form)
  int rows_per_team = 0;  ///< 1: a team per row; more: a row per team thread
};

/// RowLayout for rows of `n` on `Exec`: on a host instance a team of one thread per row; on a GPU
/// a team of up to 256 threads per row past 256, else a row per 1..32 lanes, 256 threads a team.
/// A given layout (rows_per_team > 0) is kept (the tests run the per-thread form on the host).
template <class Exec>
constexpr RowLayout row_layout(std::int64_t n, RowLayout given = {}) noexcept {
  if (given.rows_per_team > 0) return given;
  if constexpr (is_host_exec_v<Exec>) {
    return {1, 1, 1};
  } else {
    if (n > 256) return {row_team_size<Exec>(n), 1, 1};
    int lanes = 1;
    while (lanes < 32 && lanes < n) lanes *= 2;
    return {256 / lanes, lanes, 256 / lanes};
  }
}

/// In a team kernel launched by `launch_rows`: calls `body(row, range, whole_team)` for each of
/// the team's rows (`rows` in all), `range(len)` making a range over [0, len) of the row's
/// elements: a TeamThreadRange (a team per row: `whole_team` true) or a ThreadVectorRange (a row
/// per thread: false). Nested parallel_reduce over such a range gives every thread (lane) of the
/// row the result.
template <class Member, class Body>
KOKKOS_INLINE_FUNCTION void for_team_rows(const Member& team, const RowLayout& layout, std::int64_t rows, const Body& body) {
  if (layout.rows_per_team == 1) {
    body(static_cast<std::int64_t>(team.league_rank()), [&](std::int64_t len) { return Kokkos::TeamThreadRange(team, len); },
         true);
    return;
  }
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, layout.rows_per_team), [&](int i) {
    const std::int64_t r = static_cast<std::int64_t>(team.league_rank()) * layout.rows_per_team + i;
    if (r < rows) body(r, [&](std::int64_t len) { return Kokkos::ThreadVectorRange(team, len); }, false);
  });
}

/// Launches team kernel `k` (which walks its rows with for_team_rows) over `rows` rows on `exec`
/// in `layout`; fences a host instance.
template <class Exec, class Kernel>
void launch_rows(const Exec& exec, const char* label, std::int64_t rows, const RowLayout& layout, const Kernel& k) {
  if (rows <= 0) return;
  const std::int64_t league = (rows + layout.rows_per_team - 1) / layout.rows_per_team;
  Kokkos::parallel_for(label, Kokkos::TeamPolicy<Exec>(exec, static_cast<int>(league), layout.team, layout.lanes), k);
  if constexpr (is_host_exec_v<Exec>) kernels::fence(exec);
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
