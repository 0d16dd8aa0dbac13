// SPDX-License-Identifier: Apache-2.0
/// @file
/// shardlib's version (kept equal to meson.build's by tests/version.cpp).
#pragma once

#define SHARDLIB_VERSION_MAJOR 0
#define SHARDLIB_VERSION_MINOR 1
#define SHARDLIB_VERSION_PATCH 0
#define SHARDLIB_VERSION_STRING "0.1.0"

namespace shardlib {
inline constexpr int version_major = SHARDLIB_VERSION_MAJOR;
inline constexpr int version_minor = SHARDLIB_VERSION_MINOR;
inline constexpr int version_patch = SHARDLIB_VERSION_PATCH;
}  // namespace shardlib
