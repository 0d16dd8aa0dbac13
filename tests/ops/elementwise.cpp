// SPDX-License-Identifier: Apache-2.0
// Oracle tests of the elementwise ops (ops/elementwise.hpp): every op over a list of spec types
// (split, multi-axis, replicated, partial sum and partial max operands), on random meshes of
// the run's devices, random uneven shapes (extents 0 and 1 too, numpy broadcasting), against
// plain loops in double on the gathered operands. Also the output spec types, ops that must not
// communicate, and the errors of operands that do not fit. Runs on 1..8 threads devices and
// under mpirun.
#include <doctest/doctest.h>
#include <shardlib/ops.hpp>

#include "../collectives/harness.hpp"
#include "oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace sl = shardlib;
namespace oracle = shardlib::test::oracle;
using oracle::M2;
using sl::axes;
using sl::none;
using sl::partial_max;
using sl::partial_sum;
using sl::Spec;

namespace {
template <class S, class T = float>
using Ten = sl::DistributedTensor<T, M2, S>;

using namespace oracle::specs;
using PSumX = Spec<none, none, partial_sum<"x">>;
using RowsPSum = Spec<"y", none, partial_sum<"x">>;
using PMaxY = Spec<none, none, partial_max<"y">>;

constexpr int cases = 3;  // random cases per spec combination and device count
#define DEVICE_COUNTS {1, 2, 3, 4, 6, 8}

/// A pair of spec types (operand a, operand b).
template <class A, class B>
struct P {};

/// Numpy broadcast of two same-rank shapes (both valid by construction).
template <std::size_t R>
oracle::Idx<R> broadcast(const oracle::Idx<R>& a, const oracle::Idx<R>& b) {
  oracle::Idx<R> o{};
  for (std::size_t d = 0; d < R; ++d) o[d] = a[d] == 1 ? b[d] : a[d];
  return o;
}

/// Shapes of two operands of rank 2 that broadcast: a random shape, and in one draw of two some
/// of its extents set to 1 in one operand or the other.
std::pair<oracle::Idx<2>, oracle::Idx<2>> broadcast_pair(oracle::Rng& rng) {
  oracle::Idx<2> a = oracle::random_shape<2>(rng), b = a;
  if (rng.below(2) == 0)
    for (std::size_t d = 0; d < 2; ++d)
      if (rng.below(3) == 0) (rng.below(2) ? a : b)[d] = 1;
  return {a, b};
}

/// One random case of `op(a, b)` for tensors of spec SA, SB and element types TA, TB against
/// `ref(double, double)`; operand values in [lo, hi).
template <class SA, class SB, class TA = float, class TB = float, class Op, class RefOp>
void binary_case(sl::Context& ctx, oracle::Rng& rng, const std::string& name, Op op, RefOp ref, oracle::Tol tol,
                 double lo = -1, double hi = 1) {
  const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
  const auto [sa, sb] = broadcast_pair(rng);
  const auto a = oracle::operand<Ten<SA, TA>>(mesh, sa, rng.g(), static_cast<TA>(lo), static_cast<TA>(hi));
  const auto b = oracle::operand<Ten<SB, TB>>(mesh, sb, rng.g(), static_cast<TB>(lo), static_cast<TB>(hi));
  const auto r = op(a, b);
  const auto ra = oracle::host(a), rb = oracle::host(b);
  oracle::Ref<2> want(broadcast(sa, sb));
  oracle::for_each_index(want.shape, [&](const oracle::Idx<2>& i) { want(i) = ref(ra.bcast(i), rb.bcast(i)); });
  oracle::expect_tensor(r, want, tol, name + ": " + oracle::describe(a, b));
}

/// One random case of a unary op (`op(a)`, a tensor of spec S) against `ref(double)`.
template <class S, class T = float, class Op, class RefOp>
void unary_case(sl::Context& ctx, oracle::Rng& rng, const std::string& name, Op op, RefOp ref, oracle::Tol tol,
                double lo = -1, double hi = 1) {
  const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
  const auto shape = oracle::random_shape<2>(rng);
  const auto a = oracle::operand<Ten<S, T>>(mesh, shape, rng.g(), static_cast<T>(lo), static_cast<T>(hi));
  const auto r = op(a);
  const auto ra = oracle::host(a);
  oracle::Ref<2> want(shape);
  oracle::for_each_index(shape, [&](const oracle::Idx<2>& i) { want(i) = ref(ra(i)); });
  oracle::expect_tensor(r, want, tol, name + ": " + oracle::describe(a));
}

/// Whether `what` contains every one of `parts`.
template <class... S>
bool contains_all(const std::string& what, const S&... parts) {
  return ((what.find(parts) != std::string::npos) && ...);
}

constexpr oracle::Tol float_tol = oracle::Tol::rel(1e-5);

double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}
}  // namespace

TEST_SUITE("ops_elementwise") {
TEST_CASE("a + b matches the oracle for every pair of specs (broadcasting, partial operands)") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 11);
        oracle::for_each_pair(oracle::List<Rep, Rows, Grid, Both, PSumX>{},
                              oracle::List<Rep, ColsY, Grid, PSumX, PMaxY>{}, [&](auto sa, auto sb) {
                                using SA = typename decltype(sa)::type;
                                using SB = typename decltype(sb)::type;
                                for (int c = 0; c < cases; ++c)
                                  binary_case<SA, SB>(
                                      ctx, rng, "a + b", [](const auto& a, const auto& b) { return a + b; },
                                      [](double a, double b) { return a + b; }, float_tol);
                              });
      },
      DEVICE_COUNTS);
}

TEST_CASE("a - b, a * b, a / b, maximum, minimum match the oracle (partial operands kept or reduced)") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 12);
        using Pairs = oracle::List<P<Rows, Grid>, P<PSumX, PSumX>, P<PSumX, Rep>, P<Rep, RowsPSum>, P<Both, PMaxY>>;
        oracle::for_each_type(Pairs{}, [&]<class SA, class SB>(std::type_identity<P<SA, SB>>) {
          for (int c = 0; c < cases; ++c) {
            binary_case<SA, SB>(
                ctx, rng, "a - b", [](const auto& a, const auto& b) { return a - b; },
                [](double a, double b) { return a - b; }, float_tol);
            binary_case<SA, SB>(
                ctx, rng, "a * b", [](const auto& a, const auto& b) { return a * b; },
                [](double a, double b) { return a * b; }, float_tol);
            binary_case<SA, SB>(
                ctx, rng, "a / b", [](const auto& a, const auto& b) { return a / b; },
                [](double a, double b) { return a / b; }, float_tol, 0.5, 2.0);
            binary_case<SA, SB>(
                ctx, rng, "maximum", [](const auto& a, const auto& b) { return sl::maximum(a, b); },
                [](double a, double b) { return std::max(a, b); }, float_tol);
            binary_case<SA, SB>(
                ctx, rng, "minimum", [](const auto& a, const auto& b) { return sl::minimum(a, b); },
                [](double a, double b) { return std::min(a, b); }, float_tol);
          }
        });
      },
      DEVICE_COUNTS);
}

TEST_CASE("integer and mixed element types: exact integers, the result type follows the operands") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 13);
        using I = std::int32_t;
        oracle::for_each_type(oracle::List<P<Rows, Grid>, P<PSumX, PSumX>, P<PSumX, ColsY>>{},
                              [&]<class SA, class SB>(std::type_identity<P<SA, SB>>) {
                                for (int c = 0; c < cases; ++c) {
                                  binary_case<SA, SB, I, I>(
                                      ctx, rng, "int a + b", [](const auto& a, const auto& b) { return a + b; },
                                      [](double a, double b) { return a + b; }, oracle::Tol::exact(), -50, 50);
                                  binary_case<SA, SB, I, I>(
                                      ctx, rng, "int a * b", [](const auto& a, const auto& b) { return a * b; },
                                      [](double a, double b) { return a * b; }, oracle::Tol::exact(), -50, 50);
                                  binary_case<SA, SB, I, double>(
                                      ctx, rng, "int a + double b",
                                      [](const auto& a, const auto& b) {
                                        auto r = a + b;
                                        static_assert(std::is_same_v<typename decltype(r)::value_type, double>);
                                        return r;
                                      },
                                      [](double a, double b) { return a + b; }, oracle::Tol::rel(1e-12), -50, 50);
                                }
                              });
      },
      DEVICE_COUNTS);
}

TEST_CASE("16-bit operands: every op computes in float and rounds once; bf16 op bf16 is bf16, bf16 op float is float") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 19);
        using B = sl::bf16;
        using H = sl::f16;
        const auto rb = [](double x) { return static_cast<double>(static_cast<float>(B(static_cast<float>(x)))); };
        const auto rh = [](double x) { return static_cast<double>(static_cast<float>(H(static_cast<float>(x)))); };
        // Exact where no partial sum is involved: the float result rounded once.
        oracle::for_each_type(oracle::List<P<Rows, Grid>, P<Rep, ColsY>>{}, [&]<class SA, class SB>(std::type_identity<P<SA, SB>>) {
          for (int c = 0; c < cases; ++c) {
            binary_case<SA, SB, B, B>(
                ctx, rng, "bf16 a * b",
                [](const auto& a, const auto& b) {
                  auto r = a * b;
                  static_assert(std::is_same_v<typename decltype(r)::value_type, B>);
                  return r;
                },
                [&](double a, double b) { return rb(static_cast<float>(a) * static_cast<float>(b)); }, oracle::Tol::exact());
            binary_case<SA, SB, H, H>(
                ctx, rng, "f16 a - b", [](const auto& a, const auto& b) { return a - b; },
                [&](double a, double b) { return rh(static_cast<float>(a) - static_cast<float>(b)); }, oracle::Tol::exact());
            binary_case<SA, SB, B, float>(
                ctx, rng, "bf16 a + float b",
                [](const auto& a, const auto& b) {
                  auto r = a + b;
                  static_assert(std::is_same_v<typename decltype(r)::value_type, float>);
                  return r;
                },
                [&](double a, double b) { return static_cast<float>(a) + static_cast<float>(b); }, oracle::Tol::exact());
            unary_case<SA, B>(
                ctx, rng, "bf16 gelu", [](const auto& a) { return sl::gelu(a); },
                [&](double x) { return rb(static_cast<float>(gelu_ref(x))); }, oracle::Tol::rel_abs(1.0 / 128, 1e-6));
            unary_case<SA, H>(
                ctx, rng, "f16 a * 3 + 0.5", [](const auto& a) { return a * 3 + 0.5f; },
                [&](double x) { return rh(rh(x * 3) + 0.5); }, oracle::Tol::exact());
          }
        });
        // Partial sums stay partial through linear ops; the addends round, so within bf16's step.
        for (int c = 0; c < cases; ++c) {
          binary_case<PSumX, PSumX, B, B>(
              ctx, rng, "bf16 partial a + b",
              [](const auto& a, const auto& b) {
                auto r = a + b;
                static_assert(std::is_same_v<typename decltype(r)::spec_type, PSumX>);
                return r;
              },
              [](double a, double b) { return a + b; }, oracle::Tol::rel_abs(1.0 / 64, 1.0 / 64));
        }
      },
      DEVICE_COUNTS);
}

TEST_CASE("cast<U>: rounds to nearest into 16 bits and back exactly; linear between floating types") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 20);
        oracle::for_each_type(oracle::List<Rows, Grid, PSumX, RowsPSum, PMaxY>{}, [&](auto s) {
          using S = typename decltype(s)::type;
          for (int c = 0; c < cases; ++c) {
            const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
            const auto shape = oracle::random_shape<2>(rng);
            const auto a = oracle::operand<Ten<S>>(mesh, shape, rng.g(), -100.f, 100.f);
            const auto b = sl::cast<sl::bf16>(a);
            const auto h = sl::cast<sl::f16>(a);
            const auto i = sl::cast<std::int32_t>(a);
            static_assert(std::is_same_v<typename decltype(b)::value_type, sl::bf16>);
            // floating to floating keeps a partial sum partial; to an integer reduces first
            static_assert(decltype(b)::sharding.is_partial() == (Ten<S>::sharding.is_partial() && Ten<S>::sharding.op == sl::ReduceOp::sum));
            static_assert(!decltype(i)::sharding.is_partial());
            const auto back = sl::cast<float>(b);
            static_assert(std::is_same_v<typename decltype(back)::value_type, float>);
            const auto ra = oracle::host(a);
            oracle::Ref<2> wb(ra.shape), wh(ra.shape), wi(ra.shape);
            oracle::for_each_index(ra.shape, [&](const oracle::Idx<2>& k) {
              const float x = static_cast<float>(ra(k));
              wb(k) = static_cast<float>(sl::bf16(x));
              wh(k) = static_cast<float>(sl::f16(x));
              wi(k) = static_cast<double>(static_cast<std::int32_t>(x));
            });
            // Each addend of a partial sum rounds by itself: within a step of the rounded sum.
            const auto tol = Ten<S>::sharding.is_partial() && Ten<S>::sharding.op == sl::ReduceOp::sum ? oracle::Tol::rel_abs(1.0 / 32, 1.0)
                                                                                     : oracle::Tol::exact();
            const std::string what = oracle::describe(a);
            oracle::expect_tensor(b, wb, tol, "cast<bf16>: " + what);
            oracle::expect_tensor(h, wh, tol, "cast<f16>: " + what);
            oracle::expect_tensor(back, wb, tol, "cast<float>(cast<bf16>): " + what);
            oracle::expect_tensor(i, wi, oracle::Tol::exact(), "cast<int32>: " + what);
          }
        });
      },
      DEVICE_COUNTS);
}

TEST_CASE("zip and map over 16-bit tensors: the functor sees float, a float result is stored in 16 bits") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh(ctx, {1, ctx.num_devices()});
        const auto a = Ten<Grid, sl::bf16>::random(mesh, {5, 7}, 3);
        const auto b = Ten<Grid, sl::bf16>::random(mesh, {5, 7}, 4);
        const auto z = sl::zip(
            [](auto x, auto y) {
              static_assert(std::is_same_v<decltype(x), float> && std::is_same_v<decltype(y), float>);
              return x * y + 1;
            },
            a, b);
        static_assert(std::is_same_v<typename decltype(z)::value_type, sl::bf16>);
        const auto m = sl::map(a, [](float x) { return static_cast<double>(x) * 2; });  // a double result stays double
        static_assert(std::is_same_v<typename decltype(m)::value_type, double>);
        const auto ha = a.to_host(), hb = b.to_host(), hz = z.to_host();
        const auto hm = m.to_host();
        int bad = 0;
        for (std::size_t k = 0; k < ha.size(); ++k) {
          bad += hz[k].bits() != sl::bf16(float(ha[k]) * float(hb[k]) + 1).bits();
          bad += hm[k] != 2.0 * static_cast<float>(ha[k]);
        }
        CHECK(bad == 0);
      },
      DEVICE_COUNTS);
}

TEST_CASE("scalars on either side and negation match the oracle; linear ones keep a partial sum") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 14);
        oracle::for_each_type(oracle::List<Grid, Both, PSumX, RowsPSum, PMaxY>{}, [&](auto s) {
          using S = typename decltype(s)::type;
          for (int c = 0; c < cases; ++c) {
            // clang-format off
            unary_case<S>(ctx, rng, "a + 1.5", [](const auto& a) { return a + 1.5f; }, [](double x) { return x + 1.5; }, float_tol);
            unary_case<S>(ctx, rng, "1.5 + a", [](const auto& a) { return 1.5f + a; }, [](double x) { return 1.5 + x; }, float_tol);
            unary_case<S>(ctx, rng, "a - 1.5", [](const auto& a) { return a - 1.5f; }, [](double x) { return x - 1.5; }, float_tol);
            unary_case<S>(ctx, rng, "1.5 - a", [](const auto& a) { return 1.5f - a; }, [](double x) { return 1.5 - x; }, float_tol);
            unary_case<S>(ctx, rng, "a * 3", [](const auto& a) { return a * 3; }, [](double x) { return x * 3; }, float_tol);
            unary_case<S>(ctx, rng, "3 * a", [](const auto& a) { return 3.0 * a; }, [](double x) { return 3 * x; }, float_tol);
            unary_case<S>(ctx, rng, "a / 4", [](const auto& a) { return a / 4.0f; }, [](double x) { return x / 4; }, float_tol);
            unary_case<S>(ctx, rng, "2 / a", [](const auto& a) { return 2.0f / a; }, [](double x) { return 2 / x; }, float_tol, 0.5, 2);
            unary_case<S>(ctx, rng, "-a", [](const auto& a) { return -a; }, [](double x) { return -x; }, float_tol);
            // clang-format on
          }
        });
      },
      DEVICE_COUNTS);
}

TEST_CASE("output specs: the rule's layout, partial sums kept only through linear ops") {
  using A = Ten<PSumX>;
  using R = Ten<Rep>;
  static_assert(std::is_same_v<decltype(std::declval<A>() * 2.0f)::spec_type, PSumX>);
  static_assert(std::is_same_v<decltype(2.0 * std::declval<A>())::spec_type, PSumX>);
  static_assert(std::is_same_v<decltype(std::declval<A>() / 2.0f)::spec_type, PSumX>);
  static_assert(std::is_same_v<decltype(-std::declval<A>())::spec_type, PSumX>);
  static_assert(std::is_same_v<decltype(std::declval<A>() + std::declval<A>())::spec_type, PSumX>);
  static_assert(std::is_same_v<decltype(std::declval<A>() * std::declval<R>())::spec_type, PSumX>);
  static_assert(std::is_same_v<decltype(std::declval<A>() + 1.0f)::spec_type, Rep>);
  static_assert(std::is_same_v<decltype(2.0f / std::declval<A>())::spec_type, Rep>);
  static_assert(std::is_same_v<decltype(std::declval<R>() / std::declval<A>())::spec_type, Rep>);
  static_assert(std::is_same_v<decltype(std::declval<A>() * std::declval<A>())::spec_type, Rep>);
  static_assert(std::is_same_v<decltype(sl::exp(std::declval<A>()))::spec_type, Rep>);
  static_assert(std::is_same_v<decltype(-std::declval<Ten<PMaxY>>())::spec_type, Rep>);
  static_assert(std::is_same_v<decltype(std::declval<Ten<Rows>>() + std::declval<Ten<ColsY>>())::spec_type, Spec<"x", "y">>);
  static_assert(std::is_same_v<decltype(std::declval<Ten<Rep>>() + std::declval<Ten<Grid>>())::spec_type, Grid>);
  static_assert(std::is_same_v<decltype(std::declval<Ten<Rows>>() + std::declval<Ten<Both>>())::spec_type, Both>);
  static_assert(std::is_same_v<decltype(std::declval<Ten<RowsPSum>>() * std::declval<Ten<Spec<"x">>>())::spec_type,
                               RowsPSum>);  // x is partial in the result: the bias is replicated over it
  static_assert(std::is_same_v<decltype(std::declval<Ten<Rows>>() * 2.0)::value_type, float>);
  static_assert(std::is_same_v<decltype(2 * std::declval<Ten<Rows, std::int32_t>>())::value_type, std::int32_t>);
  CHECK(true);
}

TEST_CASE("output spec types do not depend on the other ops of the file (specs that differ only in which dim is split)") {
  // Runtime checks on purpose (a failure should not stop the file from compiling): g++ 12 took
  // class-type template arguments whose arrays differ only in where equal non-zero elements sit
  // for the same argument, so spec_t of {y on dim 1} and {y on dim 2} was one type (the first
  // instantiated won) until spec_t took a flat byte code.
  using RA = decltype(std::declval<Ten<Spec<none, "y", none, partial_sum<"x">>>>() + 1.0f);
  using RB = decltype(std::declval<Ten<Spec<none, none, "y", partial_sum<"x">>>>() + 1.0f);
  CHECK_MESSAGE((std::is_same_v<RA::spec_type, Spec<none, "y", none>>), RA::spec_string());
  CHECK_MESSAGE((std::is_same_v<RB::spec_type, Spec<none, none, "y">>), RB::spec_string());
  using RC = decltype(std::declval<Ten<Spec<none, "x", none, partial_sum<"y">>>>() * std::declval<Ten<Rep>>());
  using RD = decltype(std::declval<Ten<Spec<none, none, "x", partial_sum<"y">>>>() * std::declval<Ten<Rep>>());
  CHECK_MESSAGE((std::is_same_v<RC::spec_type, Spec<none, "x", none, partial_sum<"y">>>), RC::spec_string());
  CHECK_MESSAGE((std::is_same_v<RD::spec_type, Spec<none, none, "x", partial_sum<"y">>>), RD::spec_string());
}

TEST_CASE("unary math matches the oracle on split and partial operands") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 15);
        oracle::for_each_type(oracle::List<Grid, RowsPSum, PMaxY>{}, [&](auto s) {
          using S = typename decltype(s)::type;
          const oracle::Tol tol = oracle::Tol::rel(2e-6);
          for (int c = 0; c < 2; ++c) {
            // clang-format off
            unary_case<S>(ctx, rng, "exp", [](const auto& a) { return sl::exp(a); }, [](double x) { return std::exp(x); }, tol, -3, 3);
            unary_case<S>(ctx, rng, "log", [](const auto& a) { return sl::log(a); }, [](double x) { return std::log(x); }, tol, 0.1, 3);
            unary_case<S>(ctx, rng, "sqrt", [](const auto& a) { return sl::sqrt(a); }, [](double x) { return std::sqrt(x); }, tol, 0.1, 3);
            unary_case<S>(ctx, rng, "rsqrt", [](const auto& a) { return sl::rsqrt(a); }, [](double x) { return 1 / std::sqrt(x); }, tol, 0.1, 3);
            unary_case<S>(ctx, rng, "tanh", [](const auto& a) { return sl::tanh(a); }, [](double x) { return std::tanh(x); }, tol, -3, 3);
            unary_case<S>(ctx, rng, "abs", [](const auto& a) { return sl::abs(a); }, [](double x) { return std::abs(x); }, tol, -3, 3);
            unary_case<S>(ctx, rng, "square", [](const auto& a) { return sl::square(a); }, [](double x) { return x * x; }, tol, -3, 3);
            unary_case<S>(ctx, rng, "relu", [](const auto& a) { return sl::relu(a); }, [](double x) { return x > 0 ? x : 0; }, tol, -3, 3);
            unary_case<S>(ctx, rng, "sigmoid", [](const auto& a) { return sl::sigmoid(a); }, [](double x) { return 1 / (1 + std::exp(-x)); }, tol, -3, 3);
            unary_case<S>(ctx, rng, "silu", [](const auto& a) { return sl::silu(a); }, [](double x) { return x / (1 + std::exp(-x)); }, tol, -3, 3);
            unary_case<S>(ctx, rng, "gelu", [](const auto& a) { return sl::gelu(a); }, gelu_ref, tol, -3, 3);
            unary_case<S>(ctx, rng, "gelu_tanh", [](const auto& a) { return sl::gelu_tanh(a); }, gelu_tanh_ref, tol, -3, 3);
            // clang-format on
          }
        });
        // Doubles: the functors compute in the element type.
        for (int c = 0; c < cases; ++c) {
          unary_case<Grid, double>(
              ctx, rng, "double gelu", [](const auto& a) { return sl::gelu(a); }, gelu_ref, oracle::Tol::rel(1e-13), -3, 3);
          unary_case<RowsPSum, double>(
              ctx, rng, "double exp", [](const auto& a) { return sl::exp(a); }, [](double x) { return std::exp(x); },
              oracle::Tol::rel(1e-12), -3, 3);
        }
      },
      DEVICE_COUNTS);
}

TEST_CASE("broadcasting across ranks: rank-1 and rank-2 operands against rank-3 ones, on either side") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 16);
        using Big = oracle::List<Spec<"x", none, "y">, Spec<"y", none, none>, Spec<none, none, none, partial_sum<"x">>>;
        using Small = oracle::List<Spec<"y">, Spec<"x">, Spec<none, "y">, Spec<none, none, partial_sum<"x">>>;
        oracle::for_each_pair(Big{}, Small{}, [&](auto sa, auto sb) {
          using SA = typename decltype(sa)::type;
          using SB = typename decltype(sb)::type;
          constexpr std::size_t rb = SB::rank;
          for (int c = 0; c < cases; ++c) {
            const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
            const auto sha = oracle::random_shape<3>(rng);
            oracle::Idx<rb> shb{};
            for (std::size_t d = 0; d < rb; ++d) shb[d] = rng.below(4) == 0 ? 1 : sha[d + 3 - rb];
            const auto a = oracle::operand<Ten<SA>>(mesh, sha, rng.g());
            const auto b = oracle::operand<Ten<SB>>(mesh, shb, rng.g());
            const auto mul = a * b;   // the bias on the right
            const auto sub = b - a;   // on the left
            const auto ra = oracle::host(a);
            const auto rbh = oracle::host(b);
            oracle::Ref<3> want_mul(sha), want_sub(sha);
            oracle::for_each_index(sha, [&](const oracle::Idx<3>& i) {
              want_mul(i) = ra(i) * rbh.bcast(i);
              want_sub(i) = rbh.bcast(i) - ra(i);
            });
            oracle::expect_tensor(mul, want_mul, float_tol, "a * b: " + oracle::describe(a, b));
            oracle::expect_tensor(sub, want_sub, float_tol, "b - a: " + oracle::describe(b, a));
          }
        });
      },
      DEVICE_COUNTS);
}

TEST_CASE("zip of three operands of mixed types and ranks matches the oracle") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 17);
        using Triples = oracle::List<std::tuple<Rows, ColsY, Spec<"x">>, std::tuple<Grid, PSumX, Spec<none>>,
                                     std::tuple<PMaxY, Both, Spec<"y">>>;
        oracle::for_each_type(Triples{}, [&]<class SA, class SB, class SC>(std::type_identity<std::tuple<SA, SB, SC>>) {
          for (int c = 0; c < cases; ++c) {
            const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
            const auto [sa, sb] = broadcast_pair(rng);
            const oracle::Idx<1> sc{rng.below(3) == 0 ? 1 : broadcast(sa, sb)[1]};
            const auto a = oracle::operand<Ten<SA>>(mesh, sa, rng.g());
            const auto b = oracle::operand<Ten<SB, std::int32_t>>(mesh, sb, rng.g(), -9, 9);
            const auto cc = oracle::operand<Ten<SC, double>>(mesh, sc, rng.g());
            const auto r = sl::zip([](float x, std::int32_t y, double z) { return x * y + z; }, a, b, cc);
            static_assert(std::is_same_v<typename decltype(r)::value_type, double>);
            const auto ra = oracle::host(a), rb = oracle::host(b);
            const auto rc = oracle::host(cc);
            oracle::Ref<2> want(broadcast(sa, sb));
            oracle::for_each_index(want.shape, [&](const oracle::Idx<2>& i) {
              want(i) = static_cast<double>(static_cast<float>(ra.bcast(i)) * static_cast<float>(rb.bcast(i))) + rc.bcast(i);
            });
            oracle::expect_tensor(r, want, oracle::Tol::rel(1e-6), "zip: " + oracle::describe(a, b, cc));
          }
        });
      },
      DEVICE_COUNTS);
}

TEST_CASE("no collective: equal specs, replicated against split, partial sums kept, a broadcast bias") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 18);
        for (int c = 0; c < cases; ++c) {
          const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
          const auto shape = oracle::random_shape<2>(rng);
          const auto g1 = oracle::operand<Ten<Grid>>(mesh, shape, 1);
          const auto g2 = oracle::operand<Ten<Grid>>(mesh, shape, 2);
          const auto rep = oracle::operand<Ten<Rep>>(mesh, shape, 3);
          const auto p1 = oracle::operand<Ten<RowsPSum>>(mesh, shape, 4);
          const auto p2 = oracle::operand<Ten<RowsPSum>>(mesh, shape, 5);
          const auto bias = oracle::operand<Ten<Spec<"x">>>(mesh, oracle::Idx<1>{shape[1]}, 6);
          sl::coll::CommRecorder rec;
          const auto s1 = g1 + g2;
          const auto s2 = rep * g1;
          const auto s3 = p1 + p2;
          const auto s4 = p1 * 2.0f;
          const auto s5 = g1 * bias;
          const auto s6 = -p1;
          const auto s7 = sl::exp(g1);
          CHECK_MESSAGE(rec.total_calls() == 0, rec.to_string());
          static_assert(std::is_same_v<decltype(s2)::spec_type, Grid>);
          static_assert(std::is_same_v<decltype(s3)::spec_type, RowsPSum>);
          const auto h1 = oracle::host(g1), h2 = oracle::host(g2), hr = oracle::host(rep), hp1 = oracle::host(p1),
                     hp2 = oracle::host(p2);
          const auto hb = oracle::host(bias);
          oracle::Ref<2> w1(shape), w2(shape), w3(shape), w4(shape), w5(shape), w6(shape), w7(shape);
          oracle::for_each_index(shape, [&](const oracle::Idx<2>& i) {
            w1(i) = h1(i) + h2(i);
            w2(i) = hr(i) * h1(i);
            w3(i) = hp1(i) + hp2(i);
            w4(i) = hp1(i) * 2;
            w5(i) = h1(i) * hb.bcast(i);
            w6(i) = -hp1(i);
            w7(i) = std::exp(h1(i));
          });
          const std::string what = oracle::describe(g1) + ", " + std::to_string(c);
          oracle::expect_tensor(s1, w1, float_tol, "g + g " + what);
          oracle::expect_tensor(s2, w2, float_tol, "rep * g " + what);
          oracle::expect_tensor(s3, w3, float_tol, "p + p " + what);
          oracle::expect_tensor(s4, w4, float_tol, "p * 2 " + what);
          oracle::expect_tensor(s5, w5, float_tol, "g * bias " + what);
          oracle::expect_tensor(s6, w6, float_tol, "-p " + what);
          oracle::expect_tensor(s7, w7, float_tol, "exp(g) " + what);
        }
      },
      DEVICE_COUNTS);
}

TEST_CASE("errors: shapes that do not broadcast (both shapes and specs named), operands on different meshes") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const int n = ctx.num_devices();
        const M2 mesh(ctx, {n, 1});
        const auto a = Ten<Rows>::random(mesh, {3, 4}, 1);
        const auto b = Ten<ColsY>::random(mesh, {3, 5}, 2);
        const auto c = Ten<Spec<"y">>::random(mesh, {5}, 3);
        try {
          (void)(a + b);
          FAIL_CHECK("a + b of shapes [3, 4] and [3, 5] did not throw");
        } catch (const std::invalid_argument& e) {
          CHECK_MESSAGE(contains_all(e.what(), "add", "[3, 4] with Spec<\"x\", none>", "[3, 5] with Spec<none, \"y\">"),
                        e.what());
        }
        try {
          (void)sl::maximum(c, a);
          FAIL_CHECK("maximum of shapes [5] and [3, 4] did not throw");
        } catch (const std::invalid_argument& e) {
          CHECK_MESSAGE(contains_all(e.what(), "maximum", "[5] with Spec<\"y\">", "[3, 4] with Spec<\"x\", none>"),
                        e.what());
        }
        try {
          (void)sl::zip([](float x, float y, float z) { return x + y + z; }, a, a, c);
          FAIL_CHECK("zip of shapes [3, 4], [3, 4], [5] did not throw");
        } catch (const std::invalid_argument& e) {
          CHECK_MESSAGE(contains_all(e.what(), "zip", "[3, 4] with Spec<\"x\", none>", "[5] with Spec<\"y\">"), e.what());
        }
        if (n > 1) {
          const M2 other(ctx, {1, n});
          const auto d = Ten<Rows>::random(other, {3, 4}, 4);
          try {
            (void)(a * d);
            FAIL_CHECK("a * d on different meshes did not throw");
          } catch (const std::invalid_argument& e) {
            CHECK_MESSAGE(contains_all(e.what(), "different meshes", mesh.to_string(), other.to_string()), e.what());
          }
        }
      },
      DEVICE_COUNTS);
}
}
