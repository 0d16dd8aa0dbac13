// SPDX-License-Identifier: Apache-2.0
/// @file
/// Copying one strided N-D region into another of the same count (shapes may differ), for
/// `exchange`: the threads backend copies peer to peer with it, the mpi backend packs and unpacks.
///
/// Both regions are walked in row-major order, one innermost line at a time, after dropping
/// extent-1 dimensions and merging neighbours that are contiguous (stride[k] == extent[k+1] *
/// stride[k+1]). Stretches that are contiguous on both sides go in one memcpy, so a contiguous
/// region or a run of full matrix rows is one memcpy; other stretches are an element loop.
///
/// `plan_region_copy` describes the same copy as rectangles (`Copy2D`, what cudaMemcpy2DAsync
/// takes), for backends whose buffers are in GPU memory: a box of rows is one rectangle.
#pragma once

#include <shardlib/collectives/communicator.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <vector>

namespace shardlib::coll::detail {

/// The same elements in the same order with the fewest dimensions: extent-1 dimensions dropped,
/// contiguous neighbours merged. A non-empty region keeps rank >= 1; an empty one becomes rank 0.
constexpr Region normalise(const Region& r) noexcept {
  Region out;
  out.offset = r.offset;
  if (r.count() == 0) return out;
  int m = 0;
  for (int k = 0; k < r.rank && k < max_region_rank; ++k) {
    const auto ku = static_cast<std::size_t>(k);
    if (r.extent[ku] == 1) continue;
    const auto last = static_cast<std::size_t>(m - 1);
    if (m > 0 && out.stride[last] == r.extent[ku] * r.stride[ku]) {
      out.extent[last] *= r.extent[ku];
      out.stride[last] = r.stride[ku];
    } else {
      out.extent[static_cast<std::size_t>(m)] = r.extent[ku];
      out.stride[static_cast<std::size_t>(m)] = r.stride[ku];
      ++m;
    }
  }
  if (m == 0) {  // a single element
    out.extent[0] = 1;
    out.stride[0] = 1;
    m = 1;
  }
  out.rank = m;
  return out;
}

/// Walks a normalised non-empty region one innermost line at a time (element offsets).
class RegionCursor {
 public:
  explicit constexpr RegionCursor(const Region& normalised) noexcept
      : r_(normalised), inner_(static_cast<std::size_t>(normalised.rank - 1)), line_(normalised.offset) {}

  /// Elements left in the current line.
  constexpr std::size_t left() const noexcept { return r_.extent[inner_] - pos_; }
  /// Element offset of the current element, and the step to the next one in this line.
  constexpr std::size_t at() const noexcept { return line_ + pos_ * r_.stride[inner_]; }
  constexpr std::size_t step() const noexcept { return r_.stride[inner_]; }
  /// Moves `n` <= left() elements on (to the next line's start when this one ends).
  constexpr void advance(std::size_t n) noexcept {
    pos_ += n;
    if (pos_ < r_.extent[inner_]) return;
    pos_ = 0;
    for (std::size_t k = inner_; k-- > 0;) {  // odometer over the outer dimensions
      line_ += r_.stride[k];
      if (++idx_[k] < r_.extent[k]) return;
      line_ -= r_.extent[k] * r_.stride[k];  // unsigned wrap-around is exact here
      idx_[k] = 0;
    }
  }

 private:
  Region r_;
  std::size_t inner_;
  std::size_t line_;  // element offset of the current line's first element
  std::size_t pos_ = 0;
  std::array<std::size_t, max_region_rank> idx_{};
};

/// `n` elements of E bytes (E == 0: `e` bytes), `ds` / `ss` elements apart.
template <std::size_t E>
inline void copy_strided(unsigned char* d, std::size_t ds, const unsigned char* s, std::size_t ss, std::size_t n,
                         std::size_t e) noexcept {
  const std::size_t size = E != 0 ? E : e;
  if (ds == 1 && ss == 1) {
    std::memcpy(d, s, n * size);
    return;
  }
  const std::size_t db = ds * size, sb = ss * size;
  for (std::size_t i = 0; i < n; ++i, d += db, s += sb) std::memcpy(d, s, size);  // fixed size: one move
}

template <std::size_t E>
inline void copy_region_as(unsigned char* dst, const Region& dr, const unsigned char* src, const Region& sr,
                           std::size_t n, std::size_t e) noexcept {
  RegionCursor d(normalise(dr)), s(normalise(sr));
  while (n != 0) {
    const std::size_t k = std::min({n, d.left(), s.left()});
    copy_strided<E>(dst + d.at() * e, d.step(), src + s.at() * e, s.step(), k, e);
    d.advance(k);
    s.advance(k);
    n -= k;
  }
}

/// Copies the elements of `src_region` in `src` into `dst_region` in `dst`, pairing them in
/// row-major order; elements have `elem_size` bytes. The counts should agree (callers check);
/// otherwise only the first min(counts) elements move. The regions must not overlap.
inline void copy_region(void* dst, const Region& dst_region, const void* src, const Region& src_region,
                        std::size_t elem_size) noexcept {
  const std::size_t n = std::min(dst_region.count(), src_region.count());
  if (n == 0) return;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  switch (elem_size) {
    case 1: copy_region_as<1>(d, dst_region, s, src_region, n, 1); break;
    case 2: copy_region_as<2>(d, dst_region, s, src_region, n, 2); break;
    case 4: copy_region_as<4>(d, dst_region, s, src_region, n, 4); break;
    case 8: copy_region_as<8>(d, dst_region, s, src_region, n, 8); break;
    default: copy_region_as<0>(d, dst_region, s, src_region, n, elem_size); break;
  }
}

/// `height` rows of `width` bytes: row i goes from byte `src_offset + i * src_pitch` of the source
/// to byte `dst_offset + i * dst_pitch` of the destination (cudaMemcpy2DAsync's arguments; both
/// pitches are at least `width` when height > 1).
struct Copy2D {
  std::size_t dst_offset = 0;
  std::size_t dst_pitch = 0;
  std::size_t src_offset = 0;
  std::size_t src_pitch = 0;
  std::size_t width = 0;
  std::size_t height = 0;
};

/// Appends to `out` the rectangles that copy_region(dst, dst_region, src, src_region, elem_size)
/// moves, in row-major order of the elements: contiguous runs become rows, and rows (or single
/// elements) that follow at a fixed step on both sides merge into one rectangle. A box of rows,
/// a column, or a whole contiguous region is one rectangle.
inline void plan_region_copy(std::vector<Copy2D>& out, const Region& dst_region, const Region& src_region,
                             std::size_t elem_size) {
  std::size_t n = std::min(dst_region.count(), src_region.count());
  if (n == 0 || elem_size == 0) return;
  const std::size_t e = elem_size;
  bool open = false;  // whether out.back() was started by this call (and may grow)
  // Adds `h` rows of `w` bytes, `dp` / `sp` bytes apart (pitches >= w when h > 1), merging them into
  // the open rectangle when they continue its steps.
  auto rect = [&](std::size_t d, std::size_t dp, std::size_t s, std::size_t sp, std::size_t w, std::size_t h) {
    if (open && out.back().width == w) {
      Copy2D& c = out.back();
      if (c.height == 1 && d >= c.dst_offset + w && s >= c.src_offset + w &&
          (h == 1 || (dp == d - c.dst_offset && sp == s - c.src_offset))) {
        c.dst_pitch = d - c.dst_offset;
        c.src_pitch = s - c.src_offset;
        c.height = 1 + h;
        return;
      }
      if (c.height > 1 && d == c.dst_offset + c.height * c.dst_pitch && s == c.src_offset + c.height * c.src_pitch &&
          (h == 1 || (dp == c.dst_pitch && sp == c.src_pitch))) {
        c.height += h;
        return;
      }
    }
    out.push_back(h == 1 ? Copy2D{d, w, s, w, w, 1} : Copy2D{d, dp, s, sp, w, h});
    open = true;
  };
  RegionCursor dc(normalise(dst_region)), sc(normalise(src_region));
  while (n != 0) {
    const std::size_t k = std::min({n, dc.left(), sc.left()});
    if (dc.step() == 1 && sc.step() == 1) {
      rect(dc.at() * e, 0, sc.at() * e, 0, k * e, 1);
    } else if (dc.step() != 0 && sc.step() != 0) {  // k single elements at fixed steps
      rect(dc.at() * e, dc.step() * e, sc.at() * e, sc.step() * e, e, k);
    } else {  // a step of 0 (one element read or written again): rows would overlap
      for (std::size_t i = 0; i < k; ++i) rect((dc.at() + i * dc.step()) * e, 0, (sc.at() + i * sc.step()) * e, 0, e, 1);
    }
    dc.advance(k);
    sc.advance(k);
    n -= k;
  }
}

}  // namespace shardlib::coll::detail
