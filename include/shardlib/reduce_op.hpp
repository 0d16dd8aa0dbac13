// SPDX-License-Identifier: Apache-2.0
/// @file
/// `ReduceOp`: how values combine in a reduction, one enum for the whole library.
///
/// The same type names the op of a collective (`coll::Op`, an alias in collectives/types.hpp),
/// of a loop (`parallel_reduce<ReduceOp::max>(t, f)`) and of a partial spec's pending reduction
/// (`partial<ReduceOp::max, "model">`), so `sl::coll::Op::max` and `sl::ReduceOp::max` are the same
/// value. Partial clauses accept sum, max and min (spec.hpp); collectives and loops all four.
/// No dependencies: the specs (pure constexpr) and the collectives both include it.
#pragma once

#include <cstdint>
#include <string_view>

namespace shardlib {

/// How a reduction combines values: their sum, product, maximum or minimum.
enum class ReduceOp : std::uint8_t { sum, prod, max, min };

/// "sum", "prod", "max" or "min".
constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

}  // namespace shardlib
