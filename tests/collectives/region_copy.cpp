// SPDX-License-Identifier: Apache-2.0
// detail::copy_region, the strided copy under exchange: checked against a plain element loop
// for every element size, for mismatched shapes of equal count, and for random boxes; and
// detail::plan_region_copy (the same copy as cudaMemcpy2DAsync rectangles), carried out here
// row by row as cudaMemcpy2D defines it.
#include <doctest/doctest.h>
#include <shardlib/collectives/detail/region_copy.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace coll = shardlib::coll;
using coll::Region;

namespace {

constexpr auto box = coll::Region::strided;

/// Element offsets of a region in row-major order (the definition, one element at a time).
std::vector<std::size_t> offsets(const Region& r) {
  std::vector<std::size_t> out;
  if (r.count() == 0) return out;
  std::vector<std::size_t> idx(static_cast<std::size_t>(r.rank), 0);
  for (std::size_t n = 0; n < r.count(); ++n) {
    std::size_t off = r.offset;
    for (std::size_t k = 0; k < idx.size(); ++k) off += idx[k] * r.stride[k];
    out.push_back(off);
    for (std::size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < r.extent[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

/// Carries out plan_region_copy's rectangles as cudaMemcpy2D does, checking their pitches.
void copy_by_plan(void* dst, const Region& dr, const void* src, const Region& sr, std::size_t e) {
  std::vector<coll::detail::Copy2D> plan;
  coll::detail::plan_region_copy(plan, dr, sr, e);
  for (const auto& c : plan) {
    REQUIRE(c.height >= 1);
    if (c.height > 1) REQUIRE((c.dst_pitch >= c.width && c.src_pitch >= c.width));
    for (std::size_t i = 0; i < c.height; ++i)
      std::memcpy(static_cast<char*>(dst) + c.dst_offset + i * c.dst_pitch,
                  static_cast<const char*>(src) + c.src_offset + i * c.src_pitch, c.width);
  }
}

/// The number of rectangles plan_region_copy makes.
std::size_t rectangles(const Region& dr, const Region& sr, std::size_t e = 4) {
  std::vector<coll::detail::Copy2D> plan;
  coll::detail::plan_region_copy(plan, dr, sr, e);
  return plan.size();
}

/// Copies with copy_region (and with its plan of rectangles) and with the element loop, on T
/// elements; "" when they agree.
template <class T>
std::string compare(const Region& dst, std::size_t dst_size, const Region& src, std::size_t src_size) {
  std::vector<T> s(src_size), want(dst_size), got(dst_size);
  for (std::size_t i = 0; i < src_size; ++i) s[i] = static_cast<T>(i * 37 + 11);
  for (std::size_t i = 0; i < dst_size; ++i) want[i] = got[i] = static_cast<T>(-1);
  const auto so = offsets(src), dos = offsets(dst);
  if (so.size() != dos.size()) return "counts differ";
  for (std::size_t i = 0; i < so.size(); ++i) want[dos[i]] = s[so[i]];
  coll::detail::copy_region(got.data(), dst, s.data(), src, sizeof(T));
  for (std::size_t i = 0; i < dst_size; ++i)
    if (got[i] != want[i]) return "element " + std::to_string(i) + " (size " + std::to_string(sizeof(T)) + ")";
  std::fill(got.begin(), got.end(), static_cast<T>(-1));
  copy_by_plan(got.data(), dst, s.data(), src, sizeof(T));
  for (std::size_t i = 0; i < dst_size; ++i)
    if (got[i] != want[i])
      return "element " + std::to_string(i) + " by the plan of rectangles (size " + std::to_string(sizeof(T)) + ")";
  return "";
}

/// Every element size the collectives use.
std::string compare_all(const Region& dst, std::size_t dst_size, const Region& src, std::size_t src_size) {
  for (const std::string& e : {compare<std::uint8_t>(dst, dst_size, src, src_size),
                               compare<std::uint16_t>(dst, dst_size, src, src_size),
                               compare<std::uint32_t>(dst, dst_size, src, src_size),
                               compare<std::uint64_t>(dst, dst_size, src, src_size)})
    if (!e.empty()) return e;
  return "";
}

/// One past the largest element offset of a region (0 when empty).
std::size_t span_of(const Region& r) {
  std::size_t end = 0;
  for (auto o : offsets(r)) end = std::max(end, o + 1);
  return end;
}

}  // namespace

TEST_SUITE("collectives") {
  TEST_CASE("region_copy: count and contiguous") {
    CHECK(Region{}.count() == 0);
    CHECK(Region::contiguous(5, 7).count() == 7);
    CHECK(box(0, {3, 0, 2}, {1, 1, 1}).count() == 0);
    CHECK(box(0, {3, 4, 2}, {100, 10, 1}).count() == 24);
    constexpr Region c = Region::contiguous(3, 4);
    static_assert(c.rank == 1 && c.offset == 3 && c.extent[0] == 4 && c.stride[0] == 1 && c.count() == 4);
  }

  TEST_CASE("region_copy: contiguous dimensions merge, so contiguous stretches are one memcpy") {
    using coll::detail::normalise;
    // A whole 3x4 matrix: one line of 12.
    Region n = normalise(box(2, {3, 4}, {4, 1}));
    CHECK(n.rank == 1);
    CHECK(n.offset == 2);
    CHECK(n.extent[0] == 12);
    CHECK(n.stride[0] == 1);
    // Rows of a wider matrix stay lines of 4.
    n = normalise(box(0, {3, 4}, {10, 1}));
    CHECK(n.rank == 2);
    CHECK(n.extent[0] == 3);
    CHECK(n.extent[1] == 4);
    // Extent-1 dimensions drop out; a 2x1x3 block of full rows of a 5x3 matrix merges.
    n = normalise(box(0, {1, 2, 1, 3}, {99, 3, 7, 1}));
    CHECK(n.rank == 1);
    CHECK(n.extent[0] == 6);
    // A column stays strided.
    n = normalise(box(1, {5, 1}, {8, 1}));
    CHECK(n.rank == 1);
    CHECK(n.stride[0] == 8);
    // A single element and an empty region.
    n = normalise(box(9, {1, 1}, {4, 1}));
    CHECK(n.rank == 1);
    CHECK(n.extent[0] == 1);
    CHECK(normalise(box(0, {2, 0}, {1, 1})).rank == 0);
    CHECK(normalise(Region{}).rank == 0);
  }

  TEST_CASE("region_copy: same shapes, every element size") {
    CHECK(compare_all(Region::contiguous(3, 10), 16, Region::contiguous(0, 10), 10) == "");
    CHECK(compare_all(box(1, {3, 4}, {10, 1}), 40, box(5, {3, 4}, {7, 1}), 30) == "");
    CHECK(compare_all(box(0, {4, 3}, {1, 4}), 12, box(0, {4, 3}, {3, 1}), 12) == "");  // transpose
  }

  TEST_CASE("region_copy: different shapes of equal count") {
    // A 3x4 box with stride 10 into a contiguous run of 12, and back.
    CHECK(compare_all(Region::contiguous(2, 12), 14, box(3, {3, 4}, {10, 1}), 40) == "");
    CHECK(compare_all(box(3, {3, 4}, {10, 1}), 40, Region::contiguous(2, 12), 14) == "");
    // 12 contiguous into a 2x6 strided box (inner stride 2), and the reverse.
    CHECK(compare_all(box(1, {2, 6}, {15, 2}), 30, Region::contiguous(0, 12), 12) == "");
    CHECK(compare_all(Region::contiguous(0, 12), 12, box(1, {2, 6}, {15, 2}), 30) == "");
    // 3x4 strided into 2x6 strided, and a 2x2x3 box into 4x3.
    CHECK(compare_all(box(0, {2, 6}, {8, 1}), 16, box(3, {3, 4}, {10, 1}), 40) == "");
    CHECK(compare_all(box(0, {4, 3}, {1, 5}), 15, box(0, {2, 2, 3}, {20, 6, 2}), 40) == "");
  }

  TEST_CASE("region_copy: empty regions and repeated reads") {
    std::vector<int> dst(4, -1), src = {1, 2, 3, 4};
    coll::detail::copy_region(dst.data(), Region{}, src.data(), Region{}, sizeof(int));
    coll::detail::copy_region(dst.data(), box(0, {2, 0}, {2, 1}), src.data(), box(0, {0}, {1}), sizeof(int));
    CHECK(dst == std::vector<int>(4, -1));
    // Stride 0 on the source reads one element again and again.
    CHECK(compare_all(box(0, {2, 3}, {3, 1}), 6, box(2, {6}, {0}), 3) == "");
  }

  TEST_CASE("region_copy: a plan of rectangles has one for a box of rows, a column or a contiguous run") {
    CHECK(rectangles(Region::contiguous(3, 10), Region::contiguous(0, 10)) == 1);
    CHECK(rectangles(box(1, {3, 4}, {10, 1}), box(5, {3, 4}, {7, 1})) == 1);      // rows into rows
    CHECK(rectangles(Region::contiguous(2, 12), box(3, {3, 4}, {10, 1})) == 1);  // rows packed
    CHECK(rectangles(box(1, {5, 1}, {8, 1}), Region::contiguous(0, 5)) == 1);    // a column
    CHECK(rectangles(box(0, {2, 3, 4}, {30, 10, 1}), Region::contiguous(0, 24)) == 1);  // two planes, rows evenly spaced
    CHECK(rectangles(box(0, {2, 3, 4}, {50, 10, 1}), Region::contiguous(0, 24)) == 2);  // a gap between the planes
    CHECK(rectangles(box(0, {4, 3}, {1, 4}), Region::contiguous(0, 12)) == 4);  // a transpose: one per row of the box
    CHECK(rectangles(Region{}, Region{}) == 0);
    // The plan's offsets and pitches are in bytes.
    std::vector<coll::detail::Copy2D> plan;
    coll::detail::plan_region_copy(plan, Region::contiguous(2, 12), box(3, {3, 4}, {10, 1}), 8);
    REQUIRE(plan.size() == 1);
    CHECK(plan[0].dst_offset == 16);
    CHECK(plan[0].dst_pitch == 32);
    CHECK(plan[0].src_offset == 24);
    CHECK(plan[0].src_pitch == 80);
    CHECK(plan[0].width == 32);
    CHECK(plan[0].height == 3);
  }

  TEST_CASE("region_copy: random boxes of up to 8 dimensions against the element loop") {
    std::mt19937 rng(12345);
    auto pick = [&](std::size_t lo, std::size_t hi) { return std::uniform_int_distribution<std::size_t>(lo, hi)(rng); };
    // A random box of `count` elements: factors of count as extents (with extent-1 dimensions),
    // strides that are now contiguous, now padded, now shuffled.
    auto random_box = [&](std::size_t count) {
      Region r;
      r.rank = static_cast<int>(pick(1, 8));
      std::size_t left = count;
      for (int k = 0; k < r.rank; ++k) {
        std::size_t e = 1;
        if (k == r.rank - 1) {
          e = left;
        } else {
          std::vector<std::size_t> divs;
          for (std::size_t d = 1; d <= left; ++d)
            if (left % d == 0) divs.push_back(d);
          e = divs[pick(0, divs.size() - 1)];
        }
        r.extent[static_cast<std::size_t>(k)] = e;
        left /= e;
      }
      std::size_t s = pick(1, 3);  // innermost stride
      for (int k = r.rank; k-- > 0;) {
        r.stride[static_cast<std::size_t>(k)] = s;
        s = s * r.extent[static_cast<std::size_t>(k)] + (pick(0, 2) == 0 ? pick(1, 3) : 0);
      }
      if (pick(0, 2) == 0)  // now and then visit the same elements in another order (a transpose)
        std::shuffle(r.stride.begin(), r.stride.begin() + r.rank, rng);
      r.offset = pick(0, 5);
      return r;
    };
    for (int trial = 0; trial < 300; ++trial) {
      const std::size_t count = pick(1, 48);
      const Region a = random_box(count), b = random_box(count);
      INFO("trial " << trial << ", count " << count);
      CHECK(compare_all(a, span_of(a), b, span_of(b)) == "");
    }
  }
}
