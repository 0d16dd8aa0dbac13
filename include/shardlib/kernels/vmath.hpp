// SPDX-License-Identifier: Apache-2.0
/// @file
/// Vectorised math on contiguous runs of host memory, through Eigen's packet math (the
/// `Eigen::Array` expressions: exp, log, tanh, erf, logistic, ... evaluated a SIMD packet at a
/// time, one fused loop per expression).
///
/// Why Eigen's: measured on 2 M floats (AMD EPYC Zen 5), exact-erf GELU costs 19 ns per element
/// with glibc's scalar `erff`, 1.8 ns with Eigen at the default flags (SSE2 packets), 0.89 ns with
/// glibc's libmvec AVX-512 `erff` and 0.39 ns with Eigen at `-march=native` (AVX-512 packets:
/// 51 % of the copy bandwidth); tanh 18.3 / 1.44 / 0.51 / 0.31 ns. The instruction set is the
/// compiler's: build with `-march=native` (or `-mavx512f`, `-mavx2 -mfma`) for the wide packets;
/// `Runtime::describe()` says which ones a build uses (`simd_in_use()`).
///
/// Accuracy: within a few float32 ulps of the scalar functions over the whole range, with the
/// same infinities and NaNs (tests/kernels/vmath.cpp checks every op against its scalar form).
/// Results below the smallest normal number may differ (a subnormal where the scalar form gives 0,
/// or the reverse), so a product of such a result with an infinity can be inf where the scalar
/// form gives NaN. Float exp is shardlib's own (detail::pexp_float: Eigen's
/// polynomial with an exact 2^n, 1.3-2x as fast), exactly 0 at -inf.
/// Double has Eigen's packets where Eigen has them (exp, log, tanh, ...), the scalar function
/// inside the same loop elsewhere (erf). sqrt keeps the scalar path: Eigen's fast packet sqrt is
/// an estimate refined by Newton steps (a few ulps off, and +inf for a negative subnormal).
///
/// A functor opts in by a member `array(x...)` that builds the Eigen expression of its scalar
/// `operator()` (see fn:: in ops/elementwise.hpp): kernels use it on host execution spaces for
/// float and double; every other case (device spaces, other types, user functors) runs the
/// scalar `operator()`.
#pragma once

#include <shardlib/detail/attributes.hpp>
SHARDLIB_SIMD_WARNINGS_OFF  // (g++ 12 under -march=native: detail/attributes.hpp)

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include <Kokkos_Core.hpp>

#include <shardlib/kernels/exec.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#if !defined(SHARDLIB_NO_LIBMVEC) && defined(__x86_64__) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35)) && !defined(__CUDA_ARCH__) && defined(__SSE2__)
#define SHARDLIB_VMATH_LIBMVEC 1
#include <immintrin.h>
#endif

namespace shardlib::kernels::vmath {

/// A read-only run of `n` values, as an Eigen array expression.
template <class T>
using ConstRun = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
/// A writable run of `n` values.
template <class T>
using Run = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;

/// Elements per work item of the vectorised loops: 8 KiB of floats in and out stay in L1.
inline constexpr std::int64_t chunk = 2048;

/// Whether T has Eigen packets worth taking: float and double.
template <class T>
inline constexpr bool is_vector_type_v = std::is_same_v<T, float> || std::is_same_v<T, double>;


namespace detail {
#if defined(SHARDLIB_VMATH_LIBMVEC)
/// glibc's vector math (libmvec, x86-64, glibc >= 2.35 for erf and tanh): a double function of one
/// SIMD register, by the x86-64 vector ABI's names (`_ZGV` + b: SSE, c: AVX, d: AVX2, e: AVX-512 +
/// N lanes + v). Reached through libm (Debian's libm.so is a linker script that adds libmvec as
/// needed), so a program links it with no flag of its own.
#define SHARDLIB_VMATH_MVEC_DECLARE(F)                          \
  extern "C" __m128d _ZGVbN2v_##F(__m128d);                     \
  SHARDLIB_VMATH_MVEC_DECLARE_256(F) SHARDLIB_VMATH_MVEC_DECLARE_512(F)
#if defined(__AVX2__)
#define SHARDLIB_VMATH_MVEC_DECLARE_256(F) extern "C" __m256d _ZGVdN4v_##F(__m256d);
#define SHARDLIB_VMATH_MVEC_256(F) _ZGVdN4v_##F
#elif defined(__AVX__)
#define SHARDLIB_VMATH_MVEC_DECLARE_256(F) extern "C" __m256d _ZGVcN4v_##F(__m256d);
#define SHARDLIB_VMATH_MVEC_256(F) _ZGVcN4v_##F
#else
#define SHARDLIB_VMATH_MVEC_DECLARE_256(F)
#endif
#if defined(__AVX512F__)
#define SHARDLIB_VMATH_MVEC_DECLARE_512(F) extern "C" __m512d _ZGVeN8v_##F(__m512d);
#else
#define SHARDLIB_VMATH_MVEC_DECLARE_512(F)
#endif
SHARDLIB_VMATH_MVEC_DECLARE(exp)
SHARDLIB_VMATH_MVEC_DECLARE(log)
SHARDLIB_VMATH_MVEC_DECLARE(tanh)
SHARDLIB_VMATH_MVEC_DECLARE(erf)

/// An Eigen functor evaluating the double function F: libmvec on each packet Eigen hands it (of
/// whichever width), `std::` F on the scalars of a run's ends.
#define SHARDLIB_VMATH_MVEC_OP(F)                                                            \
  struct mvec_##F {                                                                          \
    double operator()(double x) const { return std::F(x); }                                  \
    __m128d packetOp(__m128d x) const { return _ZGVbN2v_##F(x); }                            \
    SHARDLIB_VMATH_MVEC_OP_256(F) SHARDLIB_VMATH_MVEC_OP_512(F)                              \
  };
#if defined(__AVX__)
#define SHARDLIB_VMATH_MVEC_OP_256(F) \
  __m256d packetOp(__m256d x) const { return SHARDLIB_VMATH_MVEC_256(F)(x); }
#else
#define SHARDLIB_VMATH_MVEC_OP_256(F)
#endif
#if defined(__AVX512F__)
#define SHARDLIB_VMATH_MVEC_OP_512(F) \
  __m512d packetOp(__m512d x) const { return _ZGVeN8v_##F(x); }
#else
#define SHARDLIB_VMATH_MVEC_OP_512(F)
#endif
SHARDLIB_VMATH_MVEC_OP(exp)
SHARDLIB_VMATH_MVEC_OP(log)
SHARDLIB_VMATH_MVEC_OP(tanh)
SHARDLIB_VMATH_MVEC_OP(erf)
#undef SHARDLIB_VMATH_MVEC_OP
#undef SHARDLIB_VMATH_MVEC_OP_256
#undef SHARDLIB_VMATH_MVEC_OP_512
#undef SHARDLIB_VMATH_MVEC_DECLARE
#undef SHARDLIB_VMATH_MVEC_DECLARE_256
#undef SHARDLIB_VMATH_MVEC_DECLARE_512
#undef SHARDLIB_VMATH_MVEC_256

template <class F>
inline constexpr bool is_mvec_op_v = std::is_same_v<F, mvec_exp> || std::is_same_v<F, mvec_log> ||
                                     std::is_same_v<F, mvec_tanh> || std::is_same_v<F, mvec_erf>;
#endif

/// exp of a packet of floats (any width: SSE, AVX, AVX-512), to 1.3 ulps of the true value over
/// the float range. Eigen's polynomial for exp(r) on r = x - n ln2, |r| <= ln2 / 2 (Cephes'), with
/// n rounded by adding 1.5 * 2^23 (no rounding instruction: SSE2 has none) and 2^n formed as two
/// normal factors from n's bits, so that a result overflows to +inf past log(FLT_MAX) and
/// underflows gradually below the smallest normal, as std::exp; exp(-inf) = 0, exp(+inf) = inf,
/// NaN stays NaN. Eigen 3.4's own (pexp) scales through pldexp's four multiplies and a floor,
/// costing 1.3x (AVX2) to 2x (SSE2, no round instruction) as much per element, and its AVX-512
/// form overflows to inf on (88.38, 88.72]. Measured on 1 M floats (AMD EPYC Zen 3, one core):
/// AVX2 0.42-0.53 ns per element against 0.60-0.74; SSE2 1.27 against 2.48.
template <class P>
EIGEN_STRONG_INLINE P pexp_float(const P& x_in) {
  namespace ei = Eigen::internal;
  using PI = typename ei::unpacket_traits<P>::integer_packet;
  // Past these the result is inf or 0 already; inside them n stays in [-150, 128]. (pmin and pmax
  // keep a NaN of their first operand: Eigen's std::min/std::max order.)
  const P x = ei::pmax(ei::pmin(x_in, ei::pset1<P>(89.0f)), ei::pset1<P>(-104.0f));
  const P magic = ei::pset1<P>(12582912.0f);  // 1.5 * 2^23: t's last bits are n, rounded to nearest
  const P t = ei::pmadd(x, ei::pset1<P>(1.44269504088896341f), magic);
  const P n = ei::psub(t, magic);
  P r = ei::pmadd(n, ei::pset1<P>(-0.693359375f), x);  // ln2 in two parts: n * the first is exact
  r = ei::pmadd(n, ei::pset1<P>(2.12194440e-4f), r);
  const P r2 = ei::pmul(r, r);
  P y = ei::pmadd(ei::pset1<P>(1.9875691500e-4f), r, ei::pset1<P>(1.3981999507e-3f));
  P y1 = ei::pmadd(ei::pset1<P>(4.1665795894e-2f), r, ei::pset1<P>(1.6666665459e-1f));
  y = ei::pmadd(y, r, ei::pset1<P>(8.3334519073e-3f));
  y1 = ei::pmadd(y1, r, ei::pset1<P>(5.0000001201e-1f));
  y = ei::pmadd(y, ei::pmul(r2, r), y1);
  y = ei::pmadd(y, r2, ei::padd(r, ei::pset1<P>(1.0f)));
  // 2^n = 2^n1 * 2^n2 with n1 = floor(n / 2), n2 = n - n1, each in [-75, 64]: a normal float.
  const PI ni = ei::psub(ei::preinterpret<PI>(t), ei::preinterpret<PI>(magic));
  const PI n1 = ei::parithmetic_shift_right<1>(ni), n2 = ei::psub(ni, n1), bias = ei::pset1<PI>(127);
  const P s1 = ei::preinterpret<P>(ei::plogical_shift_left<23>(ei::padd(n1, bias)));
  const P s2 = ei::preinterpret<P>(ei::plogical_shift_left<23>(ei::padd(n2, bias)));
  return ei::pmul(ei::pmul(y, s1), s2);
}

/// Eigen functor of float exp: pexp_float on each packet Eigen hands it, std::exp on the scalars
/// of a run's ends.
struct exp_float {
  float operator()(float x) const { return std::exp(x); }
  template <class P>
  P packetOp(const P& x) const { return pexp_float(x); }
};

/// Whether a double expression X takes glibc's vector math for F (else Eigen's F).
template <class X>
inline constexpr bool mvec_double_v =
#if defined(SHARDLIB_VMATH_LIBMVEC)
    std::is_same_v<typename X::Scalar, double>;
#else
    false;
#endif
}  // namespace detail

/// Whether double exp, log, tanh and erf run on glibc's vector math (libmvec) in this build: on
/// x86-64 with glibc 2.35 or newer, unless `SHARDLIB_NO_LIBMVEC` is defined. Measured on 2 M doubles
/// (AMD EPYC Zen 5, one core, AVX-512 packets), ns per element, Eigen 3.4 against libmvec: erf
/// 13.4 against 0.87 (Eigen 3.4 has no double erf packet: it calls std::erf per value), tanh 10.2
/// against 1.06 (the same), log 1.09 against 0.60, exp 0.66 against 0.53 (SLEEF 3.5's erf: 4.5;
/// with SSE2 packets libmvec's erf takes 2.1). Float keeps Eigen's packets (exp: shardlib's, detail::
/// pexp_float), faster than libmvec's and SLEEF's (exp of 1 M floats: Eigen 0.13 ns, SLEEF 0.16,
/// libmvec 0.19).
inline constexpr bool uses_libmvec() noexcept {
#if defined(SHARDLIB_VMATH_LIBMVEC)
  return true;
#else
  return false;
#endif
}

/// exp of an array expression. Float takes shardlib's packet exp (detail::pexp_float: Eigen's
/// polynomial, 2^n formed exactly), double glibc's vector exp where the build has it
/// (uses_libmvec()), else Eigen's.
template <class X>
auto exp(const X& x) {
  if constexpr (std::is_same_v<typename X::Scalar, float>)
    return x.unaryExpr(detail::exp_float{});
#if defined(SHARDLIB_VMATH_LIBMVEC)
  else if constexpr (detail::mvec_double_v<X>)
    return x.unaryExpr(detail::mvec_exp{});
#endif
  else
    return Eigen::exp(x);
}

/// exp of one packet (Packet<float> or Packet<double>), for kernels that work a packet at a time
/// (kernels/rows.hpp's softmax): float's is detail::pexp_float, double's Eigen's (and a build
/// without SIMD, whose packet is a scalar, Eigen's).
template <class P>
EIGEN_STRONG_INLINE P pexp(const P& x) {
  using Traits = Eigen::internal::unpacket_traits<P>;
  if constexpr (std::is_same_v<typename Traits::type, float> && Traits::size > 1)  // a SIMD packet
    return detail::pexp_float(x);
  else
    return Eigen::internal::pexp(x);
}

/// log of an array expression. Eigen's SSE/AVX packet log takes a subnormal input as the smallest
/// normal number (log(1e-40f) = -87.34, not -92.1), as a CPU with denormals-are-zero would see it
/// (its AVX-512 one does not); every other input (0, negative, inf, NaN included) gives the scalar
/// result to a few ulps.
/// Double takes glibc's vector log where the build has it (uses_libmvec()): exact on subnormals.
template <class X>
auto log(const X& x) {
#if defined(SHARDLIB_VMATH_LIBMVEC)
  if constexpr (detail::mvec_double_v<X>)
    return x.unaryExpr(detail::mvec_log{});
  else
#endif
    return Eigen::log(x);
}

/// tanh of an array expression: Eigen's packets for float, glibc's vector tanh for double where
/// the build has it (Eigen 3.4 has no double tanh packet).
template <class X>
auto tanh(const X& x) {
#if defined(SHARDLIB_VMATH_LIBMVEC)
  if constexpr (detail::mvec_double_v<X>)
    return x.unaryExpr(detail::mvec_tanh{});
  else
#endif
    return Eigen::tanh(x);
}

/// erf of an array expression: Eigen's packets for float, glibc's vector erf for double where the
/// build has it (Eigen 3.4 has no double erf packet).
template <class X>
auto erf(const X& x) {
#if defined(SHARDLIB_VMATH_LIBMVEC)
  if constexpr (detail::mvec_double_v<X>)
    return x.unaryExpr(detail::mvec_erf{});
  else
#endif
    return Eigen::erf(x);
}

/// The instruction sets Eigen's packets use in this translation unit ("SSE, SSE2", "AVX512,
/// FMA, AVX2, ...", "None").
inline const char* simd_in_use() noexcept { return Eigen::SimdInstructionSetsInUse(); }

/// Eigen's SIMD packet of T in this build (for float: 4 lanes with SSE, 8 with AVX, 16 with
/// AVX-512), for the row kernels that keep a row's statistics in registers (kernels/rows.hpp).
template <class T>
using Packet = typename Eigen::internal::packet_traits<T>::type;

/// Values of T in one Packet<T>.
template <class T>
inline constexpr std::int64_t lanes = Eigen::internal::unpacket_traits<Packet<T>>::size;

/// Bytes in one SIMD packet of float in this build (16 for SSE, 32 for AVX, 64 for AVX-512).
inline constexpr int packet_bytes() noexcept { return static_cast<int>(sizeof(Packet<float>)); }

/// One packet of read-only values as an Eigen array expression: what vmath::assign_packets hands
/// its expression builder (and so what a functor's `array(x...)` is called with).
template <class T>
using PacketRun = Eigen::Map<const Eigen::Array<T, static_cast<int>(lanes<T>), 1>>;

/// Whether functor F has an Eigen array form for inputs of element types In, all of them Out
/// (float or double): the kernels then evaluate `f.array(packets...)` a packet at a time
/// (assign_packets).
template <class F, class Out, class... In>
concept Vectorizable = is_vector_type_v<Out> && (std::is_same_v<In, Out> && ...) &&
                       requires(const F& f, const PacketRun<In>&... r) { f.array(r...); };

namespace detail {
/// 0, 1, ..., lanes<T> - 1: which lane is which.
template <class T>
alignas(sizeof(Packet<T>)) inline constexpr std::array<T, static_cast<std::size_t>(lanes<T>)> lane_index = [] {
  std::array<T, static_cast<std::size_t>(lanes<T>)> a{};
  for (std::size_t j = 0; j != a.size(); ++j) a[j] = static_cast<T>(j);
  return a;
}();

/// `g` over one packet of each input: the `left` (< lanes) values at k, then zeros; evaluated.
template <class T, class G, class... In>
EIGEN_STRONG_INLINE Eigen::Array<T, static_cast<int>(lanes<T>), 1> padded_packet(std::int64_t k, std::int64_t left,
                                                                                  const G& g, const In*... in) {
  using Fixed = Eigen::Array<T, static_cast<int>(lanes<T>), 1>;
  auto padded = [&](const T* p) {
    Fixed v = Fixed::Zero();
    for (std::int64_t j = 0; j != left; ++j) v[static_cast<Eigen::Index>(j)] = p[k + j];
    return v;
  };
  return [&](const auto&... tail) -> Fixed { return g(PacketRun<T>(tail.data())...); }(padded(in)...);
}
}  // namespace detail

/// `out[k] = g(in[k]...)` for k < n, where `g` builds the Eigen array expression of the runs it
/// is given (`[](const auto& x) { return vmath::exp(x) * 2.0f; }`): evaluated one whole SIMD
/// packet at a time (Eigen arrays of lanes<Out> values), stored from the first packet-aligned
/// output on; the values before it through the run's first packet and the last n % lanes through
/// its last (each overlapping its neighbour, only its own lanes stored; a run shorter than a
/// packet: one padded with zeros). Every value takes the same instructions wherever it sits, so a
/// result does not depend on where a run starts or ends: Eigen's own loop over a run takes its
/// unaligned head and its tail one scalar call at a time, whose exp or logistic may differ from
/// the packet's in the last bit, and an element's value then depended on where a shard, a chunk
/// or a row began (one call over 5000 floats against two split calls: up to 13 differed, AVX-512).
/// `out` may be one of the inputs (each packet is read before it is written). Inputs of Out's type.
template <class Out, class G, class... In>
EIGEN_STRONG_INLINE void assign_packets(Out* out, std::int64_t n, const G& g, const In*... in) {
  static_assert((std::is_same_v<In, Out> && ...), "shardlib::kernels::vmath::assign_packets: inputs of the output's type");
  constexpr int L = static_cast<int>(lanes<Out>);
  using Fixed = Eigen::Array<Out, L, 1>;
  using Aligned = Eigen::Map<Fixed, Eigen::AlignedMax>;
  if (n < L) {  // a run shorter than a packet: one padded with zeros
    if (n <= 0) return;
    const Fixed y = detail::padded_packet<Out>(0, n, g, in...);
    for (std::int64_t j = 0; j != n; ++j) out[j] = y[static_cast<Eigen::Index>(j)];
    return;
  }
  // The values before the first packet-aligned output: the run's first packet, only those lanes
  // stored (so in place the inputs after them are still unwritten). Stores that straddle cache
  // lines cost 1.25x on operands in the cache (AVX-512).
  std::int64_t k = static_cast<std::int64_t>((sizeof(Fixed) - reinterpret_cast<std::uintptr_t>(out) % sizeof(Fixed)) %
                                              sizeof(Fixed) / sizeof(Out));
  if (reinterpret_cast<std::uintptr_t>(out) % sizeof(Out) != 0) k = 0;  // (never aligned: unaligned stores throughout)
  if (k != 0) {
    const Fixed y = g(PacketRun<Out>(in)...);
    for (std::int64_t j = 0; j != k; ++j) out[j] = y[static_cast<Eigen::Index>(j)];
  }
  const bool aligned = reinterpret_cast<std::uintptr_t>(out + k) % sizeof(Fixed) == 0;
  for (; k + 2 * L <= n; k += 2 * L) {  // two packets an iteration
    if (aligned) {
      Aligned(out + k) = g(PacketRun<Out>(in + k)...);
      Aligned(out + k + L) = g(PacketRun<Out>(in + k + L)...);
    } else {
      Eigen::Map<Fixed>(out + k) = g(PacketRun<Out>(in + k)...);
      Eigen::Map<Fixed>(out + k + L) = g(PacketRun<Out>(in + k + L)...);
    }
  }
  if (k + L <= n) {
    Eigen::Map<Fixed>(out + k) = g(PacketRun<Out>(in + k)...);
    k += L;
  }
  if (k == n) return;
  // The last packet of the run, overlapping the one before: only its top n - k lanes are stored,
  // and their inputs are not yet written (so in place the lanes below, read after their values
  // were written, are dropped). Padding it instead cost 1.5-2.8x on rows of 100 floats.
  const Fixed y = g(PacketRun<Out>(in + n - L)...);
  for (std::int64_t j = k; j != n; ++j) out[j] = y[static_cast<Eigen::Index>(j - (n - L))];
}

/// The sum of `g(in[k]...)` over k < n (`g` as assign_packets'), in the inputs' type and in an
/// order set by k and n alone: packet i of the run goes to one of two packet accumulators (i even
/// or odd), the last n % lanes values to the first (the run's last packet with the lanes before
/// them left out, or a padded packet where the run is shorter than one), then the two and their
/// lanes are added in a fixed order. So a row's sum does not depend on
/// its address: Eigen's `.sum()` over a run starts its packets at the first aligned value, so
/// the same row summed at another address (a block of another layout) rounded differently.
template <class G, class T, class... In>
EIGEN_STRONG_INLINE T sum_packets(std::int64_t n, const G& g, const T* in0, const In*... in) {
  static_assert((std::is_same_v<In, T> && ...), "shardlib::kernels::vmath::sum_packets: inputs of one type");
  constexpr int L = static_cast<int>(lanes<T>);
  using Fixed = Eigen::Array<T, L, 1>;
  Fixed a0 = Fixed::Zero(), a1 = Fixed::Zero();
  std::int64_t k = 0;
  for (; k + 2 * L <= n; k += 2 * L) {
    a0 += g(PacketRun<T>(in0 + k), PacketRun<T>(in + k)...);
    a1 += g(PacketRun<T>(in0 + k + L), PacketRun<T>(in + k + L)...);
  }
  if (k + L <= n) {
    a0 += g(PacketRun<T>(in0 + k), PacketRun<T>(in + k)...);
    k += L;
  }
  if (k != n && n < L) {  // a run shorter than a packet: one padded with zeros, the padding's lanes dropped
    Fixed y = detail::padded_packet<T>(k, n - k, g, in0, in...);
    for (std::int64_t j = n - k; j != L; ++j) y[static_cast<Eigen::Index>(j)] = T(0);
    a0 += y;
  } else if constexpr (L > 1) {
    if (k != n) {  // the last packet of the run, overlapping the one before: its lanes below k dropped
      namespace ei = Eigen::internal;
      using P = Packet<T>;
      Fixed y = g(PacketRun<T>(in0 + n - L), PacketRun<T>(in + n - L)...);
      const P keep = ei::pcmp_le(ei::pset1<P>(static_cast<T>(k - (n - L))), ei::pload<P>(detail::lane_index<T>.data()));
      ei::pstoreu(y.data(), ei::pand(ei::ploadu<P>(y.data()), keep));  // (Eigen 3.4's select has no packet form)
      a0 += y;
    }
  }
  return (a0 + a1).sum();
}

/// sum_packets over a long run, in double: the run cut into runs of `chunk` values from its start,
/// each summed in the inputs' type (sum_packets), the chunks' sums added in double in order. The
/// row kernels' sums (a row's statistics, softmax's backward): an order set by the run alone.
template <class G, class T, class... In>
EIGEN_STRONG_INLINE double sum_runs(std::int64_t n, const G& g, const T* in0, const In*... in) {
  double s = 0;
  for (std::int64_t b = 0; b < n; b += chunk)
    s += static_cast<double>(sum_packets(n - b < chunk ? n - b : chunk, g, in0 + b, (in + b)...));
  return s;
}

}  // namespace shardlib::kernels::vmath

namespace Eigen::internal {
/// Eigen evaluates vmath's float exp a packet at a time (vmath::detail::exp_float).
template <>
struct functor_traits<shardlib::kernels::vmath::detail::exp_float> {
  enum { Cost = 20 * NumTraits<float>::MulCost, PacketAccess = packet_traits<float>::Vectorizable };
};
}  // namespace Eigen::internal

#if defined(SHARDLIB_VMATH_LIBMVEC)
namespace Eigen::internal {
/// Eigen evaluates the libmvec functors a packet at a time (vmath::detail::mvec_*).
template <class F>
  requires shardlib::kernels::vmath::detail::is_mvec_op_v<F>
struct functor_traits<F> {
  enum { Cost = 20 * NumTraits<double>::MulCost, PacketAccess = packet_traits<double>::Vectorizable };
};
}  // namespace Eigen::internal
#endif

SHARDLIB_SIMD_WARNINGS_ON
