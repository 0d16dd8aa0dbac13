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
/// Results below the smallest normal number may differ (Eigen's exp(-inf) is a subnormal, not 0),
/// so a product of such a result with an infinity can be inf where the scalar form gives NaN.
/// Double has Eigen's packets where Eigen has them (exp, log, tanh, ...), the scalar function
/// inside the same loop elsewhere (erf). sqrt keeps the scalar path: Eigen's fast packet sqrt is
/// an estimate refined by Newton steps (a few ulps off, and +inf for a negative subnormal).
///
/// A functor opts in by a member `array(x...)` that builds the Eigen expression of its scalar
/// `operator()` (see fn:: in ops/elementwise.hpp): kernels use it on host execution spaces for
/// float and double; every other case (device spaces, other types, user functors) runs the
/// scalar `operator()`.
#pragma once

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include <Kokkos_Core.hpp>

#include <shardlib/kernels/exec.hpp>

#include <cmath>
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

/// Whether functor F has an Eigen array form for inputs of element types In, all of them Out
/// (float or double): the kernels then evaluate `f.array(runs...)` a chunk at a time.
template <class F, class Out, class... In>
concept Vectorizable = is_vector_type_v<Out> && (std::is_same_v<In, Out> && ...) &&
                       requires(const F& f, const ConstRun<In>&... r) { f.array(r...); };

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
/// with SSE2 packets libmvec's erf takes 2.1). Float keeps Eigen's packets: they measured faster
/// than libmvec's and SLEEF's (exp of 1 M floats: Eigen 0.13 ns, SLEEF 0.16, libmvec 0.19).
inline constexpr bool uses_libmvec() noexcept {
#if defined(SHARDLIB_VMATH_LIBMVEC)
  return true;
#else
  return false;
#endif
}

/// exp of an array expression. Eigen 3.4's AVX-512 packet exp for float overflows to +inf on
/// (88.38, 88.72], below log(FLT_MAX) (its 2^m is formed as one float), and flushes results below
/// the smallest normal to 0: there it is taken as e^(x/2) squared (x/2 is exact; within 3 ulps,
/// subnormal results kept). Other builds take Eigen's exp as it is. (A select between the two is
/// not vectorised in Eigen 3.4, so the squared form is used for every element.)
/// Double takes glibc's vector exp where the build has it (uses_libmvec()).
template <class X>
auto exp(const X& x) {
#if defined(SHARDLIB_VMATH_LIBMVEC)
  if constexpr (detail::mvec_double_v<X>)
    return x.unaryExpr(detail::mvec_exp{});
  else
#endif
#if defined(EIGEN_VECTORIZE_AVX512)
  if constexpr (std::is_same_v<typename X::Scalar, float>)
    return Eigen::square(Eigen::exp(x * 0.5f));
  else
#endif
    return Eigen::exp(x);
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

}  // namespace shardlib::kernels::vmath

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
