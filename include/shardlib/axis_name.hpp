// SPDX-License-Identifier: Apache-2.0
/// @file
/// Mesh axis names: fixed-capacity strings usable as template arguments.
///
/// `Mesh<"data", "model">` and `Spec<"data", none>` take their axis names as class-type
/// template arguments; `AxisName` is that type. It is also the plain value the sharding
/// rules compare, so the same name works at compile time and at run time.
#pragma once

#include <shardlib/detail/text.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace shardlib {

/// Longest axis name, in characters.
inline constexpr std::size_t max_axis_name_length = 31;
/// Most axes a mesh may have (and so most axes one tensor dim may be split over).
inline constexpr std::size_t max_mesh_rank = 8;
/// Most dims a tensor may have.
inline constexpr std::size_t max_tensor_rank = 8;

namespace detail {
/// Characters allowed in an axis name: letters, digits, '_', '.', '-'.
/// (',' and ':' are reserved: they separate names inside spec entries.)
constexpr bool is_axis_name_char(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '.' || c == '-';
}

// Named errors for constant evaluation: reaching one of these non-constexpr functions while
// building a template argument stops compilation, and the compiler quotes its name.
[[noreturn]] inline void axis_name_may_only_use_letters_digits_underscore_dot_or_dash() {
  throw std::invalid_argument(
      "shardlib: an axis name may only use letters, digits, '_', '.' and '-'");
}
}  // namespace detail

/// A mesh axis name: 1 to `max_axis_name_length` characters of [A-Za-z0-9_.-].
///
/// A structural type with one member (a null-padded char array), so it is a valid class-type
/// template argument under g++, clang and nvcc. String literals convert implicitly and are
/// checked at compile time; `AxisName::from` checks a run-time string and throws.
struct AxisName {
  char chars[max_axis_name_length + 1]{};

  constexpr AxisName() = default;

  /// From a string literal (or, under nvcc, the member array itself). Empty or too long
  /// names fail to compile; a reserved character stops compilation naming the rule.
  template <std::size_t N>
  constexpr AxisName(const char (&s)[N]) {  // NOLINT(google-explicit-constructor)
    static_assert(N >= 2, "shardlib: an axis name must not be empty");
    static_assert(N <= max_axis_name_length + 1,
                  "shardlib: axis name longer than shardlib::max_axis_name_length (31) characters");
    // Stops at the first NUL: nvcc hands the whole null-padded member array back to this
    // constructor when it re-emits a template argument (N == max_axis_name_length + 1).
    for (std::size_t i = 0; i + 1 < N && s[i] != '\0'; ++i) {
      if (!detail::is_axis_name_char(s[i]))
        detail::axis_name_may_only_use_letters_digits_underscore_dot_or_dash();
      chars[i] = s[i];
    }
  }

  /// From a run-time string; throws std::invalid_argument naming the string when it is empty,
  /// too long or uses a reserved character.
  static constexpr AxisName from(std::string_view s) {
    if (s.empty()) throw std::invalid_argument("shardlib: an axis name must not be empty");
    if (s.size() > max_axis_name_length)
      throw std::invalid_argument("shardlib: axis name '" + std::string(s) + "' is longer than " +
                                  detail::to_text(max_axis_name_length) + " characters");
    AxisName a;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (!detail::is_axis_name_char(s[i]))
        throw std::invalid_argument("shardlib: axis name '" + std::string(s) +
                                    "' may only use letters, digits, '_', '.' and '-'");
      a.chars[i] = s[i];
    }
    return a;
  }

  constexpr std::size_t size() const noexcept {
    std::size_t n = 0;
    while (n < max_axis_name_length && chars[n] != '\0') ++n;
    return n;
  }
  constexpr bool empty() const noexcept { return chars[0] == '\0'; }
  constexpr std::string_view view() const noexcept { return {chars, size()}; }
  constexpr std::string str() const { return std::string(view()); }

  friend constexpr bool operator==(const AxisName& a, const AxisName& b) noexcept {
    for (std::size_t i = 0; i <= max_axis_name_length; ++i)
      if (a.chars[i] != b.chars[i]) return false;
    return true;
  }
};

}  // namespace shardlib
