// SPDX-License-Identifier: Apache-2.0
/// @file
/// Kernels that reduce along one dim of a local block, and the pieces of softmax and of layer / RMS
/// normalisation built on such reductions: host kernels (below), and on a device instance
/// (Kokkos::Cuda) the forms of `detail::portable`, queued on its stream without a fence: one
/// thread per row for the stats, per element for the apply kernels, and `rows_fused`, softmax or
/// a norm of whole contiguous rows in one launch, a group of threads per row with the row in
/// registers (kernels/row_groups.hpp).
///
/// Every kernel sees its block as `[outer, n, inner]`, row-major: the reduced dim in the middle,
/// element (o, j, i) at `(o * n + j) * inner + i`. A *row* is a fixed (o, i); per-row results are
/// stored at `o * inner + i`. Any of outer, n, inner may be zero.
///
/// The kernels know nothing of tensors or collectives. When the reduced dim is split over devices
/// the op layer runs a *stats* kernel (`reduce_dim`, `argmax_dim`, `exp_sum`, `moments`) on each
/// device, combines the per-row stats with a collective, and then runs an *apply* kernel
/// (`softmax_apply`, `layer_norm_apply`, `rms_norm_apply`) with the global stats.
///
/// Execution on the host: one `Kokkos::parallel_for` over (o, block of consecutive i) items;
/// blocks hold up to 1024 rows, fewer when that would leave under 4 items per thread of the
/// execution space. An item walks j outermost and its i block innermost, so every read is a
/// contiguous run of up to 1024 elements even when inner > 1 (short runs at a large stride cost a cache and TLB miss each); with
/// inner == 1 a row is contiguous and is accumulated in 16 interleaved lanes, which the compiler
/// can vectorise. Per-row reductions are serial loops inside an item (no `parallel_reduce`). Every
/// kernel fences a host execution space instance before returning.
#pragma once

#include <shardlib/detail/attributes.hpp>
SHARDLIB_SIMD_WARNINGS_OFF  // (g++ 12 under -march=native: detail/attributes.hpp)

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/half.hpp>
#include <shardlib/kernels/row_groups.hpp>
#include <shardlib/kernels/rows.hpp>  // (detail::causal_read)
#include <shardlib/kernels/vmath.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardlib::kernels {

/// The reduction of `reduce_dim` (kept apart from the sharding layer's `ReduceOp`).
enum class ReduceKind : std::uint8_t { sum, max, min };

/// The type norms accumulate their moments in: double (also for integer and float elements).
template <class T>
using acc_t = double;

namespace detail {

/// The most and the fewest consecutive rows (values of i) one parallel item handles.
inline constexpr std::int64_t max_row_block = 1024;
inline constexpr std::int64_t min_row_block = 64;
/// Interleaved accumulators per row when inner == 1 (a vector's worth, and hides add latency).
inline constexpr std::int64_t lanes = 16;

inline void check_shape(const char* kernel, std::int64_t outer, std::int64_t n, std::int64_t inner) {
  if (outer < 0 || n < 0 || inner < 0)
    throw std::invalid_argument(std::string("shardlib::kernels::") + kernel + ": negative extent in [outer, n, inner] = [" +
                                std::to_string(outer) + ", " + std::to_string(n) + ", " + std::to_string(inner) + "]");
}

/// Counts a kernel on a block [outer, n, inner] (count_kernel) that reads or writes `per_element`
/// bytes for each element and `per_row` for each row (o, i), when there are rows; not for a
/// negative extent (the kernel throws).
inline void count_rows(std::int64_t outer, std::int64_t n, std::int64_t inner, std::uint64_t per_element,
                       std::uint64_t per_row) noexcept {
  if (outer <= 0 || inner <= 0 || n < 0) return;
  count_kernel(static_cast<std::uint64_t>(outer) * static_cast<std::uint64_t>(inner) *
               (static_cast<std::uint64_t>(n) * per_element + per_row));
}

template <class T>
constexpr bool is_nan(const T& x) noexcept {
  if constexpr (std::is_floating_point_v<T>) return x != x;
  else return false;
}

/// The identity of max: -inf where T has one, else lowest().
template <class T>
constexpr T max_identity() noexcept {
  if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}
/// The identity of min: +inf where T has one, else max().
template <class T>
constexpr T min_identity() noexcept {
  if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::max();
}

/// Rows per item: max_row_block, halved (down to min_row_block) while there would be fewer than
/// 4 items per thread of `exec`.
template <class Exec>
std::int64_t row_block(const Exec& exec, std::int64_t outer, std::int64_t inner) {
  const std::int64_t want = 4 * static_cast<std::int64_t>(exec.concurrency());
  std::int64_t b = max_row_block;
  while (b > min_row_block && outer * ((inner + b - 1) / b) < want) b /= 2;
  return b;
}

/// Runs `item(o, i0, len)` for every o and every block [i0, i0 + len) of at most `row_block`
/// (<= max_row_block) consecutive i, in parallel on `exec`, then fences.
template <class Exec, class Item>
void for_row_blocks(const Exec& exec, const char* label, std::int64_t outer, std::int64_t inner, const Item& item) {
  const std::int64_t block = row_block(exec, outer, inner);
  const std::int64_t blocks = (inner + block - 1) / block;
  if (outer != 0 && blocks != 0) {
    Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, outer * blocks), [=](std::int64_t k) {
      const std::int64_t o = k / blocks, i0 = (k % blocks) * block;
      item(o, i0, inner - i0 < block ? inner - i0 : block);
    });
  }
  kernels::fence(exec);
}

/// The first element of row `row` (= o * inner + i; its elements `inner` apart) of `in`: `in`
/// itself when n is 0 (an empty input may have no storage: null).
template <class T>
KOKKOS_INLINE_FUNCTION const T* row_first(const T* in, std::int64_t row, std::int64_t n, std::int64_t inner) {
  return n == 0 ? in : in + row / inner * n * inner + row % inner;
}

/// A per-row fold: `state = op.init(row)`, `op.step(state, x, j)` for j = 0..n-1 in order (or in
/// `lanes` interleaved lanes merged by `op.merge(earlier_lane_state, later)` when inner == 1,
/// which must then be order-insensitive up to rounding), then `op.store(row, state)`.
template <class Exec, class T, class Op>
void fold_rows(const Exec& exec, const char* label, const T* in, std::int64_t outer, std::int64_t n, std::int64_t inner,
               const Op& op) {
  using State = decltype(op.init(std::int64_t{}));
  for_row_blocks(exec, label, outer, inner, [=](std::int64_t o, std::int64_t i0, std::int64_t len) {
    const T* base = row_first(in, o * inner + i0, n, inner);
    if (inner == 1) {
      State s[lanes];
      for (std::int64_t l = 0; l < lanes; ++l) s[l] = op.init(o);
      const std::int64_t full = n / lanes * lanes;
      for (std::int64_t j = 0; j < full; j += lanes) {
        const T* line = base + j;
        for (std::int64_t l = 0; l < lanes; ++l) op.step(s[l], line[l], j + l);
      }
      for (std::int64_t j = full; j < n; ++j) op.step(s[j - full], base[j], j);
      for (std::int64_t l = 1; l < lanes; ++l) op.merge(s[0], s[l]);
      op.store(o, s[0]);
      return;
    }
    State s[max_row_block];
    const std::int64_t row0 = o * inner + i0;
    for (std::int64_t r = 0; r < len; ++r) s[r] = op.init(row0 + r);
    for (std::int64_t j = 0; j < n; ++j) {
      const T* line = base + j * inner;
      for (std::int64_t r = 0; r < len; ++r) op.step(s[r], line[r], j);
    }
    for (std::int64_t r = 0; r < len; ++r) op.store(row0 + r, s[r]);
  });
}

/// An elementwise pass with per-row parameters: `out = op.apply(in, op.param(row))`.
template <class Exec, class T, class Op>
void map_rows(const Exec& exec, const char* label, const T* in, T* out, std::int64_t outer, std::int64_t n,
              std::int64_t inner, const Op& op) {
  using Param = decltype(op.param(std::int64_t{}));
  if (n == 0) {  // nothing to write
    kernels::fence(exec);
    return;
  }
  for_row_blocks(exec, label, outer, inner, [=](std::int64_t o, std::int64_t i0, std::int64_t len) {
    const std::int64_t off = o * n * inner + i0;
    const T* src = in + off;
    T* dst = out + off;
    if (inner == 1) {
      const Param p = op.param(o);
      for (std::int64_t j = 0; j < n; ++j) dst[j] = op.apply(src[j], p);
      return;
    }
    Param p[max_row_block];
    const std::int64_t row0 = o * inner + i0;
    for (std::int64_t r = 0; r < len; ++r) p[r] = op.param(row0 + r);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t r = 0; r < len; ++r) dst[j * inner + r] = op.apply(src[j * inner + r], p[r]);
  });
}

template <class T, class Acc, ReduceKind K>
struct ReduceFold {
  Acc* out;
  Acc init(std::int64_t) const noexcept {
    if constexpr (K == ReduceKind::sum) return Acc(0);
    else if constexpr (K == ReduceKind::max) return max_identity<Acc>();
    else return min_identity<Acc>();
  }
  // max / min propagate NaN: once the state is NaN no comparison replaces it.
  static void add(Acc& s, const Acc& v) noexcept {
    if constexpr (K == ReduceKind::sum) s = static_cast<Acc>(s + v);
    else {
      const bool nan = is_nan(v);  // with `|` below (not `||`): no branch, so the loop vectorises
      if constexpr (K == ReduceKind::max) s = ((v > s) | nan) ? v : s;
      else s = ((v < s) | nan) ? v : s;
    }
  }
  void step(Acc& s, const T& x, std::int64_t) const noexcept { add(s, static_cast<Acc>(x)); }
  void merge(Acc& s, const Acc& t) const noexcept { add(s, t); }
  void store(std::int64_t row, const Acc& s) const noexcept { out[row] = s; }
};

template <class T>
struct ArgState {
  T value;
  std::int64_t index;
};

template <class T, bool Max>
struct ArgOp {
  T* best;
  std::int64_t* index;
  std::int64_t offset;
  ArgState<T> init(std::int64_t) const noexcept { return {Max ? max_identity<T>() : min_identity<T>(), -1}; }
  /// Whether (v, j) beats (s.value, s.index): strictly better, or NaN over non-NaN; ties and
  /// later NaNs keep the smaller index (an empty state has index -1 and always loses).
  static bool better(const T& v, std::int64_t j, const ArgState<T>& s) noexcept {
    if (s.index < 0) return true;
    if (is_nan(s.value)) return is_nan(v) && j < s.index;
    if (is_nan(v)) return true;
    if (Max ? v > s.value : v < s.value) return true;
    return v == s.value && j < s.index;
  }
  void step(ArgState<T>& s, const T& x, std::int64_t j) const noexcept {
    if (better(x, j, s)) s = {x, j};
  }
  void merge(ArgState<T>& s, const ArgState<T>& t) const noexcept {
    if (t.index >= 0 && better(t.value, t.index, s)) s = t;
  }
  void store(std::int64_t row, const ArgState<T>& s) const noexcept {
    best[row] = s.value;
    index[row] = s.index < 0 ? -1 : s.index + offset;
  }
};

template <class Exec, class T, bool Max>
void arg_dim(const Exec& exec, const char* label, const T* in, T* best, std::int64_t* index, std::int64_t outer,
             std::int64_t n, std::int64_t inner, std::int64_t index_offset) {
  check_shape(label, outer, n, inner);
  fold_rows(exec, label, in, outer, n, inner, ArgOp<T, Max>{best, index, index_offset});
}

}  // namespace detail

/// The forms a device instance (Kokkos::Cuda) runs: one Kokkos thread per row (o, i) for the
/// stats kernels, one per element for the apply kernels; consecutive threads take consecutive i
/// (or elements), so a warp's reads coalesce when inner > 1. Written for any execution space:
/// the kernels below take them on a device instance, and the tests run them on a host one
/// against the host kernels (on a host instance they fence, as every host kernel does). Their
/// loops over j are in order, sums in `Acc` (double for exp_sum and the moments).
namespace detail::portable {

/// reduce_dim's fold of one row (NaN propagates through max and min).
template <class T, class Acc, ReduceKind K>
struct ReduceDimKernel {
  const T* in;
  Acc* out;
  std::int64_t n, inner;
  Acc init;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    const T* p = row_first(in, k, n, inner);
    Acc acc = init;
    for (std::int64_t j = 0; j < n; ++j) {
      const Acc x = static_cast<Acc>(p[j * inner]);
      if constexpr (K == ReduceKind::sum) acc += x;
      else if constexpr (K == ReduceKind::max) acc = (x > acc || x != x) && acc == acc ? x : acc;
      else acc = (x < acc || x != x) && acc == acc ? x : acc;
    }
    out[k] = acc;
  }
};

/// exp_sum's row: the sum in double of exp(x - row_max).
template <class T>
struct ExpSumKernel {
  const T* in;
  const T* row_max;
  T* row_sum;
  std::int64_t n, inner;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    using std::exp;
    const T* p = row_first(in, k, n, inner);
    const T m = row_max[k];
    double s = 0;
    for (std::int64_t j = 0; j < n; ++j) s += static_cast<double>(exp(p[j * inner] - m));
    row_sum[k] = static_cast<T>(s);
  }
};

/// moments' row: the sums of x and x² in double (`sum` may be null).
template <class T>
struct MomentsKernel {
  const T* in;
  double* sum;
  double* sumsq;
  std::int64_t n, inner;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    const T* p = row_first(in, k, n, inner);
    double s = 0, q = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const double v = static_cast<double>(p[j * inner]);
      s += v;
      q += v * v;
    }
    if (sum != nullptr) sum[k] = s;
    sumsq[k] = q;
  }
};

/// The row (o * inner + i) of element k of an [outer, n, inner] block.
KOKKOS_INLINE_FUNCTION std::int64_t row_of(std::int64_t k, std::int64_t n, std::int64_t inner) {
  return k / (n * inner) * inner + k % inner;
}

/// softmax_apply's element: exp(x - max) / sum, or with Log, x - max - log(sum).
template <class T, bool Log>
struct SoftmaxApplyKernel {
  const T* in;
  T* out;
  const T* row_max;
  const T* row_sum;
  std::int64_t n, inner;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    using std::exp, std::log;
    const std::int64_t row = row_of(k, n, inner);
    if constexpr (Log) out[k] = in[k] - row_max[row] - log(row_sum[row]);
    else out[k] = exp(in[k] - row_max[row]) * (T(1) / row_sum[row]);
  }
};

/// layer_norm_apply's element (`sum` not null) or rms_norm_apply's (`sum` null), in double.
template <class T>
struct NormApplyKernel {
  const T* in;
  T* out;
  const double* sum;
  const double* sumsq;
  double count, eps;
  std::int64_t n, inner;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    using std::sqrt;
    const std::int64_t row = row_of(k, n, inner);
    if (sum != nullptr) {
      const double mean = sum[row] / count, var = sumsq[row] / count - mean * mean;
      out[k] = static_cast<T>((static_cast<double>(in[k]) - mean) * (1.0 / sqrt((var > 0.0 ? var : 0.0) + eps)));
    } else {
      out[k] = static_cast<T>(static_cast<double>(in[k]) * (1.0 / sqrt(sumsq[row] / count + eps)));
    }
  }
};

/// scale's element: data[k] *= factor.
template <class T>
struct ScaleKernel {
  T* data;
  T factor;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const { data[k] = static_cast<T>(data[k] * factor); }
};

/// argmax_dim's (argmin_dim's) row: the first best value and its index, NaN over numbers.
template <class T, bool Max>
struct ArgDimKernel {
  const T* in;
  T* best;
  std::int64_t* index;
  std::int64_t n, inner, offset;
  T init;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    const T* p = row_first(in, k, n, inner);
    T v = init;
    std::int64_t at = -1;
    for (std::int64_t j = 0; j < n; ++j) {
      const T x = p[j * inner];
      // In order, so ties and later NaNs keep the smaller index; a held NaN is never replaced.
      const bool better = at < 0 || (v == v && (x != x || (Max ? x > v : x < v)));
      if (better) {
        v = x;
        at = j;
      }
    }
    best[k] = v;
    index[k] = at < 0 ? -1 : at + offset;
  }
};

/// A sum along contiguous rows (inner == 1) in row groups (kernels/row_groups.hpp: a group of GPU
/// threads per row, its elements in registers, shuffles): ReduceDimKernel gives a row to one
/// thread, whose loads are a row apart across the warp (the softmax backward's row sums of [8, 12,
/// 1024, 1024] took milliseconds on an H100). Accumulated in Acc, or float for a 16-bit Acc. The
/// tests run it on host instances too (a group of one thread: the sum in order).
template <class T, class Acc, int E, bool Chunked>
struct RowSumKernel {
  using Sum = std::conditional_t<is_half_v<Acc>, float, Acc>;
  const T* in;
  Acc* out;
  std::int64_t n, rows;
  RowGroups groups;
  bool aligned;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const RowPlace at = row_place(team, groups, rows);
    Sum* scratch = static_cast<Sum*>(team.team_shmem().get_shmem(row_groups_scratch<Sum, 1>(groups)));
    const RowWalk<T, E, 1, Chunked> walk({in}, at.valid ? at.row : 0, n, n, groups.group, at.lane, aligned, at.valid);
    Sum s[1] = {Sum(0)};
    walk.each([&](std::int64_t, const auto& v) { s[0] += static_cast<Sum>(v[0]); });
    group_combine(team, groups, s, scratch, [](Sum a, Sum b) { return a + b; });
    if (at.valid && at.lane == 0) out[at.row] = static_cast<Acc>(s[0]);
  }
};

/// RowSumKernel over `rows` rows of `n` (row_groups' layout for `Exec` unless given).
template <class Exec, class T, class Acc>
void row_sums(const Exec& exec, const T* in, Acc* out, std::int64_t rows, std::int64_t n, RowGroups groups = {}) {
  using Sum = std::conditional_t<is_half_v<Acc>, float, Acc>;
  if (groups.team == 0) groups = row_groups<Exec>(n, 32);
  const bool aligned = rows_aligned(in, n);
  with_row_tile(groups, n, [&](auto e, auto chunked) {
    launch_row_groups(exec, "shardlib::kernels::reduce_dim(sum, rows)", rows, groups, row_groups_scratch<Sum, 1>(groups),
                      RowSumKernel<T, Acc, decltype(e)::value, decltype(chunked)::value>{in, out, n, rows, groups, aligned});
  });
}

template <class Exec, class T, class Acc>
void reduce_dim(const Exec& exec, const T* in, Acc* out, std::int64_t outer, std::int64_t n, std::int64_t inner,
                ReduceKind k) {
  count_rows(outer, n, inner, sizeof(T), sizeof(Acc));  // here, not in kernels::reduce_dim: losses call this one
  if (shardlib::shape_only()) return;
  const char* label = "shardlib::kernels::reduce_dim";
  switch (k) {
    case ReduceKind::sum:
      if (!is_host_exec_v<Exec> && inner == 1 && n > 0 && outer > 0 && outer <= std::numeric_limits<int>::max())
        return row_sums(exec, in, out, outer, n);
      return run(exec, label, outer * inner, ReduceDimKernel<T, Acc, ReduceKind::sum>{in, out, n, inner, Acc(0)});
    case ReduceKind::max:
      return run(exec, label, outer * inner, ReduceDimKernel<T, Acc, ReduceKind::max>{in, out, n, inner, max_identity<Acc>()});
    case ReduceKind::min:
      return run(exec, label, outer * inner, ReduceDimKernel<T, Acc, ReduceKind::min>{in, out, n, inner, min_identity<Acc>()});
  }
  throw std::invalid_argument("shardlib::kernels::reduce_dim: unknown ReduceKind " + std::to_string(int(k)));
}

template <class Exec, class T>
void exp_sum(const Exec& exec, const T* in, const T* row_max, T* row_sum, std::int64_t outer, std::int64_t n,
             std::int64_t inner) {
  count_rows(outer, n, inner, sizeof(T), 2 * sizeof(T));  // here, not in kernels::exp_sum: losses call this one
  if (shardlib::shape_only()) return;
  run(exec, "shardlib::kernels::exp_sum", outer * inner, ExpSumKernel<T>{in, row_max, row_sum, n, inner});
}

template <class Exec, class T>
void softmax_apply(const Exec& exec, const T* in, T* out, const T* row_max, const T* row_sum, std::int64_t outer,
                   std::int64_t n, std::int64_t inner, bool log) {
  const std::int64_t count = outer * n * inner;
  if (log) run(exec, "shardlib::kernels::log_softmax_apply", count, SoftmaxApplyKernel<T, true>{in, out, row_max, row_sum, n, inner});
  else run(exec, "shardlib::kernels::softmax_apply", count, SoftmaxApplyKernel<T, false>{in, out, row_max, row_sum, n, inner});
}

template <class Exec, class T>
void moments(const Exec& exec, const T* in, double* sum, double* sumsq, std::int64_t outer, std::int64_t n,
             std::int64_t inner) {
  run(exec, "shardlib::kernels::moments", outer * inner, MomentsKernel<T>{in, sum, sumsq, n, inner});
}

template <class Exec, class T>
void scale(const Exec& exec, T* data, std::int64_t n, T factor) {
  run(exec, "shardlib::kernels::scale", n, ScaleKernel<T>{data, factor});
}

template <class Exec, class T, bool Max>
void arg_dim(const Exec& exec, const T* in, T* best, std::int64_t* index, std::int64_t outer, std::int64_t n,
             std::int64_t inner, std::int64_t index_offset) {
  run(exec, Max ? "shardlib::kernels::argmax_dim" : "shardlib::kernels::argmin_dim", outer * inner,
      ArgDimKernel<T, Max>{in, best, index, n, inner, index_offset, Max ? max_identity<T>() : min_identity<T>()});
}

/// layer_norm_apply (`sum` not null) or rms_norm_apply (`sum` null).
template <class Exec, class T>
void norm_apply(const Exec& exec, const T* in, T* out, const double* sum, const double* sumsq, std::int64_t outer,
                std::int64_t n, std::int64_t inner, std::int64_t count, double eps) {
  run(exec, sum != nullptr ? "shardlib::kernels::layer_norm_apply" : "shardlib::kernels::rms_norm_apply", outer * n * inner,
      NormApplyKernel<T>{in, out, sum, sumsq, static_cast<double>(count), eps, n, inner});
}

/// What rows_fused computes along each row.
enum class RowOp : std::uint8_t { softmax, log_softmax, layer_norm, rms_norm };

/// rows_fused's kernel, in row groups (kernels/row_groups.hpp: a group of threads per row, its
/// elements in registers, E a thread; rows longer than a group holds read again per pass).
/// softmax: the max of scale * x (a NaN counts as +inf, so that its row comes out NaN as in
/// SoftmaxApplyKernel), the sum in double of exp(scale * x - max), then the outputs; the norms:
/// the sums of x and x^2 in double (one reduction), then the outputs. The same arithmetic as the
/// stats and apply kernels above, in one launch and one read of the row from memory. With
/// `causal` (softmax and log_softmax; > 0: the rows are [..., causal, n] matrices, row r the
/// query r % causal) element j of a row is masked where j > r % causal, as an additive -infinity
/// bias there would: read up to the diagonal only, written 0 (log_softmax: -infinity) beyond it.
template <class T, RowOp Op, int E, bool Chunked>
struct RowsKernel {
  using C = compute_t<T>;
  const T* in;
  T* out;
  std::int64_t n;
  T scale;
  double eps;
  std::int64_t rows;
  RowGroups groups;
  std::int64_t causal;
  bool in_aligned, out_aligned;
  T inf;  // +infinity (a NaN's stand-in in the max; -inf the max's identity), from the host
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    using std::exp, std::log, std::sqrt;
    const RowPlace at = row_place(team, groups, rows);
    const std::int64_t r = at.valid ? at.row : 0;
    void* shared = team.team_shmem().get_shmem(row_groups_scratch<double, 2>(groups));
    if constexpr (Op == RowOp::softmax || Op == RowOp::log_softmax) {
      const std::int64_t kept = causal > 0 && r % causal + 1 < n ? r % causal + 1 : n;  // elements not masked
      RowWalk<T, E, 1, Chunked> walk({in}, r, n, kept, groups.group, at.lane, in_aligned, at.valid);
      const T s = scale;
      T m[1] = {-inf};
      walk.each([&](std::int64_t, const auto& v) {
        const T w = s * static_cast<T>(v[0]);
        const T u = w != w ? inf : w;
        if (u > m[0]) m[0] = u;
      });
      group_combine(team, groups, m, static_cast<T*>(shared), [](T a, T b) { return a > b ? a : b; });
      double sum[1] = {0};
      const T mx = m[0];
      constexpr bool keep_exp = Op == RowOp::softmax && !Chunked;  // the exponentials kept in registers
      if constexpr (keep_exp) {
        walk.transform([&](std::int64_t, const auto& v) {
          const T e = exp(s * static_cast<T>(v[0]) - mx);
          sum[0] += static_cast<double>(e);
          return static_cast<C>(e);
        });
      } else {
        walk.each([&](std::int64_t, const auto& v) { sum[0] += static_cast<double>(exp(s * static_cast<T>(v[0]) - mx)); });
      }
      group_combine(team, groups, sum, static_cast<double*>(shared), [](double a, double b) { return a + b; });
      const T z = static_cast<T>(sum[0]);
      if constexpr (Op == RowOp::log_softmax) {
        const T lz = log(z);
        walk.store(out, r, out_aligned, [&](std::int64_t j, const auto& v) { return j < kept ? s * static_cast<T>(v[0]) - mx - lz : -inf; });
      } else if constexpr (keep_exp) {
        const T inv = T(1) / z;
        walk.store(out, r, out_aligned, [&](std::int64_t j, const auto& v) { return j < kept ? static_cast<T>(v[0]) * inv : T(0); });
      } else {
        const T inv = T(1) / z;
        walk.store(out, r, out_aligned,
                   [&](std::int64_t j, const auto& v) { return j < kept ? exp(s * static_cast<T>(v[0]) - mx) * inv : T(0); });
      }
    } else {
      const RowWalk<T, E, 1, Chunked> walk({in}, r, n, n, groups.group, at.lane, in_aligned, at.valid);
      const double count = static_cast<double>(n);
      double sums[2] = {0, 0};  // x, x^2
      walk.each([&](std::int64_t, const auto& v) {
        const double d = static_cast<double>(v[0]);
        if constexpr (Op == RowOp::layer_norm) sums[0] += d;
        sums[1] += d * d;
      });
      group_combine(team, groups, sums, static_cast<double*>(shared), [](double a, double b) { return a + b; });
      double mean = 0, inv;
      if constexpr (Op == RowOp::layer_norm) {
        mean = sums[0] / count;
        const double var = sums[1] / count - mean * mean;
        inv = 1.0 / sqrt((var > 0.0 ? var : 0.0) + eps);
      } else {
        inv = 1.0 / sqrt(sums[1] / count + eps);
      }
      walk.store(out, r, out_aligned, [&](std::int64_t, const auto& v) { return static_cast<T>((static_cast<double>(v[0]) - mean) * inv); });
    }
  }
};

/// `op` along each of `rows` contiguous rows of `n` (`in` [rows, n] row-major, whole rows on this
/// device): one launch (softmax and log_softmax of scale * in; eps for the norms), in row groups
/// (row_groups' layout for `Exec` unless given: on a GPU a group of threads per row, up to 32
/// elements a thread in registers; on a host instance one thread per row); `causal` as
/// RowsKernel's (softmax and log_softmax only). `out` may be `in`: each thread writes only what it
/// read.
template <class Exec, class T>
void rows_fused(const Exec& exec, RowOp op, const T* in, T* out, std::int64_t rows, std::int64_t n, T scale, double eps,
                RowGroups groups = {}, std::int64_t causal = 0) {
  if (rows <= 0) return;
  // in read (under `causal` the elements up to each row's diagonal), out written
  const std::int64_t read =
      causal > 0 && (op == RowOp::softmax || op == RowOp::log_softmax) ? kernels::detail::causal_read(rows, n, causal) : rows * n;
  if (n > 0) count_kernel(static_cast<std::uint64_t>(read + rows * n) * sizeof(T));
  if (shardlib::shape_only()) return;
  if (causal < 0 || (causal > 0 && op != RowOp::softmax && op != RowOp::log_softmax))
    throw std::invalid_argument("shardlib::kernels::rows_fused: causal " + std::to_string(causal) +
                                " (a causal mask is softmax's and log_softmax's, over rows of > 0 queries)");
  if (groups.team == 0) groups = row_groups<Exec>(n, 32);
  const bool ia = rows_aligned(in, n), oa = rows_aligned(static_cast<const T*>(out), n);
  const std::size_t scratch = row_groups_scratch<double, 2>(groups);
  auto with_tile = [&](auto op_tag) {
    with_row_tile(groups, n, [&](auto e, auto chunked) {
      launch_row_groups(exec, "shardlib::kernels::rows_fused", rows, groups, scratch,
                        RowsKernel<T, decltype(op_tag)::value, decltype(e)::value, decltype(chunked)::value>{
                            in, out, n, scale, eps, rows, groups, causal, ia, oa, min_identity<T>()});
    });
  };
  switch (op) {
    case RowOp::softmax: return with_tile(std::integral_constant<RowOp, RowOp::softmax>{});
    case RowOp::log_softmax: return with_tile(std::integral_constant<RowOp, RowOp::log_softmax>{});
    case RowOp::layer_norm: return with_tile(std::integral_constant<RowOp, RowOp::layer_norm>{});
    case RowOp::rms_norm: return with_tile(std::integral_constant<RowOp, RowOp::rms_norm>{});
  }
}

}  // namespace detail::portable

/// out[o * inner + i] = the `k`-reduction over j of in[(o * n + j) * inner + i], accumulated in
/// `Acc`. On a device instance (Kokkos::Cuda) one GPU thread per output element, queued on its
/// stream (detail::portable); on a host one the paths below, fenced. n == 0 gives the identity:
/// 0, -inf / +inf for floating point, lowest() / max() of `Acc` otherwise. max and min propagate NaN (as torch.amax / amin). With inner == 1 a sum is
/// accumulated in 16 interleaved partial sums, so its rounding differs from a sequential loop.
template <class Exec, class T, class Acc = T>
void reduce_dim(const Exec& exec, const T* in, Acc* out, std::int64_t outer, std::int64_t n, std::int64_t inner,
                ReduceKind k) {
  if constexpr (!is_host_exec_v<Exec>) {  // counted in portable::reduce_dim, which does nothing else in shape-only mode
    if (!shardlib::shape_only()) detail::check_shape("reduce_dim", outer, n, inner);
    detail::portable::reduce_dim(exec, in, out, outer, n, inner, k);
  } else {
    detail::count_rows(outer, n, inner, sizeof(T), sizeof(Acc));
    if (shardlib::shape_only()) return;
    detail::check_shape("reduce_dim", outer, n, inner);
    switch (k) {
      case ReduceKind::sum:
        detail::fold_rows(exec, "shardlib::kernels::reduce_dim(sum)", in, outer, n, inner,
                          detail::ReduceFold<T, Acc, ReduceKind::sum>{out});
        return;
      case ReduceKind::max:
        detail::fold_rows(exec, "shardlib::kernels::reduce_dim(max)", in, outer, n, inner,
                          detail::ReduceFold<T, Acc, ReduceKind::max>{out});
        return;
      case ReduceKind::min:
        detail::fold_rows(exec, "shardlib::kernels::reduce_dim(min)", in, outer, n, inner,
                          detail::ReduceFold<T, Acc, ReduceKind::min>{out});
        return;
    }
    throw std::invalid_argument("shardlib::kernels::reduce_dim: unknown ReduceKind " + std::to_string(int(k)));
  }
}

/// Per row, the first maximum: best[row] = its value, index[row] = its j + `index_offset` (the
/// block's global offset along the dim). NaN counts as greater than every number (as torch's
/// argmax): a row holding NaN answers its first NaN. n == 0: value -inf (lowest() for integers),
/// index -1. Devices' answers combine with `arg_better<true>` (ties: smaller index).
template <class Exec, class T>
void argmax_dim(const Exec& exec, const T* in, T* best, std::int64_t* index, std::int64_t outer, std::int64_t n,
                std::int64_t inner, std::int64_t index_offset) {
  detail::count_rows(outer, n, inner, sizeof(T), sizeof(T) + sizeof(std::int64_t));
  if (shardlib::shape_only()) return;
  if constexpr (!is_host_exec_v<Exec>) {
    detail::check_shape("argmax_dim", outer, n, inner);
    detail::portable::arg_dim<Exec, T, true>(exec, in, best, index, outer, n, inner, index_offset);
  } else {
    detail::arg_dim<Exec, T, true>(exec, "argmax_dim", in, best, index, outer, n, inner, index_offset);
  }
}

/// As `argmax_dim`, for the first minimum (NaN still wins, as in torch's argmin); n == 0 gives
/// +inf (max() for integers) and index -1.
template <class Exec, class T>
void argmin_dim(const Exec& exec, const T* in, T* best, std::int64_t* index, std::int64_t outer, std::int64_t n,
                std::int64_t inner, std::int64_t index_offset) {
  detail::count_rows(outer, n, inner, sizeof(T), sizeof(T) + sizeof(std::int64_t));
  if (shardlib::shape_only()) return;
  if constexpr (!is_host_exec_v<Exec>) {
    detail::check_shape("argmin_dim", outer, n, inner);
    detail::portable::arg_dim<Exec, T, false>(exec, in, best, index, outer, n, inner, index_offset);
  } else {
    detail::arg_dim<Exec, T, false>(exec, "argmin_dim", in, best, index, outer, n, inner, index_offset);
  }
}

/// Whether candidate (v, i) beats (w, k) for argmax (`Max`) or argmin, by the kernels' rule:
/// NaN beats numbers, then the larger (smaller) value, then the smaller index; index -1 (an empty
/// block) always loses. For combining per-device answers of `argmax_dim` / `argmin_dim`.
template <bool Max, class T>
constexpr bool arg_better(const T& v, std::int64_t i, const T& w, std::int64_t k) noexcept {
  if (i < 0) return false;
  return detail::ArgOp<T, Max>::better(v, i, detail::ArgState<T>{w, k});
}

/// Softmax pass 2: row_sum[row] = sum over j of exp(in - row_max[row]), where row_max is the
/// row's GLOBAL maximum (pass 1 is `reduce_dim` max, then a max all-reduce). Summed in double
/// (on the host with inner == 1: Eigen's packet exp, in float a chunk at a time, double across).
/// n == 0 gives 0. A row whose maximum is -inf (all -inf) gives NaN, as torch does.
template <class Exec, class T>
void exp_sum(const Exec& exec, const T* in, const T* row_max, T* row_sum, std::int64_t outer, std::int64_t n,
             std::int64_t inner) {
  static_assert(std::is_floating_point_v<T>, "shardlib::kernels::exp_sum: T must be a floating-point type");
  if constexpr (!is_host_exec_v<Exec>) {  // counted in portable::exp_sum, which does nothing else in shape-only mode
    if (!shardlib::shape_only()) detail::check_shape("exp_sum", outer, n, inner);
    detail::portable::exp_sum(exec, in, row_max, row_sum, outer, n, inner);
  } else {
    detail::count_rows(outer, n, inner, sizeof(T), 2 * sizeof(T));  // in read; row_max read, row_sum written
    if (shardlib::shape_only()) return;
    detail::check_shape("exp_sum", outer, n, inner);
    if constexpr (vmath::is_vector_type_v<T>) {
      if (inner == 1) {  // contiguous rows: packet exp, float sums per chunk (whole packets from its start), double across
        Kokkos::parallel_for("shardlib::kernels::exp_sum(vector)", Kokkos::RangePolicy<Exec>(exec, 0, outer), [=](std::int64_t r) {
          const T m = row_max[r];
          row_sum[r] = static_cast<T>(vmath::sum_runs(n, [m](const auto& v) { return vmath::exp(v - m); }, in + r * n));
        });
        kernels::fence(exec);
        return;
      }
    }
    struct State {
      double sum;
      T max;
    };
    struct Op {
      const T* row_max;
      T* row_sum;
      State init(std::int64_t row) const noexcept { return {0.0, row_max[row]}; }
      void step(State& s, const T& x, std::int64_t) const noexcept { s.sum += static_cast<double>(std::exp(x - s.max)); }
      void merge(State& s, const State& t) const noexcept { s.sum += t.sum; }
      void store(std::int64_t row, const State& s) const noexcept { row_sum[row] = static_cast<T>(s.sum); }
    };
    detail::fold_rows(exec, "shardlib::kernels::exp_sum", in, outer, n, inner, Op{row_max, row_sum});
  }
}

/// Softmax pass 3, with the global row_max and row_sum: out = exp(in - max) / sum, or with `log`,
/// out = in - max - log(sum). `out` may be `in` (in place).
template <class Exec, class T>
void softmax_apply(const Exec& exec, const T* in, T* out, const T* row_max, const T* row_sum, std::int64_t outer,
                   std::int64_t n, std::int64_t inner, bool log) {
  static_assert(std::is_floating_point_v<T>, "shardlib::kernels::softmax_apply: T must be a floating-point type");
  if (n > 0) detail::count_rows(outer, n, inner, 2 * sizeof(T), 2 * sizeof(T));  // in read, out written; the stats read
  if (shardlib::shape_only()) return;
  detail::check_shape("softmax_apply", outer, n, inner);
  if constexpr (!is_host_exec_v<Exec>) {
    detail::portable::softmax_apply(exec, in, out, row_max, row_sum, outer, n, inner, log);
  } else {
    struct Param {
      T max, k;  // k = 1 / sum, or log(sum)
    };
    if (log) {
      struct Op {
        const T *row_max, *row_sum;
        Param param(std::int64_t row) const noexcept { return {row_max[row], std::log(row_sum[row])}; }
        T apply(const T& x, const Param& p) const noexcept { return x - p.max - p.k; }
      };
      detail::map_rows(exec, "shardlib::kernels::log_softmax_apply", in, out, outer, n, inner, Op{row_max, row_sum});
    } else {
      if constexpr (is_host_exec_v<Exec> && vmath::is_vector_type_v<T>) {
        if (inner == 1) {  // contiguous rows: Eigen's packet exp
          if (n != 0)
            Kokkos::parallel_for("shardlib::kernels::softmax_apply(vector)", Kokkos::RangePolicy<Exec>(exec, 0, outer),
                                 [=](std::int64_t r) {
                                   const T m = row_max[r], k = T(1) / row_sum[r];
                                   vmath::assign_packets(out + r * n, n, [m, k](const auto& x) { return vmath::exp(x - m) * k; },
                                                         in + r * n);
                                 });
          kernels::fence(exec);
          return;
        }
      }
      struct Op {
        const T *row_max, *row_sum;
        Param param(std::int64_t row) const noexcept { return {row_max[row], T(1) / row_sum[row]}; }
        T apply(const T& x, const Param& p) const noexcept { return std::exp(x - p.max) * p.k; }
      };
      detail::map_rows(exec, "shardlib::kernels::softmax_apply", in, out, outer, n, inner, Op{row_max, row_sum});
    }
  }
}

/// Norm stats: sum[row] = sum over j of in, sumsq[row] = sum over j of in², in `acc_t<T>`
/// (double). `sum` may be null (RMS norm needs only sumsq). n == 0 gives zeros.
template <class Exec, class T>
void moments(const Exec& exec, const T* in, acc_t<T>* sum, acc_t<T>* sumsq, std::int64_t outer, std::int64_t n,
             std::int64_t inner) {
  detail::count_rows(outer, n, inner, sizeof(T), (sum != nullptr ? 2u : 1u) * sizeof(acc_t<T>));  // in; sum, sumsq
  if (shardlib::shape_only()) return;
  detail::check_shape("moments", outer, n, inner);
  if constexpr (!is_host_exec_v<Exec>) {
    detail::portable::moments(exec, in, sum, sumsq, outer, n, inner);
  } else {
    using A = acc_t<T>;
    struct State {
      A s, q;
    };
    struct Op {
      A *sum, *sumsq;
      State init(std::int64_t) const noexcept { return {A(0), A(0)}; }
      void step(State& st, const T& x, std::int64_t) const noexcept {
        const A v = static_cast<A>(x);
        st.s += v;
        st.q += v * v;
      }
      void merge(State& st, const State& t) const noexcept {
        st.s += t.s;
        st.q += t.q;
      }
      void store(std::int64_t row, const State& st) const noexcept {
        if (sum != nullptr) sum[row] = st.s;
        sumsq[row] = st.q;
      }
    };
    detail::fold_rows(exec, "shardlib::kernels::moments", in, outer, n, inner, Op{sum, sumsq});
  }
}

namespace detail {
inline void check_count(const char* kernel, std::int64_t n, std::int64_t count, double eps) {
  if (count < n)
    throw std::invalid_argument(std::string("shardlib::kernels::") + kernel + ": global count " + std::to_string(count) +
                                " is smaller than the local extent " + std::to_string(n) + " of the normalised dim");
  if (!(eps >= 0))
    throw std::invalid_argument(std::string("shardlib::kernels::") + kernel + ": eps must be >= 0, got " +
                                std::to_string(eps));
}
}  // namespace detail

/// Layer norm apply, with the GLOBAL row stats from `moments` (all-reduced) and `count` = the full
/// extent of the normalised dim (>= the local n): y = (x - mean) / sqrt(var + eps), mean =
/// sum / count, var = max(sumsq / count - mean², 0) (biased, as torch). Computed in double.
/// `out` may be `in`. Throws std::invalid_argument if count < n or eps < 0.
template <class Exec, class T>
void layer_norm_apply(const Exec& exec, const T* in, T* out, const acc_t<T>* sum, const acc_t<T>* sumsq,
                      std::int64_t outer, std::int64_t n, std::int64_t inner, std::int64_t count, double eps) {
  if (n > 0) detail::count_rows(outer, n, inner, 2 * sizeof(T), 2 * sizeof(acc_t<T>));  // in, out; sum, sumsq
  if (shardlib::shape_only()) return;
  detail::check_shape("layer_norm_apply", outer, n, inner);
  detail::check_count("layer_norm_apply", n, count, eps);
  if constexpr (!is_host_exec_v<Exec>) {
    detail::portable::norm_apply(exec, in, out, sum, sumsq, outer, n, inner, count, eps);
  } else {
    using A = acc_t<T>;
    struct Param {
      A mean, rstd;
    };
    struct Op {
      const A *sum, *sumsq;
      A count, eps;
      Param param(std::int64_t row) const noexcept {
        const A mean = sum[row] / count, var = sumsq[row] / count - mean * mean;
        return {mean, A(1) / std::sqrt((var > A(0) ? var : A(0)) + eps)};
      }
      T apply(const T& x, const Param& p) const noexcept { return static_cast<T>((static_cast<A>(x) - p.mean) * p.rstd); }
    };
    detail::map_rows(exec, "shardlib::kernels::layer_norm_apply", in, out, outer, n, inner,
                     Op{sum, sumsq, static_cast<A>(count), static_cast<A>(eps)});
  }
}

/// RMS norm apply, with the GLOBAL sumsq from `moments` and `count` as for `layer_norm_apply`:
/// y = x / sqrt(sumsq / count + eps). Computed in double. `out` may be `in`.
template <class Exec, class T>
void rms_norm_apply(const Exec& exec, const T* in, T* out, const acc_t<T>* sumsq, std::int64_t outer, std::int64_t n,
                    std::int64_t inner, std::int64_t count, double eps) {
  if (n > 0) detail::count_rows(outer, n, inner, 2 * sizeof(T), sizeof(acc_t<T>));  // in, out; sumsq
  if (shardlib::shape_only()) return;
  detail::check_shape("rms_norm_apply", outer, n, inner);
  detail::check_count("rms_norm_apply", n, count, eps);
  if constexpr (!is_host_exec_v<Exec>) {
    detail::portable::norm_apply(exec, in, out, static_cast<const double*>(nullptr), sumsq, outer, n, inner, count, eps);
  } else {
    using A = acc_t<T>;
    struct Op {
      const A* sumsq;
      A count, eps;
      A param(std::int64_t row) const noexcept { return A(1) / std::sqrt(sumsq[row] / count + eps); }
      T apply(const T& x, const A& rstd) const noexcept { return static_cast<T>(static_cast<A>(x) * rstd); }
    };
    detail::map_rows(exec, "shardlib::kernels::rms_norm_apply", in, out, outer, n, inner,
                     Op{sumsq, static_cast<A>(count), static_cast<A>(eps)});
  }
}

/// data[k] *= factor for k in [0, n) (a mean is a sum scaled by 1 / count). On a device instance,
/// queued on its stream; on a host one, fenced.
template <class Exec, class T>
void scale(const Exec& exec, T* data, std::int64_t n, T factor) {
  if (n > 0) count_kernel(2 * static_cast<std::uint64_t>(n) * sizeof(T));  // data read and written
  if (shardlib::shape_only()) return;
  if (n < 0) throw std::invalid_argument("shardlib::kernels::scale: negative count " + std::to_string(n));
  constexpr std::int64_t chunk = 4096;
  if constexpr (!is_host_exec_v<Exec>) {
    if (n != 0)
      detail::portable::scale(exec, data, n, factor);
    return;
  } else if (n != 0) {
    Kokkos::parallel_for("shardlib::kernels::scale", Kokkos::RangePolicy<Exec>(exec, 0, (n + chunk - 1) / chunk),
                         [=](std::int64_t c) {
                           T* p = data + c * chunk;
                           const std::int64_t len = n - c * chunk < chunk ? n - c * chunk : chunk;
                           for (std::int64_t k = 0; k < len; ++k) p[k] = static_cast<T>(p[k] * factor);
                         });
  }
  kernels::fence(exec);
}

}  // namespace shardlib::kernels

SHARDLIB_SIMD_WARNINGS_ON
