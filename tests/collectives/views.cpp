// SPDX-License-Identifier: Apache-2.0
#include "harness.hpp"

#include <doctest/doctest.h>
#include <shardlib/collectives/views.hpp>

#include <vector>

namespace sl = shardlib;
using sl::coll::CollectiveError;
using sl::coll::Op;
using View = Kokkos::View<double*, Kokkos::HostSpace>;

TEST_SUITE("collectives_views") {
  TEST_CASE("collectives on Kokkos views") {
    sl::test::for_each_run([](sl::Context& ctx) {
      auto& c = ctx.world();
      const int n = c.size(), me = c.rank();
      View a("a", 3), g("g", 3 * static_cast<std::size_t>(n)), r("r", 3);
      for (int i = 0; i < 3; ++i) a(i) = me * 10 + i;
      sl::coll::all_gather(c, a, g);
      for (int p = 0; p < n; ++p)
        for (int i = 0; i < 3; ++i) REQUIRE(g(static_cast<std::size_t>(p * 3 + i)) == p * 10 + i);
      sl::coll::all_reduce(c, a, r, Op::max);
      for (int i = 0; i < 3; ++i) REQUIRE(r(i) == (n - 1) * 10 + i);
      sl::coll::reduce_scatter(c, g, r, Op::sum);  // every rank holds the same g
      for (int i = 0; i < 3; ++i) REQUIRE(r(i) == n * (me * 10 + i));
      sl::coll::all_reduce(c, a, Op::sum);
      for (int i = 0; i < 3; ++i) REQUIRE(a(i) == 10 * n * (n - 1) / 2 + n * i);
      View t("t", 2 * static_cast<std::size_t>(n)), u("u", 2 * static_cast<std::size_t>(n));
      for (int q = 0; q < n; ++q) t(static_cast<std::size_t>(2 * q)) = t(static_cast<std::size_t>(2 * q + 1)) = me * 100 + q;
      sl::coll::all_to_all(c, t, u);
      for (int p = 0; p < n; ++p) REQUIRE(u(static_cast<std::size_t>(2 * p)) == p * 100 + me);
      View b("b", 2);
      if (me == n - 1) b(0) = b(1) = 42;
      sl::coll::broadcast(c, b, n - 1);
      REQUIRE((b(0) == 42 && b(1) == 42));
      View s("s", 1), q("q", 1);
      s(0) = me;
      sl::coll::permute(c, s, (me + 1) % n, q, (me + n - 1) % n);
      REQUIRE(q(0) == (me + n - 1) % n);
      // Uneven: rank r gives r % 2 + 1 elements.
      std::vector<std::size_t> counts(static_cast<std::size_t>(n));
      std::size_t total = 0;
      for (int p = 0; p < n; ++p) total += counts[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p % 2 + 1);
      View mine("mine", counts[static_cast<std::size_t>(me)]), all("all", total);
      Kokkos::deep_copy(mine, me);
      sl::coll::all_gather(c, mine, all, counts);
      REQUIRE(all(total - 1) == n - 1);
    });
  }

  TEST_CASE("view extents and layouts are checked, with the labels in the message") {
    sl::Runtime::threads(2).spmd([](sl::Context& ctx) {
      auto& c = ctx.world();
      View a("a", 3), g("gathered", 5);
      CHECK_THROWS_WITH_AS(sl::coll::all_gather(c, a, g), doctest::Contains("receive view 'gathered' (5 elements) must hold 2 × send view 'a' (3 elements)"),
                           CollectiveError);
      View r("r", 4);
      CHECK_THROWS_WITH_AS(sl::coll::all_reduce(c, a, r, Op::sum), doctest::Contains("differ in size"), CollectiveError);
      CHECK_THROWS_WITH_AS(sl::coll::reduce_scatter(c, a, r, Op::sum), doctest::Contains("must hold 2 × receive view"),
                           CollectiveError);
      CHECK_THROWS_WITH_AS(sl::coll::all_to_all(c, a, a), doctest::Contains("divisible by the group size 2"), CollectiveError);
      Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> m("m", 4, 4);
      auto column = Kokkos::subview(m, Kokkos::ALL(), 1);  // stride 4: not contiguous
      CHECK_THROWS_WITH_AS(sl::coll::all_reduce(c, column, Op::sum), doctest::Contains("is not contiguous"), CollectiveError);
      std::size_t counts[2] = {3, 3};
      CHECK_THROWS_WITH_AS(sl::coll::all_gather(c, a, g, counts), doctest::Contains("do not match the block counts"),
                           CollectiveError);
    });
  }
}
