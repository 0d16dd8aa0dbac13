// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <shardlib/mesh.hpp>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

namespace sl = shardlib;

namespace {
// A random mesh of 1..4 axes of sizes 1..4, and a random ordered subset of its axes.
struct RandomMesh {
  sl::MeshShape shape;
  explicit RandomMesh(std::mt19937& rng) {
    int rank = std::uniform_int_distribution<int>(1, 4)(rng);
    std::vector<sl::AxisName> names;
    std::vector<int> sizes;
    const char* pool[] = {"a", "b", "c", "d"};
    for (int i = 0; i < rank; ++i) {
      names.push_back(sl::AxisName::from(pool[i]));
      sizes.push_back(std::uniform_int_distribution<int>(1, 4)(rng));
    }
    shape = sl::MeshShape(names, sizes);
  }
  sl::AxisList random_axes(std::mt19937& rng) const {
    std::vector<int> all(static_cast<std::size_t>(shape.rank()));
    for (int i = 0; i < shape.rank(); ++i) all[static_cast<std::size_t>(i)] = i;
    std::shuffle(all.begin(), all.end(), rng);
    sl::AxisList l;
    int n = std::uniform_int_distribution<int>(0, shape.rank())(rng);
    for (int i = 0; i < n; ++i) l.push_back(all[static_cast<std::size_t>(i)]);
    return l;
  }
};
sl::AxisList complement(const sl::AxisList& l, int rank) {
  sl::AxisList c;
  for (int a = 0; a < rank; ++a)
    if (!l.contains(a)) c.push_back(a);
  return c;
}
}  // namespace

TEST_SUITE("mesh") {
  TEST_CASE("devices are row-major over the axes, last axis fastest") {
    using M = sl::Mesh<"data", "model">;
    M mesh({4, 2}, 8);
    CHECK(mesh.num_devices() == 8);
    CHECK(mesh.coords(5) == std::array<int, 2>{2, 1});
    CHECK(mesh.coords(0) == std::array<int, 2>{0, 0});
    CHECK(mesh.coords(7) == std::array<int, 2>{3, 1});
    CHECK(mesh.device_at({2, 1}) == 5);
    CHECK(mesh.size<"model">() == 2);
    CHECK(mesh.size<"data">() == 4);
    CHECK(mesh.to_string() == "{data: 4, model: 2}");
    static_assert(M::rank == 2);
    static_assert(M::index_of<"model">() == 1);
    static_assert(M::axes<"model", "data">() == sl::AxisList{1, 0});
  }

  TEST_CASE("a group along some axes shares the coordinates on the others") {
    using M = sl::Mesh<"data", "model">;
    M mesh({4, 2});
    CHECK(mesh.group_devices(5, M::axes<"model">()) == std::vector<int>{4, 5});
    CHECK(mesh.group_devices(5, M::axes<"data">()) == std::vector<int>{1, 3, 5, 7});
    CHECK(mesh.group_rank(5, M::axes<"data">()) == 2);
    CHECK(mesh.group_devices(5, M::axes<"data", "model">()) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
    // Axis order inside a group is the order of its ranks: "model" major here.
    CHECK(mesh.group_devices(5, M::axes<"model", "data">()) == std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7});
    CHECK(mesh.group_devices(5, sl::AxisList{}) == std::vector<int>{5});
    CHECK(mesh.group_size(M::axes<"data">()) == 4);

    sl::Mesh<"pp", "dp", "tp"> m3({2, 3, 2});
    using M3 = decltype(m3);
    // device = pp*6 + dp*2 + tp; device 7 is (pp 1, dp 0, tp 1).
    CHECK(m3.group_devices(7, M3::axes<"pp", "tp">()) == std::vector<int>{0, 1, 6, 7});
    CHECK(m3.group_devices(8, sl::AxisList{0, 2}) == std::vector<int>{2, 3, 8, 9});  // dp coordinate 1
  }

  TEST_CASE("property: coordinates and groups over random meshes") {
    std::mt19937 rng(20261121);
    for (int trial = 0; trial < 500; ++trial) {
      RandomMesh rm(rng);
      const auto& m = rm.shape;
      CAPTURE(m.to_string());
      sl::AxisList axes = rm.random_axes(rng);
      sl::AxisList rest = complement(axes, m.rank());
      std::set<int> covered;
      for (int d = 0; d < m.num_devices(); ++d) {
        auto c = m.coords(d);
        REQUIRE(m.device_at(sl::detail::ArrayRef<int>(c.data(), static_cast<std::size_t>(m.rank()))) == d);
        auto g = m.group_devices(d, axes);
        REQUIRE(static_cast<int>(g.size()) == m.group_size(axes));
        REQUIRE(g[static_cast<std::size_t>(m.group_rank(d, axes))] == d);
        for (int i = 0; i < static_cast<int>(g.size()); ++i) {
          int peer = g[static_cast<std::size_t>(i)];
          REQUIRE(m.group_rank(peer, axes) == i);
          REQUIRE(m.group_devices(peer, axes) == g);  // every member sees the same group
          auto pc = m.coords(peer);
          for (int a : rest) REQUIRE(pc[static_cast<std::size_t>(a)] == c[static_cast<std::size_t>(a)]);
        }
        // The group along `axes` and the group along the other axes meet in this device only.
        auto h = m.group_devices(d, rest);
        int common = 0;
        for (int x : g) common += static_cast<int>(std::count(h.begin(), h.end(), x));
        REQUIRE(common == 1);
        if (m.group_rank(d, axes) == 0) covered.insert(g.begin(), g.end());
      }
      // Groups partition the devices: the groups' first members account for every device.
      CHECK(static_cast<int>(covered.size()) == m.num_devices());
    }
  }

  TEST_CASE("bad sizes are refused with the mesh and the axis in the message") {
    using M = sl::Mesh<"data", "model">;
    CHECK_THROWS_WITH_AS(M({4, 3}, 8),
                         "shardlib: mesh {data: 4, model: 3} has 12 devices but the run has 8; the axis sizes must "
                         "multiply to the device count",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(M({4, 0}), doctest::Contains("axis 'model' has size 0; sizes must be >= 1"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(M({-1, 2}), doctest::Contains("axis 'data' has size -1"), std::invalid_argument);
    CHECK_THROWS_AS(sl::Mesh<"a">({1 << 16}, 1), std::invalid_argument);
    CHECK_THROWS_WITH_AS((sl::Mesh<"a", "b", "c">({1 << 16, 1 << 16, 2})), doctest::Contains("more than 2^31 devices"),
                         std::invalid_argument);
  }

  TEST_CASE("run-time meshes check their names and indices") {
    std::vector<sl::AxisName> names{"x", "x"};
    std::vector<int> sizes{2, 2};
    CHECK_THROWS_WITH_AS(sl::MeshShape(names, sizes), doctest::Contains("names axis 'x' twice"), std::invalid_argument);
    std::vector<int> one{2};
    CHECK_THROWS_WITH_AS(sl::MeshShape(names, one), doctest::Contains("one size per axis"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::MeshShape({}, {}), doctest::Contains("at least one axis"), std::invalid_argument);
    std::vector<sl::AxisName> nine{"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    std::vector<int> nine_sizes(9, 1);
    CHECK_THROWS_WITH_AS(sl::MeshShape(nine, nine_sizes), doctest::Contains("at most 8 axes"), std::invalid_argument);

    sl::MeshShape m({"data", "model"}, {2, 3});
    CHECK(m.index_of("model") == 1);
    CHECK(m.find("pipe") == -1);
    CHECK_THROWS_WITH_AS(m.index_of("pipe"), "shardlib: axis 'pipe' is not in mesh {data: 2, model: 3}",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(m.coords(6), doctest::Contains("device 6 is outside mesh"), std::out_of_range);
    CHECK_THROWS_AS(m.coords(-1), std::out_of_range);
    CHECK_THROWS_WITH_AS(m.device_at({1, 3}), doctest::Contains("coordinate 3 is outside axis 'model'"),
                         std::out_of_range);
    CHECK_THROWS_WITH_AS(m.device_at({1}), doctest::Contains("needs 2 coordinates, got 1"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(m.group_size(sl::AxisList{0, 0}), doctest::Contains("axis 'data' is listed twice"),
                         std::invalid_argument);
    CHECK_THROWS_AS(m.group_size(sl::AxisList{2}), std::out_of_range);
    CHECK_THROWS_AS(m.group_member(0, sl::AxisList{1}, 3), std::out_of_range);
    CHECK_THROWS_AS(m.require_devices(5), std::invalid_argument);
    CHECK_NOTHROW(m.require_devices(6));
  }

  TEST_CASE("mesh values are constexpr") {
    constexpr sl::MeshShape m({"data", "model"}, {4, 2});
    static_assert(m.num_devices() == 8);
    static_assert(m.coords(5)[0] == 2 && m.coords(5)[1] == 1);
    static_assert(m.group_member(5, sl::AxisList{0}, 0) == 1);
    static_assert(m.group_rank(6, sl::AxisList{1, 0}) == 3);
    CHECK(m == sl::MeshShape({"data", "model"}, {4, 2}));
    CHECK_FALSE(m == sl::MeshShape({"data", "model"}, {2, 4}));
  }
}
