// SPDX-License-Identifier: Apache-2.0
/// @file
/// Compile-time errors that name what is wrong (the {fmt} / mp-units technique): an error is
/// a deliberately undefined class template in `shardlib::error` whose name reads as a sentence
/// and whose arguments are the offending axis, spec or mesh. Asking for its size stops the
/// build and the compiler quotes it, e.g.
///   invalid application of 'sizeof' to incomplete type
///   'shardlib::error::axis_is_not_in_the_mesh<shardlib::AxisName{"pipe"}, ...>'
#pragma once

namespace shardlib::detail {

/// `require<Ok, Error>::value` is true when `Ok`; otherwise instantiating it names `Error`.
template <bool Ok, class Error>
struct require {
  static constexpr bool value = true;
};
template <class Error>
struct require<false, Error> {
  static constexpr bool value = sizeof(Error) != 0;  // Error is incomplete: the build stops here
};

}  // namespace shardlib::detail

/// Stops compilation unless `cond`, with two messages: `message` (a sentence) and the name of
/// the error type given last (which quotes the offending axis, spec or mesh).
#define SHARDLIB_STATIC_REQUIRE(cond, message, ...)                                  \
  static_assert(::shardlib::detail::require<(cond), __VA_ARGS__>::value, message); \
  static_assert(cond, message)
