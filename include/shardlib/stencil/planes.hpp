// SPDX-License-Identifier: Apache-2.0
/// @file
/// stencil_for's interior in GPU memory as planes in shared memory (2.5-D blocking), for 2-D and
/// 3-D blocks: a team takes a tile of the other dims (32 x 8 points of a 3-D block's planes, 256
/// points of a 2-D block's rows) and marches along dim 0 over a run of planes. The planes a point
/// reads (dim 0 within the width) stay in the team's shared memory, each plane of the tile and its
/// halo loaded from the block once, the next one while the current one is computed (its values in
/// registers across the computation, then stored): a point's neighbours are read from shared
/// memory, not from L1 or L2, and its address in it is one 32-bit multiply-add an offset.
///
/// Not the default yet: SHARDLIB_STENCIL_PLANES=1 (or detail::set_stencil_planes(true)) selects
/// it; `bench_gpu --part stencil` measures it beside the default kernels (the tiles of a 2-D block,
/// a team per row of a 3-D one). The host runs the same per-thread code, a team's threads in turn
/// between its barriers (the tests run it on host memory against the oracles).
#pragma once

#include <shardlib/execute/block.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/runtime/runtime.hpp>
#include <shardlib/stencil/neighbors.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardlib::detail {

/// Whether stencil_for runs a 2-D or 3-D block's interior in GPU memory as planes in shared
/// memory (StencilPlaneKernel): SHARDLIB_STENCIL_PLANES ("0" or "1", read once; unset: no), or what
/// set_stencil_planes set last.
inline std::atomic<int>& stencil_planes_setting() {
  static std::atomic<int> setting{-1};  // -1: not read yet
  return setting;
}
inline bool stencil_planes_selected() {
  int s = stencil_planes_setting().load(std::memory_order_relaxed);
  if (s < 0) {
    const char* e = std::getenv("SHARDLIB_STENCIL_PLANES");
    const std::string v = e ? e : "";
    if (!v.empty() && v != "0" && v != "1")
      throw std::invalid_argument("shardlib: SHARDLIB_STENCIL_PLANES is '" + v +
                                  "': 1 runs 2-D and 3-D stencils' interiors in GPU memory as planes in shared memory, "
                                  "0 (or unset) with the default kernels");
    s = v == "1" ? 1 : 0;
    stencil_planes_setting().store(s, std::memory_order_relaxed);
  }
  return s == 1;
}
/// Overrides SHARDLIB_STENCIL_PLANES (benchmarks and tests compare the kernels in one run).
inline void set_stencil_planes(bool on) { stencil_planes_setting().store(on ? 1 : 0, std::memory_order_relaxed); }
/// Sets the planes setting for a scope and puts back the one before (-1, not read yet,
/// included) when it ends, however it ends: tests that compare the kernels.
class StencilPlanesScope {
 public:
  explicit StencilPlanesScope(bool on) : before_(stencil_planes_setting().load(std::memory_order_relaxed)) { set_stencil_planes(on); }
  StencilPlanesScope(const StencilPlanesScope&) = delete;
  StencilPlanesScope& operator=(const StencilPlanesScope&) = delete;
  ~StencilPlanesScope() { stencil_planes_setting().store(before_, std::memory_order_relaxed); }

 private:
  int before_;
};

/// The points of the box [lo, hi) of a 2-D or 3-D block (its reads all inside the block) as planes
/// in shared memory (see the file's comment). A team's tile: `tx` points along the last dim by
/// `ty` along dim 1 (a 3-D block; 1 for a 2-D one), a thread a point, over `run` planes of dim 0;
/// its shared memory a ring of `slots` = 2 w0 + 2 planes of the tile and its halo (`rows` x `px`),
/// each stored twice (at slot s and s + slots), so that the 2 w0 + 1 planes a point reads are
/// consecutive from the oldest one's slot: nb(a, b, c) is at[a plane + b px + c]. Indices are
/// 32-bit (the caller checks that the block has fewer than 2^31 elements).
template <class T, class U, std::size_t R, class F>
struct StencilPlaneKernel {
  static_assert(R == 2 || R == 3, "shardlib: stencil planes are for 2-D and 3-D blocks");
  static constexpr int tx = R == 3 ? 32 : 256, ty = R == 3 ? 8 : 1, threads = tx * ty;
  /// Values of a plane a thread loads (its registers between a plane's load and its store).
  static constexpr int most_loads = 4;

  const T* block;
  U* out;
  int stride0, stride1;          // the block's strides along dims 0 and 1 (3-D; 0 for a 2-D block)
  int lo[3], hi[3], w[3];        // the box and the widths, as 3-D (a 2-D block: dim 1 [0, 1), width 0)
  std::int64_t offset[R];        // the block's first point's global index
  int tiles_x, tiles_y, run;     // tiles along the last dim and dim 1; planes a team takes
  int px, rows, plane, slots;    // the shared tile's pitch, rows and size; slots in the ring
  F f;

  /// A team's tile: planes [z0, z1), rows [y0, y0 + ny), columns [x0, x0 + nx) of the box.
  struct Tile {
    int z0, z1, y0, ny, x0, nx;
  };
  KOKKOS_INLINE_FUNCTION Tile tile(int t) const {
    Tile b;
    const int ix = t % tiles_x, rest = t / tiles_x, iy = rest % tiles_y, iz = rest / tiles_y;
    b.x0 = lo[2] + ix * tx;
    b.nx = hi[2] - b.x0 < tx ? hi[2] - b.x0 : tx;
    b.y0 = lo[1] + iy * ty;
    b.ny = hi[1] - b.y0 < ty ? hi[1] - b.y0 : ty;
    b.z0 = lo[0] + iz * run;
    b.z1 = hi[0] - b.z0 < run ? hi[0] : b.z0 + run;
    return b;
  }
  /// Thread `rank`'s values of plane z of the tile and its halo (`v`): rows rank / tx and that
  /// plus ty, columns rank % tx and that plus tx (the halo's: the launch checks that 2 w1 <= ty and
  /// 2 w2 <= tx), in loops of constant counts, so that `v` stays in registers.
  KOKKOS_INLINE_FUNCTION void fetch(const Tile& b, int rank, int z, T (&v)[most_loads]) const {
    const T* p = block + z * stride0 + (b.y0 - w[1]) * stride1 + (b.x0 - w[2]);
    const int nr = b.ny + 2 * w[1], nc = b.nx + 2 * w[2];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const int r = rank / tx + i * ty, c = rank % tx + j * tx;
        if (r < nr && c < nc) v[2 * i + j] = p[r * stride1 + c];
      }
  }
  /// ... stored in ring slot `s` (and s + slots).
  KOKKOS_INLINE_FUNCTION void put(const Tile& b, int rank, int s, const T (&v)[most_loads], T* ring) const {
    const int nr = b.ny + 2 * w[1], nc = b.nx + 2 * w[2];
    T* p = ring + s * plane;
    T* q = ring + (s + slots) * plane;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const int r = rank / tx + i * ty, c = rank % tx + j * tx;
        if (r < nr && c < nc) {
          p[r * px + c] = v[2 * i + j];
          q[r * px + c] = v[2 * i + j];
        }
      }
  }
  /// Thread `rank`'s point of plane z, whose oldest plane read (z - w0) is in slot `first`.
  KOKKOS_INLINE_FUNCTION void compute(const Tile& b, int rank, int z, int first, const T* ring) const {
    const int r = rank / tx, c = rank % tx;
    if (r >= b.ny || c >= b.nx) return;
    const int y = b.y0 + r, x = b.x0 + c;
    Neighbors<T, R, false, int> nb{ring + (first + w[0]) * plane + (r + w[1]) * px + (c + w[2]), {}};
    Index<R> gi;
    nb.s[0] = plane;
    gi.i[0] = offset[0] + z;
    if constexpr (R == 3) {
      nb.s[1] = px;
      gi.i[1] = offset[1] + y;
    }
    nb.s[R - 1] = 1;
    gi.i[R - 1] = offset[R - 1] + x;
    out[z * stride0 + y * stride1 + x] = static_cast<U>(f(static_cast<const Index<R>&>(gi), nb));
  }
  /// One thread's part of the step that computes plane z (oldest plane read in slot `first`) and
  /// loads plane z + w0 + 1 for the next step (when there is one) into the slot z - w0 - 1 had:
  /// no thread reads that slot in this step, so the step needs no barrier inside it.
  KOKKOS_INLINE_FUNCTION void step(const Tile& b, int rank, int z, int first, T* ring) const {
    T v[most_loads] = {};
    const bool more = z + 1 < b.z1;
    if (more) fetch(b, rank, z + w[0] + 1, v);
    compute(b, rank, z, first, ring);
    if (more) put(b, rank, first == 0 ? slots - 1 : first - 1, v, ring);
  }
  /// The first 2 w0 + 1 planes (z0 - w0 to z0 + w0) into slots 0 to 2 w0.
  KOKKOS_INLINE_FUNCTION void start(const Tile& b, int rank, T* ring) const {
    for (int s = 0; s <= 2 * w[0]; ++s) {
      T v[most_loads] = {};
      fetch(b, rank, b.z0 - w[0] + s, v);
      put(b, rank, s, v, ring);
    }
  }
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const Tile b = tile(team.league_rank());
    T* ring = static_cast<T*>(team.team_scratch(0).get_shmem(static_cast<std::size_t>(2 * slots * plane) * sizeof(T)));
    if (team.team_size() == threads) {  // a GPU's team: a thread a point
      const int rank = team.team_rank();
      start(b, rank, ring);
      team.team_barrier();
      int first = 0;
      for (int z = b.z0; z < b.z1; ++z) {
        step(b, rank, z, first, ring);
        first = first + 1 == slots ? 0 : first + 1;
        team.team_barrier();
      }
    } else {  // the host (a thread a team): the threads in turn between the barriers
      for (int rank = 0; rank < threads; ++rank) start(b, rank, ring);
      int first = 0;
      for (int z = b.z0; z < b.z1; ++z) {
        for (int rank = 0; rank < threads; ++rank) step(b, rank, z, first, ring);
        first = first + 1 == slots ? 0 : first + 1;
      }
    }
  }
};

/// Runs the middle points of stencil_rows' rows (`k`, its geometry and [mid0, mid1) set: the box
/// whose reads all fall inside the block) with StencilPlaneKernel on `Mem`'s instance, when the
/// block has fewer than 2^31 elements and its widths fit a thread's loads (3-D: at most 4 along
/// dim 1 and 16 along the last; 2-D: 128 along the last) and the ring the team's scratch (an H100's
/// 48 KiB a block less what Kokkos keeps for a team's reductions: 40 KiB; the host's 32 KiB);
/// false (nothing run) else.
template <class Mem, class K>
bool run_stencil_planes(const Context& ctx, const K& k) {
  using T = std::remove_cvref_t<decltype(*k.g.block)>;
  using U = std::remove_cvref_t<decltype(*k.out)>;
  constexpr std::size_t R = std::extent_v<decltype(k.g.extent)>;
  using P = StencilPlaneKernel<T, U, R, std::remove_cvref_t<decltype(k.f)>>;
  const auto& g = k.g;
  if (!g.fits_int()) return false;
  P p{g.block, k.out, static_cast<int>(g.stride[0]), R == 3 ? static_cast<int>(g.stride[1]) : 0, {}, {}, {}, {}, 1, 1, 1,
      0, 0, 0, 0, k.f};
  // The box as 3-D (dims 0, 1, last; a 2-D block's dim 1 is [0, 1) with width 0).
  for (std::size_t d = 0; d < 3; ++d) {
    const bool last = d == 2;
    const std::size_t gd = last ? R - 1 : d;
    if (R == 2 && d == 1) {
      p.lo[1] = 0, p.hi[1] = 1, p.w[1] = 0;
      continue;
    }
    p.w[d] = static_cast<int>(g.width[gd]);
    p.lo[d] = static_cast<int>(last ? k.mid0 : g.width[gd]);
    p.hi[d] = static_cast<int>(last ? k.mid1 : g.extent[gd] - g.width[gd]);
    if (p.hi[d] <= p.lo[d]) return true;  // no points
  }
  for (std::size_t d = 0; d < R; ++d) p.offset[d] = g.offset[d];
  if (2 * p.w[1] > P::ty || 2 * p.w[2] > P::tx) return false;  // more than most_loads a thread
  p.px = P::tx + 2 * p.w[2];
  p.rows = P::ty + 2 * p.w[1];
  p.plane = p.px * p.rows;
  p.slots = 2 * p.w[0] + 2;
  const auto& exec = ctx.exec_for<Mem>();
  using Exec = std::remove_cvref_t<decltype(exec)>;
  const std::size_t scratch = static_cast<std::size_t>(2 * p.slots * p.plane) * sizeof(T);
  if (scratch > static_cast<std::size_t>(Kokkos::TeamPolicy<Exec>::scratch_size_max(0))) return false;
  p.tiles_x = (p.hi[2] - p.lo[2] + P::tx - 1) / P::tx;
  p.tiles_y = (p.hi[1] - p.lo[1] + P::ty - 1) / P::ty;
  // Runs of planes: long (a run reloads 2 w0 planes), but teams enough to fill a GPU (>= 2048).
  const int planes = p.hi[0] - p.lo[0];
  const std::int64_t tiles = static_cast<std::int64_t>(p.tiles_x) * p.tiles_y;
  p.run = planes;
  while (p.run > 8 && tiles * ((planes + p.run - 1) / p.run) < 2048) p.run = (p.run + 1) / 2;
  if (p.run > 64) p.run = 64;
  const std::int64_t league = tiles * ((planes + p.run - 1) / p.run);
  if (league >= std::numeric_limits<int>::max()) return false;
  const int team = kernels::is_host_exec_v<Exec> ? 1 : P::threads;
  // (Locked as a reduction is: Kokkos 3's Serial shares its team scratch among callers as it does its reduction buffer.)
  [[maybe_unused]] const auto guard = kernel_guard_for<Mem>(ctx, true);
  std::int64_t points = 1;
  for (int d = 0; d < 3; ++d) points *= p.hi[d] - p.lo[d];
  kernels::count_kernel(stencil_bytes<T, U>(points));
  Kokkos::parallel_for("shardlib::stencil_for(planes)",
                       Kokkos::TeamPolicy<Exec>(exec, static_cast<int>(league), team).set_scratch_size(0, Kokkos::PerTeam(scratch)), p);
  if constexpr (kernels::is_host_exec_v<Exec>) kernels::fence(exec);
  return true;
}

}  // namespace shardlib::detail
