// SPDX-License-Identifier: Apache-2.0
/// @file
/// constexpr text helpers for error messages (std::to_string is not constexpr in C++20).
#pragma once

#include <string>

namespace shardlib::detail {

/// Decimal text of `v`, usable in constant evaluation.
constexpr std::string to_text(long long v) {
  if (v == 0) return "0";
  bool neg = v < 0;
  unsigned long long u = neg ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
  std::string s;
  while (u) {
    s.insert(s.begin(), static_cast<char>('0' + u % 10));
    u /= 10;
  }
  if (neg) s.insert(s.begin(), '-');
  return s;
}

}  // namespace shardlib::detail
