// SPDX-License-Identifier: Apache-2.0
// Command-line values for the examples: `--name value`.
#pragma once

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

}  // namespace example
