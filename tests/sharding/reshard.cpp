// SPDX-License-Identifier: Apache-2.0
// The reshard rules (sharding/reshard.hpp) on their own: plans at compile time, schedules for
// given shapes, and a property test of exchange_box against a brute-force element oracle.
#include <doctest/doctest.h>
#include <shardlib/sharding/reshard.hpp>

#include "random.hpp"

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;
using K = sl::ReshardStepKind;

namespace {
using M = sl::Mesh<"x", "y">;
template <class S>
constexpr sl::Sharding sh = sl::sharding_v<M, S>;

// ---- Plans are constant expressions -------------------------------------------------------
constexpr auto gather = sl::plan_reshard(sh<sl::Spec<"x", none>>, sh<sl::Spec<none, none>>);
static_assert(!gather.identity && gather.reduce.empty() && gather.scatter.empty() && gather.new_partial.empty());
constexpr auto same = sl::plan_reshard(sh<sl::Spec<"x", "y">>, sh<sl::Spec<"x", "y">>);
static_assert(same.identity);
constexpr auto rs = sl::plan_reshard(sh<sl::Spec<none, none, sl::partial_sum<"x">>>, sh<sl::Spec<"x", none>>);
static_assert(rs.reduce == sl::AxisList{0} && rs.scatter == sl::AxisList{0} && rs.scattered == sh<sl::Spec<"x", none>>);
// Appended after an existing axis of the same dim: still a reduce_scatter.
constexpr auto rs2 = sl::plan_reshard(sh<sl::Spec<"y", none, sl::partial_sum<"x">>>, sh<sl::Spec<sl::axes<"y", "x">, none>>);
static_assert(rs2.scatter == sl::AxisList{0});
// Put in front of an existing axis: not a reduce_scatter (all_reduce, then an exchange).
constexpr auto no_rs = sl::plan_reshard(sh<sl::Spec<"y", none, sl::partial_sum<"x">>>, sh<sl::Spec<sl::axes<"x", "y">, none>>);
static_assert(no_rs.scatter.empty() && no_rs.reduce == sl::AxisList{0});
// Partial max kept, partial sum over another axis reduced.
constexpr auto keep = sl::plan_reshard(sh<sl::Spec<none, sl::partial_max<"x", "y">>>, sh<sl::Spec<none, sl::partial_max<"y">>>);
static_assert(keep.kept_partial == sl::AxisList{1} && keep.reduce == sl::AxisList{0} && keep.new_partial.empty());
// A different op: everything reduced, then made partial again.
constexpr auto swap_op = sl::plan_reshard(sh<sl::Spec<none, sl::partial_sum<"x">>>, sh<sl::Spec<none, sl::partial_max<"x">>>);
static_assert(swap_op.kept_partial.empty() && swap_op.reduce == sl::AxisList{0} && swap_op.new_partial == sl::AxisList{0});
constexpr auto to_partial = sl::plan_reshard(sh<sl::Spec<none, "x">>, sh<sl::Spec<none, "x", sl::partial_sum<"y">>>);
static_assert(to_partial.new_partial == sl::AxisList{1} && to_partial.target_layout == sh<sl::Spec<none, "x">>);

constexpr sl::MeshShape mesh42(M::axis_names, std::array<int, 2>{4, 2});
constexpr std::array<std::int64_t, 2> even{8, 6}, odd{5, 3};
constexpr sl::ReshardSchedule sched(const sl::ReshardPlan& p, const std::array<std::int64_t, 2>& s) {
  return sl::schedule_reshard(p, mesh42, s);
}
static_assert(sched(gather, even).num_steps == 1 && sched(gather, even).steps[0].kind == K::all_gather);
static_assert(sched(same, even).num_steps == 0);
static_assert(sched(rs, even).num_steps == 1 && sched(rs, even).steps[0].kind == K::reduce_scatter);
static_assert(sched(rs, odd).steps[0].kind == K::reduce_scatter);  // ceil blocks of one dim always tile it
static_assert(sched(to_partial, even).num_steps == 1 && sched(to_partial, even).steps[0].kind == K::mask);
constexpr auto slice = sl::plan_reshard(sh<sl::Spec<none, none>>, sh<sl::Spec<"y", "x">>);
static_assert(sched(slice, odd).num_steps == 1 && sched(slice, odd).steps[0].kind == K::local_copy);
constexpr auto a2a = sl::plan_reshard(sh<sl::Spec<"x", none>>, sh<sl::Spec<none, "x">>);
static_assert(sched(a2a, even).steps[0].kind == K::exchange && sched(a2a, even).steps[0].group == sl::AxisList{0});
// Uneven nested blocks that do not line up: the exchange widens to the prefix axis too.
// dim of 5 over (x, y) = 8 parts of 1; over x alone, 4 parts of 2: (x, y) -> (x) lines up...
constexpr auto nest = sl::plan_reshard(sh<sl::Spec<sl::axes<"x", "y">, none>>, sh<sl::Spec<"x", none>>);
static_assert(sched(nest, odd).steps[0].kind == K::all_gather);
static_assert(sched(nest, odd).steps[0].group == sl::AxisList{1});
// ...but 6 over (x, y) = 8 parts of 1 (x-superblocks of 2) vs 4 parts of 2 (x-blocks of 2) lines
// up, while 10 over (x, y) = 8 parts of 2 (x-superblocks of 4) vs x alone (blocks of 3) does not.
constexpr std::array<std::int64_t, 2> ten{10, 3};
static_assert(sched(nest, ten).steps[0].kind == K::exchange);
static_assert(sched(nest, ten).steps[0].group == sl::AxisList{0, 1});

// ---- Brute force: every device gets exactly its new block, each missing element once --------
using sl::test::Rng;
using sl::test::random_sharding;

std::int64_t linear(const std::vector<std::int64_t>& idx, const std::vector<std::int64_t>& shape) {
  std::int64_t k = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) k = k * shape[d] + idx[d];
  return k;
}

// Calls f(global linear index) for each element of box b.
template <class F>
void for_each(const sl::ShardBox& b, const std::vector<std::int64_t>& shape, F f) {
  if (b.num_elements() == 0) return;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(b.rank));
  for (int d = 0; d < b.rank; ++d) idx[static_cast<std::size_t>(d)] = b.offset[static_cast<std::size_t>(d)];
  while (true) {
    f(linear(idx, shape));
    int d = b.rank - 1;
    for (; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      if (++idx[u] < b.offset[u] + b.extent[u]) break;
      idx[u] = b.offset[u];
    }
    if (d < 0) return;
  }
}
}  // namespace

TEST_SUITE("sharding_reshard") {
TEST_CASE("exchange boxes deliver every needed element exactly once (2000 random cases)") {
  Rng r{std::mt19937_64(20261121)};
  const sl::AxisName names[] = {"a", "b", "c"};
  int exchanges = 0;
  for (int c = 0; c < 2000; ++c) {
    const int mesh_rank = 1 + r.below(3);
    std::vector<int> sizes;
    int devices = 1;
    for (int i = 0; i < mesh_rank; ++i) {
      sizes.push_back(1 + r.below(devices >= 4 ? 2 : 4));
      devices *= sizes.back();
    }
    const sl::MeshShape mesh(sl::detail::ArrayRef<sl::AxisName>(names, static_cast<std::size_t>(mesh_rank)), sizes);
    const int rank = 1 + r.below(3);
    std::vector<std::int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(r.below(4) == 0 ? r.below(2) : r.below(11));
    const sl::Sharding from = random_sharding(r, mesh_rank, rank, false), to = random_sharding(r, mesh_rank, rank, false);
    const sl::ReshardSchedule s = sl::schedule_reshard(sl::plan_reshard(from, to), mesh, shape);
    INFO("case " << c << ": " << sl::describe(s, mesh, shape, 0, 1));
    REQUIRE(s.num_steps <= 1);
    if (from == to) {
      CHECK(s.num_steps == 0);
      continue;
    }
    const sl::ReshardStep& st = s.steps[0];
    CHECK(st.before == from);
    CHECK(st.after == to);
    for (int dst = 0; dst < devices; ++dst) {
      const sl::ShardBox need = sl::shard_box(to, mesh, shape, dst), held = sl::shard_box(from, mesh, shape, dst);
      std::vector<int> got(static_cast<std::size_t>(std::max<std::int64_t>(1, [&] {
        std::int64_t n = 1;
        for (auto e : shape) n *= e;
        return n;
      }())));
      std::int64_t from_others = 0;
      if (st.kind == K::local_copy) {
        CHECK(sl::covers(held, need));
        for_each(need, shape, [&](std::int64_t k) { ++got[static_cast<std::size_t>(k)]; });
      } else {
        ++exchanges;
        const int n = mesh.group_size(st.group);
        for (int i = 0; i < n; ++i) {
          const int src = mesh.group_member(dst, st.group, i);
          const sl::ShardBox b = sl::exchange_box(st.before, st.after, mesh, shape, st.group, src, dst);
          CHECK(sl::covers(sl::shard_box(from, mesh, shape, src), b));
          CHECK(sl::covers(need, b));
          if (src != dst) from_others += b.num_elements();
          for_each(b, shape, [&](std::int64_t k) { ++got[static_cast<std::size_t>(k)]; });
        }
      }
      // Each element of the new block arrives once; nothing else arrives.
      std::int64_t wanted = 0;
      for_each(need, shape, [&](std::int64_t k) {
        ++wanted;
        CHECK(got[static_cast<std::size_t>(k)] == 1);
        got[static_cast<std::size_t>(k)] = 0;
      });
      for (int x : got) CHECK(x == 0);
      // The lower bound: exactly the elements needed and not held come from other devices.
      CHECK(from_others == wanted - sl::intersect(need, held).num_elements());
      if (st.kind == K::all_gather) CHECK(sl::covers(need, held));
    }
  }
  CHECK(exchanges > 1000);
}

TEST_CASE("schedules with partial axes reduce first, then move, then mask") {
  const sl::MeshShape mesh(M::axis_names, std::array<int, 2>{4, 2});
  const std::vector<std::int64_t> shape{8, 6};
  auto kinds = [&](const sl::Sharding& a, const sl::Sharding& b) {
    const auto s = sl::schedule_reshard(sl::plan_reshard(a, b), mesh, shape);
    std::string k;
    for (int i = 0; i < s.num_steps; ++i) k += (i ? " " : "") + std::string(sl::to_string(s.steps[static_cast<std::size_t>(i)].kind));
    return k;
  };
  CHECK(kinds(sh<sl::Spec<none, none, sl::partial_sum<"x">>>, sh<sl::Spec<none, none>>) == "all_reduce");
  CHECK(kinds(sh<sl::Spec<none, none, sl::partial_sum<"x">>>, sh<sl::Spec<"x", none>>) == "reduce_scatter");
  CHECK(kinds(sh<sl::Spec<none, none, sl::partial_sum<"x">>>, sh<sl::Spec<none, "x">>) == "reduce_scatter");
  CHECK(kinds(sh<sl::Spec<none, none, sl::partial_sum<"x", "y">>>, sh<sl::Spec<"x", none>>) == "reduce_scatter all_reduce");
  CHECK(kinds(sh<sl::Spec<"y", none, sl::partial_sum<"x">>>, sh<sl::Spec<sl::axes<"x", "y">, none>>) == "all_reduce all_to_all");
  CHECK(kinds(sh<sl::Spec<none, none, sl::partial_sum<"x">>>, sh<sl::Spec<none, none, sl::partial_max<"x">>>) == "all_reduce mask");
  CHECK(kinds(sh<sl::Spec<"x", none>>, sh<sl::Spec<none, none, sl::partial_sum<"x">>>) == "all_gather mask");
  CHECK(kinds(sh<sl::Spec<none, none, sl::partial_min<"x", "y">>>, sh<sl::Spec<none, none, sl::partial_min<"y", "x">>>) == "local slice");
  CHECK_THROWS_WITH_AS(sl::plan_reshard(sh<sl::Spec<"x", none>>, sl::sharding_v<M, sl::Spec<"x">>),
                       "shardlib: reshard between shardings of rank 2 and 1; a reshard keeps the rank", std::invalid_argument);
}

TEST_CASE("describe names the steps, groups, specs and bytes") {
  const sl::MeshShape mesh(M::axis_names, std::array<int, 2>{4, 2});
  const std::vector<std::int64_t> shape{8, 3};
  const auto s = sl::schedule_reshard(gather, mesh, shape);
  CHECK(sl::describe(s, mesh, shape, 1, 4) ==
        "reshard Spec<\"x\", none> -> Spec<none, none> on mesh {x: 4, y: 2}, shape [8, 3]:\n"
        "  1. all_gather over {x}: Spec<\"x\", none> -> Spec<none, none>; device 1 sends 72 B, receives 72 B\n");
  CHECK(sl::describe(sl::schedule_reshard(same, mesh, shape), mesh, shape, 0, 4) ==
        "reshard Spec<\"x\", \"y\"> -> Spec<\"x\", \"y\"> on mesh {x: 4, y: 2}, shape [8, 3]: nothing to do\n");
  CHECK(sl::to_spec(sh<sl::Spec<"y", none, sl::partial_max<"x">>>, mesh).to_string() ==
        "Spec<\"y\", none, partial<max, \"x\">>");
  CHECK(sl::to_spec(sh<sl::Spec<sl::axes<"y", "x">, none>>, mesh).to_string() == "Spec<axes<\"y\", \"x\">, none>");
}
}
