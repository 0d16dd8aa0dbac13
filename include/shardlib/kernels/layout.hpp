// SPDX-License-Identifier: Apache-2.0
/// @file
/// Kernels that move elements of a local block without arithmetic: `permute` (transpose of any
/// rank), `take` (gather along a dim; the vocab-parallel embedding lookup) and its transpose
/// `index_add`, `copy_sub_box` (the local part of slicing), `copy_strided` and `fill_strided`
/// (boxes between strided views: pad's pieces, shift's vacated cells), and `copy_pieces` (a batch
/// of copy_strided copies, one kernel on a GPU: a ghost exchange's packing).
///
/// `permute` and `copy_sub_box` share one engine: copy into a row-major output from an input
/// read at arbitrary strides. It first drops extent-1 dims and merges neighbouring dims that are
/// contiguous on both sides, so an identity permutation or a box of whole rows is one contiguous
/// run. Then: when the input's last remaining dim has stride 1, each output row is one memcpy
/// (chunked); otherwise the input's unit-stride dim and the output's last dim are walked in
/// 128 x 128 tiles of 32 x 32 sub-tiles (a batched, cache-friendly transpose; any permutation
/// that moves the last dim lands here, not only a swap of the last two dims).
///
/// All kernels: one `Kokkos::parallel_for` on the given execution space instance, no allocation,
/// arguments checked before anything is written; on a host instance the paths above and a fence
/// before returning. Every kernel also takes a device instance (Kokkos::Cuda): the forms of
/// `detail::portable`, one output element per GPU thread (consecutive threads write consecutive
/// elements), queued on its stream without a fence; take's and index_add's id check is then one
/// reduction the host waits for (skipped when the caller does not check).
#pragma once

#include <Kokkos_Core.hpp>

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/exec.hpp>

#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace shardlib::kernels {

/// The highest rank `permute` and `copy_sub_box` accept.
inline constexpr int max_layout_rank = 8;

namespace detail {

/// out (row-major, `extent`) = in[offset + sum_k idx_k * stride[k]].
struct StridedView {
  int rank = 0;
  std::int64_t offset = 0;
  std::int64_t extent[max_layout_rank] = {};
  std::int64_t stride[max_layout_rank] = {};

  std::int64_t count() const noexcept {
    std::int64_t n = 1;
    for (int k = 0; k < rank; ++k) n *= extent[k];
    return n;
  }
};

/// The same elements in the same order with the fewest dims: extent-1 dims dropped, and dim k
/// merged into dim k + 1 when stride[k] == extent[k + 1] * stride[k + 1] (the output is row-major,
/// so it is contiguous there too). A non-empty single element becomes rank 0.
inline StridedView normalise(const StridedView& v) noexcept {
  StridedView out;
  out.offset = v.offset;
  for (int k = 0; k < v.rank; ++k) {
    if (v.extent[k] == 1) continue;
    const int last = out.rank - 1;
    if (last >= 0 && out.stride[last] == v.extent[k] * v.stride[k]) {
      out.extent[last] *= v.extent[k];
      out.stride[last] = v.stride[k];
    } else {
      out.extent[out.rank] = v.extent[k];
      out.stride[out.rank] = v.stride[k];
      ++out.rank;
    }
  }
  return out;
}

/// One piece of a batched copy (copy_pieces): the elements of view `in` of source buffer `from`
/// go to view `out` (same rank and extents) of destination buffer `to`; `first` is the number of
/// the batch's elements in the pieces before it. Trivially copyable: a table of them lives in the
/// memory the kernel runs in.
struct StridedPiece {
  StridedView in, out;
  std::int64_t first = 0;
  int from = 0, to = 0;  // 0 or 1: which of the batch's two sources and two destinations
};

/// Elements per parallel item in contiguous copies.
inline constexpr std::int64_t copy_chunk = std::int64_t{1} << 14;
/// Side of a transpose tile (one parallel item), and of the sub-tiles it is walked in: a 32 x 32
/// sub-tile stays in L1, a 128 x 128 tile reads and writes 512-byte runs (for floats) per line.
inline constexpr std::int64_t tile = 128;
inline constexpr std::int64_t sub_tile = 32;

template <class T>
inline void copy_elements(T* dst, const T* src, std::int64_t n) noexcept {
  std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), static_cast<std::size_t>(n) * sizeof(T));
}

/// Columns per parallel item of index_add on a host (4 KiB of floats of a row).
inline constexpr std::int64_t index_add_chunk = 1024;

/// dst[k] += src[k] for k < n (distinct arrays).
template <class T>
inline void add_elements(T* __restrict dst, const T* __restrict src, std::int64_t n) noexcept {
  for (std::int64_t k = 0; k < n; ++k) dst[k] += src[k];
}

/// The forms a device instance (Kokkos::Cuda) runs: one Kokkos thread per output element
/// (consecutive threads write consecutive elements, so a warp's writes coalesce), functors rather
/// than lambdas (nvcc names them in any enclosing template). Written for any execution space: the
/// public kernels take them on a device instance, queued on its stream without a fence; the tests
/// run them on a host instance against the host kernels (there they fence, as every host kernel
/// does).
namespace portable {

/// The walk of two strided views of one extent: element k's offsets in both (row-major order).
KOKKOS_INLINE_FUNCTION void strided_at(const StridedView& a, const StridedView& b, std::int64_t k, std::int64_t& ia,
                                       std::int64_t& ib) {
  ia = a.offset;
  ib = b.offset;
  for (int d = a.rank - 1; d >= 0; --d) {
    const std::int64_t i = k % a.extent[d];
    k /= a.extent[d];
    ia += i * a.stride[d];
    ib += i * b.stride[d];
  }
}

/// out[out view at k] = in[in view at k] (strided_copy: the out view is row-major).
template <class T>
struct StridedCopyKernel {
  const T* in;
  T* out;
  StridedView a, b;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    std::int64_t ia, ib;
    strided_at(a, b, k, ia, ib);
    out[ib] = in[ia];
  }
};

/// copy_pieces: element k of the batch, in the last piece whose `first` is k or less (a binary
/// search over the table: empty pieces are never found, the next piece starts where they do).
template <class T>
struct CopyPiecesKernel {
  const StridedPiece* pieces;
  int n;
  const T* from[2];
  T* to[2];
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (pieces[mid].first <= k) lo = mid;
      else hi = mid - 1;
    }
    const StridedPiece& p = pieces[lo];
    std::int64_t ia, ib;
    strided_at(p.in, p.out, k - p.first, ia, ib);
    to[p.to][ib] = from[p.from][ia];
  }
};

/// out[view at k] = value.
template <class T>
struct FillStridedKernel {
  T* out;
  StridedView v;
  T value;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    std::int64_t iv, unused;
    strided_at(v, v, k, iv, unused);
    out[iv] = value;
  }
};

/// take's element e of out [outer, n_ids, inner]: the table's row when this block holds it, else 0.
template <class T, class I>
struct TakeKernel {
  const T* table;
  const I* ids;
  T* out;
  std::int64_t n_local, inner, n_ids, row_offset;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t e) const {
    const std::int64_t i = e % inner, om = e / inner, o = om / n_ids;
    const auto id = static_cast<std::int64_t>(ids[om % n_ids]);  // an unsigned id past INT64_MAX: negative, absent
    const std::int64_t j = id - row_offset;
    out[e] = j >= 0 && j < n_local ? table[(o * n_local + j) * inner + i] : T(0);
  }
};

/// index_add's column (o, i) of out [outer, n_local, inner]: the values of every id this block
/// holds, added in the order of the ids (deterministic).
template <class T, class I>
struct IndexAddKernel {
  T* out;
  const I* ids;
  const T* values;
  std::int64_t n_local, inner, n_ids, row_offset;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    const std::int64_t o = item / inner, i = item % inner;
    for (std::int64_t m = 0; m < n_ids; ++m) {
      const std::int64_t j = static_cast<std::int64_t>(ids[m]) - row_offset;
      if (j >= 0 && j < n_local) out[(o * n_local + j) * inner + i] += values[(o * n_ids + m) * inner + i];
    }
  }
};

/// The first id outside [0, extent): its position (val) and value (loc), as Kokkos::MinLoc folds.
template <class I>
struct FirstBadIdKernel {
  using Pair = Kokkos::ValLocScalar<std::int64_t, std::int64_t>;
  const I* ids;
  std::int64_t extent;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t m, Pair& first) const {
    const I id = ids[m];  // a negative id converts to 2^64 - |id|: past every extent
    const bool bad = static_cast<std::uint64_t>(id) >= static_cast<std::uint64_t>(extent);
    if (bad && m < first.val) {
      first.val = m;
      first.loc = static_cast<std::int64_t>(id);
    }
  }
};

/// strided_copy: out (row-major, v's extents) = the elements of `in` that `v` addresses.
template <class Exec, class T>
void strided_copy(const Exec& exec, const char* label, const T* in, T* out, const StridedView& v) {
  StridedView row_major = v;
  row_major.offset = 0;
  std::int64_t s = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    row_major.stride[d] = s;
    s *= v.extent[d];
  }
  run(exec, label, v.count(), StridedCopyKernel<T>{in, out, v, row_major});
}
/// copy_strided: out[b] = in[a] (views of one rank and extents, checked by the caller).
template <class Exec, class T>
void copy_strided(const Exec& exec, const char* label, const T* in, const StridedView& a, T* out, const StridedView& b) {
  run(exec, label, a.count(), StridedCopyKernel<T>{in, out, a, b});
}
/// copy_pieces: the `n` pieces of `table` (in exec's memory), `total` elements, in one kernel.
template <class Exec, class T>
void copy_pieces(const Exec& exec, const char* label, const StridedPiece* table, int n, std::int64_t total,
                 const T* from0, const T* from1, T* to0, T* to1) {
  run(exec, label, total, CopyPiecesKernel<T>{table, n, {from0, from1}, {to0, to1}});
}
/// out[v] = value.
template <class Exec, class T>
void fill_strided(const Exec& exec, const char* label, const T& value, T* out, const StridedView& v) {
  run(exec, label, v.count(), FillStridedKernel<T>{out, v, value});
}
/// take on a block of the table (arguments checked by the caller).
template <class Exec, class T, class I>
void take(const Exec& exec, const T* table, std::int64_t outer, std::int64_t n_local, std::int64_t inner,
          std::int64_t row_offset, const I* ids, std::int64_t n_ids, T* out) {
  run(exec, "shardlib::kernels::take", outer * n_ids * inner, TakeKernel<T, I>{table, ids, out, n_local, inner, n_ids, row_offset});
}
/// index_add into a block (arguments checked by the caller).
template <class Exec, class T, class I>
void index_add(const Exec& exec, T* out, std::int64_t outer, std::int64_t n_local, std::int64_t inner,
               std::int64_t row_offset, const I* ids, std::int64_t n_ids, const T* values) {
  if (n_local == 0 || n_ids == 0) return;
  run(exec, "shardlib::kernels::index_add", outer * inner, IndexAddKernel<T, I>{out, ids, values, n_local, inner, n_ids, row_offset});
}
/// The position and value of the first id outside [0, extent), or position n_ids: one reduction,
/// which the host waits for (the ids may be in device memory). Position n_ids (no bad id) in
/// shape-only mode.
template <class Exec, class I>
Kokkos::ValLocScalar<std::int64_t, std::int64_t> first_bad_id(const Exec& exec, const I* ids, std::int64_t n_ids,
                                                             std::int64_t extent) {
  Kokkos::ValLocScalar<std::int64_t, std::int64_t> first{n_ids, 0};
  if (shardlib::shape_only()) return first;
  if (n_ids > 0)
    Kokkos::parallel_reduce("shardlib::kernels::check_ids", Kokkos::RangePolicy<Exec>(exec, 0, n_ids),
                            FirstBadIdKernel<I>{ids, extent}, Kokkos::MinLoc<std::int64_t, std::int64_t>(first));
  if (first.val > n_ids) first.val = n_ids;  // MinLoc's identity when nothing was folded in
  return first;
}

}  // namespace portable

template <class Exec, class T>
void strided_copy_host(const Exec& exec, const char* label, const T* in, T* out, const StridedView& view);

/// out (row-major, v's extents) = the elements of `in` that `v` addresses; then fences (on a host
/// instance; on a device one the kernel is queued on its stream).
template <class Exec, class T>
void strided_copy(const Exec& exec, const char* label, const T* in, T* out, const StridedView& view) {
  static_assert(std::is_trivially_copyable_v<T>, "shardlib::kernels: layout kernels copy trivially copyable elements");
  if constexpr (!is_host_exec_v<Exec>) {
    portable::strided_copy(exec, label, in, out, normalise(view));
  } else {
    strided_copy_host(exec, label, in, out, view);
  }
}

/// strided_copy on a host instance (see the file comment), then fences.
template <class Exec, class T>
void strided_copy_host(const Exec& exec, const char* label, const T* in, T* out, const StridedView& view) {
  if (view.count() == 0) {
    kernels::fence(exec);
    return;
  }
  const StridedView v = normalise(view);
  const int r = v.rank;
  if (r == 0) {  // one element
    Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, 1), [=](std::int64_t) { out[0] = in[v.offset]; });
  } else if (v.stride[r - 1] == 1) {  // output rows are contiguous runs of the input
    const std::int64_t run = v.extent[r - 1], rows = v.count() / run;
    const std::int64_t chunks = (run + copy_chunk - 1) / copy_chunk;
    Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, rows * chunks), [=](std::int64_t item) {
      const std::int64_t row = item / chunks, c = item % chunks;
      std::int64_t src = v.offset, rest = row;
      for (int d = r - 2; d >= 0; --d) {
        src += (rest % v.extent[d]) * v.stride[d];
        rest /= v.extent[d];
      }
      const std::int64_t start = c * copy_chunk, len = run - start < copy_chunk ? run - start : copy_chunk;
      copy_elements(out + row * run + start, in + src + start, len);
    });
  } else {
    // Output strides (row-major), and p = the input's unit-stride dim if there is one.
    std::int64_t ostride[max_layout_rank];
    ostride[r - 1] = 1;
    for (int d = r - 2; d >= 0; --d) ostride[d] = ostride[d + 1] * v.extent[d + 1];
    int p = -1;
    for (int d = 0; d < r - 1; ++d)
      if (v.stride[d] == 1) p = d;
    const int last = r - 1;
    if (p < 0) {  // no unit stride on the input side (not produced by permute / copy_sub_box)
      const std::int64_t run = v.extent[last], rows = v.count() / run, step = v.stride[last];
      Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, rows), [=](std::int64_t row) {
        std::int64_t src = v.offset, rest = row;
        for (int d = r - 2; d >= 0; --d) {
          src += (rest % v.extent[d]) * v.stride[d];
          rest /= v.extent[d];
        }
        T* dst = out + row * run;
        for (std::int64_t k = 0; k < run; ++k) dst[k] = in[src + k * step];
      });
    } else {  // tiles of (p: contiguous in input) x (last: contiguous in output), over a batch
      struct Tiles {
        int nb;  // batch dims (all but p and last)
        std::int64_t ext[max_layout_rank], istr[max_layout_rank], ostr[max_layout_rank];
        std::int64_t xp, yl, ostr_p, istr_l, tx, ty;
      } t{};
      for (int d = 0; d < last; ++d) {
        if (d == p) continue;
        t.ext[t.nb] = v.extent[d];
        t.istr[t.nb] = v.stride[d];
        t.ostr[t.nb] = ostride[d];
        ++t.nb;
      }
      t.xp = v.extent[p];
      t.yl = v.extent[last];
      t.ostr_p = ostride[p];
      t.istr_l = v.stride[last];
      t.tx = (t.xp + tile - 1) / tile;
      t.ty = (t.yl + tile - 1) / tile;
      const std::int64_t batch = v.count() / (t.xp * t.yl);
      const std::int64_t offset = v.offset;
      Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, batch * t.tx * t.ty), [=](std::int64_t item) {
        const std::int64_t ty_i = item % t.ty, tx_i = (item / t.ty) % t.tx;
        std::int64_t b = item / (t.ty * t.tx), src = offset, dst = 0;
        for (int d = t.nb - 1; d >= 0; --d) {
          const std::int64_t i = b % t.ext[d];
          b /= t.ext[d];
          src += i * t.istr[d];
          dst += i * t.ostr[d];
        }
        const std::int64_t x0 = tx_i * tile, y0 = ty_i * tile;
        const std::int64_t nx = t.xp - x0 < tile ? t.xp - x0 : tile, ny = t.yl - y0 < tile ? t.yl - y0 : tile;
        const T* s = in + src + x0 + y0 * t.istr_l;
        T* o = out + dst + x0 * t.ostr_p + y0;
        for (std::int64_t xs = 0; xs < nx; xs += sub_tile)
          for (std::int64_t ys = 0; ys < ny; ys += sub_tile) {
            const std::int64_t xe = nx - xs < sub_tile ? nx : xs + sub_tile, ye = ny - ys < sub_tile ? ny : ys + sub_tile;
            for (std::int64_t x = xs; x < xe; ++x)
              for (std::int64_t y = ys; y < ye; ++y) o[x * t.ostr_p + y] = s[x + y * t.istr_l];
          }
      });
    }
  }
  kernels::fence(exec);
}

inline void check_rank(const char* kernel, int rank) {
  if (rank < 0 || rank > max_layout_rank)
    throw std::invalid_argument(std::string("shardlib::kernels::") + kernel + ": rank " + std::to_string(rank) +
                                " is outside [0, " + std::to_string(max_layout_rank) + "]");
}

/// Throws std::out_of_range naming the first id outside [0, extent), its position and the
/// extent. Ids in device memory are checked by one reduction on `exec`, which the host waits for.
template <class Exec, class I>
void check_ids(const Exec& exec, const char* kernel, const I* ids, std::int64_t n_ids, std::int64_t extent) {
  std::int64_t m = n_ids, id = 0;
  if constexpr (is_host_exec_v<Exec>) {
    for (std::int64_t k = 0; k < n_ids && m == n_ids; ++k)
      if (std::cmp_less(ids[k], 0) || std::cmp_greater_equal(ids[k], extent)) m = k;
    if (m < n_ids) id = static_cast<std::int64_t>(ids[m]);
  } else {
    const auto first = portable::first_bad_id(exec, ids, n_ids, extent);
    m = first.val;
    id = first.loc;
  }
  if (m < n_ids) {
    const std::string value = std::is_unsigned_v<I> ? std::to_string(static_cast<std::uint64_t>(id)) : std::to_string(id);
    throw std::out_of_range(std::string("shardlib::kernels::") + kernel + ": id " + value + " at position " +
                            std::to_string(m) + " is outside [0, " + std::to_string(extent) + ")");
  }
}

/// The elements of a box of `rank` extents, for counting a kernel before its checks: 0 for a rank
/// outside [0, max_layout_rank] or a negative extent (the kernel throws).
inline std::int64_t box_elements(int rank, const std::int64_t* extent) noexcept {
  if (rank < 0 || rank > max_layout_rank) return 0;
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) {
    if (extent[d] < 0) return 0;
    n *= extent[d];
  }
  return n;
}

/// Counts a layout kernel that reads `read` and writes `written` elements of T (count_kernel),
/// when it writes any.
template <class T>
void count_layout(std::int64_t read, std::int64_t written) noexcept {
  if (written > 0) count_kernel((static_cast<std::uint64_t>(read) + static_cast<std::uint64_t>(written)) * sizeof(T));
}

}  // namespace detail

/// out = in with its dims permuted: out dim k is in dim perm[k] (numpy.transpose's axes), so
/// out's extents are in_extent[perm[k]] and out is row-major in them. `in_extent` and `perm` hold
/// `rank` (0..8) values. An identity (after dropping extent-1 dims) is a contiguous copy; see the
/// file comment for the other paths. `in` and `out` must not overlap. Throws
/// std::invalid_argument for a bad rank, a negative extent, or a perm that is not a permutation.
template <class Exec, class T>
void permute(const Exec& exec, const T* in, T* out, int rank, const std::int64_t* in_extent, const int* perm) {
  const std::int64_t elements = detail::box_elements(rank, in_extent);
  detail::count_layout<T>(elements, elements);
  if (shardlib::shape_only()) return;
  detail::check_rank("permute", rank);
  std::int64_t in_stride[max_layout_rank];
  bool seen[max_layout_rank] = {};
  std::int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (in_extent[d] < 0)
      throw std::invalid_argument("shardlib::kernels::permute: extent " + std::to_string(in_extent[d]) + " of dim " +
                                  std::to_string(d) + " is negative");
    in_stride[d] = s;
    s *= in_extent[d];
  }
  detail::StridedView v;
  v.rank = rank;
  for (int k = 0; k < rank; ++k) {
    const int d = perm[k];
    if (d < 0 || d >= rank || seen[d])
      throw std::invalid_argument("shardlib::kernels::permute: perm[" + std::to_string(k) + "] = " + std::to_string(d) +
                                  (d >= 0 && d < rank ? " repeats a dim" : " is outside [0, " + std::to_string(rank) + ")") +
                                  ": perm must be a permutation of 0.." + std::to_string(rank - 1));
    seen[d] = true;
    v.extent[k] = in_extent[d];
    v.stride[k] = in_stride[d];
  }
  detail::strided_copy(exec, "shardlib::kernels::permute", in, out, v);
}

/// out (row-major, extents `count`) = the box of `in` (row-major, extents `in_extent`) that starts
/// at `start` and spans `count`, per dim (`rank` 0..8 values each); the local work of slice.
/// Throws std::out_of_range, naming the dim, when the box leaves `in`, and std::invalid_argument
/// for a bad rank or a negative extent.
template <class Exec, class T>
void copy_sub_box(const Exec& exec, const T* in, int rank, const std::int64_t* in_extent, const std::int64_t* start,
                  const std::int64_t* count, T* out) {
  const std::int64_t elements = detail::box_elements(rank, count);
  detail::count_layout<T>(elements, elements);
  if (shardlib::shape_only()) return;
  detail::check_rank("copy_sub_box", rank);
  detail::StridedView v;
  v.rank = rank;
  std::int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (in_extent[d] < 0 || count[d] < 0)
      throw std::invalid_argument("shardlib::kernels::copy_sub_box: dim " + std::to_string(d) + " has a negative " +
                                  (in_extent[d] < 0 ? "extent " + std::to_string(in_extent[d])
                                                    : "count " + std::to_string(count[d])));
    if (start[d] < 0 || start[d] > in_extent[d] - count[d])
      throw std::out_of_range("shardlib::kernels::copy_sub_box: dim " + std::to_string(d) + ": [" +
                              std::to_string(start[d]) + ", " + std::to_string(start[d]) + " + " + std::to_string(count[d]) +
                              ") is not inside [0, " + std::to_string(in_extent[d]) + ")");
    v.extent[d] = count[d];
    v.stride[d] = s;
    v.offset += start[d] * s;
    s *= in_extent[d];
  }
  detail::strided_copy(exec, "shardlib::kernels::copy_sub_box", in, out, v);
}

/// numpy.take along a dim (torch.embedding when the dim is 0), on one block of the table:
/// `table` is [outer, n_local, inner] and holds the global rows [row_offset, row_offset + n_local)
/// of a dim of global extent `extent`; ids[0..n_ids) are GLOBAL indices. out is [outer, n_ids,
/// inner]: out[(o * n_ids + m) * inner + i] = table[(o * n_local + ids[m] - row_offset) * inner + i]
/// when ids[m] is in this block, else T(0), so summing the devices' outputs gives the full take
/// (Megatron's vocab-parallel embedding). With `check`, an id outside [0, extent) (negative ids
/// too: no wrap-around) throws std::out_of_range naming the id, its position m and the extent,
/// before anything is written; without it such an id just gives zeros. Throws
/// std::invalid_argument when the block does not lie inside [0, extent).
template <class Exec, class T, class I>
void take(const Exec& exec, const T* table, std::int64_t outer, std::int64_t n_local, std::int64_t inner,
          std::int64_t row_offset, std::int64_t extent, const I* ids, std::int64_t n_ids, T* out, bool check) {
  static_assert(std::is_integral_v<I> && !std::is_same_v<I, bool>, "shardlib::kernels::take: ids must be integers");
  static_assert(std::is_trivially_copyable_v<T>, "shardlib::kernels::take: elements must be trivially copyable");
  if (outer > 0 && n_ids > 0 && inner > 0 && n_local >= 0) {
    // out written; the ids read; table elements read: one per output element, at most the block
    const std::int64_t written = outer * n_ids * inner, block = outer * n_local * inner;
    const std::int64_t read = block < written ? block : written;
    count_kernel(static_cast<std::uint64_t>(written + read) * sizeof(T) +
                 static_cast<std::uint64_t>(n_ids) * sizeof(I));
  }
  if (shardlib::shape_only()) return;
  if (outer < 0 || n_local < 0 || inner < 0 || n_ids < 0)
    throw std::invalid_argument("shardlib::kernels::take: negative extent in outer = " + std::to_string(outer) +
                                ", n_local = " + std::to_string(n_local) + ", inner = " + std::to_string(inner) +
                                ", n_ids = " + std::to_string(n_ids));
  if (row_offset < 0 || n_local > extent - row_offset)
    throw std::invalid_argument("shardlib::kernels::take: the block [" + std::to_string(row_offset) + ", " +
                                std::to_string(row_offset) + " + " + std::to_string(n_local) +
                                ") does not lie inside the dim [0, " + std::to_string(extent) + ")");
  if (check) detail::check_ids(exec, "take", ids, n_ids, extent);
  if constexpr (!is_host_exec_v<Exec>) {
    detail::portable::take(exec, table, outer, n_local, inner, row_offset, ids, n_ids, out);
  } else {
    const std::int64_t chunks = (inner + detail::copy_chunk - 1) / detail::copy_chunk;
    if (outer != 0 && n_ids != 0 && chunks != 0) {
      const std::int64_t hi = row_offset + n_local;
      Kokkos::parallel_for("shardlib::kernels::take", Kokkos::RangePolicy<Exec>(exec, 0, outer * n_ids * chunks),
                           [=](std::int64_t item) {
                             const std::int64_t c = item % chunks, om = item / chunks;  // om = o * n_ids + m
                             const std::int64_t o = om / n_ids;
                             const I id = ids[om % n_ids];
                             const std::int64_t start = c * detail::copy_chunk;
                             const std::int64_t len = inner - start < detail::copy_chunk ? inner - start : detail::copy_chunk;
                             T* dst = out + om * inner + start;
                             if (std::cmp_greater_equal(id, row_offset) && std::cmp_less(id, hi)) {
                               const std::int64_t j = static_cast<std::int64_t>(id) - row_offset;
                               detail::copy_elements(dst, table + (o * n_local + j) * inner + start, len);
                             } else {
                               for (std::int64_t k = 0; k < len; ++k) dst[k] = T(0);
                             }
                           });
    }
    kernels::fence(exec);
  }
}

/// The transpose of take: `out` (the block [outer, n_local, inner] of a tensor whose dim of
/// `extent` rows starts at `row_offset` in this block) gets `values` ([outer, n_ids, inner]) added
/// at the rows `ids` names; ids outside the block are skipped (another device holds them), ids
/// outside [0, extent) throw std::out_of_range when `check`. Repeated ids add up (each output
/// element is owned by one work item, which walks the ids in order: deterministic).
template <class Exec, class T, class I>
void index_add(const Exec& exec, T* out, std::int64_t outer, std::int64_t n_local, std::int64_t inner,
               std::int64_t row_offset, std::int64_t extent, const I* ids, std::int64_t n_ids, const T* values,
               bool check) {
  static_assert(std::is_integral_v<I> && !std::is_same_v<I, bool>, "shardlib::kernels::index_add: ids must be integers");
  if (outer > 0 && inner > 0 && n_ids > 0 && n_local > 0) {
    // the ids read; the values of ids in the block read (at most all); out's rows they hit read and written (at
    // most one per id, at most the block)
    const std::int64_t read = outer * n_ids * inner, hit = outer * (n_local < n_ids ? n_local : n_ids) * inner;
    count_kernel(static_cast<std::uint64_t>(read + 2 * hit) * sizeof(T) +
                 static_cast<std::uint64_t>(n_ids) * sizeof(I));
  }
  if (shardlib::shape_only()) return;
  if (check) detail::check_ids(exec, "index_add", ids, n_ids, extent);
  if constexpr (!is_host_exec_v<Exec>) {
    detail::portable::index_add(exec, out, outer, n_local, inner, row_offset, ids, n_ids, values);
  } else {
    if (outer == 0 || inner == 0 || n_ids == 0 || n_local == 0) return;
    // A work item per run of index_add_chunk columns of an outer slice: it walks the ids in order
    // and adds each value row's run to its output row's, contiguous both. (An item per column,
    // the device form, strode a row apart at every id: 1.6 ms a call for the embedding gradient of
    // benchmarks/run train's GPT, [2048, 256] floats into [512, 256], where this takes 0.08.)
    const std::int64_t hi = row_offset + n_local, runs = (inner + detail::index_add_chunk - 1) / detail::index_add_chunk;
    Kokkos::parallel_for("shardlib::kernels::index_add", Kokkos::RangePolicy<Exec>(exec, 0, outer * runs),
                         [=](std::int64_t item) {
                           const std::int64_t o = item / runs, start = item % runs * detail::index_add_chunk;
                           const std::int64_t len =
                               inner - start < detail::index_add_chunk ? inner - start : detail::index_add_chunk;
                           T* rows = out + o * n_local * inner + start;
                           const T* from = values + o * n_ids * inner + start;
                           for (std::int64_t m = 0; m < n_ids; ++m) {
                             const I id = ids[m];
                             if (std::cmp_greater_equal(id, row_offset) && std::cmp_less(id, hi))
                               detail::add_elements(rows + (static_cast<std::int64_t>(id) - row_offset) * inner,
                                                    from + m * inner, len);
                           }
                         });
    kernels::fence(exec);
  }
}

namespace detail {
/// copy_strided's checks and copy, not counted (copy_strided counts it; fill_strided copies from
/// its value with it on a host instance).
template <class Exec, class T>
void copy_strided_run(const Exec& exec, const char* label, const T* in, const StridedView& in_view, T* out,
                      const StridedView& out_view) {
  static_assert(std::is_trivially_copyable_v<T>, "shardlib::kernels: layout kernels copy trivially copyable elements");
  detail::check_rank("copy_strided", in_view.rank);
  if (in_view.rank != out_view.rank)
    throw std::invalid_argument("shardlib::kernels::copy_strided: views of rank " + std::to_string(in_view.rank) + " and " +
                                std::to_string(out_view.rank));
  for (int d = 0; d < in_view.rank; ++d)
    if (in_view.extent[d] != out_view.extent[d] || in_view.extent[d] < 0)
      throw std::invalid_argument("shardlib::kernels::copy_strided: extent " + std::to_string(in_view.extent[d]) +
                                  " against " + std::to_string(out_view.extent[d]) + " on dim " + std::to_string(d));
  if (in_view.count() == 0) return;
  if constexpr (!is_host_exec_v<Exec>) {
    detail::portable::copy_strided(exec, label, in, in_view, out, out_view);
  } else {
    const int r = in_view.rank;
    detail::StridedView a = in_view, b = out_view;
    // Rows along the last dim, or along the innermost long one when the last is short (a box one
    // cell thin in the last dim would have rows of one element).
    if (r > 1 && a.extent[r - 1] < 16) {
      int k = r - 1;
      while (k > 0 && a.extent[k] < 16 && a.extent[k - 1] > a.extent[k]) --k;
      std::swap(a.extent[k], a.extent[r - 1]);
      std::swap(a.stride[k], a.stride[r - 1]);
      std::swap(b.extent[k], b.extent[r - 1]);
      std::swap(b.stride[k], b.stride[r - 1]);
    }
    const std::int64_t run = r == 0 ? 1 : a.extent[r - 1], rows = a.count() / run;
    const std::int64_t sa = r == 0 ? 0 : a.stride[r - 1], sb = r == 0 ? 0 : b.stride[r - 1];
    Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, rows), [=](std::int64_t row) {
      std::int64_t ia = a.offset, ib = b.offset, rest = row;
      for (int d = r - 2; d >= 0; --d) {
        const std::int64_t i = rest % a.extent[d];
        rest /= a.extent[d];
        ia += i * a.stride[d];
        ib += i * b.stride[d];
      }
      if (sa == 1 && sb == 1) {
        detail::copy_elements(out + ib, in + ia, run);
      } else {
        for (std::int64_t k = 0; k < run; ++k) out[ib + k * sb] = in[ia + k * sa];
      }
    });
    kernels::fence(exec);
  }
}
}  // namespace detail

/// out[out_view] = in[in_view], element by element in row-major order of their common extents:
/// both sides strided (strides may be negative or zero on the input side: a mirror image, a
/// repeated element), so a box of one array lands in a box of another with no packing. The two
/// views must have the same rank and extents (std::invalid_argument otherwise) and must not
/// overlap. One row (the last dim) per work item; rows contiguous on both sides are memcpys.
/// Fences before returning.
template <class Exec, class T>
void copy_strided(const Exec& exec, const char* label, const T* in, const detail::StridedView& in_view, T* out,
                  const detail::StridedView& out_view) {
  const std::int64_t elements = detail::box_elements(in_view.rank, in_view.extent);
  detail::count_layout<T>(elements, elements);
  if (shardlib::shape_only()) return;
  detail::copy_strided_run(exec, label, in, in_view, out, out_view);
}

/// Several copy_strided copies as one batch: piece i copies view `in` of `from[piece.from]` to view
/// `out` of `to[piece.to]`. `pieces` is the table on the host, `table` the same table in the memory
/// `exec` runs in (the same pointer on a host instance); the caller keeps both, so that a batch
/// it repeats (a ghost exchange's packing) allocates nothing. On a device instance the batch is
/// one kernel, a thread per element (one launch however many pieces: the pieces of a ghost
/// exchange are small, and their launches cost more than their copies), queued on its stream; on
/// a host instance each piece is copy_strided's rows, then a fence. Throws std::invalid_argument,
/// before anything is written, for a piece whose views differ in rank or extents, or a `first`
/// that is not the elements of the pieces before it.
template <class Exec, class T>
void copy_pieces(const Exec& exec, const char* label, std::span<const detail::StridedPiece> pieces,
                 const detail::StridedPiece* table, const T* from0, const T* from1, T* to0, T* to1) {
  static_assert(std::is_trivially_copyable_v<T>, "shardlib::kernels: layout kernels copy trivially copyable elements");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const detail::StridedPiece& p = pieces[i];
    detail::check_rank("copy_pieces", p.in.rank);
    bool same = p.in.rank == p.out.rank && p.from >= 0 && p.from <= 1 && p.to >= 0 && p.to <= 1;
    for (int d = 0; same && d < p.in.rank; ++d) same = p.in.extent[d] == p.out.extent[d] && p.in.extent[d] >= 0;
    if (!same)
      throw std::invalid_argument("shardlib::kernels::copy_pieces: piece " + std::to_string(i) +
                                  " has views of different ranks or extents, or a buffer other than 0 or 1");
    if (p.first != total)
      throw std::invalid_argument("shardlib::kernels::copy_pieces: piece " + std::to_string(i) + " starts at element " +
                                  std::to_string(p.first) + " of the batch, after " + std::to_string(total) + " elements");
    total += p.in.count();
  }
  detail::count_layout<T>(total, total);
  if (shardlib::shape_only() || total == 0) return;
  if constexpr (!is_host_exec_v<Exec>) {
    detail::portable::copy_pieces(exec, label, table, static_cast<int>(pieces.size()), total, from0, from1, to0, to1);
  } else {
    (void)table;
    const T* from[2] = {from0, from1};
    T* to[2] = {to0, to1};
    for (const detail::StridedPiece& p : pieces) detail::copy_strided_run(exec, label, from[p.from], p.in, to[p.to], p.out);
  }
}

/// out[out_view] = value: a box of a row-major array (a constant boundary, a shift's vacated
/// cells). On a host instance, copy_strided from the value (stride 0) and a fence; on a device
/// instance, one thread per element, the value carried in the kernel.
template <class Exec, class T>
void fill_strided(const Exec& exec, const char* label, const T& value, T* out, const detail::StridedView& out_view) {
  detail::count_layout<T>(0, detail::box_elements(out_view.rank, out_view.extent));
  if (shardlib::shape_only()) return;
  detail::check_rank("fill_strided", out_view.rank);
  if constexpr (!is_host_exec_v<Exec>) {
    detail::portable::fill_strided(exec, label, value, out, out_view);
  } else {
    detail::StridedView in = out_view;
    in.offset = 0;
    for (int d = 0; d < in.rank; ++d) in.stride[d] = 0;
    detail::copy_strided_run(exec, label, &value, in, out, out_view);  // (counted above, not again)
  }
}

}  // namespace shardlib::kernels
