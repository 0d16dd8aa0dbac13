// SPDX-License-Identifier: Apache-2.0
/// @file
/// The machinery of the kernels that work along whole contiguous rows in one launch (softmax,
/// log_softmax, the norms and their backward, sums along rows): a *group* of consecutive threads
/// of a team per row, each thread holding its share of the row in registers.
///
/// Why: a row's statistics (a max, a sum of exponentials, moments) must be known before its
/// outputs are written, so a row is read more than once. The kernels before these read it from
/// memory once per pass, a pass a `parallel_reduce` with its own barriers, and ran at 0.27-0.72 of
/// a device copy on an H100 (issue 40). Here a thread loads its elements once (16 bytes at a time
/// where the row is aligned, all loads in flight before the first is used), the passes run over
/// its registers, and a group's reductions are warp shuffles (and, for a group of more than a
/// warp, one exchange through team scratch memory with two barriers), several statistics in one
/// reduction. Rows longer than a group's registers hold are walked in chunks, each pass reading
/// the row again (the last pass backwards: RowWalk).
///
/// Layout of a row's elements over its group: a thread (the group's `lane`) holds `per_thread`
/// elements, in runs of W = 16 / sizeof(T) consecutive elements (one 16-byte load), the group's
/// threads on consecutive runs: element index ((k * group + lane) * W + i) for run k, element i.
/// With a group of one thread (every host instance, where a team has one thread) a thread walks
/// its row in order, so its sums are sequential ones, as the host kernels'.
#pragma once

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/half.hpp>
#include <shardlib/kernels/exec.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardlib::kernels {

/// How a row-group kernel lays out its rows (row_groups picks it): teams of `team` threads, a
/// group of `group` of them per row (a power of two dividing `team`: several rows a team when the
/// rows are short), each thread holding up to `per_thread` elements of the row (8 or 32, the
/// kernel's compile-time tile; longer rows are walked in chunks of group * per_thread).
struct RowGroups {
  int team = 0;
  int group = 0;
  int per_thread = 0;
};

/// Whether `Exec` runs row groups of more than one thread: CUDA, where a group reduces with warp
/// shuffles. Other execution spaces run a group of one thread per row.
template <class Exec>
inline constexpr bool row_groups_shuffle_v =
#if defined(KOKKOS_ENABLE_CUDA)
    std::is_same_v<Exec, Kokkos::Cuda>;
#else
    false;
#endif

/// The layout for rows of `n` on `Exec`, registers for up to `most` (8 or 32) elements a thread:
/// on CUDA a group of the fewest threads (a power of two, up to 1024) that hold the row 8
/// elements each, or 32 each for rows of 257 to 32k when `most` is 32 (rows of 1024: a warp, its
/// reductions shuffles alone; longer rows: 1024 threads in chunks of 8 a thread); teams of at
/// least 128 threads. On host instances a team of one thread per row; on other devices teams of
/// 64 threads, a row each. Measured on an H100 (bench_gpu --part rows, issue 40): softmax of
/// rows of 1024 at 0.73 of a copy with groups of 128 threads 8 elements each, of 4096 at 0.56.
template <class Exec>
constexpr RowGroups row_groups(std::int64_t n, int most = 8) noexcept {
  if constexpr (is_host_exec_v<Exec>) {
    return {1, 1, 8};
  } else if constexpr (!row_groups_shuffle_v<Exec>) {
    return {64, 1, 8};
  } else {
    const int per = most == 32 && n > 256 && n <= 32 * 1024 ? 32 : 8;
    int group = 1;
    while (group < 1024 && static_cast<std::int64_t>(group) * per < n) group *= 2;
    return {group > 128 ? group : 128, group, per};
  }
}

namespace detail {

/// x ^ o's value of `v` among the warp's lanes (CUDA device code; elsewhere never called).
template <class V>
KOKKOS_INLINE_FUNCTION V shuffle_xor(V v, int o) {
#if defined(__CUDA_ARCH__)
  return __shfl_xor_sync(0xffffffffu, v, o);
#else
  (void)o;
  return v;
#endif
}

}  // namespace detail

/// Where a row-group kernel's thread is: its row (may be past the last: `valid` false, the thread
/// takes part in its team's barriers and shuffles only), its lane in the row's group, and the
/// team's scratch for reductions across warps.
struct RowPlace {
  std::int64_t row;
  int lane;
  bool valid;
};

template <class Member>
KOKKOS_INLINE_FUNCTION RowPlace row_place(const Member& team, const RowGroups& g, std::int64_t rows) {
  const int t = team.team_rank();
  const std::int64_t row = static_cast<std::int64_t>(team.league_rank()) * (g.team / g.group) + t / g.group;
  return {row, t % g.group, row < rows};
}

/// Team scratch a row-group kernel's reductions of up to K values of V need: a slot per warp
/// and value.
template <class V, int K>
KOKKOS_INLINE_FUNCTION constexpr std::size_t row_groups_scratch(const RowGroups& g) noexcept {
  return g.group > 32 ? static_cast<std::size_t>(g.team / 32) * K * sizeof(V) : 0;
}

/// Combines K values across each row group of `team` with `op` (every thread of the group gets
/// the results): warp shuffles, then for groups of more than a warp the warps' results through
/// `scratch` (row_groups_scratch's bytes) between two team barriers. Every thread of the team
/// calls it the same number of times. A group of one thread: nothing to do.
template <int K, class V, class Member, class Op>
KOKKOS_INLINE_FUNCTION void group_combine(const Member& team, const RowGroups& g, V (&v)[K], V* scratch, const Op& op) {
  if (g.group == 1) return;
  const int lanes = g.group < 32 ? g.group : 32;
  for (int o = lanes / 2; o > 0; o /= 2)
    for (int k = 0; k < K; ++k) v[k] = op(v[k], detail::shuffle_xor(v[k], o));
  if (g.group > 32) {
    const int t = team.team_rank(), warps = g.team / 32;
    if (t % 32 == 0)
      for (int k = 0; k < K; ++k) scratch[k * warps + t / 32] = v[k];
    team.team_barrier();
    const int first = (t / g.group) * (g.group / 32);
    for (int k = 0; k < K; ++k) {
      V a = scratch[k * warps + first];
      for (int w = 1; w < g.group / 32; ++w) a = op(a, scratch[k * warps + first + w]);
      v[k] = a;
    }
    team.team_barrier();
  }
}

/// One thread's share of a row chunk in registers, in compute_t<T> (float for the 16-bit types):
/// E elements in runs of W (see the file's comment).
template <class T, int E>
struct RowTile {
  using C = compute_t<T>;
  static constexpr int W = sizeof(T) >= 16 ? 1 : (16 / static_cast<int>(sizeof(T)) < E ? 16 / static_cast<int>(sizeof(T)) : E);
  static constexpr int runs = E / W;
  static_assert(E % W == 0, "shardlib: a row tile holds whole runs");
  struct alignas(W * sizeof(T)) Run {
    T e[W];
  };
  C v[E];

  /// The index in its chunk of run k's first element for the thread at `lane` (a chunk holds at
  /// most 1024 * 32 elements: int).
  KOKKOS_INLINE_FUNCTION static int run_start(int k, int group, int lane) { return (k * group + lane) * W; }
  /// Loads the slots whose indices are below `len` from `p` (a chunk's start), the others `pad`;
  /// whole runs with one load when `aligned` (p and every run start W-aligned).
  KOKKOS_INLINE_FUNCTION void load(const T* p, int len, int group, int lane, bool aligned, C pad) {
    for (int k = 0; k < runs; ++k) {
      const int j = run_start(k, group, lane);
      if (aligned && j + W <= len) {
        const Run run = *reinterpret_cast<const Run*>(p + j);
        for (int i = 0; i < W; ++i) v[k * W + i] = static_cast<C>(run.e[i]);
      } else {
        for (int i = 0; i < W; ++i) v[k * W + i] = j + i < len ? static_cast<C>(p[j + i]) : pad;
      }
    }
  }
};

/// Whether rows of `n` T's from `p` start on 16-byte boundaries (RowTile's whole-run loads).
template <class T>
bool rows_aligned(const T* p, std::int64_t n) noexcept {
  using Tile = RowTile<T, 8>;
  return reinterpret_cast<std::uintptr_t>(p) % (Tile::W * sizeof(T)) == 0 && n % Tile::W == 0;
}

/// Launches team kernel `k` over `rows` rows on `exec` in layout `g` with `scratch` bytes of team
/// scratch (row_groups_scratch); fences a host instance. Up to 1024 threads a team (the
/// compiler keeps a thread's registers within what that allows).
template <class Exec, class Kernel>
void launch_row_groups(const Exec& exec, const char* label, std::int64_t rows, const RowGroups& g, std::size_t scratch,
                       const Kernel& k) {
  if (rows <= 0 || shardlib::shape_only()) return;
  const std::int64_t per_team = g.team / g.group;
  const std::int64_t league = (rows + per_team - 1) / per_team;
  if (league > std::numeric_limits<int>::max())  // Kokkos' league size is an int
    throw std::length_error(std::string("shardlib: ") + label + ": " + std::to_string(rows) + " rows of " +
                            std::to_string(per_team) + " a team need " + std::to_string(league) +
                            " teams, more than one launch takes (2^31 - 1)");
  Kokkos::TeamPolicy<Exec, Kokkos::LaunchBounds<1024, 1>> policy(exec, static_cast<int>(league), g.team);
  if (scratch > 0) policy.set_scratch_size(0, Kokkos::PerTeam(scratch));
  Kokkos::parallel_for(label, policy, k);
  if constexpr (is_host_exec_v<Exec>) kernels::fence(exec);
}

/// One thread's walk along a row of `n` of K arrays at once (softmax's backward reads y and g;
/// the norms' x, y and g). Not `Chunked` (rows of up to group * E): the thread's share is loaded
/// once, on construction, and every pass runs over registers. `Chunked`: the row is walked in
/// chunks of group * E, each pass loading every chunk again: `each` in order (its callbacks get an
/// element's index j and its K values, `const C (&)[K]`, j ascending for a group of one thread:
/// sums in the row's order), `store` last chunk first. Why `store` goes backwards: it is the last
/// pass, after an `each` that read the chunks in order, so its first chunks are the ones read most
/// recently, the likeliest still in the GPU's L2 cache when a row's chunks do not all fit there
/// (a team's row of 32k floats in y and g is 256 KiB, a team per SM: 33 MB of an H100's 50 MB L2
/// in flight). Walked in order again, the chunk read first, the oldest, is the first evicted.
template <class T, int E, int K, bool Chunked>
struct RowWalk {
  using C = compute_t<T>;
  using Tile = RowTile<T, E>;
  static constexpr int W = Tile::W;
  const T* p[K];
  std::int64_t n, kept;  // elements, of which the first `kept` are read (the others are `pad`)
  int group, lane;
  bool aligned, valid;
  C pad;
  Tile first[K];  // not Chunked: the thread's share

  /// `rows[q] + row * n` is the row of array q; a thread with `valid` false (past the last row)
  /// reads and writes nothing.
  KOKKOS_INLINE_FUNCTION RowWalk(const T* const (&rows)[K], std::int64_t row, std::int64_t n_, std::int64_t kept_,
                                 int group_, int lane_, bool aligned_, bool valid_, C pad_ = C(0))
      : n(n_), kept(kept_), group(group_), lane(lane_), aligned(aligned_), valid(valid_), pad(pad_) {
    for (int q = 0; q < K; ++q) p[q] = rows[q] + row * n;
    if constexpr (!Chunked)
      if (valid)
        for (int q = 0; q < K; ++q) first[q].load(p[q], static_cast<int>(kept), group, lane, aligned, pad);
  }

  /// f(tiles, base, len, all) for each chunk, in order or (`backwards`) last first: its tiles
  /// (loaded here when Chunked), its first element, its elements below `kept` and in all.
  template <class F>
  KOKKOS_INLINE_FUNCTION void chunks(const F& f, bool backwards = false) const {
    if (!valid) return;
    if constexpr (!Chunked) {
      (void)backwards;
      f(first, std::int64_t(0), static_cast<int>(kept), static_cast<int>(n));
    } else {
      const int chunk = group * E;
      const std::int64_t count = (n + chunk - 1) / chunk;
      for (std::int64_t c = 0; c < count; ++c) {
        const std::int64_t b = (backwards ? count - 1 - c : c) * chunk;
        Tile t[K];
        const std::int64_t left = kept - b;
        const int len = left < chunk ? (left > 0 ? static_cast<int>(left) : 0) : chunk;
        for (int q = 0; q < K; ++q) t[q].load(p[q] + b, len, group, lane, aligned, pad);
        f(t, b, len, n - b < chunk ? static_cast<int>(n - b) : chunk);
      }
    }
  }
  /// Not Chunked: first[0]'s slot of element j becomes f(j, values), for each of this thread's
  /// elements j below `kept` (a pass whose results the next one reads: softmax's exponentials).
  template <class F>
  KOKKOS_INLINE_FUNCTION void transform(const F& f) {
    static_assert(!Chunked, "shardlib: a chunked row walk keeps nothing between passes");
    if (!valid) return;
    for (int s = 0; s < E; ++s) {
      const int j = Tile::run_start(s / W, group, lane) + s % W;
      if (j < kept) {
        C v[K];
        for (int q = 0; q < K; ++q) v[q] = first[q].v[s];
        first[0].v[s] = f(static_cast<std::int64_t>(j), v);
      }
    }
  }
  /// f(j, values) for each of this thread's elements j below `kept`.
  template <class F>
  KOKKOS_INLINE_FUNCTION void each(const F& f) const {
    chunks([&](const Tile(&t)[K], std::int64_t b, int len, int) {
      for (int s = 0; s < E; ++s) {
        const int j = Tile::run_start(s / W, group, lane) + s % W;
        if (j < len) {
          C v[K];
          for (int q = 0; q < K; ++q) v[q] = t[q].v[s];
          f(b + j, v);
        }
      }
    });
  }
  /// out[row * n + j] = f(j, values) for each of this thread's elements j below `n` (values
  /// `pad` past `kept`), whole runs with one store when `out_aligned`; Chunked, the chunks last
  /// first. `out` may be one of the arrays read: a thread writes only what it read, after reading
  /// it.
  template <class F>
  KOKKOS_INLINE_FUNCTION void store(T* out, std::int64_t row, bool out_aligned, const F& f) const {
    T* o = out + row * n;
    const auto write = [&](const Tile(&t)[K], std::int64_t b, int, int all) {
      for (int k = 0; k < Tile::runs; ++k) {
        const int j = Tile::run_start(k, group, lane);
        auto value = [&](int i) {
          C v[K];
          for (int q = 0; q < K; ++q) v[q] = t[q].v[k * W + i];
          return static_cast<T>(f(b + j + i, v));
        };
        if (out_aligned && j + W <= all) {
          typename Tile::Run run;
          for (int i = 0; i < W; ++i) run.e[i] = value(i);
          *reinterpret_cast<typename Tile::Run*>(o + b + j) = run;
        } else {
          for (int i = 0; i < W; ++i)
            if (j + i < all) o[b + j + i] = value(i);
        }
      }
    };
    chunks(write, true);
  }
};

/// Calls f(std::integral_constant<int, E>, std::bool_constant<Chunked>) for layout `g` and rows
/// of `n`: the tile a thread holds (8, or 32 for rows that 32 a thread hold whole) and whether the
/// rows are walked in chunks.
template <class F>
void with_row_tile(const RowGroups& g, std::int64_t n, const F& f) {
  const bool chunked = n > static_cast<std::int64_t>(g.group) * g.per_thread;
  if (g.per_thread == 32 && !chunked) {
    f(std::integral_constant<int, 32>{}, std::false_type{});
  } else {  // (rows longer than 32 a thread holds: chunks of 8 a thread, the same sums in order)
    if (chunked) f(std::integral_constant<int, 8>{}, std::true_type{});
    else f(std::integral_constant<int, 8>{}, std::false_type{});
  }
}

}  // namespace shardlib::kernels
