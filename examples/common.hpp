// SPDX-License-Identifier: Apache-2.0
// Shared by the examples: command-line values (`--name value`) and mesh sizes.
#pragma once

#include <array>
#include <cstdlib>
#include <cstring>
#include <string>

namespace example {

/// The number after `name` on the command line, or `fallback`.
inline long long arg(int argc, char** argv, const char* name, long long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

/// The text after `name` on the command line, or `fallback`.
inline std::string arg_text(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

/// Two mesh sizes whose product is `devices`, as square as they come (8 -> {4, 2}, 6 -> {3, 2}).
inline std::array<int, 2> square_mesh(int devices) {
  int b = 1;
  for (int d = 1; d * d <= devices; ++d)
    if (devices % d == 0) b = d;
  return {devices / b, b};
}

}  // namespace example
