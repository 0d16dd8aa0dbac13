// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <shardlib/runtime/kokkos_scope.hpp>

TEST_SUITE("runtime") {
  TEST_CASE("the test main's KokkosScope initialised Kokkos; inner scopes leave it alone") {
    REQUIRE(Kokkos::is_initialized());
    {
      shardlib::KokkosScope inner;
      CHECK_FALSE(inner.owns_kokkos());
    }
    CHECK(Kokkos::is_initialized());  // the inner scope did not finalise
    CHECK_FALSE(shardlib::KokkosScope::execution_space_name().empty());
  }

  TEST_CASE("a kernel runs on the default execution space") {
    long long sum = 0;
    Kokkos::parallel_reduce(
        "shardlib_test_sum", Kokkos::RangePolicy<>(0, 1000), KOKKOS_LAMBDA(int i, long long& s) { s += i; }, sum);
    CHECK(sum == 999 * 1000 / 2);
  }
}
