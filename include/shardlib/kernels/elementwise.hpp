// SPDX-License-Identifier: Apache-2.0
/// @file
/// Elementwise kernel on one shard: `out[i] = f(in0[i], in1[i], ...)` over a row-major box, each
/// input read through its own strides (0 along a broadcast dim), so a bias row, a block of a
/// larger replicated operand or an operand of lower rank needs no copy.
///
/// On host execution spaces, a functor with an Eigen array form (kernels/vmath.hpp) over float or
/// double operands laid out as the output runs vectorised, a chunk of `vmath::chunk` elements per
/// work item, every element through whole packets (vmath::assign_packets: a value's result does not
/// depend on where a shard or chunk starts); everything else runs the scalar functor per element. On a GPU, operands laid out as
/// the output are read and written 16 bytes per load and store where their pointers allow.
///
/// Knows nothing of tensors or collectives: raw pointers, extents, an execution-space instance.
#pragma once

#include <shardlib/detail/attributes.hpp>
SHARDLIB_SIMD_WARNINGS_OFF  // (g++ 12 under -march=native: detail/attributes.hpp)

#include <shardlib/detail/attributes.hpp>
#include <shardlib/detail/pack.hpp>
#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/vmath.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
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
using shardlib::detail::get;
using shardlib::detail::Pack;

/// `out[k] = f(in[k]...)`, inputs laid out as the output: a named functor, so that it also runs on
/// a GPU (nvcc cannot name an extended lambda in every template that calls it). The form host
/// instances use (`Device` false: f may be host-only; nvcc warns) and the one device instances
/// use (f must run on the GPU: calling host code is an error).
template <bool Device, class Out, class F, class P, std::size_t... I>
struct FlatKernel {
  Out* out;
  F f;
  P in;  // Pack<const In*...>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t k) const { out[k] = f(get<I>(in)[k]...); }
};

/// RowsKernel's walk: the output box and each input's strides; `start` decomposes a row index
/// once into each input's offset.
template <std::size_t R, std::size_t N, std::size_t... I>
struct RowsWalk {
  std::int64_t extent[R];                     // the output box
  std::int64_t stride[N > 0 ? N : 1][R];      // stride[i][d]: input i along dim d
  KOKKOS_FORCEINLINE_FUNCTION void start(std::int64_t row, std::int64_t (&base)[N > 0 ? N : 1]) const {
    std::int64_t rest = row;
    for (std::size_t d = R - 1; d-- > 0;) {
      const std::int64_t i = rest % extent[d];
      rest /= extent[d];
      ((base[I] += i * stride[I][d]), ...);
    }
  }
};

/// One row of the last dim per work item: the row index decomposed once, then each input strided
/// along the row (stride 0 broadcasts). Host and device forms as FlatKernel's.
template <bool Device, class Out, std::size_t R, class F, class P, std::size_t... I>
struct RowsKernel {
  static constexpr std::size_t N = sizeof...(I);
  Out* out;
  F f;
  P in;  // Pack<const In*...>
  RowsWalk<R, N, I...> w;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t row) const {
    std::int64_t base[N > 0 ? N : 1] = {};
    w.start(row, base);
    Out* o = out + row * w.extent[R - 1];
    for (std::int64_t j = 0; j < w.extent[R - 1]; ++j) o[j] = f(get<I>(in)[base[I] + j * w.stride[I][R - 1]]...);
  }
};

/// Elements per GPU thread in FlatKernel's device form.
inline constexpr int flat_per_thread = 4;

SHARDLIB_DEVICE_FUNCTORS_BEGIN
/// The device form: work item i computes elements i, i + items, ... (flat_per_thread of them), all
/// loaded before any is stored, so each thread has several loads in flight and neighbouring
/// threads still touch neighbouring elements. One element per thread left an H200 at 20 to 60 %
/// of its copy bandwidth (ncu: 41 % achieved occupancy, the memory system 22 % busy).
template <class Out, class F, class P, std::size_t... I>
struct FlatKernel<true, Out, F, P, I...> {
  Out* out;
  F f;
  P in;
  std::int64_t n, items;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t i) const {
    Out v[flat_per_thread];
    for (int j = 0; j < flat_per_thread; ++j) {
      const std::int64_t k = i + j * items;
      if (k < n) v[j] = f(get<I>(in)[k]...);
    }
    for (int j = 0; j < flat_per_thread; ++j) {
      const std::int64_t k = i + j * items;
      if (k < n) out[k] = v[j];
    }
  }
};
template <class Out, std::size_t R, class F, class P, std::size_t... I>
struct RowsKernel<true, Out, R, F, P, I...> {
  static constexpr std::size_t N = sizeof...(I);
  Out* out;
  F f;
  P in;
  RowsWalk<R, N, I...> w;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t row) const {
    std::int64_t base[N > 0 ? N : 1] = {};
    w.start(row, base);
    Out* o = out + row * w.extent[R - 1];
    for (std::int64_t j = 0; j < w.extent[R - 1]; ++j) o[j] = f(get<I>(in)[base[I] + j * w.stride[I][R - 1]]...);
  }
};

/// The GPU's strided (broadcasting) form for rows of 32 elements and more: a team of threads per
/// row, striding along it (neighbouring threads touch neighbouring elements), the row index
/// decomposed once per team. RowsKernel's device form gives a row to one thread, whose loads are a
/// row apart across the warp: `layer_norm(x) * g + b` of bf16 [8192, 768] took 290 us on an H100
/// against about 13 us of memory traffic (issue 40). The tests run it on host instances too.
template <class Out, std::size_t R, class F, class P, std::size_t... I>
struct RowsTeamKernel {
  static constexpr std::size_t N = sizeof...(I);
  Out* out;
  F f;
  P in;
  RowsWalk<R, N, I...> w;
  template <class Member>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t row = team.league_rank();
    std::int64_t base[N > 0 ? N : 1] = {};
    w.start(row, base);
    Out* o = out + row * w.extent[R - 1];
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, w.extent[R - 1]),
                         [&](std::int64_t j) { o[j] = f(get<I>(in)[base[I] + j * w.stride[I][R - 1]]...); });
  }
};

/// `V` elements of T in one aligned load or store (`sizeof(T) * V` bytes, a power of two).
template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};
/// Each input's vector of V elements at element k.
template <int V>
KOKKOS_FORCEINLINE_FUNCTION Pack<> load_vectors(const Pack<>&, std::int64_t) { return {}; }
template <int V, class H, class... Ts>
KOKKOS_FORCEINLINE_FUNCTION Pack<Vec<H, V>, Vec<Ts, V>...> load_vectors(const Pack<const H*, const Ts*...>& p, std::int64_t k) {
  return {*reinterpret_cast<const Vec<H, V>*>(p.head + k), load_vectors<V>(p.rest, k)};
}

/// The vectorised device form: work item i loads V consecutive elements of each input with one
/// aligned load (16 bytes for the widest type) and stores V outputs with one; the item past the
/// last whole vector does the n % V left. 16-bit elements one per load left an H200 at 0.58 of
/// its copy bandwidth for bf16 `a + b` (FlatKernel's 4 per thread move 8 bytes of each input).
template <int V, class Out, class F, class P, std::size_t... I>
struct VectorKernel {
  Out* out;
  F f;
  P in;  // Pack<const In*...>, each aligned to V of its elements
  std::int64_t n, vectors;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t i) const {
    if (i < vectors) {
      const std::int64_t k = i * V;
      const auto x = load_vectors<V>(in, k);
      Vec<Out, V> y;
      for (int j = 0; j < V; ++j) y.v[j] = f(get<I>(x).v[j]...);
      *reinterpret_cast<Vec<Out, V>*>(out + k) = y;
    } else {
      for (std::int64_t k = vectors * V; k < n; ++k) out[k] = f(get<I>(in)[k]...);
    }
  }
};
SHARDLIB_DEVICE_FUNCTORS_END

/// Elements per vector for these element types: 16 bytes of the widest (8 bf16, 4 float, 2
/// double); 1 (no vectors) when a size is not a power of two up to 16 bytes.
template <class... Ts>
inline constexpr int vector_width = [] {
  std::size_t widest = 1;
  for (std::size_t s : {sizeof(Ts)...}) {
    if (s > 16 || (s & (s - 1)) != 0) return 1;
    widest = s > widest ? s : widest;
  }
  return static_cast<int>(16 / widest);
}();

/// Whether `p` is aligned to `bytes`.
inline bool aligned_to(const void* p, std::size_t bytes) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

/// `out[k] = f(in[k]...)` for k < n with VectorKernel, when the element types have vectors and
/// every pointer is aligned to its vector; false (nothing launched) otherwise. The GPU's dense
/// elementwise path; the tests run it on host instances too.
template <class Exec, class Out, class F, class... In>
bool elementwise_vectors(const Exec& exec, Out* out, std::int64_t n, F f, const In*... in) {
  constexpr int V = vector_width<Out, In...>;
  if constexpr (V < 2) {
    return false;
  } else {
    if (!aligned_to(out, sizeof(Out) * V) || !(aligned_to(in, sizeof(In) * V) && ...)) return false;
    const std::int64_t vectors = n / V, items = vectors + (n % V != 0 ? 1 : 0);
    Kokkos::parallel_for("shardlib::elementwise(vector)", Kokkos::RangePolicy<Exec>(exec, 0, items),
                         [&]<std::size_t... I>(std::index_sequence<I...>) {
                           return VectorKernel<V, Out, F, Pack<const In*...>, I...>{out, f, shardlib::detail::pack(in...), n,
                                                                                     vectors};
                         }(std::index_sequence_for<In...>{}));
    if constexpr (is_host_exec_v<Exec>) kernels::fence(exec);
    return true;
  }
}

/// The strided walk with a team per row (RowsTeamKernel), on any instance: teams of 32 to 256 GPU
/// threads (one on a host instance).
template <class Exec, class Out, std::size_t R, class F, std::size_t... I, class... In>
void elementwise_strided_teams(const Exec& exec, Out* out, const std::array<std::int64_t, R>& extent, std::int64_t rows,
                               F f, std::index_sequence<I...>, const Strided<In, R>&... in) {
  RowsTeamKernel<Out, R, F, Pack<const In*...>, I...> k{out, f, shardlib::detail::pack(in.data...), {}};
  for (std::size_t d = 0; d < R; ++d) {
    k.w.extent[d] = extent[d];
    ((k.w.stride[I][d] = in.stride[d]), ...);
  }
  const int team = row_team_size<Exec>(extent[R - 1]);
  Kokkos::parallel_for("shardlib::elementwise_strided(team)", Kokkos::TeamPolicy<Exec>(exec, static_cast<int>(rows), team), k);
  if constexpr (is_host_exec_v<Exec>) kernels::fence(exec);
}

template <class Exec, class Out, std::size_t R, class F, std::size_t... I, class... In>
void elementwise_strided(const Exec& exec, Out* out, const std::array<std::int64_t, R>& extent, std::int64_t rows,
                         F f, std::index_sequence<I...> seq, const Strided<In, R>&... in) {
  if constexpr (!is_host_exec_v<Exec>) {
    if (extent[R - 1] >= 32 && rows <= std::numeric_limits<int>::max())
      return elementwise_strided_teams(exec, out, extent, rows, f, seq, in...);
  }
  RowsKernel<!is_host_exec_v<Exec>, Out, R, F, Pack<const In*...>, I...> k{out, f, shardlib::detail::pack(in.data...), {}};
  for (std::size_t d = 0; d < R; ++d) {
    k.w.extent[d] = extent[d];
    ((k.w.stride[I][d] = in.stride[d]), ...);
  }
  Kokkos::parallel_for("shardlib::elementwise_strided", Kokkos::RangePolicy<Exec>(exec, 0, rows), k);
}

/// The bytes of input `in` an elementwise kernel over `extent` reads, each element once: a
/// broadcast (stride-0) dim reads one.
template <class In, std::size_t R>
std::uint64_t read_bytes(const Strided<In, R>& in, const std::array<std::int64_t, R>& extent) noexcept {
  std::uint64_t bytes = sizeof(In);
  for (std::size_t d = 0; d != R; ++d)  // != R: nvcc warns of d < 0 for R = 0
    if (in.stride[d] != 0) bytes *= static_cast<std::uint64_t>(extent[d]);
  return bytes;
}
}  // namespace detail

/// `out` (row-major over `extent`) = `f(inputs...)` elementwise. Inputs laid out exactly as the
/// output take one flat loop; others walk rows of the last dim with their strides. On a host
/// execution space it returns when `out` is written; on a device one (a GPU stream) the kernel
/// is queued on `exec` and it returns at once (`f` then runs on the GPU: its operator() must be
/// KOKKOS_INLINE_FUNCTION, as fn::'s are).
template <class Exec, class Out, std::size_t R, class F, class... In>
void elementwise(const Exec& exec, Out* out, const std::array<std::int64_t, R>& extent, F f,
                 const Strided<In, R>&... in) {
  std::int64_t n = 1;
  for (auto e : extent) n *= e;
  if (n == 0) return;
  count_kernel(static_cast<std::uint64_t>(n) * sizeof(Out) +
               (std::uint64_t{0} + ... + detail::read_bytes(in, extent)));  // out written, each input read once
  if (shardlib::shape_only()) return;
  const auto dense = row_major_strides(extent);
  if constexpr (is_host_exec_v<Exec> && vmath::Vectorizable<F, Out, In...>) {
    if (((in.stride == dense) && ...)) {
      const std::int64_t chunks = (n + vmath::chunk - 1) / vmath::chunk;
      Kokkos::parallel_for("shardlib::elementwise(vector)", Kokkos::RangePolicy<Exec>(exec, 0, chunks), [=](std::int64_t c) {
        const std::int64_t b = c * vmath::chunk, len = n - b < vmath::chunk ? n - b : vmath::chunk;
        vmath::assign_packets(out + b, len, [&f](const auto&... x) { return f.array(x...); }, (in.data + b)...);
      });
      kernels::fence(exec);
      return;
    }
  }
  if (((in.stride == dense) && ...)) {
    if constexpr (is_host_exec_v<Exec>) {
      Kokkos::parallel_for("shardlib::elementwise", Kokkos::RangePolicy<Exec>(exec, 0, n),
                           [&]<std::size_t... I>(std::index_sequence<I...>) {
                             return detail::FlatKernel<false, Out, F, shardlib::detail::Pack<const In*...>, I...>{
                                 out, f, shardlib::detail::pack(in.data...)};
                           }(std::index_sequence_for<In...>{}));
    } else if (!detail::elementwise_vectors(exec, out, n, f, in.data...)) {  // unaligned: element loads
      const std::int64_t items = (n + detail::flat_per_thread - 1) / detail::flat_per_thread;
      Kokkos::parallel_for("shardlib::elementwise", Kokkos::RangePolicy<Exec>(exec, 0, items),
                           [&]<std::size_t... I>(std::index_sequence<I...>) {
                             return detail::FlatKernel<true, Out, F, shardlib::detail::Pack<const In*...>, I...>{
                                 out, f, shardlib::detail::pack(in.data...), n, items};
                           }(std::index_sequence_for<In...>{}));
    }
  } else if constexpr (R > 0) {  // (a rank-0 box has no strides: always dense)
    detail::elementwise_strided(exec, out, extent, n / extent[R - 1], f, std::index_sequence_for<In...>{}, in...);
  }
  if constexpr (is_host_exec_v<Exec>) kernels::fence(exec);
}

}  // namespace shardlib::kernels

SHARDLIB_SIMD_WARNINGS_ON
