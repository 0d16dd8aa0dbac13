// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <shardlib/spec.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

using Mesh2D = sl::Mesh<"data", "model">;
using Mesh3D = sl::Mesh<"pp", "dp", "tp">;

// ---- Type-level checks: the rules run at compile time. ---------------------------------------
using X = sl::Spec<"data", none>;
using W1 = sl::Spec<none, "model">;
using Both = sl::Spec<sl::axes<"model", "data">, none>;
using PartialRows = sl::Spec<"data", none, sl::partial_sum<"model">>;
using Scalar = sl::Spec<>;

static_assert(X::rank == 2 && W1::rank == 2 && PartialRows::rank == 2 && Scalar::rank == 0);
static_assert(sl::sharding_v<Mesh2D, X>.dims[0] == sl::AxisList{0});
static_assert(sl::sharding_v<Mesh2D, X>.dims[1].empty());
static_assert(sl::sharding_v<Mesh2D, Both>.dims[0] == sl::AxisList{1, 0});
static_assert(sl::sharding_v<Mesh2D, PartialRows>.partial == sl::AxisList{1});
static_assert(sl::sharding_v<Mesh2D, PartialRows>.op == sl::ReduceOp::sum);
static_assert(sl::sharding_v<Mesh2D, sl::Spec<none, sl::partial_max<"data", "model">>>.partial == sl::AxisList{0, 1});
static_assert(sl::sharding_v<Mesh2D, W1>.replicated_axes(2) == sl::AxisList{0});
static_assert(sl::sharding_v<Mesh3D, sl::Spec<"tp", none, "pp">>.dim_of(0) == 2);
static_assert(sl::sharding_v<Mesh3D, sl::Spec<"tp", none, "pp">>.dim_of(1) == -1);
static_assert(sl::ValidSpecFor<X, Mesh2D>);
static_assert(!sl::ValidSpecFor<X, Mesh3D>);          // "data" is not an axis of Mesh3D
static_assert(!sl::ValidSpecFor<X, Mesh2D, 3>);       // rank mismatch
static_assert(sl::ValidSpecFor<Scalar, Mesh2D>);
// The typed spec and the value spec are the same value: one set of rules serves both.
static_assert(PartialRows::value == sl::PartitionSpec{"data", none, sl::partial_sum<"model">});
static_assert(Both::value == sl::PartitionSpec{sl::axes<"model", "data">, none});
static_assert(!(Both::value == sl::PartitionSpec{sl::axes<"data", "model">, none}));  // order matters

TEST_SUITE("spec") {
  TEST_CASE("specs print as the typed API spells them") {
    CHECK(X::value.to_string() == "Spec<\"data\", none>");
    CHECK(Both::value.to_string() == "Spec<axes<\"model\", \"data\">, none>");
    CHECK(PartialRows::value.to_string() == "Spec<\"data\", none, partial<sum, \"model\">>");
    CHECK(sl::Spec<sl::partial_min<"a", "b">>::value.to_string() == "Spec<partial<min, \"a\", \"b\">>");
    CHECK(Scalar::value.to_string() == "Spec<>");
  }

  TEST_CASE("entries hold their axes in order") {
    constexpr sl::SpecEntry e = sl::axes<"x", "yy", "zzz">;
    static_assert(e.axis_count() == 3);
    static_assert(e.axis(0) == sl::AxisName("x") && e.axis(1) == sl::AxisName("yy") && e.axis(2) == sl::AxisName("zzz"));
    static_assert(sl::SpecEntry(none).axis_count() == 0);
    static_assert(sl::partial_max<"m">.is_partial() && sl::partial_max<"m">.reduce_op() == sl::ReduceOp::max);
    constexpr sl::SpecEntry longest = sl::axes<"a234567890123456789012345678901", "b234567890123456789012345678901",
                                               "c234567890123456789012345678901", "d234567890123456789012345678901",
                                               "e234567890123456789012345678901", "f234567890123456789012345678901",
                                               "g234567890123456789012345678901", "h234567890123456789012345678901">;
    static_assert(longest.axis_count() == 8 && longest.axis(7) == sl::AxisName("h234567890123456789012345678901"));
  }

  TEST_CASE("run-time specs resolve like typed ones") {
    sl::MeshShape mesh({"data", "model"}, {4, 2});
    sl::PartitionSpec s{sl::AxisName::from("model"), none, sl::partial_sum<"data">};
    sl::Sharding r = sl::resolve(s, mesh);
    CHECK(r.rank == 2);
    CHECK(r.dims[0] == sl::AxisList{1});
    CHECK(r.partial == sl::AxisList{0});
    CHECK(r == sl::sharding_v<Mesh2D, sl::Spec<"model", none, sl::partial_sum<"data">>>);
  }

  TEST_CASE("bad specs: the message names the spec and the axis") {
    CHECK_THROWS_WITH_AS((sl::PartitionSpec{"data", "data"}),
                         "shardlib: spec Spec<\"data\", \"data\"> uses axis 'data' twice; an axis appears at most once per spec",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS((sl::PartitionSpec{"model", sl::partial_sum<"model">}), doctest::Contains("uses axis 'model' twice"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS((sl::PartitionSpec{sl::axes<"a", "b", "a">}), doctest::Contains("uses axis 'a' twice"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS((sl::PartitionSpec{"a", sl::partial_sum<"b">, sl::partial_max<"c">}),
                         doctest::Contains("has more than one partial clause"), std::invalid_argument);
    CHECK_THROWS_WITH_AS((sl::PartitionSpec{none, none, none, none, none, none, none, none, none}),
                         "shardlib: a spec has at most 8 dims", std::invalid_argument);
    CHECK_THROWS_AS(sl::SpecEntry::pending(sl::ReduceOp::sum, {}), std::invalid_argument);
    // A pending product has no sharding rule: partial clauses are sum, max or min.
    CHECK_THROWS_WITH_AS((sl::PartitionSpec{"a", sl::partial<sl::ReduceOp::prod, "b">}),
                         "shardlib: spec Spec<\"a\", partial<prod, \"b\">> has a partial clause over prod; partial "
                         "clauses are sum, max or min",
                         std::invalid_argument);
    static constexpr std::array<sl::SpecEntry, 2> with_prod{sl::SpecEntry("a"), sl::partial<sl::ReduceOp::prod, "b">};
    static_assert(sl::check_entries(with_prod).issue == sl::SpecCheck::partial_op_unsupported);

    sl::MeshShape mesh({"data", "model"}, {4, 2});
    CHECK_THROWS_WITH_AS(sl::resolve(sl::PartitionSpec{"pipe", none}, mesh),
                         "shardlib: spec Spec<\"pipe\", none> uses axis 'pipe' (dim 0), which is not in mesh "
                         "{data: 4, model: 2}",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::resolve(sl::PartitionSpec{none, sl::partial_sum<"pipe">}, mesh),
                         doctest::Contains("uses axis 'pipe' (partial clause)"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::resolve(sl::PartitionSpec{"data", none}, mesh, 3),
                         "shardlib: spec Spec<\"data\", none> has rank 2 but the tensor has rank 3", std::invalid_argument);
  }

  TEST_CASE("property: random specs on random meshes resolve to the axes they name") {
    std::mt19937 rng(7);
    const char* pool[] = {"a", "b", "c", "d", "e"};
    for (int trial = 0; trial < 2000; ++trial) {
      int mesh_rank = std::uniform_int_distribution<int>(1, 5)(rng);
      std::vector<sl::AxisName> names;
      std::vector<int> sizes;
      for (int i = 0; i < mesh_rank; ++i) {
        names.push_back(sl::AxisName::from(pool[i]));
        sizes.push_back(std::uniform_int_distribution<int>(1, 3)(rng));
      }
      sl::MeshShape mesh(names, sizes);
      int tensor_rank = std::uniform_int_distribution<int>(0, 4)(rng);
      // Deal each mesh axis to a dim, to the partial clause, or to nobody, in random order.
      std::vector<int> order(static_cast<std::size_t>(mesh_rank));
      for (int i = 0; i < mesh_rank; ++i) order[static_cast<std::size_t>(i)] = i;
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<std::vector<sl::AxisName>> dims(static_cast<std::size_t>(tensor_rank));
      std::vector<sl::AxisName> partial;
      for (int a : order) {
        int where = std::uniform_int_distribution<int>(-2, tensor_rank - 1)(rng);
        if (where >= 0) dims[static_cast<std::size_t>(where)].push_back(names[static_cast<std::size_t>(a)]);
        else if (where == -1) partial.push_back(names[static_cast<std::size_t>(a)]);
      }
      // Sometimes repeat an axis already used, or name one the mesh lacks.
      int mutate = std::uniform_int_distribution<int>(0, 5)(rng);
      bool repeated = false, unknown = false;
      if (mutate == 0 && tensor_rank > 0) {
        std::vector<sl::AxisName> used = partial;
        for (auto& d : dims) used.insert(used.end(), d.begin(), d.end());
        if (!used.empty()) {
          auto& d = dims[static_cast<std::size_t>(std::uniform_int_distribution<int>(0, tensor_rank - 1)(rng))];
          d.push_back(used[static_cast<std::size_t>(std::uniform_int_distribution<int>(0, static_cast<int>(used.size()) - 1)(rng))]);
          repeated = true;
        }
      } else if (mutate == 1 && tensor_rank > 0) {
        dims[0].push_back("zz");
        unknown = true;
      }
      std::vector<sl::SpecEntry> entries;
      for (auto& d : dims) entries.push_back(sl::SpecEntry::split(d));
      if (!partial.empty()) entries.push_back(sl::SpecEntry::pending(sl::ReduceOp::max, partial));
      std::shuffle(entries.begin(), entries.end() - (partial.empty() ? 0 : 1), rng);  // dims in any order
      CAPTURE(mesh.to_string());
      CHECK(static_cast<bool>(sl::check_entries(entries)) == !repeated);
      if (repeated) {
        CHECK_THROWS_AS((sl::PartitionSpec(sl::detail::ArrayRef<sl::SpecEntry>(entries))), std::invalid_argument);
        continue;
      }
      sl::PartitionSpec spec{sl::detail::ArrayRef<sl::SpecEntry>(entries)};
      CAPTURE(spec.to_string());
      if (unknown) {
        CHECK_THROWS_WITH_AS(sl::resolve(spec, mesh), doctest::Contains("uses axis 'zz'"), std::invalid_argument);
        continue;
      }
      CHECK_THROWS_AS(sl::resolve(spec, mesh, tensor_rank + 1), std::invalid_argument);
      sl::Sharding s = sl::resolve(spec, mesh, tensor_rank);
      REQUIRE(s.rank == tensor_rank);
      int used = 0;
      for (int d = 0; d < tensor_rank; ++d) {
        REQUIRE(s.dims[static_cast<std::size_t>(d)].size() == spec.dim(d).size());
        for (int k = 0; k < spec.dim(d).size(); ++k)
          CHECK(mesh.name(s.dims[static_cast<std::size_t>(d)][k]) == spec.dim(d)[k]);
        used += spec.dim(d).size();
      }
      CHECK(s.partial.size() == static_cast<int>(partial.size()));
      CHECK(s.replicated_axes(mesh_rank).size() == mesh_rank - used - static_cast<int>(partial.size()));
    }
  }
}
