// SPDX-License-Identifier: Apache-2.0
// Shared helpers of the ops oracle tests (tests/ops/*.cpp): compile-time type lists to iterate
// over spec types, random meshes and shapes drawn identically on every device, operands whose
// partial addends are spread over their group, the one-device reference (a global array in
// double with plain index loops) and comparison with a tolerance.
//
// The pattern of a test:
//
//   sl::test::for_each_run([](sl::Context& ctx) {
//     auto rng = oracle::rng_for(ctx, 7);                        // same draws on every device
//     oracle::for_each_type(oracle::List<SpecA, SpecB>{}, [&](auto s) {
//       using S = typename decltype(s)::type;
//       const auto mesh = oracle::random_mesh<oracle::M2>(ctx, rng);
//       const auto shape = oracle::random_shape<2>(rng);
//       const auto a = oracle::operand<sl::DistributedTensor<float, oracle::M2, S>>(mesh, shape, 1);
//       const auto r = sl::exp(a);
//       const auto ra = oracle::host(a);                       // collective: all devices, same order
//       oracle::Ref<2> want(shape);
//       oracle::for_each_index(shape, [&](const auto& i) { want(i) = std::exp(ra(i)); });
//       oracle::expect_tensor(r, want, oracle::Tol::rel(1e-6), "exp");   // collective too
//     });
//   });
//
// Every function that calls `to_host` is collective (all devices call it, in the same order);
// the others are local. Checks go through doctest (thread-safe), naming the case in `what`.
#pragma once

#include <doctest/doctest.h>
#include <shardlib/tensor.hpp>

#include "../sharding/random.hpp"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib::test::oracle {

/// The mesh most op tests run on.
using M2 = Mesh<"x", "y">;
/// The spec types the op and gradient suites draw from: replicated, split along dim 0, along
/// dim 1, a grid (axes swapped), dim 0 over both axes.
namespace specs {
using Rep = Spec<none, none>;
using Rows = Spec<"x", none>;
using ColsY = Spec<none, "y">;
using Grid = Spec<"y", "x">;
using Both = Spec<axes<"x", "y">, none>;
}  // namespace specs
/// The generator of tests/sharding/random.hpp (`below(n)`, raw draws with `g()`).
using Rng = test::Rng;

// -- type lists ------------------------------------------------------------------------------------

/// A compile-time list of types (spec types, element types, ...).
template <class... Ts>
struct List {};

/// Calls `f(std::type_identity<T>{})` for each `T` of the list, in order. In the body:
/// `using S = typename decltype(tag)::type;`.
template <class... Ts, class F>
void for_each_type(List<Ts...>, F&& f) {
  (f(std::type_identity<Ts>{}), ...);
}

/// Calls `f(std::type_identity<A>{}, std::type_identity<B>{})` for every pair of the two lists
/// (|As| x |Bs| instantiations: keep the lists short).
template <class... As, class... Bs, class F>
void for_each_pair(List<As...>, List<Bs...> bs, F&& f) {
  (for_each_type(bs, [&](auto b) { f(std::type_identity<As>{}, b); }), ...);
}

// -- random draws (identical on every device for a seed) -------------------------------------------

/// A generator seeded from `seed` and the run's device count: every device draws the same values.
inline Rng rng_for(const Context& ctx, std::uint64_t seed) {
  return Rng{std::mt19937_64(seed * 1000003u + static_cast<std::uint64_t>(ctx.num_devices()))};
}

/// A random factorisation of the run's device count over the axes of `MeshT` (each axis size
/// divides what is left; the last takes the rest), bound to `ctx`. Over many draws every
/// factorisation appears (for 2 axes: each n = sx * sy).
template <class MeshT>
MeshT random_mesh(Context& ctx, Rng& rng) {
  constexpr std::size_t R = MeshT::rank;
  std::array<int, R> sizes{};
  int left = ctx.num_devices();
  for (std::size_t i = 0; i + 1 < R; ++i) {
    std::vector<int> divisors;
    for (int d = 1; d <= left; ++d)
      if (left % d == 0) divisors.push_back(d);
    sizes[i] = divisors[static_cast<std::size_t>(rng.below(static_cast<int>(divisors.size())))];
    left /= sizes[i];
  }
  sizes[R - 1] = left;
  return MeshT(ctx, sizes);
}

/// Random extents in [1, max_extent] (uneven over most meshes); with `allow_empty`, one draw in
/// eight is 0; one in six is 1 either way.
template <std::size_t R>
std::array<std::int64_t, R> random_shape(Rng& rng, int max_extent = 7, bool allow_empty = true) {
  std::array<std::int64_t, R> s{};
  for (auto& e : s) {
    const int k = rng.below(24);
    e = allow_empty && k < 3 ? 0 : k < 7 ? 1 : 1 + rng.below(max_extent);
  }
  return s;
}

// -- operands ----------------------------------------------------------------------------------------

namespace detail_ {
/// Calls `f(i, k)` for each element of the tensor's block: local index i, global linear index k.
template <class Tensor, class F>
void for_each_local(const Tensor& t, F&& f) {
  const ShardBox& b = t.block();
  const std::int64_t n = b.num_elements();
  for (std::int64_t i = 0; i < n; ++i) {
    std::array<std::int64_t, max_tensor_rank> idx{};
    std::int64_t rest = i, k = 0;
    for (int d = b.rank - 1; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      idx[u] = b.offset[u] + rest % b.extent[u];
      rest /= b.extent[u];
    }
    for (int d = 0; d < b.rank; ++d) k = k * t.shape()[static_cast<std::size_t>(d)] + idx[static_cast<std::size_t>(d)];
    f(i, k);
  }
}
inline std::uint64_t draw(std::int64_t k, std::uint64_t salt) {
  return detail::mix64(static_cast<std::uint64_t>(k) ^ detail::mix64(salt + 0x5eed));
}
}  // namespace detail_

/// Rewrites the block of a partial tensor so that its value is spread over the partial group
/// (local, no communication): `random`/`full` put a partial-sum value on coordinate 0 only and a
/// partial-max value on every device, which would hide a kernel that ignores other addends.
/// Partial sum: the device at group position p > 0 holds r, position 0 holds v - (g-1) r, r a
/// small integer drawn from the element and `salt` (exact for integers; floating-point values come
/// back within rounding: prefer operand(), which is exact). Partial max (min): a random owner
/// keeps v, the others hold v minus (plus) 1 to 3. For signed or floating-point element types; a
/// tensor that is not partial is left alone.
template <class Tensor>
void spread_partial(Tensor& t, std::uint64_t salt = 0) {
  using T = typename Tensor::value_type;
  constexpr Sharding s = Tensor::sharding;
  if constexpr (s.is_partial()) {
    const auto& mesh = t.mesh();
    const int g = mesh.group_size(s.partial);
    if (g == 1) return;
    const int p = mesh.group_rank(t.context().device(), s.partial);
    T* data = t.local().data();
    detail_::for_each_local(t, [&](std::int64_t i, std::int64_t k) {
      const std::uint64_t h = detail_::draw(k, salt);
      if constexpr (s.op == ReduceOp::sum) {
        const T r = static_cast<T>(static_cast<int>(h % 7) - 3);
        data[i] = p == 0 ? static_cast<T>(data[i] - static_cast<T>(g - 1) * r) : r;
      } else {
        const int owner = static_cast<int>(h % static_cast<std::uint64_t>(g));
        const T delta = static_cast<T>(1 + (h >> 8) % 3);
        if (p != owner) data[i] = s.op == ReduceOp::max ? static_cast<T>(data[i] - delta) : static_cast<T>(data[i] + delta);
      }
    });
  }
}

/// `Tensor::random(mesh, shape, seed, lo, hi)` with its partial addends spread over the partial
/// group: the same global tensor for a seed whatever the spec and mesh, and `to_host` gives it
/// back exactly. Floating-point partial sums: the mantissa bits of each value are cut into one
/// chunk per group member (which member holds which chunk varies by element), so the addends
/// sum exactly in any order; integer partial sums and partial max/min: spread_partial(t, seed).
/// No communication.
template <class Tensor>
Tensor operand(const typename Tensor::mesh_type& mesh, const typename Tensor::Shape& shape, std::uint64_t seed,
               typename Tensor::value_type lo = static_cast<typename Tensor::value_type>(-1),
               typename Tensor::value_type hi = static_cast<typename Tensor::value_type>(1)) {
  using T = typename Tensor::value_type;
  Tensor t = Tensor::random(mesh, shape, seed, lo, hi);
  constexpr Sharding s = Tensor::sharding;
  if constexpr (s.is_partial() && s.op == ReduceOp::sum && is_floating_v<T>) {
    const int g = mesh.group_size(s.partial);
    const int p = mesh.group_rank(t.context().device(), s.partial);
    constexpr int bits = std::numeric_limits<T>::digits;  // 24 (float), 53 (double), 11 (f16), 8 (bf16)
    T* data = t.local().data();
    detail_::for_each_local(t, [&](std::int64_t i, std::int64_t k) {
      const T v = detail::random_value<T>(seed, k, lo, hi);
      int e = 0;
      const double f = std::frexp(static_cast<double>(v), &e);             // |f| in [0.5, 1) or 0
      const auto m = static_cast<std::int64_t>(std::ldexp(std::abs(f), bits));  // exact, < 2^bits
      const int c = (p + static_cast<int>(detail_::draw(k, seed) % static_cast<std::uint64_t>(g))) % g;
      const int b0 = c * bits / g, b1 = (c + 1) * bits / g;
      const std::int64_t part = m & ((std::int64_t{1} << b1) - (std::int64_t{1} << b0));
      data[i] = static_cast<T>(std::ldexp(static_cast<double>(f < 0 ? -part : part), e - bits));
    });
  } else {
    spread_partial(t, seed);
  }
  return t;
}

// -- the one-device reference -----------------------------------------------------------------------

/// A multi-index of rank R.
template <std::size_t R>
using Idx = std::array<std::int64_t, R>;

/// Number of elements of `shape`.
template <std::size_t R>
std::int64_t count(const Idx<R>& shape) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  return n;
}

/// Row-major linear index of `i` in `shape`.
template <std::size_t R>
std::int64_t linear(const Idx<R>& shape, const Idx<R>& i) {
  std::int64_t k = 0;
  for (std::size_t d = 0; d < R; ++d) k = k * shape[d] + i[d];
  return k;
}

/// Calls `f(const Idx<R>&)` for every index of `shape`, row-major (none when an extent is 0; once
/// for rank 0).
template <std::size_t R, class F>
void for_each_index(const Idx<R>& shape, F&& f) {
  const std::int64_t n = count(shape);
  Idx<R> i{};
  for (std::int64_t k = 0; k < n; ++k) {
    f(static_cast<const Idx<R>&>(i));
    for (std::size_t d = R; d-- > 0;) {
      if (++i[d] < shape[d]) break;
      i[d] = 0;
    }
  }
}

/// A global tensor in double: shape and row-major values, indexed by Idx<R>.
template <std::size_t R>
struct Ref {
  Idx<R> shape{};
  std::vector<double> v;
  Ref() = default;
  /// Zeros of `shape`.
  explicit Ref(const Idx<R>& s) : shape(s), v(static_cast<std::size_t>(count(s)), 0.0) {}
  double& operator()(const Idx<R>& i) { return v[static_cast<std::size_t>(linear(shape, i))]; }
  double operator()(const Idx<R>& i) const { return v[static_cast<std::size_t>(linear(shape, i))]; }
  /// Numpy broadcasting read: `out` is an index of a rank-RO output this operand broadcasts
  /// against (dims aligned to the right; extent-1 dims read at 0).
  template <std::size_t RO>
  double bcast(const Idx<RO>& out) const {
    static_assert(RO >= R, "oracle::Ref::bcast: the output has a lower rank than the operand");
    Idx<R> i{};
    for (std::size_t d = 0; d < R; ++d) i[d] = shape[d] == 1 ? 0 : out[d + (RO - R)];
    return (*this)(i);
  }
};

/// The global tensor of `t` in double (collective: `to_host`, a partial tensor is reduced).
template <class Tensor>
Ref<Tensor::rank> host(const Tensor& t) {
  const auto values = t.to_host();
  Ref<Tensor::rank> r;
  for (std::size_t d = 0; d < Tensor::rank; ++d) r.shape[d] = t.shape()[d];
  r.v.assign(values.begin(), values.end());
  return r;
}

// -- comparison ---------------------------------------------------------------------------------------

/// Tolerance: |got - want| <= abs + rel * |want|. NaN matches NaN; infinities match themselves.
struct Tol {
  double rel_ = 0, abs_ = 0;
  /// Bit-exact (layout ops, integer results).
  static constexpr Tol exact() { return {0, 0}; }
  /// Relative `r`, with the same absolute floor (for values near 0).
  static constexpr Tol rel(double r) { return {r, r}; }
  /// Relative `r` and absolute `a`.
  static constexpr Tol rel_abs(double r, double a) { return {r, a}; }
};

/// Whether `got` matches `want` within `tol`.
inline bool close(double got, double want, Tol tol) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::abs(got - want) <= tol.abs_ + tol.rel_ * std::abs(want);
}

/// Checks `got` (row-major values of shape `want.shape`) against `want`; on a mismatch reports
/// one doctest failure naming `what`, the first bad multi-index, both values, and the number of
/// bad elements. Returns whether all matched. Local (no communication).
template <class T, std::size_t R>
bool expect_values(const std::vector<T>& got, const Ref<R>& want, Tol tol, const std::string& what) {
  if (got.size() != want.v.size()) {
    FAIL_CHECK(what << ": " << got.size() << " elements, expected " << want.v.size());
    return false;
  }
  std::size_t bad = 0, first = 0;
  for (std::size_t k = 0; k < got.size(); ++k)
    if (!close(static_cast<double>(got[k]), want.v[k], tol) && bad++ == 0) first = k;
  if (bad == 0) return true;
  std::ostringstream idx;
  std::size_t rest = first;
  Idx<R> i{};
  for (std::size_t d = R; d-- > 0;) {
    const auto e = static_cast<std::size_t>(want.shape[d]);
    i[d] = static_cast<std::int64_t>(rest % e);
    rest /= e;
  }
  idx << "[";
  for (std::size_t d = 0; d < R; ++d) idx << (d ? ", " : "") << i[d];
  idx << "]";
  std::ostringstream sh;
  sh << "[";
  for (std::size_t d = 0; d < R; ++d) sh << (d ? ", " : "") << want.shape[d];
  sh << "]";
  FAIL_CHECK(what << ": " << bad << " of " << got.size() << " elements differ; first at " << idx.str() << " of shape "
                  << sh.str() << ": got " << static_cast<double>(got[first]) << ", expected " << want.v[first]);
  return false;
}

/// expect_tensor's failure on a shape (out of line: one copy, not one per tensor type).
inline bool fail_shape(const std::string& what, detail::ArrayRef<std::int64_t> got, detail::ArrayRef<std::int64_t> want) {
  FAIL_CHECK(what << ": result shape " << detail::shape_text(got) << ", expected " << detail::shape_text(want));
  return false;
}

/// Checks a tensor against the reference: its shape, then its global values (collective:
/// `to_host`). `what` should name the op, the specs, the mesh and the shapes (see describe()).
template <class Tensor, std::size_t R>
bool expect_tensor(const Tensor& t, const Ref<R>& want, Tol tol, const std::string& what) {
  static_assert(Tensor::rank == R, "oracle::expect_tensor: the reference has another rank than the tensor");
  bool same_shape = true;
  for (std::size_t d = 0; d < R; ++d) same_shape = same_shape && t.shape()[d] == want.shape[d];
  const auto values = t.to_host();  // before any early return: collective
  if (!same_shape) return fail_shape(what, t.shape(), want.shape);
  return expect_values(values, want, tol, what);
}

/// "[3, 5] with Spec<"x", none>": describe()'s text of one tensor (not a template: compiled once,
/// not once per tensor type).
inline std::string describe_one(detail::ArrayRef<std::int64_t> shape, const std::string& spec) {
  return detail::shape_text(shape) + " with " + spec;
}
/// "[3, 5] with Spec<"x", none>" for each tensor, then the mesh: for `what` texts.
template <class Tensor, class... Tensors>
std::string describe(const Tensor& t, const Tensors&... ts) {
  std::string s = describe_one(t.shape(), t.spec_string());
  ((s += "; " + describe_one(ts.shape(), ts.spec_string())), ...);
  return s + " on mesh " + t.mesh().to_string();
}

}  // namespace shardlib::test::oracle
