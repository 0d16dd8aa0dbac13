// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <shardlib/axis_name.hpp>

#include <string>

namespace sl = shardlib;

TEST_SUITE("axis_name") {
  TEST_CASE("literals convert at compile time") {
    constexpr sl::AxisName a = "data";
    static_assert(a.size() == 4);
    static_assert(a.view() == "data");
    static_assert(a == sl::AxisName("data"));
    static_assert(!(a == sl::AxisName("model")));
    constexpr sl::AxisName longest = "a234567890123456789012345678901";  // 31 characters
    static_assert(longest.size() == sl::max_axis_name_length);
    static_assert(sl::AxisName("x.y-z_0").size() == 7);
    CHECK(a.str() == "data");
  }

  TEST_CASE("from() checks run-time names and says which") {
    CHECK(sl::AxisName::from("model") == sl::AxisName("model"));
    static_assert(sl::AxisName::from("tp") == sl::AxisName("tp"));
    CHECK_THROWS_WITH_AS(sl::AxisName::from(""), "shardlib: an axis name must not be empty", std::invalid_argument);
    std::string too_long(sl::max_axis_name_length + 1, 'x');
    CHECK_THROWS_WITH_AS(sl::AxisName::from(too_long),
                         doctest::Contains(("axis name '" + too_long + "' is longer than 31 characters").c_str()),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::AxisName::from("da,ta"), doctest::Contains("'da,ta' may only use letters"),
                         std::invalid_argument);
    CHECK_THROWS_AS(sl::AxisName::from("a b"), std::invalid_argument);
    CHECK_THROWS_AS(sl::AxisName::from("a:b"), std::invalid_argument);
  }
}
