// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <shardlib/sharding/block.hpp>

#include "../string_makers.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace sl = shardlib;
using sl::none;
using Shape = std::vector<std::int64_t>;

namespace {
// A box as text, from its fields alone: the oracle comparisons below use it rather than the
// operator== under test (printed so by doctest too: string_makers.hpp).
std::string text(const sl::ShardBox& b) { return sl::test::box_text(b); }
}  // namespace

namespace {
// ---- Compile-time examples: the rules run in constant evaluation. ----------------------------
constexpr std::array<std::int64_t, 4> sizes_of(std::int64_t extent) {
  std::array<std::int64_t, 4> s{};
  for (int i = 0; i < 4; ++i) s[static_cast<std::size_t>(i)] = sl::block_of(extent, 4, i).size;
  return s;
}
static_assert(sizes_of(10) == std::array<std::int64_t, 4>{3, 3, 3, 1});
static_assert(sizes_of(2) == std::array<std::int64_t, 4>{1, 1, 0, 0});
static_assert(sizes_of(0) == std::array<std::int64_t, 4>{0, 0, 0, 0});
static_assert(sizes_of(8) == std::array<std::int64_t, 4>{2, 2, 2, 2});
static_assert(sizes_of(5) == std::array<std::int64_t, 4>{2, 2, 1, 0});  // torch.chunk(5, 4): 2, 2, 1
static_assert(sl::block_of(10, 4, 3) == sl::BlockRange{9, 1});
static_assert(sl::block_of(2, 4, 3) == sl::BlockRange{2, 0});  // empty parts sit at the end
static_assert(sl::block_of(7, 1, 0) == sl::BlockRange{0, 7});
// No overflow near the top of the range.
constexpr std::int64_t big = 0x7fffffffffffffff;
static_assert(sl::block_of(big, 2, 1) == sl::BlockRange{big / 2 + 1, big / 2});
static_assert(sl::block_of(big, 3, 2).offset + sl::block_of(big, 3, 2).size == big);

using M = sl::Mesh<"data", "model">;
constexpr sl::MeshShape mesh42(M::axis_names, std::array<int, 2>{4, 2});
// Dim 0 over data (major) then model: 8 parts, device (data, model) holds part 2 * data + model.
constexpr sl::Sharding both = sl::sharding_v<M, sl::Spec<sl::axes<"data", "model">, none>>;
constexpr bool parts_are_data_major() {
  for (int dev = 0; dev < 8; ++dev) {
    auto c = mesh42.coords(dev);
    sl::ShardBox b = sl::shard_box(both, mesh42, {16, 5}, dev);
    if (b.offset[0] != 2 * (2 * c[0] + c[1]) || b.extent[0] != 2 || b.offset[1] != 0 || b.extent[1] != 5) return false;
  }
  return true;
}
static_assert(parts_are_data_major());
// The reversed order: model major, part index 4 * model + data. Device 5 is (data 2, model 1).
constexpr sl::Sharding reversed = sl::sharding_v<M, sl::Spec<sl::axes<"model", "data">, none>>;
static_assert(sl::shard_box(reversed, mesh42, {16, 5}, 5).offset[0] == 2 * (4 * 1 + 2));
static_assert(sl::shard_box(both, mesh42, {16, 5}, 5).offset[0] == 2 * (2 * 2 + 1));
// 10 rows over data (4) and 3 columns over model (2): device 7 (3, 1) holds rows [9, 10), column [2, 3).
constexpr sl::Sharding grid = sl::sharding_v<M, sl::Spec<"data", "model">>;
static_assert(sl::shard_box(grid, mesh42, {10, 3}, 7) == sl::ShardBox{2, {9, 2}, {1, 1}});
static_assert(sl::shard_box(grid, mesh42, {10, 3}, 7).num_elements() == 1);
static_assert(sl::shard_box(grid, mesh42, {10, 0}, 7).num_elements() == 0);
static_assert(sl::shard_box(grid, mesh42, {10, 3}, 7).contains({9, 2}));
static_assert(!sl::shard_box(grid, mesh42, {10, 3}, 7).contains({8, 2}));
static_assert(!sl::shard_box(grid, mesh42, {10, 3}, 7).contains({9, 1}));
// A scalar: every device holds the whole (one-element) tensor.
constexpr sl::Sharding scalar = sl::sharding_v<M, sl::Spec<>>;
static_assert(sl::shard_box(scalar, mesh42, {}, 6) == sl::ShardBox{0, {}, {}});
static_assert(sl::shard_box(scalar, mesh42, {}, 6).num_elements() == 1);
static_assert(sl::shard_box(scalar, mesh42, {}, 6).contains({}));
// Replicated over model: devices 4 and 5 (data 2) hold the same rows; only model 0 is primary.
constexpr sl::Sharding rows = sl::sharding_v<M, sl::Spec<"data", none>>;
static_assert(sl::shard_box(rows, mesh42, {10, 3}, 4) == sl::shard_box(rows, mesh42, {10, 3}, 5));
static_assert(sl::is_primary(rows, mesh42, 4) && !sl::is_primary(rows, mesh42, 5));
static_assert(sl::is_primary_replica(rows, mesh42, 4) && !sl::is_primary_replica(rows, mesh42, 5));
// Partial over model: both addends count in a reduction, only model 0 stands for the block.
constexpr sl::Sharding rows_partial = sl::sharding_v<M, sl::Spec<"data", none, sl::partial_sum<"model">>>;
static_assert(sl::is_primary(rows_partial, mesh42, 4) && !sl::is_primary(rows_partial, mesh42, 5));
static_assert(sl::is_primary_replica(rows_partial, mesh42, 4) && sl::is_primary_replica(rows_partial, mesh42, 5));
// Boxes compare on their rank's entries only.
static_assert(sl::ShardBox{1, {3, 7}, {2, 7}} == sl::ShardBox{1, {3, 0}, {2, 0}});
static_assert(!(sl::ShardBox{1, {3}, {2}} == sl::ShardBox{2, {3}, {2}}));
static_assert(!(sl::ShardBox{1, {3}, {2}} == sl::ShardBox{1, {3}, {1}}));

// ---- The oracle: the same rules written the plain way. ------------------------------------------
struct Case {
  sl::MeshShape mesh;
  sl::Sharding sharding;
  Shape shape;
  std::string text;  // for failure messages
};

std::string describe(const sl::MeshShape& mesh, const sl::Sharding& s, const Shape& shape) {
  auto list = [&](const sl::AxisList& l) {
    std::string t = "[";
    for (int i = 0; i < l.size(); ++i) t += (i ? "," : "") + mesh.name(l[i]).str();
    return t + "]";
  };
  std::string t = "mesh " + mesh.to_string() + ", dims";
  for (int d = 0; d < s.rank; ++d) t += " " + list(s.dims[static_cast<std::size_t>(d)]);
  t += ", partial " + list(s.partial) + ", shape (";
  for (std::size_t d = 0; d < shape.size(); ++d) t += (d ? "," : "") + std::to_string(shape[d]);
  return t + ")";
}

// 1-3 axes of sizes 1-4, at most 8 devices; each axis to a random dim, to partial, or unused,
// in random order; rank 0-4, extents 0-9.
Case random_case(std::mt19937_64& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  Case c;
  std::vector<int> sizes;
  int rank = 1 + pick(3), devices = 1;
  for (int a = 0; a < rank; ++a) {
    int s = 1 + pick(std::min(4, 8 / devices));
    sizes.push_back(s);
    devices *= s;
  }
  std::vector<sl::AxisName> names;
  const char* pool[] = {"x", "y", "z"};
  for (int a = 0; a < rank; ++a) names.push_back(sl::AxisName::from(pool[a]));
  c.mesh = sl::MeshShape(names, sizes);
  int trank = pick(5);
  c.sharding.rank = trank;
  std::vector<int> order(static_cast<std::size_t>(rank));
  for (int a = 0; a < rank; ++a) order[static_cast<std::size_t>(a)] = a;
  std::shuffle(order.begin(), order.end(), rng);
  for (int a : order) {
    int where = pick(trank + 2);  // 0..trank-1: that dim; trank: partial; trank + 1: unused
    if (where < trank) c.sharding.dims[static_cast<std::size_t>(where)].push_back(a);
    else if (where == trank) c.sharding.partial.push_back(a);
  }
  for (int d = 0; d < trank; ++d) c.shape.push_back(pick(10));
  c.text = describe(c.mesh, c.sharding, c.shape);
  return c;
}

// The box computed without shard_box, block_of or group_rank: find the part index by trying
// every part (decoding it, first axis major) and cut the dim with the chunk formula.
sl::ShardBox oracle_box(const Case& c, int device) {
  auto coords = c.mesh.coords(device);
  sl::ShardBox b;
  b.rank = c.sharding.rank;
  for (int d = 0; d < b.rank; ++d) {
    const sl::AxisList& axes = c.sharding.dims[static_cast<std::size_t>(d)];
    int parts = 1;
    for (int a : axes) parts *= c.mesh.size(a);
    int part = -1;
    for (int p = 0; p < parts; ++p) {
      int rest = p;
      bool match = true;
      for (int k = axes.size() - 1; k >= 0; --k) {
        int a = axes[k];
        if (rest % c.mesh.size(a) != coords[static_cast<std::size_t>(a)]) match = false;
        rest /= c.mesh.size(a);
      }
      if (match) part = p;
    }
    std::int64_t e = c.shape[static_cast<std::size_t>(d)];
    std::int64_t chunk = (e + parts - 1) / parts;
    std::int64_t lo = std::min(part * chunk, e), hi = std::min((part + 1) * chunk, e);
    b.offset[static_cast<std::size_t>(d)] = lo;
    b.extent[static_cast<std::size_t>(d)] = hi - lo;
  }
  return b;
}

// Coordinates of `device` on the axes that pass `keep`, as a key.
template <class Keep>
std::vector<int> coords_on(const sl::MeshShape& mesh, int device, Keep keep) {
  auto c = mesh.coords(device);
  std::vector<int> k;
  for (int a = 0; a < mesh.rank(); ++a) k.push_back(keep(a) ? c[static_cast<std::size_t>(a)] : -1);
  return k;
}

// Every multi-index of `shape`, in row-major order (one empty index for rank 0).
template <class F>
void for_each_index(const Shape& shape, F f) {
  for (auto e : shape)
    if (e == 0) return;
  Shape i(shape.size(), 0);
  while (true) {
    f(sl::detail::ArrayRef<std::int64_t>(i));
    std::size_t d = shape.size();
    while (d > 0 && ++i[d - 1] == shape[d - 1]) i[--d] = 0;
    if (d == 0) return;
  }
}
}  // namespace

TEST_SUITE("sharding_block") {
  TEST_CASE("block_of cuts like torch.chunk: parts tile the extent in order") {
    for (std::int64_t e = 0; e <= 40; ++e)
      for (int p = 1; p <= 12; ++p) {
        CAPTURE(e);
        CAPTURE(p);
        std::int64_t chunk = (e + p - 1) / p, next = 0;
        for (int i = 0; i < p; ++i) {
          sl::BlockRange r = sl::block_of(e, p, i);
          CHECK(r.offset == next);                         // contiguous, in order
          CHECK(r.size == std::min(chunk, e - r.offset));  // full chunks, the remainder, then empty
          next = r.offset + r.size;
        }
        CHECK(next == e);  // covers the extent exactly
      }
  }

  TEST_CASE("run-time shardings from specs: the 2 x 2 grid over a 5 x 3 tensor") {
    sl::MeshShape mesh({"data", "model"}, {2, 2});
    sl::Sharding s = sl::resolve(sl::PartitionSpec{"model", "data"}, mesh);
    const Shape shape{5, 3};
    // Device (data d, model m) holds rows part m, columns part d: rows 3 + 2, columns 2 + 1.
    CHECK(sl::shard_box(s, mesh, shape, 0) == sl::ShardBox{2, {0, 0}, {3, 2}});
    CHECK(sl::shard_box(s, mesh, shape, 1) == sl::ShardBox{2, {3, 0}, {2, 2}});
    CHECK(sl::shard_box(s, mesh, shape, 2) == sl::ShardBox{2, {0, 2}, {3, 1}});
    CHECK(sl::shard_box(s, mesh, shape, 3) == sl::ShardBox{2, {3, 2}, {2, 1}});
    for (int dev = 0; dev < 4; ++dev) {
      CHECK(sl::is_primary(s, mesh, dev));
      CHECK(sl::is_primary_replica(s, mesh, dev));
    }
  }

  TEST_CASE("random meshes, shardings and shapes agree with a brute-force oracle") {
    constexpr std::uint64_t seed = 20240611;
    std::mt19937_64 rng(seed);
    constexpr int cases = 10000;
    int nonempty_partial = 0, uneven = 0, multi_axis = 0, empty_boxes = 0;
    for (int n = 0; n < cases; ++n) {
      const Case c = random_case(rng);
      INFO("case ", n, " (seed ", seed, "): ", c.text);
      const int devices = c.mesh.num_devices();
      std::vector<sl::ShardBox> box;
      for (int dev = 0; dev < devices; ++dev) box.push_back(sl::shard_box(c.sharding, c.mesh, c.shape, dev));

      // 1. Every device's box is the oracle's.
      for (int dev = 0; dev < devices; ++dev) {
        CAPTURE(dev);
        CHECK(text(box[static_cast<std::size_t>(dev)]) == text(oracle_box(c, dev)));
      }

      // 2. The primaries' boxes tile the global index space exactly once.
      std::vector<int> primaries;
      for (int dev = 0; dev < devices; ++dev)
        if (sl::is_primary(c.sharding, c.mesh, dev)) primaries.push_back(dev);
      std::int64_t indices = 0, not_once = 0, covered = 0;
      for_each_index(c.shape, [&](sl::detail::ArrayRef<std::int64_t> i) {
        int hits = 0;
        for (int dev : primaries) hits += box[static_cast<std::size_t>(dev)].contains(i) ? 1 : 0;
        ++indices;
        if (hits != 1) ++not_once;
      });
      for (int dev : primaries) covered += box[static_cast<std::size_t>(dev)].num_elements();
      CHECK(not_once == 0);
      CHECK(covered == indices);  // and no primary box reaches outside the index space

      // 3. Replicas and addend holders (same coordinates on every axis that splits a dim) hold
      //    the same box; each such class has one primary, and each class of coordinates on the
      //    splitting and partial axes (one addend of one block) one primary replica.
      auto splits = [&](int a) { return c.sharding.shards_over(a); };
      auto splits_or_partial = [&](int a) { return c.sharding.shards_over(a) || c.sharding.partial.contains(a); };
      std::map<std::vector<int>, int> primary_per_block, primary_replica_per_addend;
      std::map<std::vector<int>, std::set<int>> holders;  // coordinates on splitting axes -> devices
      int replica_mismatch = 0, primary_not_replica = 0;
      for (int dev = 0; dev < devices; ++dev) {
        auto block_key = coords_on(c.mesh, dev, splits);
        auto addend_key = coords_on(c.mesh, dev, splits_or_partial);
        for (int other : holders[block_key])
          if (text(box[static_cast<std::size_t>(other)]) != text(box[static_cast<std::size_t>(dev)])) ++replica_mismatch;
        holders[block_key].insert(dev);
        primary_per_block[block_key] += sl::is_primary(c.sharding, c.mesh, dev) ? 1 : 0;
        primary_replica_per_addend[addend_key] += sl::is_primary_replica(c.sharding, c.mesh, dev) ? 1 : 0;
        if (sl::is_primary(c.sharding, c.mesh, dev) && !sl::is_primary_replica(c.sharding, c.mesh, dev))
          ++primary_not_replica;
      }
      CHECK(replica_mismatch == 0);
      int eq_wrong = 0;  // operator== agrees with the fields, on equal and unequal boxes alike
      for (const auto& a : box)
        for (const auto& b : box) eq_wrong += (a == b) != (text(a) == text(b));
      CHECK(eq_wrong == 0);
      CHECK(primary_not_replica == 0);
      int blocks_without_one_primary = 0, addends_without_one_primary_replica = 0;
      for (auto& [key, count] : primary_per_block) blocks_without_one_primary += count != 1;
      for (auto& [key, count] : primary_replica_per_addend) addends_without_one_primary_replica += count != 1;
      CHECK(blocks_without_one_primary == 0);
      CHECK(addends_without_one_primary_replica == 0);

      // 4. As the brief puts it: one primary replica per distinct (box, partial coordinates)
      //    pair, for non-empty boxes (empty trailing parts of different blocks coincide).
      std::map<std::pair<std::vector<std::int64_t>, std::vector<int>>, int> per_pair;
      for (int dev = 0; dev < devices; ++dev) {
        const auto& b = box[static_cast<std::size_t>(dev)];
        if (b.num_elements() == 0) continue;
        std::vector<std::int64_t> k;
        for (int d = 0; d < b.rank; ++d) {
          k.push_back(b.offset[static_cast<std::size_t>(d)]);
          k.push_back(b.extent[static_cast<std::size_t>(d)]);
        }
        auto partial_key = coords_on(c.mesh, dev, [&](int a) { return c.sharding.partial.contains(a); });
        per_pair[{k, partial_key}] += sl::is_primary_replica(c.sharding, c.mesh, dev) ? 1 : 0;
        if (c.sharding.is_partial() && c.mesh.group_size(c.sharding.partial) > 1) ++nonempty_partial;
      }
      int pairs_without_one = 0;
      for (auto& [key, count] : per_pair) pairs_without_one += count != 1;
      CHECK(pairs_without_one == 0);

      for (int d = 0; d < c.sharding.rank; ++d) {
        int parts = c.mesh.group_size(c.sharding.dims[static_cast<std::size_t>(d)]);
        if (c.shape[static_cast<std::size_t>(d)] % parts != 0) ++uneven;
        if (c.sharding.dims[static_cast<std::size_t>(d)].size() > 1) ++multi_axis;
      }
      for (const auto& b : box) empty_boxes += b.num_elements() == 0;
    }
    // The generator reached the interesting corners.
    CHECK(nonempty_partial > 100);
    CHECK(uneven > 100);
    CHECK(multi_axis > 100);
    CHECK(empty_boxes > 100);
  }

  TEST_CASE("bad input: the message names the values") {
    CHECK_THROWS_WITH_AS(sl::block_of(-3, 2, 0), "shardlib: block_of: extent -3 is negative; extents must be >= 0",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::block_of(10, 0, 0),
                         "shardlib: block_of: cannot cut extent 10 into 0 parts; parts must be >= 1",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::block_of(10, -2, 0), doctest::Contains("into -2 parts"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::block_of(10, 4, 4), "shardlib: block_of: part 4 is outside 0..3 (extent 10 in 4 parts)",
                         std::out_of_range);
    CHECK_THROWS_WITH_AS(sl::block_of(10, 4, -1), doctest::Contains("part -1 is outside 0..3"), std::out_of_range);

    sl::MeshShape mesh({"data", "model"}, {4, 2});
    sl::Sharding rows = sl::resolve(sl::PartitionSpec{"data", none}, mesh);
    CHECK_THROWS_WITH_AS(sl::shard_box(rows, mesh, {10, 3, 2}, 0),
                         "shardlib: shard_box: the global shape has rank 3 but the sharding has rank 2",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::shard_box(rows, mesh, {}, 0),
                         "shardlib: shard_box: the global shape has rank 0 but the sharding has rank 2",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::shard_box(rows, mesh, {10, -4}, 0),
                         "shardlib: shard_box: dim 1 of the global shape has extent -4; extents must be >= 0",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::shard_box(rows, mesh, {10, 3}, 8),
                         "shardlib: device 8 is outside mesh {data: 4, model: 2} of 8 devices", std::out_of_range);
    CHECK_THROWS_WITH_AS(sl::shard_box(rows, mesh, {10, 3}, -1), doctest::Contains("device -1 is outside mesh"),
                         std::out_of_range);
    sl::Sharding scalar = sl::resolve(sl::PartitionSpec{}, mesh);  // no dim reads the device: still checked
    CHECK_THROWS_WITH_AS(sl::shard_box(scalar, mesh, {}, 9), doctest::Contains("device 9 is outside mesh"),
                         std::out_of_range);
    CHECK_THROWS_WITH_AS(sl::is_primary(rows, mesh, 8), doctest::Contains("device 8 is outside mesh"), std::out_of_range);
    CHECK_THROWS_WITH_AS(sl::is_primary_replica(rows, mesh, 8), doctest::Contains("device 8 is outside mesh"),
                         std::out_of_range);
    CHECK_THROWS_WITH_AS(sl::shard_box(rows, mesh, {10, 3}, 0).contains({1}),
                         "shardlib: ShardBox::contains: an index of rank 1 for a box of rank 2", std::invalid_argument);

    // Hand-built shardings that resolve() would never make.
    sl::Sharding outside = rows;
    outside.partial = sl::AxisList{2};
    CHECK_THROWS_WITH_AS(sl::is_primary(outside, mesh, 0),
                         "shardlib: is_primary: the sharding uses mesh axis 2, outside mesh {data: 4, model: 2}",
                         std::out_of_range);
    sl::Sharding twice = rows;
    twice.dims[1] = sl::AxisList{0};
    CHECK_THROWS_WITH_AS(sl::shard_box(twice, mesh, {10, 3}, 0),
                         "shardlib: shard_box: the sharding uses mesh axis 'data' twice; an axis appears at most once per spec",
                         std::invalid_argument);
    sl::Sharding too_long = rows;
    too_long.rank = 9;
    CHECK_THROWS_WITH_AS(sl::is_primary_replica(too_long, mesh, 0),
                         "shardlib: is_primary_replica: a sharding of rank 9; ranks are 0..8", std::invalid_argument);
  }
}
