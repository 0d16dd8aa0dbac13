// SPDX-License-Identifier: Apache-2.0
// How doctest prints the values of failed comparisons that it cannot print by itself. They live
// here, not in the test sources: a test source may be compiled inside a namespace of its own
// (tests/unity.py), where a specialisation of doctest's template cannot be declared.
#pragma once

#include <doctest/doctest.h>
#include <shardlib/sharding/block.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace shardlib::test {
/// A box as text, from its fields alone (the oracle comparisons of tests/sharding/block.cpp use it
/// rather than the operator== under test).
inline std::string box_text(const ShardBox& b) {
  std::string s = "box{";
  for (int d = 0; d < b.rank; ++d)
    s += (d ? ", [" : "[") + std::to_string(b.offset[static_cast<std::size_t>(d)]) + " +" +
         std::to_string(b.extent[static_cast<std::size_t>(d)]) + ")";
  return s + "}";
}
}  // namespace shardlib::test

template <>
struct doctest::StringMaker<shardlib::ShardBox> {
  static doctest::String convert(const shardlib::ShardBox& b) { return shardlib::test::box_text(b).c_str(); }
};

/// A vector prints its elements (a failed comparison of two downloaded tensors).
template <class T>
struct doctest::StringMaker<std::vector<T>> {
  static doctest::String convert(const std::vector<T>& v) {
    std::string s = "[";
    for (std::size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(static_cast<double>(v[k]));
    return doctest::String((s + "]").c_str());
  }
};
