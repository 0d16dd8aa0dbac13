// SPDX-License-Identifier: Apache-2.0
// Oracle tests of the reductions and normalisations (ops/reduce.hpp): sum, mean, max, min and
// argmax along each dim with keepdim on and off, softmax, log_softmax, layer_norm and rms_norm
// along split and unsplit dims, over lists of spec types (split, multi-axis, replicated, partial
// sum and partial max operands), on random meshes of the run's devices and random uneven shapes
// (extents 0 and 1 too), against plain loops in double on the gathered operand. Also the output
// spec types, the collectives each op runs, and ties of argmax across devices. Runs on 1..8
// threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/autodiff.hpp>
#include <shardlib/ops.hpp>

#include "../collectives/harness.hpp"
#include "oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace sl = shardlib;
namespace oracle = shardlib::test::oracle;
using oracle::M2;
using sl::axes;
using sl::none;
using sl::partial_max;
using sl::partial_min;
using sl::partial_sum;
using sl::Spec;

namespace {
template <class S, class T = float>
using Ten = sl::DistributedTensor<T, M2, S>;

using Rep = Spec<none, none>;
using Rows = Spec<"x", none>;
using Grid = Spec<"y", "x">;
using Both = Spec<axes<"x", "y">, none>;
using PSumX = Spec<none, none, partial_sum<"x">>;
using RowsPSum = Spec<"y", none, partial_sum<"x">>;
using PMaxY = Spec<none, none, partial_max<"y">>;
using ColsPMin = Spec<none, "x", partial_min<"y">>;

constexpr int cases = 3;  // random cases per combination and device count
#define DEVICE_COUNTS {1, 2, 3, 4, 6, 8}

enum class Op { sum, mean, max, min, argmax, softmax, log_softmax, layer_norm, rms_norm };
constexpr const char* op_name(Op op) {
  constexpr const char* names[] = {"sum", "mean", "max", "min", "argmax", "softmax", "log_softmax", "layer_norm", "rms_norm"};
  return names[static_cast<int>(op)];
}
constexpr bool needs_elements(Op op) { return op == Op::max || op == Op::min || op == Op::argmax; }

/// A dim and keepdim, as a type.
template <int D, bool K = false>
struct DK {};

/// `i` without dim `d` (or with 0 there when `keep`): the output index of a reduction.
template <std::size_t RO, std::size_t R>
oracle::Idx<RO> reduced_index(const oracle::Idx<R>& i, int d, bool keep) {
  oracle::Idx<RO> o{};
  std::size_t k = 0;
  for (std::size_t j = 0; j < R && k < RO; ++j) {
    if (static_cast<int>(j) == d) {
      if (keep) o[k++] = 0;
    } else {
      o[k++] = i[j];
    }
  }
  return o;
}

/// The values along dim `d` through index `i` (whose entry at `d` is ignored).
template <std::size_t R>
std::vector<double> row_of(const oracle::Ref<R>& in, oracle::Idx<R> i, int d) {
  const auto ud = static_cast<std::size_t>(d);
  std::vector<double> row(static_cast<std::size_t>(in.shape[ud]));
  for (std::int64_t k = 0; k < in.shape[ud]; ++k) {
    i[ud] = k;
    row[static_cast<std::size_t>(k)] = in(i);
  }
  return row;
}

/// The one-device reduction of a row.
double reduce_row(Op op, const std::vector<double>& row) {
  double s = 0;
  switch (op) {
    case Op::sum:
    case Op::mean:
      for (double x : row) s += x;
      return op == Op::mean ? s / static_cast<double>(row.size()) : s;
    case Op::max: return *std::max_element(row.begin(), row.end());
    case Op::min: return *std::min_element(row.begin(), row.end());
    case Op::argmax: return static_cast<double>(std::max_element(row.begin(), row.end()) - row.begin());  // the first
    default: return 0;
  }
}

/// The one-device normalisation of a row, in place.
void normalize_row(Op op, std::vector<double>& row, double eps) {
  const double n = static_cast<double>(row.size());
  if (op == Op::softmax || op == Op::log_softmax) {
    const double mx = *std::max_element(row.begin(), row.end());
    double s = 0;
    for (double x : row) s += std::exp(x - mx);
    for (double& x : row) x = op == Op::softmax ? std::exp(x - mx) / s : x - mx - std::log(s);
  } else if (op == Op::layer_norm) {
    double mean = 0, var = 0;
    for (double x : row) mean += x;
    mean /= n;
    for (double x : row) var += (x - mean) * (x - mean);
    var /= n;
    for (double& x : row) x = (x - mean) / std::sqrt(var + eps);
  } else {
    double ms = 0;
    for (double x : row) ms += x * x;
    ms /= n;
    for (double& x : row) x = x / std::sqrt(ms + eps);
  }
}

template <Op O, int D, bool K, class A>
auto apply(const A& a) {
  if constexpr (O == Op::sum) return sl::sum<D, K>(a);
  else if constexpr (O == Op::mean) return sl::mean<D, K>(a);
  else if constexpr (O == Op::max) return sl::max<D, K>(a);
  else if constexpr (O == Op::min) return sl::min<D, K>(a);
  else return sl::argmax<D, K>(a);
}

/// The reference of reduction `O` along `D` of `in`.
template <std::size_t RO, std::size_t R>
oracle::Ref<RO> reference_reduce(Op op, const oracle::Ref<R>& in, int d, bool keep) {
  oracle::Idx<RO> shape = reduced_index<RO>(in.shape, d, keep);
  if (keep) shape[static_cast<std::size_t>(d)] = 1;
  oracle::Ref<RO> want(shape);
  oracle::Idx<R> rows = in.shape;
  rows[static_cast<std::size_t>(d)] = 1;
  oracle::for_each_index(rows, [&](const oracle::Idx<R>& i) { want(reduced_index<RO>(i, d, keep)) = reduce_row(op, row_of(in, i, d)); });
  return want;
}

/// One random case of reduction `O` along `D` (keepdim `K`) of a rank-R tensor of spec S.
template <Op O, int D, bool K, class S, class T = float>
void reduce_case(sl::Context& ctx, oracle::Rng& rng, oracle::Tol tol, T lo = T(-1), T hi = T(1)) {
  constexpr std::size_t R = S::rank;
  const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
  auto shape = oracle::random_shape<R>(rng);
  if (needs_elements(O)) shape[D] = std::max<std::int64_t>(shape[D], 1);
  const auto a = oracle::operand<Ten<S, T>>(mesh, shape, rng.g(), lo, hi);
  const auto r = apply<O, D, K>(a);
  using Out = std::remove_cvref_t<decltype(r)>;
  static_assert(Out::rank == (K ? R : R - 1));
  static_assert(std::is_same_v<typename Out::value_type, std::conditional_t<O == Op::argmax, std::int64_t, T>>);
  const auto in = oracle::host(a);
  const auto want = reference_reduce<Out::rank>(O, in, D, K);
  oracle::expect_tensor(r, want, tol,
                        std::string(op_name(O)) + "<" + std::to_string(D) + (K ? ", keepdim" : "") + ">: " + oracle::describe(a));
}

/// One random case of normalisation `O` along `D` of a tensor of spec S, and its collectives:
/// none when `D` is not split, else two all_reduces (softmax) or one (the norms); the output
/// keeps the (reduced) layout of the operand.
template <Op O, int D, class S, class T = float>
void normalize_case(sl::Context& ctx, oracle::Rng& rng, oracle::Tol tol, double eps) {
  constexpr std::size_t R = S::rank;
  const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
  const auto shape = oracle::random_shape<R>(rng);
  const auto a = oracle::operand<Ten<S, T>>(mesh, shape, rng.g(), T(-3), T(3));
  const bool split = !Ten<S, T>::sharding.dims[D].empty();
  sl::coll::CommRecorder rec;
  const auto r = [&] {
    if constexpr (O == Op::softmax) return sl::softmax<D>(a);
    else if constexpr (O == Op::log_softmax) return sl::log_softmax<D>(a);
    else if constexpr (O == Op::layer_norm) return sl::layer_norm<D>(a, eps);
    else return sl::rms_norm<D>(a, eps);
  }();
  const std::string what = std::string(op_name(O)) + "<" + std::to_string(D) + ">: " + oracle::describe(a);
  if constexpr (!Ten<S, T>::sharding.is_partial()) {  // a partial operand is reduced first (collectives)
    const std::uint64_t expected = !split ? 0 : (O == Op::softmax || O == Op::log_softmax) ? 2 : 1;
    CHECK_MESSAGE(rec.total_calls() == expected, what << ": " << rec.to_string());
    CHECK_MESSAGE(rec[sl::coll::Kind::all_reduce].calls == expected, what << ": " << rec.to_string());
  }
  static_assert(std::is_same_v<typename decltype(r)::spec_type, sl::spec_t<M2, sl::detail::reduced(Ten<S, T>::sharding)>>);
  const auto in = oracle::host(a);
  oracle::Ref<R> want(shape);
  oracle::Idx<R> rows = shape;
  rows[D] = 1;
  oracle::for_each_index(rows, [&](oracle::Idx<R> i) {
    std::vector<double> row = row_of(in, i, D);
    if (row.empty()) return;
    normalize_row(O, row, eps);
    for (std::size_t k = 0; k < row.size(); ++k) {
      i[D] = static_cast<std::int64_t>(k);
      want(i) = row[k];
    }
  });
  oracle::expect_tensor(r, want, tol, what);
}

constexpr oracle::Tol sum_tol = oracle::Tol::rel_abs(1e-5, 1e-4);  // partial addends reach +-20
constexpr oracle::Tol norm_tol = oracle::Tol::rel_abs(1e-4, 1e-4);

using Specs2 = oracle::List<Rep, Rows, Grid, Both, PSumX, RowsPSum, PMaxY, ColsPMin>;
using DimsKeep2 = oracle::List<DK<0, false>, DK<1, false>, DK<0, true>, DK<1, true>>;

template <Op O>
void reduce_property(sl::Context& ctx, std::uint64_t seed, oracle::Tol tol) {
  auto rng = oracle::rng_for(ctx, seed);
  oracle::for_each_pair(Specs2{}, DimsKeep2{}, [&]<class S, int D, bool K>(std::type_identity<S>, std::type_identity<DK<D, K>>) {
    for (int c = 0; c < cases; ++c) reduce_case<O, D, K, S>(ctx, rng, tol);
  });
}
}  // namespace

TEST_SUITE("ops_reduce") {
TEST_CASE("sum along each dim, keepdim or not, matches the oracle for every spec (partial sums stay partial)") {
  sl::test::for_each_run([](sl::Context& ctx) { reduce_property<Op::sum>(ctx, 21, sum_tol); }, DEVICE_COUNTS);
}

TEST_CASE("mean divides by the global extent (uneven blocks, empty dims give NaN)") {
  sl::test::for_each_run([](sl::Context& ctx) { reduce_property<Op::mean>(ctx, 22, sum_tol); }, DEVICE_COUNTS);
}

TEST_CASE("max and min match the oracle (a partial max stays partial through max, is reduced for min)") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        reduce_property<Op::max>(ctx, 23, oracle::Tol::exact());
        reduce_property<Op::min>(ctx, 24, oracle::Tol::exact());
      },
      DEVICE_COUNTS);
}

TEST_CASE("argmax answers global int64 indices of the first maximum (split dims, partial operands)") {
  sl::test::for_each_run([](sl::Context& ctx) { reduce_property<Op::argmax>(ctx, 25, oracle::Tol::exact()); },
                         DEVICE_COUNTS);
}

TEST_CASE("integer elements: exact sums, max, min; argmax ties resolve to the first index across devices") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 26);
        using I = std::int32_t;
        oracle::for_each_pair(oracle::List<Grid, Both, RowsPSum, PMaxY>{}, oracle::List<DK<0, false>, DK<1, true>>{},
                              [&]<class S, int D, bool K>(std::type_identity<S>, std::type_identity<DK<D, K>>) {
                                for (int c = 0; c < cases; ++c) {
                                  reduce_case<Op::sum, D, K, S, I>(ctx, rng, oracle::Tol::exact(), I(-100), I(100));
                                  reduce_case<Op::max, D, K, S, I>(ctx, rng, oracle::Tol::exact(), I(-100), I(100));
                                  reduce_case<Op::min, D, K, S, I>(ctx, rng, oracle::Tol::exact(), I(-100), I(100));
                                  // values in [0, 3): many ties, on several devices along a split dim
                                  reduce_case<Op::argmax, D, K, S, I>(ctx, rng, oracle::Tol::exact(), I(0), I(3));
                                  reduce_case<Op::argmax, D, K, S, double>(ctx, rng, oracle::Tol::exact());
                                }
                              });
      },
      DEVICE_COUNTS);
}

TEST_CASE("reductions of rank-1 and rank-3 tensors (scalar outputs, inner and outer dims)") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 27);
        oracle::for_each_type(oracle::List<Spec<"x">, Spec<axes<"y", "x">>, Spec<none, partial_sum<"y">>>{}, [&](auto s) {
          using S = typename decltype(s)::type;
          for (int c = 0; c < cases; ++c) {
            reduce_case<Op::sum, 0, false, S>(ctx, rng, sum_tol);
            reduce_case<Op::mean, 0, true, S>(ctx, rng, sum_tol);
            reduce_case<Op::max, 0, false, S>(ctx, rng, oracle::Tol::exact());
            reduce_case<Op::argmax, 0, false, S>(ctx, rng, oracle::Tol::exact());
          }
        });
        using Specs3 = oracle::List<Spec<"x", none, "y">, Spec<none, axes<"y", "x">, none>, Spec<"y", none, none, partial_sum<"x">>>;
        oracle::for_each_pair(Specs3{}, oracle::List<DK<0, true>, DK<1, false>, DK<2, true>, DK<2, false>>{},
                              [&]<class S, int D, bool K>(std::type_identity<S>, std::type_identity<DK<D, K>>) {
                                for (int c = 0; c < cases; ++c) {
                                  reduce_case<Op::sum, D, K, S>(ctx, rng, sum_tol);
                                  reduce_case<Op::min, D, K, S>(ctx, rng, oracle::Tol::exact());
                                  reduce_case<Op::argmax, D, K, S>(ctx, rng, oracle::Tol::exact());
                                }
                              });
      },
      DEVICE_COUNTS);
}

TEST_CASE("output specs of the reductions: partial over the reduced dim's axes, argmax never partial") {
  using G = Ten<Grid>;
  static_assert(std::is_same_v<decltype(sl::sum<1>(std::declval<G>()))::spec_type, Spec<"y", partial_sum<"x">>>);
  static_assert(std::is_same_v<decltype(sl::sum<0, true>(std::declval<G>()))::spec_type, Spec<none, "x", partial_sum<"y">>>);
  static_assert(std::is_same_v<decltype(sl::mean<0>(std::declval<Ten<Both>>()))::spec_type, Spec<none, partial_sum<"x", "y">>>);
  static_assert(std::is_same_v<decltype(sl::max<1>(std::declval<G>()))::spec_type, Spec<"y", partial_max<"x">>>);
  static_assert(std::is_same_v<decltype(sl::min<0, true>(std::declval<G>()))::spec_type, Spec<none, "x", partial_min<"y">>>);
  static_assert(std::is_same_v<decltype(sl::sum<0>(std::declval<Ten<PSumX>>()))::spec_type, Spec<none, partial_sum<"x">>>);
  static_assert(std::is_same_v<decltype(sl::sum<1>(std::declval<Ten<RowsPSum>>()))::spec_type, Spec<"y", partial_sum<"x">>>);
  static_assert(std::is_same_v<decltype(sl::sum<0>(std::declval<Ten<RowsPSum>>()))::spec_type, Spec<none, partial_sum<"x", "y">>>);
  static_assert(std::is_same_v<decltype(sl::max<1>(std::declval<Ten<PMaxY>>()))::spec_type, Spec<none, partial_max<"y">>>);
  static_assert(std::is_same_v<decltype(sl::sum<1>(std::declval<Ten<PMaxY>>()))::spec_type, Spec<none>>);
  static_assert(std::is_same_v<decltype(sl::min<1>(std::declval<Ten<PMaxY>>()))::spec_type, Spec<none>>);
  static_assert(std::is_same_v<decltype(sl::max<0>(std::declval<Ten<ColsPMin>>()))::spec_type, Spec<"x">>);
  static_assert(std::is_same_v<decltype(sl::min<0>(std::declval<Ten<ColsPMin>>()))::spec_type, Spec<"x", partial_min<"y">>>);
  static_assert(std::is_same_v<decltype(sl::argmax<1>(std::declval<G>()))::spec_type, Spec<"y">>);
  static_assert(std::is_same_v<decltype(sl::argmax<1>(std::declval<G>()))::value_type, std::int64_t>);
  static_assert(std::is_same_v<decltype(sl::argmax<0, true>(std::declval<Ten<PSumX>>()))::spec_type, Rep>);
  static_assert(std::is_same_v<decltype(sl::sum<0>(std::declval<Ten<Spec<"x">>>()))::spec_type, Spec<partial_sum<"x">>>);
  static_assert(decltype(sl::sum<0>(std::declval<Ten<Spec<"x">>>()))::rank == 0);
  static_assert(std::is_same_v<decltype(sl::softmax<1>(std::declval<G>()))::spec_type, Grid>);
  static_assert(std::is_same_v<decltype(sl::layer_norm<0>(std::declval<Ten<RowsPSum>>()))::spec_type, Spec<"y", none>>);
  static_assert(std::is_same_v<decltype(sl::rms_norm<1>(std::declval<Ten<PMaxY>>()))::spec_type, Rep>);
  CHECK(true);
}

TEST_CASE("output spec types do not depend on the other ops of the file (specs that differ only in which dim is split)") {
  // Runtime checks on purpose (a failure should not stop the file from compiling): g++ 12 took
  // class-type template arguments whose arrays differ only in where equal non-zero elements sit
  // for the same argument, so spec_t of {y on dim 1} and {y on dim 2} was one type (the first
  // instantiated won) until spec_t took a flat byte code.
  using A = Ten<Spec<none, "y", none, partial_sum<"x">>>;
  using B = Ten<Spec<none, none, "y", partial_sum<"x">>>;
  using RA = decltype(sl::softmax<0>(std::declval<A>()));
  using RB = decltype(sl::softmax<0>(std::declval<B>()));
  CHECK_MESSAGE((std::is_same_v<RA::spec_type, Spec<none, "y", none>>), RA::spec_string());
  CHECK_MESSAGE((std::is_same_v<RB::spec_type, Spec<none, none, "y">>), RB::spec_string());
  using SA = decltype(sl::max<0, true>(std::declval<Ten<Spec<none, "y", none>>>()));
  using SB = decltype(sl::max<0, true>(std::declval<Ten<Spec<none, none, "y">>>()));
  CHECK_MESSAGE((std::is_same_v<SA::spec_type, Spec<none, "y", none>>), SA::spec_string());
  CHECK_MESSAGE((std::is_same_v<SB::spec_type, Spec<none, none, "y">>), SB::spec_string());
}

TEST_CASE("collectives: none for reductions of unpartial operands, two small all_reduces for argmax along a split dim") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 28);
        for (int c = 0; c < cases; ++c) {
          const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
          auto shape = oracle::random_shape<2>(rng);
          shape[1] = std::max<std::int64_t>(shape[1], 1);
          const auto g = oracle::operand<Ten<Grid>>(mesh, shape, 1);
          const auto p = oracle::operand<Ten<RowsPSum>>(mesh, shape, 2);
          sl::coll::CommRecorder rec;
          const auto s1 = sl::sum<1>(g);
          const auto s2 = sl::mean<0, true>(g);
          const auto s3 = sl::max<1>(g);
          const auto s4 = sl::sum<0>(p);  // a partial sum stays partial
          CHECK_MESSAGE(rec.total_calls() == 0, rec.to_string());
          const auto s5 = sl::softmax<0>(g);
          (void)s5;
          CHECK_MESSAGE(rec.total_calls() == 2, rec.to_string());  // along dim 0, split over "y"
          rec.reset();
          const auto am = sl::argmax<1>(g);
          const bool rows = g.block().extent[0] > 0;
          CHECK_MESSAGE(rec[sl::coll::Kind::all_reduce].calls == (rows ? 2u : 0u), rec.to_string());
          CHECK_MESSAGE(rec.total_calls() == rec[sl::coll::Kind::all_reduce].calls, rec.to_string());
          const auto hg = oracle::host(g), hp = oracle::host(p);
          const std::string what = oracle::describe(g, p);
          oracle::expect_tensor(s1, reference_reduce<1>(Op::sum, hg, 1, false), sum_tol, "sum<1> " + what);
          oracle::expect_tensor(s2, reference_reduce<2>(Op::mean, hg, 0, true), sum_tol, "mean<0, true> " + what);
          oracle::expect_tensor(s3, reference_reduce<1>(Op::max, hg, 1, false), oracle::Tol::exact(), "max<1> " + what);
          oracle::expect_tensor(s4, reference_reduce<1>(Op::sum, hp, 0, false), sum_tol, "sum<0> " + what);
          oracle::expect_tensor(am, reference_reduce<1>(Op::argmax, hg, 1, false), oracle::Tol::exact(), "argmax<1> " + what);
        }
      },
      DEVICE_COUNTS);
}

TEST_CASE("softmax, log_softmax, layer_norm, rms_norm along split and unsplit dims match the oracle") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 29);
        oracle::for_each_pair(oracle::List<Rep, Rows, Grid, Both, RowsPSum, PMaxY>{}, oracle::List<DK<0>, DK<1>>{},
                              [&]<class S, int D>(std::type_identity<S>, std::type_identity<DK<D>>) {
                                for (int c = 0; c < cases; ++c) {
                                  normalize_case<Op::softmax, D, S>(ctx, rng, norm_tol, 0);
                                  normalize_case<Op::log_softmax, D, S>(ctx, rng, norm_tol, 0);
                                  normalize_case<Op::layer_norm, D, S>(ctx, rng, norm_tol, 1e-5);
                                  normalize_case<Op::rms_norm, D, S>(ctx, rng, norm_tol, 1e-6);
                                }
                              });
      },
      DEVICE_COUNTS);
}

TEST_CASE("normalisations of rank-3 tensors along each dim; eps is used; doubles") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 30);
        using Specs3 = oracle::List<Spec<"x", none, "y">, Spec<none, none, axes<"y", "x">>,
                                    Spec<none, "y", none, partial_sum<"x">>>;
        oracle::for_each_pair(Specs3{}, oracle::List<DK<0>, DK<1>, DK<2>>{},
                              [&]<class S, int D>(std::type_identity<S>, std::type_identity<DK<D>>) {
                                for (int c = 0; c < cases; ++c) {
                                  normalize_case<Op::softmax, D, S>(ctx, rng, norm_tol, 0);
                                  normalize_case<Op::layer_norm, D, S>(ctx, rng, norm_tol, 0.5);
                                  normalize_case<Op::rms_norm, D, S>(ctx, rng, norm_tol, 0.25);
                                }
                              });
        for (int c = 0; c < cases; ++c) {
          normalize_case<Op::log_softmax, 1, Grid, double>(ctx, rng, oracle::Tol::rel(1e-12), 0);
          normalize_case<Op::layer_norm, 1, Both, double>(ctx, rng, oracle::Tol::rel(1e-10), 1e-5);
          normalize_case<Op::rms_norm, 0, Grid, double>(ctx, rng, oracle::Tol::rel(1e-10), 1e-6);
        }
      },
      DEVICE_COUNTS);
}

TEST_CASE("softmax with a scale and layer_norm with a gain and a bias: the composed ops' results, fused or not") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 31);
        oracle::for_each_type(oracle::List<Rep, Rows, Grid, Both>{}, [&]<class S>(std::type_identity<S>) {
          for (int c = 0; c < cases; ++c) {
            const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
            const auto shape = oracle::random_shape<2>(rng);
            const auto a = oracle::operand<Ten<S>>(mesh, shape, rng.g(), -3.f, 3.f);
            const std::string what = oracle::describe(a);
            // the scale folded into the softmax's pass (and into the stats kernels' input when split)
            const auto s1 = sl::softmax<1>(a, 0.3);
            static_assert(std::is_same_v<decltype(s1), const std::remove_cvref_t<decltype(sl::softmax<1>(a))>>);
            oracle::expect_tensor(s1, oracle::host(sl::softmax<1>(a * 0.3f)), norm_tol, "softmax scale: " + what);
            oracle::expect_tensor(sl::log_softmax<1>(a, -2.0), oracle::host(sl::log_softmax<1>(a * -2.0f)), norm_tol,
                                  "log_softmax scale: " + what);
            // gain and bias replicated (one pass where the last dim is whole) or split (the three ops)
            const auto g = oracle::operand<Ten<Spec<none>>>(mesh, {shape[1]}, rng.g(), -2.f, 2.f);
            const auto b = oracle::operand<Ten<Spec<none>>>(mesh, {shape[1]}, rng.g(), -2.f, 2.f);
            const auto ln = sl::layer_norm<1>(a, g, b, 0.01);
            static_assert(std::is_same_v<decltype(ln), const decltype(sl::layer_norm<1>(a, 0.01) * g + b)>);
            oracle::expect_tensor(ln, oracle::host(sl::layer_norm<1>(a, 0.01) * g + b), norm_tol, "layer_norm affine: " + what);
            const auto gx = sl::reshard<Spec<"y">>(g);
            const auto lnx = sl::layer_norm<-1>(a, gx, b, 0.01);
            static_assert(std::is_same_v<decltype(lnx), const decltype(sl::layer_norm<1>(a, 0.01) * gx + b)>);
            oracle::expect_tensor(lnx, oracle::host(sl::layer_norm<1>(a, 0.01) * g + b), norm_tol,
                                  "layer_norm affine, gain split: " + what);
          }
        });
        const M2 mesh(ctx, {1, ctx.num_devices()});
        const auto a = Ten<Rows>::random(mesh, {4, 3}, 1);
        CHECK_THROWS_WITH_AS(sl::softmax<1>(a, std::numeric_limits<double>::infinity()),
                             "shardlib: softmax: scale must be finite, got inf (operand [4, 3] with Spec<\"x\", none>)",
                             std::invalid_argument);
        const auto g = Ten<Spec<none>>::random(mesh, {4}, 2);
        CHECK_THROWS_AS(sl::layer_norm<1>(a, g, g), std::invalid_argument);  // gain of the wrong extent
      },
      DEVICE_COUNTS);
}

TEST_CASE("bf16 and f16 operands: reductions, normalisations, products and the loss in float32, rounded once") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        auto rng = oracle::rng_for(ctx, 41);
        using B = sl::bf16;
        using H = sl::f16;
        // A partial sum resolves in 16 bits (each addend rounded): within a few steps of the type.
        constexpr oracle::Tol b_tol = oracle::Tol::rel_abs(1.0 / 32, 1.0 / 32), h_tol = oracle::Tol::rel_abs(1.0 / 256, 1.0 / 256);
        oracle::for_each_type(oracle::List<Rows, Grid, PSumX, PMaxY>{}, [&](auto s) {
          using S = typename decltype(s)::type;
          for (int c = 0; c < cases; ++c) {
            reduce_case<Op::sum, 1, false, S, B>(ctx, rng, b_tol);
            reduce_case<Op::mean, 0, true, S, H>(ctx, rng, h_tol);
            reduce_case<Op::max, 0, false, S, B>(ctx, rng, oracle::Tol::exact());
            reduce_case<Op::argmax, 1, false, S, H>(ctx, rng, oracle::Tol::exact());
            normalize_case<Op::softmax, 1, S, B>(ctx, rng, oracle::Tol::rel_abs(1.0 / 64, 1.0 / 256), 0);
            normalize_case<Op::layer_norm, 0, S, H>(ctx, rng, oracle::Tol::rel_abs(1.0 / 256, 1.0 / 256), 1e-5);
          }
        });
        // Products: float32 accumulation; a contraction over a split dim is partial, resolved in bf16.
        for (int c = 0; c < cases; ++c) {
          const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
          const std::int64_t m = 1 + rng.below(6), k = 1 + rng.below(40), n = 1 + rng.below(6);
          const auto a = oracle::operand<Ten<Spec<none, "x">, B>>(mesh, {m, k}, rng.g());
          const auto b = oracle::operand<Ten<Spec<"x", "y">, B>>(mesh, {k, n}, rng.g());
          const auto r = sl::matmul(a, b);
          static_assert(std::is_same_v<typename decltype(r)::value_type, B>);
          static_assert(decltype(r)::sharding.is_partial());
          const auto e = sl::einsum<"mk,kn->nm">(a, b);
          const auto ra = oracle::host(a), rb = oracle::host(b);
          oracle::Ref<2> want({m, n}), want_t({n, m});
          oracle::for_each_index(want.shape, [&](const oracle::Idx<2>& i) {
            double acc = 0;
            for (std::int64_t j = 0; j < k; ++j) acc += ra({i[0], j}) * rb({j, i[1]});
            want(i) = acc;
            want_t({i[1], i[0]}) = acc;
          });
          oracle::expect_tensor(r, want, b_tol, "bf16 matmul: " + oracle::describe(a, b));
          oracle::expect_tensor(e, want_t, b_tol, "bf16 einsum: " + oracle::describe(a, b));
        }
        // The loss of 16-bit logits is the float32 loss of their values.
        const M2 mesh = oracle::random_mesh<M2>(ctx, rng);
        const auto logits = Ten<Spec<"y", "x">, B>::random(mesh, {6, 10}, 7, -2.f, 2.f);
        const auto targets = sl::DistributedTensor<std::int64_t, M2, Spec<"y">>::random(mesh, {6}, 8, 0, 10);
        const auto l16 = sl::cross_entropy(logits, targets);
        static_assert(std::is_same_v<typename decltype(l16)::value_type, float>);
        const double got = l16.to_host()[0], want = sl::cross_entropy(sl::cast<float>(logits), targets).to_host()[0];
        CHECK(got == want);
      },
      DEVICE_COUNTS);
}
}
