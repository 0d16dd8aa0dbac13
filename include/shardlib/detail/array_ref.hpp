// SPDX-License-Identifier: Apache-2.0
/// @file
/// A read-only view of contiguous values for constexpr interfaces. std::span would do, but
/// nvcc 13's front end treats libstdc++ 12's std::span destructor as non-constexpr, so a
/// std::span parameter breaks constant evaluation under nvcc.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <vector>

namespace shardlib::detail {

template <class T>
class ArrayRef {
 public:
  constexpr ArrayRef() = default;
  constexpr ArrayRef(const T* data, std::size_t size) : data_(data), size_(size) {}
  template <std::size_t N>
  constexpr ArrayRef(const std::array<T, N>& a) : data_(a.data()), size_(N) {}  // NOLINT
  template <std::size_t N>
  constexpr ArrayRef(const T (&a)[N]) : data_(a), size_(N) {}  // NOLINT
  // For parameters only (`MeshShape({"data", "model"}, {4, 2})`): the list lives until the end of
  // the full expression, as long as the call. g++ warns on every such constructor; silenced here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
#endif
  constexpr ArrayRef(std::initializer_list<T> l) : data_(l.begin()), size_(l.size()) {}  // NOLINT
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  constexpr ArrayRef(const std::vector<T>& v) : data_(v.data()), size_(v.size()) {}  // NOLINT

  constexpr const T* begin() const noexcept { return data_; }
  constexpr const T* end() const noexcept { return data_ + size_; }
  constexpr const T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr const T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  const T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace shardlib::detail
