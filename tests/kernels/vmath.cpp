// SPDX-License-Identifier: Apache-2.0
// The vectorised elementwise path (kernels/vmath.hpp: Eigen's packet math through each functor's
// `array` form) against the scalar functor, element by element, over the whole float range:
// random bit patterns (every exponent, subnormals, infinities, NaNs) and a dense sweep of the
// range where the functions bend. Built twice when the CPU allows it: at the project's flags and
// with -march=native (tests/meson.build), so both the SSE2 and the widest packets are checked.
#include <doctest/doctest.h>
#include <shardlib/kernels/elementwise.hpp>
#include <shardlib/kernels/rows.hpp>
#include <shardlib/autodiff/elementwise.hpp>
#include <shardlib/ops/elementwise.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace k = shardlib::kernels;
namespace fn = shardlib::fn;

namespace {

using I64 = std::int64_t;
/// The host instance the kernels run on, made when first used: after Kokkos is initialised (an
/// instance made before, at namespace scope, is an error with an OpenMP Kokkos 4.6).
const Kokkos::DefaultHostExecutionSpace& exec() {
  static const Kokkos::DefaultHostExecutionSpace e{};
  return e;
}

template <class T>
std::vector<T> inputs(std::uint64_t seed) {
  std::vector<T> v;
  std::mt19937_64 g(seed);
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  for (int i = 0; i < (1 << 17); ++i) v.push_back(std::bit_cast<T>(static_cast<Bits>(g())));  // every exponent
  for (T x = T(-30); x <= T(30); x += T(0.00731)) v.push_back(x);                               // where they bend
  const T lim = std::numeric_limits<T>::max(), tiny = std::numeric_limits<T>::denorm_min();
  for (T x : {T(0), T(-0.0), T(1), T(-1), tiny, -tiny, std::numeric_limits<T>::min(), lim, -lim,
              std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
              std::numeric_limits<T>::quiet_NaN(), T(88.7), T(-88.7), T(89), T(-104), T(710), T(-745)})
    v.push_back(x);
  v.resize(v.size() + 13, T(0.5));  // a length that is no multiple of a packet or a chunk
  return v;
}

// Whether `got` is `ref` to within `ulps` units in the last place of the larger of |ref| and
// `scale` (the size of the terms the result was computed from), or both are NaN, or both the
// same infinity; results below the smallest normal may also be flushed to zero.
template <class T>
bool close(T got, T ref, double ulps, double scale) {
  if (std::isnan(ref) || std::isnan(got)) return std::isnan(ref) && std::isnan(got);
  if (std::isinf(ref) || std::isinf(got)) return got == ref;
  const double eps = std::numeric_limits<T>::epsilon();
  const double m = std::max(std::fabs(double(ref)), scale);
  return std::fabs(double(got) - double(ref)) <= ulps * eps * m + double(std::numeric_limits<T>::min());
}

// softmax / log_softmax / layer_norm / rms_norm of one row in double (the definitions).
std::vector<double> row_ref(const char* op, std::vector<double> x, double scale, double eps) {
  const double n = double(x.size());
  if (std::string(op) == "softmax" || std::string(op) == "log_softmax") {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (double& v : x) v *= scale;
    for (double v : x) m = std::isnan(v) || std::isnan(m) ? NAN : std::max(m, v);
    for (double v : x) s += std::exp(v - m);
    for (double& v : x) v = std::string(op) == "softmax" ? std::exp(v - m) / s : v - m - std::log(s);
  } else if (std::string(op) == "layer_norm") {
    double mean = 0, var = 0;
    for (double v : x) mean += v / n;
    for (double v : x) var += (v - mean) * (v - mean) / n;
    for (double& v : x) v = (v - mean) / std::sqrt(var + eps);
  } else {
    double ms = 0;
    for (double v : x) ms += v * v / n;
    for (double& v : x) v = v / std::sqrt(ms + eps);
  }
  return x;
}

// Runs f on `in` through the kernel (the vector path for float/double) and compares every
// element with the scalar functor; `scale(x)` bounds the magnitude of the intermediate terms.
// `input_as`: another input whose scalar result is accepted too (log of a subnormal).
template <class T, class F, class Scale>
void check_unary(const char* name, F f, double ulps, Scale scale, T (*input_as)(T) = [](T x) { return x; }) {
  static_assert(k::vmath::Vectorizable<F, T, T>, "the functor should have an array form");
  const std::vector<T> in = inputs<T>(7);
  std::vector<T> out(in.size());
  const std::array<I64, 1> extent{static_cast<I64>(in.size())};
  k::elementwise(exec(), out.data(), extent, f, k::Strided<T, 1>{in.data(), {1}});
  int bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const T ref = f(in[i]);
    if (!close(out[i], ref, ulps, scale(double(in[i]))) && !close(out[i], f(input_as(in[i])), ulps, scale(double(in[i])))) {
      if (++bad <= 3)
        std::printf("%s<%s>(%.9g) = %.9g, scalar %.9g\n", name, sizeof(T) == 4 ? "float" : "double", double(in[i]),
                    double(out[i]), double(ref));
    }
  }
  const std::string what = std::string(name) + (sizeof(T) == 4 ? " (float" : " (double") + ", SIMD: " + k::vmath::simd_in_use() + ")";
  INFO(what);
  CHECK(bad == 0);
}

double none(double) { return 0; }

struct Opted {  // a user functor with an array form (docs/04: "Local kernels")
  float operator()(float x) const { return x * x + 1.0f; }
  template <class X>
  auto array(const X& x) const { return x * x + 1.0f; }
};
double gelu_scale(double x) { return std::fabs(x); }  // x/2 * (1 + erf): erf's error times |x|/2

}  // namespace

TEST_SUITE("kernels_vmath") {
  TEST_CASE_TEMPLATE("unary functors: the vector path gives the scalar results, specials included", T, float, double) {
    check_unary<T>("exp", fn::exp{}, 4, none);
    check_unary<T>("log", fn::log{}, 4, none, [](T x) {  // subnormal inputs: exact, or as the smallest normal
      return std::fpclassify(x) == FP_SUBNORMAL && x > 0 ? std::numeric_limits<T>::min() : x;
    });
    check_unary<T>("tanh", fn::tanh{}, 8, none);
    check_unary<T>("abs", fn::abs{}, 0, none);
    check_unary<T>("square", fn::square{}, 0, none);
    check_unary<T>("relu", fn::relu{}, 0, none);
    check_unary<T>("neg", fn::neg{}, 0, none);
    check_unary<T>("sigmoid", fn::sigmoid{}, 8, none);
    check_unary<T>("silu", fn::silu{}, 8, gelu_scale);
    check_unary<T>("gelu", fn::gelu{}, 8, gelu_scale);
    check_unary<T>("gelu_tanh", fn::gelu_tanh{}, 8, gelu_scale);
  }

  TEST_CASE_TEMPLATE("a value's result does not depend on where its run starts or ends (shards, chunks, alignment)", T,
                     float, double) {
    // One call over the whole run against calls over two pieces cut anywhere, each piece at
    // another address: every value bit for bit. Eigen's own loop took a run's unaligned head and
    // its tail one scalar exp at a time (a last bit apart from the packet's): up to 13 of 5000
    // floats differed, so an op's result depended on the sharding (DP against TP).
    std::vector<T> in = inputs<T>(11);
    in.resize(6000);
    std::vector<T> g(in.size());
    std::mt19937_64 gen(12);
    std::normal_distribution<double> normal;
    for (T& x : g) x = static_cast<T>(normal(gen));
    const I64 n = static_cast<I64>(in.size());
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    auto same = [](T a, T b) { return std::bit_cast<Bits>(a) == std::bit_cast<Bits>(b) || (std::isnan(a) && std::isnan(b)); };
    auto check = [&](const char* name, auto f, auto... operand) {  // operand: the inputs' vectors
      std::vector<T> whole(in.size());
      k::elementwise(exec(), whole.data(), std::array<I64, 1>{n}, f, k::Strided<T, 1>{operand->data(), {1}}...);
      int differ = 0;
      for (I64 cut : {I64(1), I64(3), I64(5), I64(17), I64(1001), I64(2047), I64(2049), I64(4099)})
        for (I64 shift : {1, 2, 3, 7}) {  // the pieces' copies start `shift` elements into their buffers
          for (const auto& piece : {std::pair{I64(0), cut}, std::pair{cut, n - cut}}) {
            const I64 b = piece.first, len = piece.second;  // (clang 14 captures no structured binding)
            auto copy = [&](const std::vector<T>* v) {
              std::vector<T> c(static_cast<std::size_t>(len + shift));
              std::copy(v->begin() + b, v->begin() + b + len, c.begin() + shift);
              return c;
            };
            const auto pieces = std::array<std::vector<T>, sizeof...(operand)>{copy(operand)...};
            std::vector<T> out(static_cast<std::size_t>(len + shift));
            [&]<std::size_t... I>(std::index_sequence<I...>) {
              k::elementwise(exec(), out.data() + shift, std::array<I64, 1>{len}, f,
                             k::Strided<T, 1>{pieces[I].data() + shift, {1}}...);
            }(std::make_index_sequence<sizeof...(operand)>{});
            for (I64 i = 0; i < len; ++i) differ += !same(out[static_cast<std::size_t>(shift + i)], whole[static_cast<std::size_t>(b + i)]);
          }
        }
      const std::string what = std::string(name) + (sizeof(T) == 4 ? " (float" : " (double") + ", SIMD: " + k::vmath::simd_in_use() + ")";
      INFO(what);
      CHECK(differ == 0);
    };
    check("exp", fn::exp{}, &in);
    check("log", fn::log{}, &in);
    check("tanh", fn::tanh{}, &in);
    check("sigmoid", fn::sigmoid{}, &in);
    check("silu", fn::silu{}, &in);
    check("gelu", fn::gelu{}, &in);
    check("gelu_tanh", fn::gelu_tanh{}, &in);
    check("x * 0.125", fn::bind_scalar<fn::mul, double, false>{{}, 0.125}, &in);
    check("add", fn::add{}, &in, &g);
    check("d exp", shardlib::fn::grad::exp{}, &g, &in);
    check("d sigmoid", shardlib::fn::grad::sigmoid{}, &g, &in);
    check("d silu", shardlib::fn::grad::silu{}, &g, &in);
    check("d gelu", shardlib::fn::grad::gelu{}, &g, &in);
    check("d gelu_tanh", shardlib::fn::grad::gelu_tanh{}, &g, &in);
  }

  TEST_CASE_TEMPLATE("assign_packets: every length, in place, each value as if alone", T, float, double) {
    // Each value is the expression's value on a run of that value alone (one padded packet), so
    // it depends on nothing around it; in place (out = in) gives the same.
    constexpr I64 L = k::vmath::lanes<T>;
    const std::vector<T> in = inputs<T>(13);
    auto expr = [](const auto& x) { return shardlib::kernels::vmath::exp(x - T(0.25)) * T(3); };
    for (I64 shift = 0; shift < L + 1; ++shift)  // outputs at every alignment (the head before an aligned packet)
      for (I64 n = 0; n <= 4 * L + 3; ++n) {
        CAPTURE(n);
        CAPTURE(shift);
        const auto s0 = static_cast<std::size_t>(shift);
        std::vector<T> out(s0 + static_cast<std::size_t>(n) + 1, T(-7)), inplace(out.size(), T(-7));
        std::copy_n(in.begin(), n, inplace.begin() + shift);
        k::vmath::assign_packets(out.data() + shift, n, expr, in.data());
        k::vmath::assign_packets(inplace.data() + shift, n, expr, inplace.data() + shift);
        CHECK(out[s0 + static_cast<std::size_t>(n)] == T(-7));  // nothing written outside the run
        CHECK(inplace[s0 + static_cast<std::size_t>(n)] == T(-7));
        if (shift > 0) CHECK(out[s0 - 1] == T(-7));
        int differ = 0;
        for (I64 i = 0; i < n; ++i) {
          T alone = 0;
          k::vmath::assign_packets(&alone, 1, expr, &in[static_cast<std::size_t>(i)]);
          const T got = out[s0 + static_cast<std::size_t>(i)], again = inplace[s0 + static_cast<std::size_t>(i)];
          differ += !((got == alone && again == alone) || (std::isnan(alone) && std::isnan(got) && std::isnan(again)));
        }
        CHECK(differ == 0);
      }
  }

  TEST_CASE_TEMPLATE("binary functors and a bound scalar: the vector path is exact", T, float, double) {
    const std::vector<T> a = inputs<T>(1), b = inputs<T>(2);
    const std::array<I64, 1> extent{static_cast<I64>(a.size())};
    auto run = [&](auto f, const char* name) {
      std::vector<T> out(a.size());
      k::elementwise(exec(), out.data(), extent, f, k::Strided<T, 1>{a.data(), {1}}, k::Strided<T, 1>{b.data(), {1}});
      int bad = 0;
      for (std::size_t i = 0; i < a.size(); ++i) bad += !close(out[i], T(f(a[i], b[i])), 0, 0);
      const std::string what = name;
      INFO(what);
      CHECK(bad == 0);
    };
    run(fn::add{}, "add");
    run(fn::sub{}, "sub");
    run(fn::mul{}, "mul");
    run(fn::div{}, "div");
    static_assert(k::vmath::Vectorizable<fn::bind_scalar<fn::mul, double, false>, T, T>);
    static_assert(k::vmath::Vectorizable<fn::bind_scalar<fn::div, int, true>, T, T>);
    check_unary<T>("x * 0.125", fn::bind_scalar<fn::mul, double, false>{{}, 0.125}, 0, none);
    check_unary<T>("3 / x", fn::bind_scalar<fn::div, int, true>{{}, 3}, 0, none);
    check_unary<T>("x - 2.5", fn::bind_scalar<fn::sub, float, false>{{}, 2.5f}, 0, none);
  }

  TEST_CASE("which functors and types take the vector path") {
    CHECK(k::vmath::Vectorizable<Opted, float, float>);
    std::vector<float> in = {1, 2, 3}, out(3);
    k::elementwise(exec(), out.data(), std::array<I64, 1>{3}, Opted{}, k::Strided<float, 1>{in.data(), {1}});
    CHECK(out == std::vector<float>{2, 5, 10});
    auto user = [](float x) { return x * 2; };
    CHECK(!k::vmath::Vectorizable<decltype(user), float, float>);          // user functors: scalar
    CHECK(!k::vmath::Vectorizable<fn::max, float, float, float>);          // NaN rules of its own
    CHECK(!k::vmath::Vectorizable<fn::sqrt, float, float>);                // Eigen's is not exact
    CHECK(!k::vmath::Vectorizable<fn::gelu, int, int>);                    // not float or double
    CHECK(!k::vmath::Vectorizable<fn::add, float, float, double>);         // mixed element types
    CHECK(k::vmath::Vectorizable<fn::gelu, float, float>);
    CHECK(std::string(k::vmath::simd_in_use()).size() > 0);
  }

  TEST_CASE("double erf, tanh, exp and log take glibc's vector math where the build has it") {
#if defined(__x86_64__) && defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35)) && \
    !defined(SHARDLIB_NO_LIBMVEC)
    CHECK(k::vmath::uses_libmvec());
#endif
    // A packet at a time with libmvec; without it, Eigen 3.4 evaluates double erf and tanh a value at
    // a time (no packets), and exp and log on its own packets.
    auto packets = [](auto expr) {
      return (Eigen::internal::evaluator<decltype(expr)>::Flags & Eigen::PacketAccessBit) != 0;
    };
    const k::vmath::ConstRun<double> x(nullptr, 0);
    CHECK(packets(k::vmath::erf(x)) == k::vmath::uses_libmvec());
    CHECK(packets(k::vmath::tanh(x * 2.0)) == k::vmath::uses_libmvec());
    CHECK(packets(k::vmath::exp(x)));
    CHECK(packets(k::vmath::log(x)));
#if defined(SHARDLIB_VMATH_LIBMVEC)
    CHECK(std::is_same_v<std::remove_cvref_t<decltype(k::vmath::erf(x).functor())>, k::vmath::detail::mvec_erf>);
#endif
    // float keeps Eigen's packets
    const k::vmath::ConstRun<float> f(nullptr, 0);
    CHECK(packets(k::vmath::erf(f)));
    CHECK(std::is_same_v<std::remove_cv_t<decltype(k::vmath::erf(f))>, std::remove_cv_t<decltype(Eigen::erf(f))>>);
  }

  TEST_CASE("float exp: shardlib's packet exp (vmath::detail::pexp_float), infinities, NaN, overflow and underflow") {
    const k::vmath::ConstRun<float> f(nullptr, 0);
    CHECK(std::is_same_v<std::remove_cvref_t<decltype(k::vmath::exp(f).functor())>, k::vmath::detail::exp_float>);
    CHECK((Eigen::internal::evaluator<decltype(k::vmath::exp(f))>::Flags & Eigen::PacketAccessBit) != 0);
    // A packet at a time, every lane the same value: against std::exp, to 2 ulps (normal results),
    // to 1 unit of the smallest subnormal below them, exactly at the ends (0, inf, NaN).
    using P = k::vmath::Packet<float>;
    constexpr int W = static_cast<int>(k::vmath::lanes<float>);
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> xs = {-inf, inf, std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f,
                             -1.0f, 88.0f, 88.72283f, 88.72284f, 88.7229f, 88.73f, 89.0f, 89.5f, 100.0f, 1e30f,
                             -87.3f, -87.34f, -87.5f, -90.0f, -100.0f, -103.2f, -103.28f, -103.98f, -104.0f, -110.0f,
                             -1e30f};
    for (float x = -104.5f; x < 89.5f; x += 0.0137f) xs.push_back(x);
    int bad = 0;
    for (float x : xs) {
      alignas(64) float in[W], out[W];
      for (float& v : in) v = x;
      Eigen::internal::pstore(out, k::vmath::pexp(Eigen::internal::pload<P>(in)));
      const float ref = std::exp(x);
      const bool ok = std::isnan(ref) ? std::isnan(out[0])
                      : std::isinf(ref) || ref == 0 ? out[0] == ref
                      : ref < std::numeric_limits<float>::min()
                          ? std::fabs(out[0] - ref) <= std::numeric_limits<float>::denorm_min()
                          : std::fabs(double(out[0]) - double(ref)) <= 2 * std::numeric_limits<float>::epsilon() * ref;
      if (!ok && ++bad <= 3) std::printf("pexp_float(%.9g) = %.9g, std::exp %.9g\n", double(x), double(out[0]), double(ref));
      for (int l = 1; l < W; ++l) bad += std::bit_cast<std::uint32_t>(out[l]) != std::bit_cast<std::uint32_t>(out[0]);
    }
    INFO("SIMD: " << k::vmath::simd_in_use());
    CHECK(bad == 0);
    // softmax of a row with -inf entries (a causal mask) puts exactly 0 there
    std::vector<float> row(64, 1.0f), y(64);
    for (int j = 40; j < 64; ++j) row[j] = -inf;
    k::softmax_rows(exec(), row.data(), y.data(), 1, 64, false);
    for (int j = 40; j < 64; ++j) CHECK(y[j] == 0.0f);
    CHECK(y[0] == doctest::Approx(1.0 / 40).epsilon(1e-6));
  }

  TEST_CASE("strided and broadcast operands keep the scalar path and agree with it") {
    // [3, 5] out = gelu-free a + bias row (stride 0 along dim 0): not dense, so per row.
    std::vector<float> a(15), bias(5), out(15);
    for (int i = 0; i < 15; ++i) a[i] = float(i) * 0.5f;
    for (int i = 0; i < 5; ++i) bias[i] = float(i) * -2;
    k::elementwise(exec(), out.data(), std::array<I64, 2>{3, 5}, fn::add{}, k::Strided<float, 2>{a.data(), {5, 1}},
                   k::Strided<float, 2>{bias.data(), {0, 1}});
    for (int i = 0; i < 15; ++i) CHECK(out[i] == a[i] + bias[i % 5]);
  }

  TEST_CASE_TEMPLATE("sum_packets: every length, any address, the padding left out", T, float, double) {
    // exp(0) = 1 in the padding's lanes: a sum that took them would be off by whole units.
    const std::vector<T> in = [] {
      std::vector<T> v(300);
      std::mt19937_64 g(21);
      std::uniform_real_distribution<double> u(-3, 3);
      for (T& x : v) x = static_cast<T>(u(g));
      return v;
    }();
    auto expr = [](const auto& x) { return shardlib::kernels::vmath::exp(x); };
    CHECK(k::vmath::sum_packets(0, expr, in.data()) == T(0));
    for (I64 n = 1; n <= 200; n += (n < 40 ? 1 : 37)) {
      CAPTURE(n);
      double want = 0;
      for (I64 i = 0; i < n; ++i) want += std::exp(double(in[static_cast<std::size_t>(i)]));
      const T got = k::vmath::sum_packets(n, expr, in.data());
      CHECK(double(got) == doctest::Approx(want).epsilon(sizeof(T) == 4 ? 1e-5 : 1e-12));
      for (std::size_t shift = 1; shift < 8; ++shift) {  // the same values at another address
        std::vector<T> moved(static_cast<std::size_t>(n) + shift);
        std::copy_n(in.begin(), n, moved.begin() + static_cast<std::ptrdiff_t>(shift));
        CHECK(k::vmath::sum_packets(n, expr, moved.data() + shift) == got);
      }
    }
  }

  TEST_CASE_TEMPLATE("fused row kernels: a row's result does not depend on its address", T, float, double) {
    // The same rows at addresses 1 to 7 values apart give the same bits (a block of another
    // layout, or a row of odd length, starts elsewhere): Eigen's sums began at a row's first
    // aligned value and took its ends one scalar at a time.
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    std::mt19937_64 g(8);
    std::normal_distribution<double> normal;
    for (I64 n : {I64(3), I64(5), I64(8), I64(12), I64(15), I64(17), I64(100), I64(257), I64(2061)}) {
      const I64 rows = 3;
      std::vector<T> in(static_cast<std::size_t>(rows * n) + 8), gain(static_cast<std::size_t>(n) + 8), bias(gain.size());
      for (T& v : in) v = static_cast<T>(1.5 + 3 * normal(g));
      for (T& v : gain) v = static_cast<T>(1 + 0.1 * normal(g));
      for (T& v : bias) v = static_cast<T>(normal(g));
      auto run = [&](int op, std::size_t shift) {  // the inputs copied `shift` values in
        std::vector<T> x(in.size()), gn(gain.size()), bs(bias.size()), out(in.size());
        std::copy(in.begin(), in.end() - 8, x.begin() + static_cast<std::ptrdiff_t>(shift));
        std::copy(gain.begin(), gain.end() - 8, gn.begin() + static_cast<std::ptrdiff_t>(shift));
        std::copy(bias.begin(), bias.end() - 8, bs.begin() + static_cast<std::ptrdiff_t>(shift));
        const T *xp = x.data() + shift, *gp = gn.data() + shift, *bp = bs.data() + shift;
        T* o = out.data() + shift;
        if (op < 2) k::softmax_rows(exec(), xp, o, rows, n, op == 1, T(0.5));
        else if (op == 2) k::layer_norm_rows(exec(), xp, o, rows, n, 1e-5);
        else if (op == 3) k::layer_norm_rows(exec(), xp, o, rows, n, 1e-5, gp, bp);
        else if (op == 4) k::layer_norm_rows(exec(), xp, o, rows, n, 1e-5, gp, static_cast<const T*>(nullptr));
        else k::rms_norm_rows(exec(), xp, o, rows, n, 1e-5);
        return std::vector<T>(o, o + rows * n);
      };
      for (int op = 0; op < 6; ++op) {
        CAPTURE(n);
        CAPTURE(op);
        const std::vector<T> at0 = run(op, 0);
        int differ = 0;
        for (std::size_t shift = 1; shift < 8; ++shift) {
          const std::vector<T> there = run(op, shift);
          for (std::size_t i = 0; i < at0.size(); ++i) differ += std::bit_cast<Bits>(there[i]) != std::bit_cast<Bits>(at0[i]);
        }
        CHECK(differ == 0);
      }
    }
  }

  TEST_CASE_TEMPLATE("softmax_rows with a causal mask: as an additive -infinity above each diagonal, half read", T, float,
                     double) {
    // Rows of [2, causal, n] matrices, row r the query r % causal: against the unmasked kernel on
    // the rows with -inf above the diagonal (each value to a few ulps: the sums add no zeros), the
    // masked values exactly 0 (log_softmax: -inf); in place alike; the bytes counted as the GPU's
    // rows_fused counts them.
    std::mt19937_64 g(17);
    std::normal_distribution<double> normal;
    for (const auto& shape : {std::pair{I64(1), I64(5)}, std::pair{I64(7), I64(7)}, std::pair{I64(40), I64(40)},
                              std::pair{I64(33), I64(70)}, std::pair{I64(70), I64(33)}})
      for (const bool log : {false, true}) {
        const I64 causal = shape.first, n = shape.second;  // (clang 14 captures no structured binding)
        CAPTURE(causal);
        CAPTURE(n);
        CAPTURE(log);
        const I64 rows = 2 * causal;
        std::vector<T> in(static_cast<std::size_t>(rows * n)), masked(in.size()), got(in.size()), want(in.size());
        for (T& v : in) v = static_cast<T>(3 * normal(g));
        for (I64 r = 0; r < rows; ++r)
          for (I64 j = 0; j < n; ++j)
            masked[static_cast<std::size_t>(r * n + j)] =
                j > r % causal ? -std::numeric_limits<T>::infinity() : in[static_cast<std::size_t>(r * n + j)];
        const auto before = k::flop_count();
        k::softmax_rows(exec(), in.data(), got.data(), rows, n, log, T(0.5), causal);
        const auto after = k::flop_count();
        k::softmax_rows(exec(), masked.data(), want.data(), rows, n, log, T(0.5));
        const I64 full = std::min(causal, n), read = 2 * (full * (full + 1) / 2 + (causal - full) * n);
        CHECK(after.kernel_bytes - before.kernel_bytes == static_cast<std::uint64_t>(read + rows * n) * sizeof(T));
        int bad = 0;
        for (I64 r = 0; r < rows; ++r)
          for (I64 j = 0; j < n; ++j) {
            const T a = got[static_cast<std::size_t>(r * n + j)], b = want[static_cast<std::size_t>(r * n + j)];
            if (j > r % causal) bad += log ? !(std::isinf(a) && a < 0) : a != T(0);
            else bad += !close(a, b, 8, log ? std::fabs(double(b)) + 1 : 0);
          }
        CHECK(bad == 0);
        std::vector<T> inplace = in;
        k::softmax_rows(exec(), inplace.data(), inplace.data(), rows, n, log, T(0.5), causal);
        CHECK(inplace == got);
      }
    std::vector<T> x(4);
    CHECK_THROWS_WITH_AS(k::softmax_rows(exec(), x.data(), x.data(), 1, 4, false, T(1), -2),
                         "shardlib::kernels::softmax_rows: causal -2 (0: no mask; > 0: the rows are [..., causal, n] "
                         "matrices of queries)",
                         std::invalid_argument);
  }

  TEST_CASE_TEMPLATE("fused row kernels against the definitions in double", T, float, double) {
    std::mt19937_64 g(3);
    std::normal_distribution<double> normal;
    for (const char* op : {"softmax", "log_softmax", "layer_norm", "rms_norm"}) {
      for (I64 n : {1, 7, 16, 2048, 2049, 5000}) {
        for (double offset : {0.0, 1000.0}) {  // a mean far from zero: no cancellation allowed
          const I64 rows = 3;
          std::vector<T> in(static_cast<std::size_t>(rows * n)), out(in.size());
          for (T& v : in) v = static_cast<T>(offset + 3 * normal(g));
          const T scale = T(0.125);
          const std::string name = op;
          const bool soft = name == "softmax" || name == "log_softmax", log = name == "log_softmax";
          if (soft)
            k::softmax_rows(exec(), in.data(), out.data(), rows, n, log, scale);
          else if (name == "layer_norm")
            k::layer_norm_rows(exec(), in.data(), out.data(), rows, n, 1e-5);
          else
            k::rms_norm_rows(exec(), in.data(), out.data(), rows, n, 1e-5);
          double worst = 0;
          for (I64 r = 0; r < rows; ++r) {
            const std::vector<double> x(in.begin() + r * n, in.begin() + (r + 1) * n);
            const std::vector<double> ref = row_ref(op, x, soft ? double(scale) : 1.0, 1e-5);
            for (I64 j = 0; j < n; ++j) {
              // error in ulps of the larger of the result and the size of its terms: |scale x| for
              // log_softmax, the row's largest probability for softmax, |x| / std for the norms
              // (the inputs' own round-off, as float arithmetic on x = 1000 + 3 N has it; std = 3)
              const double size = soft ? (log ? std::fabs(double(scale) * x[j]) + 1 : 1.0 / double(n))
                                       : std::fabs(x[j]) / 3 + 1;
              worst = std::max(worst, std::fabs(double(out[r * n + j]) - ref[j]) /
                                          (std::numeric_limits<T>::epsilon() * std::max(std::fabs(ref[j]), size)));
            }
          }
          const std::string what = std::string(op) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
          INFO(what);
          CHECK(worst < 64);  // float round-off of sums over up to 5000 terms
        }
      }
    }
  }

  TEST_CASE_TEMPLATE("softmax_rows: no subnormal probability (0 below n x the smallest normal), NaN rows stay NaN", T,
                     float, double) {
    // Scores from 0 down past where exp underflows (an underflowing multiply costs a microcode
    // assist on Intel cores: a causal softmax ran 4.6x slower than an unmasked one): each
    // probability is the reference's, or 0 where the reference is below n times the smallest
    // normal; none is subnormal. log_softmax is the reference's everywhere.
    using L = std::numeric_limits<T>;
    const double lowest = std::log(double(L::min()));  // ln of the smallest normal
    for (I64 n : {1, 3, 7, 16, 37, 128, 1000}) {  // (rows shorter than a packet too: softmax_row_short)
      const I64 rows = 4;
      std::vector<T> in(static_cast<std::size_t>(rows * n)), out(in.size()), lg(in.size());
      for (I64 r = 0; r < rows; ++r)
        for (I64 j = 0; j < n; ++j)  // row r: 0 down to 1.5 ln(min) (past the subnormals), -inf at r's end
          in[r * n + j] = j > 0 && j + r >= n ? -L::infinity()
                                              : static_cast<T>(1.5 * lowest * double(j) / double(std::max<I64>(n - 1, 1)));
      in[3 * n + n / 2] = L::quiet_NaN();
      k::softmax_rows(exec(), in.data(), out.data(), rows, n, false);
      k::softmax_rows(exec(), in.data(), lg.data(), rows, n, true);
      int subnormal = 0, wrong = 0;
      for (I64 r = 0; r < 3; ++r) {
        const std::vector<double> x(in.begin() + r * n, in.begin() + (r + 1) * n);
        const std::vector<double> ref = row_ref("softmax", x, 1.0, 0), lref = row_ref("log_softmax", x, 1.0, 0);
        for (I64 j = 0; j < n; ++j) {
          const T v = out[r * n + j];
          subnormal += std::fpclassify(v) == FP_SUBNORMAL;
          const bool floor = ref[j] < double(n) * double(L::min());
          wrong += floor ? !(v == 0 || std::fabs(double(v) - ref[j]) <= 4 * L::epsilon() * ref[j])
                         : std::fabs(double(v) - ref[j]) > 8 * L::epsilon() * ref[j];
          if (std::isfinite(lref[j])) wrong += std::fabs(double(lg[r * n + j]) - lref[j]) > 8 * L::epsilon() * std::fabs(lref[j]) + 8 * L::epsilon();
          else wrong += lg[r * n + j] != lref[j];
        }
      }
      INFO("n = " << n);
      CHECK(subnormal == 0);
      CHECK(wrong == 0);
      for (I64 j = 0; j < n; ++j) CHECK((std::isnan(out[3 * n + j]) && std::isnan(lg[3 * n + j])));
    }
  }

  TEST_CASE_TEMPLATE("softmax_rows in place gives the values it gives out of place, every tail length", T, float,
                     double) {
    // The values past the last whole SIMD packet are taken as one packet overlapping the one before:
    // each value must be summed once and, in place, read before it is written. n from 1 (shorter
    // than a packet) to past two AVX-512 packets.
    std::mt19937_64 g(5);
    std::normal_distribution<double> normal;
    for (I64 n = 1; n <= 40; ++n) {
      for (bool log : {false, true}) {
        const I64 rows = 3;
        std::vector<T> in(static_cast<std::size_t>(rows * n)), out(in.size());
        for (T& v : in) v = static_cast<T>(4 * normal(g));
        std::vector<T> same = in;
        k::softmax_rows(exec(), in.data(), out.data(), rows, n, log, T(0.5));
        k::softmax_rows(exec(), same.data(), same.data(), rows, n, log, T(0.5));
        INFO("n=" << n << " log=" << log);
        CHECK(same == out);
        double total = 0;  // and a softmax row sums to 1
        for (I64 j = 0; j < n; ++j) total += log ? std::exp(double(out[j])) : double(out[j]);
        CHECK(total == doctest::Approx(1).epsilon(1e-5));
      }
    }
  }

  TEST_CASE("fused row kernels: NaN, infinities, empty rows, in place, bad extents") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> x = {1, nan, 2, -inf, -inf, -inf, 0, inf, 1}, y(9);
    k::softmax_rows(exec(), x.data(), y.data(), 3, 3, false);
    for (int j = 0; j < 9; ++j) CHECK(std::isnan(y[j]));  // a NaN; all -inf (torch: NaN); an inf
    k::layer_norm_rows(exec(), x.data(), y.data(), 3, 3, 1e-5);
    for (int j = 0; j < 3; ++j) CHECK(std::isnan(y[j]));
    std::vector<float> z = {1, 2, 3, 4};
    k::softmax_rows(exec(), z.data(), z.data(), 1, 4, true);  // in place
    CHECK(z[3] == doctest::Approx(-0.4401897).epsilon(1e-6));
    k::softmax_rows(exec(), z.data(), z.data(), 0, 4, false);  // nothing to do
    k::softmax_rows(exec(), z.data(), z.data(), 4, 0, false);
    CHECK_THROWS_WITH_AS(k::layer_norm_rows(exec(), z.data(), z.data(), 1, 4, -1.0),
                         "shardlib::kernels::layer_norm_rows: eps must be >= 0, got -1.000000", std::invalid_argument);
    CHECK_THROWS_WITH_AS(k::rms_norm_rows(exec(), z.data(), z.data(), -1, 4, 0.0),
                         "shardlib::kernels::rms_norm_rows: negative extent in [rows, n] = [-1, 4]", std::invalid_argument);
  }

  TEST_CASE_TEMPLATE("derivative functors (autodiff): the vector path gives the scalar results", T, float, double) {
    // v = +-inf left out: there the scalar forms give inf * 0 = NaN, and the vector ones may give
    // inf * (exp's result below the smallest normal, not exactly 0) = inf (kernels/vmath.hpp)
    std::vector<T> v = inputs<T>(5);
    std::erase_if(v, [](T x) { return std::isinf(x); });
    std::vector<T> g(v.size());
    std::mt19937_64 gen(9);
    std::normal_distribution<double> normal;
    for (T& x : g) x = static_cast<T>(normal(gen));
    const std::array<I64, 1> extent{static_cast<I64>(v.size())};
    auto run = [&](auto d, const char* name) {
      static_assert(k::vmath::Vectorizable<decltype(d), T, T, T>);
      std::vector<T> out(v.size());
      k::elementwise(exec(), out.data(), extent, d, k::Strided<T, 1>{g.data(), {1}}, k::Strided<T, 1>{v.data(), {1}});
      int bad = 0;
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double size = std::fabs(double(g[i])) * (1 + std::fabs(double(v[i])));
        if (!close(out[i], d(g[i], v[i]), 16, std::isfinite(size) ? size : 0) && ++bad <= 3)
          std::printf("%s(g %.9g, v %.9g) = %.9g, scalar %.9g\n", name, double(g[i]), double(v[i]), double(out[i]),
                      double(d(g[i], v[i])));
      }
      const std::string what = name;
      INFO(what);
      CHECK(bad == 0);
    };
    run(shardlib::fn::grad::exp{}, "d exp");
    run(shardlib::fn::grad::log{}, "d log");
    run(shardlib::fn::grad::tanh{}, "d tanh");
    run(shardlib::fn::grad::square{}, "d square");
    run(shardlib::fn::grad::sigmoid{}, "d sigmoid");
    run(shardlib::fn::grad::silu{}, "d silu");
    run(shardlib::fn::grad::gelu{}, "d gelu");
    run(shardlib::fn::grad::gelu_tanh{}, "d gelu_tanh");
  }
}
