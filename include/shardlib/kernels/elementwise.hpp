// SPDX-License-Identifier: Apache-2.0
/// @file
/// Elementwise kernel on one shard: `out[i] = f(in0[i], in1[i], ...)` over a row-major box, each
/// input read through its own strides (0 along a broadcast dim), so a bias row, a block of a
/// larger replicated operand or an operand of lower rank needs no copy.
///
/// On host execution spaces, a functor with an Eigen array form (kernels/vmath.hpp) over float or
/// double operands laid out as the output runs vectorised, a chunk of `vmath::chunk` elements per
/// work item; everything else runs the scalar functor per element.
///
/// Knows nothing of tensors or collectives: raw pointers, extents, an execution-space instance.
#pragma once

#include <shardlib/kernels/vmath.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace shardlib::kernels {

/// An input of an elementwise kernel: element `i` (a multi-index of the output box) is at
/// `data[sum_d i[d] * stride[d]]`; stride 0 broadcasts along that dim.
template <class T, std::size_t R>
struct Strided {
  const T* data = nullptr;
  std::array<std::int64_t, R> stride{};
};

/// Row-major strides of a box of `extent`.
template <std::size_t R>
constexpr std::array<std::int64_t, R> row_major_strides(const std::array<std::int64_t, R>& extent) noexcept {
  std::array<std::int64_t, R> s{};
  std::int64_t n = 1;
  for (std::size_t d = R; d-- > 0;) {
    s[d] = n;
    n *= extent[d];
  }
  return s;
}

namespace detail {
template <class Exec, class Out, std::size_t R, class F, std::size_t... I, class... In>
void elementwise_strided(const Exec& exec, Out* out, const std::array<std::int64_t, R>& extent, std::int64_t rows,
                         F f, std::index_sequence<I...>, const Strided<In, R>&... in) {
  // One work item per row of the last dim: decompose the row index once, then stride along it.
  const std::int64_t len = extent[R - 1];
  Kokkos::parallel_for("shardlib::elementwise_strided", Kokkos::RangePolicy<Exec>(exec, 0, rows),
                       [=](std::int64_t row) {
                         std::int64_t rest = row;
                         std::array<std::int64_t, sizeof...(In)> base{};
                         for (std::size_t d = R - 1; d-- > 0;) {
                           const std::int64_t i = rest % extent[d];
                           rest /= extent[d];
                           ((base[I] += i * in.stride[d]), ...);
                         }
                         Out* o = out + row * len;
                         for (std::int64_t j = 0; j < len; ++j) o[j] = f(in.data[base[I] + j * in.stride[R - 1]]...);
                       });
}
}  // namespace detail

/// `out` (row-major over `extent`) = `f(inputs...)` elementwise. Inputs laid out exactly as the
/// output take one flat loop; others walk rows of the last dim with their strides.
template <class Exec, class Out, std::size_t R, class F, class... In>
void elementwise(const Exec& exec, Out* out, const std::array<std::int64_t, R>& extent, F f,
                 const Strided<In, R>&... in) {
  std::int64_t n = 1;
  for (auto e : extent) n *= e;
  if (n == 0) return;
  const auto dense = row_major_strides(extent);
  if constexpr (vmath::is_host_v<Exec> && vmath::Vectorizable<F, Out, In...>) {
    if (((in.stride == dense) && ...)) {
      const std::int64_t chunks = (n + vmath::chunk - 1) / vmath::chunk;
      Kokkos::parallel_for("shardlib::elementwise(vector)", Kokkos::RangePolicy<Exec>(exec, 0, chunks), [=](std::int64_t c) {
        const std::int64_t b = c * vmath::chunk, len = n - b < vmath::chunk ? n - b : vmath::chunk;
        vmath::Run<Out>(out + b, len) = f.array(vmath::ConstRun<In>(in.data + b, len)...);
      });
      exec.fence();
      return;
    }
  }
  if (((in.stride == dense) && ...)) {
    Kokkos::parallel_for("shardlib::elementwise", Kokkos::RangePolicy<Exec>(exec, 0, n),
                         [=](std::int64_t k) { out[k] = f(in.data[k]...); });
  } else if constexpr (R == 0) {
    out[0] = f(in.data[0]...);
  } else {
    detail::elementwise_strided(exec, out, extent, n / extent[R - 1], f, std::index_sequence_for<In...>{}, in...);
  }
  exec.fence();
}

}  // namespace shardlib::kernels
