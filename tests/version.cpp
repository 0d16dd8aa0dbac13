// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <shardlib/version.hpp>

#include <string>

TEST_SUITE("version") {
  TEST_CASE("version.hpp agrees with meson.build") {
    CHECK(std::string(SHARDLIB_VERSION_STRING) == SHARDLIB_MESON_VERSION);
    CHECK(std::to_string(shardlib::version_major) + "." + std::to_string(shardlib::version_minor) + "." +
              std::to_string(shardlib::version_patch) ==
          SHARDLIB_MESON_VERSION);
  }
}
