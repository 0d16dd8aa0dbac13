// SPDX-License-Identifier: Apache-2.0
// Oracle property tests of the layout ops (permute, transpose, reshape, slice, concat, take): for
// fixed lists of operand specs on Mesh<"x", "y">, random meshes (every factorisation of the run's
// devices), random shapes (uneven, extents 1 and 0) and random integer data (so that comparisons
// are exact, partial addends included), the result gathered on every device must equal the op
// applied here to the gathered operands with plain index loops. Also: output spec types, the
// collectives each case costs (none for permute, aligned reshapes, slices and concats along
// unsplit dims, and take; one all_reduce to resolve a vocab-parallel embedding), and the errors
// for bad sizes, ranges and ids. Runs on 1..8 threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/ops.hpp>

#include "../collectives/harness.hpp"
#include "oracle.hpp"

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace sl = shardlib;
namespace coll = shardlib::coll;
using sl::axes;
using sl::none;
using sl::partial_max;
using sl::partial_sum;
using sl::Spec;

namespace {
namespace oracle = sl::test::oracle;
using oracle::Idx;
using oracle::List;
using oracle::Ref;
using oracle::Tol;
using sl::test::Rng;
using M = oracle::M2;
/// Integer elements: every layout op (and every partial sum of spread addends) is exact.
template <class S, class T = std::int32_t>
using Tensor = sl::DistributedTensor<T, M, S>;

constexpr std::initializer_list<int> device_counts = {1, 2, 3, 4, 6, 8};

/// A random integer operand of spec S in [-50, 50), partial addends spread over the group.
template <class S, class T = std::int32_t>
Tensor<S, T> operand(const M& mesh, const typename Tensor<S, T>::Shape& shape, std::uint64_t seed) {
  return oracle::operand<Tensor<S, T>>(mesh, shape, seed, T{-50}, T{50});
}

/// The same spec type as `S`.
template <class A, class S>
inline constexpr bool spec_is = std::is_same_v<typename std::remove_cvref_t<A>::spec_type, S>;

/// Whether the result type `Out` of an op has the sharding that the op's rule answers (`want`).
/// g++ 12 can take two different Sharding template arguments for one (it drops zero-initialised
/// trailing elements), giving an op the type of another: then the op's kernel writes a block of
/// the wrong shape, so the op is not run (all devices agree: types are compile-time).
template <class Out>
bool type_matches_rule(const sl::Sharding& want, const std::string& what) {
  if (Out::sharding == want) return true;
  FAIL_CHECK(what << ": the result type's spec " << Out::spec_string()
                  << " is not the sharding the op's rule answers (the op is skipped)");
  return false;
}

/// type_matches_rule for reshape<P> of a tensor of type A.
template <sl::OpName P, class A>
bool reshape_type_ok(const std::string& what) {
  using T = std::remove_cvref_t<A>;
  using Out = decltype(sl::reshape<P>(std::declval<const T&>()));
  return type_matches_rule<Out>(sl::reshape_rule(sl::parse_reshape(P.text), T::sharding).out,
                                std::string("reshape \"") + P.text + "\" of " + what);
}

/// A reference of `shape` holding `values` (row-major).
template <std::size_t R>
Ref<R> ref_of(const Idx<R>& shape, const std::vector<double>& values) {
  Ref<R> r;
  r.shape = shape;
  r.v = values;
  return r;
}

/// A random range [begin, end) inside [0, extent].
std::array<std::int64_t, 2> random_range(Rng& r, std::int64_t extent) {
  const std::int64_t begin = r.below(static_cast<int>(extent) + 1);
  return {begin, begin + r.below(static_cast<int>(extent - begin) + 1)};
}

// Operand specs on Mesh<"x", "y">.
using Rep2 = Spec<none, none>;
using Rows = Spec<"x", none>;
using ColsY = Spec<none, "y">;
using Grid = Spec<"y", "x">;
using Both = Spec<axes<"x", "y">, none>;
using PSum = Spec<none, none, partial_sum<"x">>;
using PMax = Spec<none, "y", partial_max<"x">>;
using Rank2 = List<Rep2, Rows, ColsY, Grid, Both, PSum, PMax>;
using Rank3 = List<Spec<none, none, none>, Spec<"x", none, "y">, Spec<none, axes<"y", "x">, none>,
                   Spec<"y", none, none, partial_sum<"x">>, Spec<none, "x", none, partial_max<"y">>>;

/// permute<P...> of an operand against the oracle; no collective. False when skipped (wrong type).
template <int... P, class A>
bool check_permute(const A& a, const std::string& what) {
  constexpr std::array<int, sizeof...(P)> perm{P...};
  sl::Sharding want_spec = A::sharding;  // out dim k has the axes of in dim perm[k]
  for (std::size_t k = 0; k < perm.size(); ++k) want_spec.dims[k] = A::sharding.dims[static_cast<std::size_t>(perm[k])];
  if (!type_matches_rule<decltype(sl::permute<P...>(a))>(want_spec, what)) return false;
  coll::CommRecorder rec;
  const auto out = sl::permute<P...>(a);
  CHECK_MESSAGE(rec.total_calls() == 0, what << ": " << rec.to_string());
  const auto ref = oracle::host(a);
  Idx<sizeof...(P)> shape{};
  for (std::size_t k = 0; k < perm.size(); ++k) shape[k] = ref.shape[static_cast<std::size_t>(perm[k])];
  Ref<sizeof...(P)> want(shape);
  oracle::for_each_index(shape, [&](const auto& i) {
    Idx<sizeof...(P)> j{};
    for (std::size_t k = 0; k < perm.size(); ++k) j[static_cast<std::size_t>(perm[k])] = i[k];
    want(i) = ref(j);
  });
  oracle::expect_tensor(out, want, Tol::exact(), what + " -> " + decltype(out)::spec_string());
  return true;
}
}  // namespace

TEST_SUITE("ops_layout") {
TEST_CASE("permute and transpose move the specs with their dims, with no collective") {
  // Specs follow their dims; partial clauses are kept.
  using S = Spec<"x", none, "y">;
  static_assert(spec_is<decltype(sl::permute<2, 0, 1>(std::declval<Tensor<S>>())), Spec<"y", "x", none>>);
  static_assert(spec_is<decltype(sl::transpose<0, 2>(std::declval<Tensor<S>>())), Spec<"y", none, "x">>);
  static_assert(spec_is<decltype(sl::permute<1, 0, 2>(std::declval<Tensor<Spec<"y", none, none, partial_sum<"x">>>>())),
                        Spec<none, "y", none, partial_sum<"x">>>);
  static_assert(spec_is<decltype(sl::transpose<1, 0>(std::declval<Tensor<PMax>>())), Spec<"y", none, partial_max<"x">>>);
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 11);
        oracle::for_each_type(Rank3{}, [&](auto tag) {
          using S3 = typename decltype(tag)::type;
          for (int c = 0; c < 4; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const auto a = operand<S3>(mesh, oracle::random_shape<3>(r), 1 + static_cast<std::uint64_t>(c));
            const std::string what = oracle::describe(a);
            check_permute<2, 0, 1>(a, "permute<2, 0, 1> of " + what);
            check_permute<1, 0, 2>(a, "permute<1, 0, 2> of " + what);
            check_permute<0, 2, 1>(a, "permute<0, 2, 1> of " + what);
            check_permute<0, 1, 2>(a, "permute<0, 1, 2> of " + what);
            // transpose<d0, d1> is the permutation that swaps them.
            static_assert(std::is_same_v<decltype(sl::transpose<0, 2>(a)), decltype(sl::permute<2, 1, 0>(a))>);
            if (check_permute<2, 1, 0>(a, "permute<2, 1, 0> of " + what))
              CHECK(sl::transpose<0, 2>(a).to_host() == sl::permute<2, 1, 0>(a).to_host());
          }
        });
        oracle::for_each_type(Rank2{}, [&](auto tag) {  // rank 2, float elements
          using S2 = typename decltype(tag)::type;
          for (int c = 0; c < 3; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const auto a = operand<S2, float>(mesh, oracle::random_shape<2>(r), 5 + static_cast<std::uint64_t>(c));
            static_assert(std::is_same_v<decltype(sl::transpose<0, 1>(a)), decltype(sl::permute<1, 0>(a))>);
            if (check_permute<1, 0>(a, "permute<1, 0> of " + oracle::describe(a)))
              CHECK(sl::transpose<0, 1>(a).to_host() == sl::permute<1, 0>(a).to_host());
          }
        });
      },
      device_counts);
}

TEST_CASE("reshape merges and splits dims: even blocks reinterpret in place, uneven ones are regathered") {
  // Each output dim takes its first atom's axes; a split minor atom of a merge is gathered first.
  static_assert(spec_is<decltype(sl::reshape<"b s h -> (b s) h">(std::declval<Tensor<Spec<"x", none, "y">>>())), Spec<"x", "y">>);
  static_assert(spec_is<decltype(sl::reshape<"b s h -> b (s h)">(std::declval<Tensor<Spec<"x", none, "y">>>())), Spec<"x", none>>);
  static_assert(spec_is<decltype(sl::reshape<"b s h -> (b s) h">(std::declval<Tensor<Spec<none, "x", none>>>())), Spec<none, none>>);
  static_assert(spec_is<decltype(sl::reshape<"b (n d) -> b n d">(std::declval<Tensor<Grid>>(), {1, 1, 1})), Spec<"y", "x", none>>);
  static_assert(spec_is<decltype(sl::reshape<"a b -> (a b)">(std::declval<Tensor<PSum>>())), Spec<none, partial_sum<"x">>>);

  using Merge = List<Spec<none, none, none>, Spec<"x", none, "y">, Spec<none, "x", none>, Spec<none, none, axes<"y", "x">>,
                     Spec<axes<"y", "x">, none, none>, Spec<"x", none, none, partial_sum<"y">>>;
  using Split = List<Rep2, Rows, ColsY, Grid, Both, PSum, PMax>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 12);
        int aligned_seen = 0;
        oracle::for_each_type(Merge{}, [&](auto tag) {
          using S = typename decltype(tag)::type;
          for (int c = 0; c < 6; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            auto shape = oracle::random_shape<3>(r);
            // Half the cases: every split dim a multiple of its group's size (blocks line up).
            const bool even = c % 2 == 0;
            if (even)
              for (int d = 0; d < 3; ++d) {
                const int g = mesh.group_size(Tensor<S>::sharding.dims[static_cast<std::size_t>(d)]);
                if (g > 1) shape[static_cast<std::size_t>(d)] = g * (1 + r.below(2));
              }
            const auto a = operand<S>(mesh, shape, 20 + static_cast<std::uint64_t>(c));
            const std::string what = oracle::describe(a);
            const auto values = oracle::host(a);
            using A = decltype(a);
            bool types_ok = reshape_type_ok<"b s h -> (b s) h", A>(what);  // each reports its own failure
            types_ok = reshape_type_ok<"b s h -> b (s h)", A>(what) && types_ok;
            types_ok = reshape_type_ok<"b s h -> (b s h)", A>(what) && types_ok;
            types_ok = reshape_type_ok<"(b s) h -> b s h", decltype(sl::reshape<"b s h -> (b s) h">(a))>(what) && types_ok;
            if (!types_ok) continue;
            coll::CommRecorder rec;
            const auto bs_h = sl::reshape<"b s h -> (b s) h">(a);
            const std::uint64_t merge_calls = rec.total_calls();
            const auto b_sh = sl::reshape<"b s h -> b (s h)">(a);
            const auto all = sl::reshape<"b s h -> (b s h)">(a);
            // Row-major order is kept: the values are the same flat array in a new shape.
            oracle::expect_tensor(bs_h, ref_of<2>({shape[0] * shape[1], shape[2]}, values.v), Tol::exact(),
                                  "reshape \"b s h -> (b s) h\" of " + what);
            oracle::expect_tensor(b_sh, ref_of<2>({shape[0], shape[1] * shape[2]}, values.v), Tol::exact(),
                                  "reshape \"b s h -> b (s h)\" of " + what);
            oracle::expect_tensor(all, ref_of<1>({shape[0] * shape[1] * shape[2]}, values.v), Tol::exact(),
                                  "reshape \"b s h -> (b s h)\" of " + what);
            // (b s) h with s unsplit and b's extent a multiple of its group: each device reinterprets
            // its block, no copy and no collective.
            if (even && Tensor<S>::sharding.dims[1].empty()) {
              ++aligned_seen;
              CHECK_MESSAGE(merge_calls == 0, "reshape \"b s h -> (b s) h\" of " << what << ": " << rec.to_string());
              if (a.block().num_elements() > 0) CHECK(bs_h.local().data() == a.local().data());
            }
            // Split back: "(b s) h -> b s h" with the shape restores the operand.
            const auto back = sl::reshape<"(b s) h -> b s h">(bs_h, {shape[0], shape[1], shape[2]});
            oracle::expect_tensor(back, values, Tol::exact(), "reshape back of " + what);
          }
        });
        oracle::for_each_type(Split{}, [&](auto tag) {
          using S = typename decltype(tag)::type;
          for (int c = 0; c < 6; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const bool even = c % 2 == 0;
            const int g = mesh.group_size(Tensor<S>::sharding.dims[1]);
            const std::int64_t b = oracle::random_shape<1>(r)[0], d = 1 + r.below(4),
                               n = even ? g * r.below(3) : oracle::random_shape<1>(r)[0];
            const auto a = operand<S>(mesh, {b, n * d}, 30 + static_cast<std::uint64_t>(c));
            const std::string what = oracle::describe(a);
            const auto values = oracle::host(a);
            bool types_ok = reshape_type_ok<"b (n d) -> b n d", decltype(a)>(what);
            types_ok = reshape_type_ok<"b (n d) -> (b n) d", decltype(a)>(what) && types_ok;
            if (!types_ok) continue;
            coll::CommRecorder rec;
            const auto split = sl::reshape<"b (n d) -> b n d">(a, {b, n, d});
            if (even) {
              ++aligned_seen;
              CHECK_MESSAGE(rec.total_calls() == 0, "reshape \"b (n d) -> b n d\" of " << what << ": " << rec.to_string());
            }
            oracle::expect_tensor(split, ref_of<3>({b, n, d}, values.v), Tol::exact(), "reshape \"b (n d) -> b n d\" of " + what);
            const auto regroup = sl::reshape<"b (n d) -> (b n) d">(a, {b * n, d});
            oracle::expect_tensor(regroup, ref_of<2>({b * n, d}, values.v), Tol::exact(),
                                  "reshape \"b (n d) -> (b n) d\" of " + what);
          }
        });
        CHECK(aligned_seen > 0);
      },
      device_counts);
}

TEST_CASE("reshape rejects shapes that do not fit, naming both shapes and the spec") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M mesh(ctx, {ctx.num_devices(), 1});
        const auto a = Tensor<Rows>::zeros(mesh, {4, 6});
        CHECK_THROWS_WITH_AS(sl::reshape<"b (n d) -> b n d">(a, {4, 4, 2}),
                             "shardlib: reshape \"b (n d) -> b n d\" of [4, 6] with Spec<\"x\", none> to shape "
                             "[4, 4, 2]: output dim 1 does not match (a reshape keeps the element count and the "
                             "pattern's groups)",
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::reshape<"(a b) c -> a b c">(a, {3, 2, 6}), doctest::Contains("to shape [3, 2, 6]"),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::reshape<"(a b) c -> a b c">(a), doctest::Contains("splits input dim 0: pass the output shape"),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::reshape<"a b -> (a b)">(a, {25}), doctest::Contains("of [4, 6] with Spec<\"x\", none> to shape [25]"),
                             std::invalid_argument);
        // The devices still agree afterwards.
        CHECK(sl::reshape<"a b -> (a b)">(a).to_host() == std::vector<std::int32_t>(24, 0));
      },
      device_counts);
}

TEST_CASE("slice along split and unsplit dims keeps the spec; only a split dim communicates") {
  static_assert(spec_is<decltype(sl::slice<0>(std::declval<Tensor<Grid>>(), 0, 1)), Grid>);
  static_assert(spec_is<decltype(sl::slice<1>(std::declval<Tensor<PSum>>(), 0, 1)), PSum>);
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 13);
        oracle::for_each_type(Rank2{}, [&](auto tag) {
          using S = typename decltype(tag)::type;
          for (int c = 0; c < 6; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const auto shape = oracle::random_shape<2>(r, 9);
            const auto a = operand<S>(mesh, shape, 40 + static_cast<std::uint64_t>(c));
            const auto values = oracle::host(a);
            auto check = [&]<int D>(std::integral_constant<int, D>) {
              const auto range = random_range(r, shape[D]);
              const std::int64_t begin = range[0], end = range[1];
              const std::string what = "slice<" + std::to_string(D) + ">(" + std::to_string(begin) + ", " +
                                       std::to_string(end) + ") of " + oracle::describe(a);
              if (!type_matches_rule<decltype(sl::slice<D>(a, begin, end))>(sl::slice_rule(Tensor<S>::sharding, D).out, what)) return;
              coll::CommRecorder rec;
              const auto out = sl::slice<D>(a, begin, end);
              // A runtime check, not a static_assert: g++ 12 can give a wrong type here (see the report).
              CHECK_MESSAGE((std::is_same_v<typename decltype(out)::spec_type, S>),
                            what << " has type " << decltype(out)::spec_string());
              // A dim no axis splits: a local copy. A split dim: one exchange over its group at most.
              if (Tensor<S>::sharding.dims[D].empty()) CHECK_MESSAGE(rec.total_calls() == 0, what << ": " << rec.to_string());
              else CHECK_MESSAGE(rec.total_calls() <= 1, what << ": " << rec.to_string());
              Idx<2> out_shape = shape;
              out_shape[D] = end - begin;
              Ref<2> want(out_shape);
              oracle::for_each_index(out_shape, [&](const Idx<2>& i) {
                Idx<2> j = i;
                j[D] += begin;
                want(i) = values(j);
              });
              oracle::expect_tensor(out, want, Tol::exact(), what);
            };
            check(std::integral_constant<int, 0>{});
            check(std::integral_constant<int, 1>{});
          }
        });
        // Rank 3, the middle dim, split over both axes.
        for (int c = 0; c < 6; ++c) {
          using S3 = Spec<none, axes<"y", "x">, none>;
          const M mesh = oracle::random_mesh<M>(ctx, r);
          const auto shape = oracle::random_shape<3>(r, 9);
          const auto a = operand<S3>(mesh, shape, 50 + static_cast<std::uint64_t>(c));
          const auto range = random_range(r, shape[1]);
          const std::int64_t begin = range[0], end = range[1];
          const auto values = oracle::host(a);
          Idx<3> out_shape = shape;
          out_shape[1] = end - begin;
          Ref<3> want(out_shape);
          oracle::for_each_index(out_shape, [&](const Idx<3>& i) { want(i) = values({i[0], i[1] + begin, i[2]}); });
          const std::string what = "slice<1> of " + oracle::describe(a);
          if (type_matches_rule<decltype(sl::slice<1>(a, begin, end))>(sl::slice_rule(Tensor<S3>::sharding, 1).out, what))
            oracle::expect_tensor(sl::slice<1>(a, begin, end), want, Tol::exact(), what);
        }
      },
      device_counts);
}

TEST_CASE("slice rejects a range outside the dim, naming it, the shape and the spec") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M mesh(ctx, {ctx.num_devices(), 1});
        const auto a = Tensor<Rows>::zeros(mesh, {4, 6});
        CHECK_THROWS_WITH_AS(sl::slice<1>(a, 2, 7),
                             "shardlib: slice [2, 7) of dim 1 of [4, 6] with Spec<\"x\", none> is outside [0, 6]",
                             std::out_of_range);
        CHECK_THROWS_WITH_AS(sl::slice<0>(a, -1, 2), doctest::Contains("slice [-1, 2) of dim 0 of [4, 6]"), std::out_of_range);
        CHECK_THROWS_WITH_AS(sl::slice<0>(a, 3, 2), doctest::Contains("slice [3, 2) of dim 0"), std::out_of_range);
        CHECK(sl::slice<0>(a, 4, 4).shape() == std::array<std::int64_t, 2>{0, 6});  // empty is fine
      },
      device_counts);
}

TEST_CASE("concat along split and unsplit dims: a's layout; partial sums over the same axes stay partial") {
  static_assert(spec_is<decltype(sl::concat<0>(std::declval<Tensor<Grid>>(), std::declval<Tensor<Rows>>())), Grid>);
  static_assert(spec_is<decltype(sl::concat<1>(std::declval<Tensor<PSum>>(), std::declval<Tensor<PSum>>())), PSum>);
  static_assert(spec_is<decltype(sl::concat<1>(std::declval<Tensor<PSum>>(), std::declval<Tensor<Rows>>())), Rep2>);
  static_assert(spec_is<decltype(sl::concat<0>(std::declval<Tensor<PMax>>(), std::declval<Tensor<PMax>>())), ColsY>);
  using As = List<Rep2, Rows, ColsY, Grid, Both, PSum>;
  using Bs = List<Rep2, Rows, Grid, PSum, PMax>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 14);
        oracle::for_each_pair(As{}, Bs{}, [&](auto ta, auto tb) {
          using SA = typename decltype(ta)::type;
          using SB = typename decltype(tb)::type;
          for (int c = 0; c < 3; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const auto shape = oracle::random_shape<2>(r);
            auto check = [&]<int D>(std::integral_constant<int, D>) {
              Idx<2> bshape = shape;
              bshape[D] = oracle::random_shape<1>(r)[0];
              const auto a = operand<SA>(mesh, shape, 60 + static_cast<std::uint64_t>(c));
              const auto b = operand<SB>(mesh, bshape, 70 + static_cast<std::uint64_t>(c));
              const std::string what = "concat<" + std::to_string(D) + "> of " + oracle::describe(a, b);
              if (!type_matches_rule<decltype(sl::concat<D>(a, b))>(
                      sl::concat_rule(Tensor<SA>::sharding, Tensor<SB>::sharding, D).out, what))
                return;
              coll::CommRecorder rec;
              const auto out = sl::concat<D>(a, b);
              // Same spec, not partial, along an unsplit dim: each device joins its two blocks.
              if constexpr (std::is_same_v<SA, SB> && !Tensor<SA>::sharding.is_partial())
                if (Tensor<SA>::sharding.dims[D].empty()) CHECK_MESSAGE(rec.total_calls() == 0, what << ": " << rec.to_string());
              const auto va = oracle::host(a), vb = oracle::host(b);
              Idx<2> out_shape = shape;
              out_shape[D] += bshape[D];
              Ref<2> want(out_shape);
              oracle::for_each_index(out_shape, [&](const Idx<2>& i) {
                Idx<2> j = i;
                if (i[D] < shape[D]) {
                  want(i) = va(i);
                } else {
                  j[D] -= shape[D];
                  want(i) = vb(j);
                }
              });
              oracle::expect_tensor(out, want, Tol::exact(), what + " -> " + decltype(out)::spec_string());
            };
            check(std::integral_constant<int, 0>{});
            check(std::integral_constant<int, 1>{});
          }
        });
      },
      device_counts);
}

TEST_CASE("concat rejects operands whose other dims differ, naming both shapes and specs") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M mesh(ctx, {ctx.num_devices(), 1});
        const auto a = Tensor<Rows>::zeros(mesh, {4, 6});
        const auto b = Tensor<Grid>::zeros(mesh, {3, 5});
        CHECK_THROWS_WITH_AS(sl::concat<1>(a, b),
                             "shardlib: concat along dim 1 of [4, 6] with Spec<\"x\", none> and [3, 5] with "
                             "Spec<\"y\", \"x\">: dim 0 differs",
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::concat<0>(a, b), doctest::Contains("dim 1 differs"), std::invalid_argument);
      },
      device_counts);
}

TEST_CASE("take along dims 0 and 1 matches numpy.take for every table and index spec") {
  // The output: table dims before, index dims, table dims after; a table split along the taken
  // dim gives a partial sum over its axes; index axes the table uses are dropped.
  using Ids = sl::DistributedTensor<std::int64_t, M, Rows>;
  static_assert(spec_is<decltype(sl::take<0>(std::declval<Tensor<Spec<"y", none>>>(), std::declval<Ids>())),
                        Spec<"x", none, none, partial_sum<"y">>>);
  static_assert(spec_is<decltype(sl::take<1>(std::declval<Tensor<Spec<"y", none>>>(), std::declval<Ids>())),
                        Spec<"y", "x", none>>);
  static_assert(spec_is<decltype(sl::take<0>(std::declval<Tensor<Spec<none, "x">>>(), std::declval<Ids>())),
                        Spec<none, none, "x">>);
  static_assert(spec_is<decltype(sl::take<0>(std::declval<Tensor<PSum>>(), std::declval<Ids>())),
                        Spec<none, none, none, partial_sum<"x">>>);
  using Tables = List<Rep2, Spec<"y", none>, ColsY, Spec<"x", "y">, Both, PSum, PMax>;
  using Indices = List<Spec<none>, Spec<"x">, Spec<none, none>, Spec<"x", none>, Spec<"y", "x">>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 15);
        oracle::for_each_pair(Tables{}, Indices{}, [&](auto tt, auto ti) {
          using ST = typename decltype(tt)::type;
          using SI = typename decltype(ti)::type;
          constexpr std::size_t RI = SI::rank;
          for (int c = 0; c < 2; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            Idx<2> tshape = oracle::random_shape<2>(r, 9);
            auto check = [&]<int D, class I>(std::integral_constant<int, D>, I) {
              Idx<2> ts = tshape;
              if (ts[D] == 0) ts[D] = 1 + r.below(5);  // ids need somewhere to point
              const auto ishape = oracle::random_shape<RI>(r, 5);
              const auto table = operand<ST>(mesh, ts, 80 + static_cast<std::uint64_t>(c));
              const auto ids = sl::DistributedTensor<I, M, SI>::random(mesh, ishape, 90 + static_cast<std::uint64_t>(c), I{0},
                                                                        static_cast<I>(ts[D]));
              const std::string what = "take<" + std::to_string(D) + "> of " + oracle::describe(table, ids);
              if (!type_matches_rule<decltype(sl::take<D>(table, ids))>(
                      sl::take_rule(Tensor<ST>::sharding, sl::DistributedTensor<I, M, SI>::sharding, D).out, what))
                return;
              coll::CommRecorder rec;
              const auto out = sl::take<D>(table, ids);
              // Only resharding the operands may communicate: none when the table is not partial max
              // and the ids use no axis of the table's.
              if constexpr (!(Tensor<ST>::sharding.is_partial() && Tensor<ST>::sharding.op != sl::ReduceOp::sum)) {
                constexpr auto rule = sl::take_rule(Tensor<ST>::sharding, sl::DistributedTensor<I, M, SI>::sharding, D);
                if constexpr (rule.in[1] == sl::DistributedTensor<I, M, SI>::sharding)
                  CHECK_MESSAGE(rec.total_calls() == 0, what << ": " << rec.to_string());
              }
              const auto vt = oracle::host(table);
              const auto vi = oracle::host(ids);
              Idx<1 + RI> out_shape{};
              for (std::size_t k = 0; k < out_shape.size(); ++k)
                out_shape[k] = D == 0 ? (k < RI ? ishape[k] : ts[1]) : (k == 0 ? ts[0] : ishape[k - 1]);
              Ref<1 + RI> want(out_shape);
              oracle::for_each_index(out_shape, [&](const Idx<1 + RI>& o) {
                Idx<RI> i{};
                for (std::size_t k = 0; k < RI; ++k) i[k] = o[D == 0 ? k : k + 1];
                const auto id = static_cast<std::int64_t>(vi(i));
                want(o) = D == 0 ? vt({id, o[RI]}) : vt({o[0], id});
              });
              oracle::expect_tensor(out, want, Tol::exact(), what + " -> " + decltype(out)::spec_string());
            };
            check(std::integral_constant<int, 0>{}, std::int64_t{});
            check(std::integral_constant<int, 1>{}, std::int32_t{});
          }
        });
      },
      device_counts);
}

TEST_CASE("vocab-parallel embedding: no collective to look up, one all_reduce to resolve") {
  using Table = sl::DistributedTensor<float, M, Spec<"y", none>>;  // [vocab, hidden], vocab split
  using Ids = sl::DistributedTensor<std::int64_t, M, Spec<"x", none>>;  // [batch, seq], batch split
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 16);
        for (int c = 0; c < 8; ++c) {
          const M mesh = oracle::random_mesh<M>(ctx, r);
          const std::int64_t vocab = 1 + r.below(20), hidden = 1 + r.below(6), batch = r.below(5), seq = 1 + r.below(6);
          const auto table = Table::random(mesh, {vocab, hidden}, 100 + static_cast<std::uint64_t>(c), -1.0f, 1.0f);
          const auto ids = Ids::random(mesh, {batch, seq}, 200 + static_cast<std::uint64_t>(c), 0, vocab);
          coll::CommRecorder rec;
          const auto e = sl::take<0>(table, ids);
          static_assert(std::is_same_v<decltype(e)::spec_type, Spec<"x", none, none, partial_sum<"y">>>);
          CHECK_MESSAGE(rec.total_calls() == 0, rec.to_string());
          std::vector<float> got;
          {
            coll::CommRecorder resolve;
            sl::DistributedTensor<float, M, Spec<"x", none, none>> z = e;
            const std::uint64_t one = mesh.size(1) > 1 ? 1 : 0;  // a group of one device needs no collective
            CHECK(resolve[coll::Kind::all_reduce].calls == one);
            CHECK_MESSAGE(resolve.total_calls() == one, resolve.to_string() << " on " << mesh.to_string());
            got = z.to_host();
          }
          const auto vt = oracle::host(table);
          const auto vi = oracle::host(ids);
          Ref<3> want({batch, seq, hidden});
          oracle::for_each_index(want.shape, [&](const Idx<3>& o) {
            want(o) = vt({static_cast<std::int64_t>(vi({o[0], o[1]})), o[2]});
          });
          oracle::expect_values(got, want, Tol::exact(), "embedding of " + oracle::describe(table, ids));
        }
      },
      device_counts);
}

TEST_CASE("take rejects an id outside the table, naming the id and its position") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const int n = ctx.num_devices();
        const M mesh(ctx, {1, n});
        const auto table = Tensor<Spec<"y", none>>::zeros(mesh, {10, 3});  // vocab-parallel: each device checks all ids
        const std::vector<std::int64_t> bad = {1, 2, 3, 4, 10, 5};
        const auto ids = sl::DistributedTensor<std::int64_t, M, Spec<none, none>>::from_host(mesh, {2, 3}, bad);
        CHECK_THROWS_WITH_AS(sl::take<0>(table, ids), doctest::Contains("id 10 at position 4 is outside [0, 10)"),
                             std::out_of_range);
        CHECK_THROWS_WITH_AS(sl::take<0>(table, ids),
                             doctest::Contains("take<0> of table [10, 3] with Spec<\"y\", none> with indices [2, 3] with Spec<none, none>"),
                             std::out_of_range);
        const std::vector<std::int32_t> negative = {0, -3};
        const auto neg = sl::DistributedTensor<std::int32_t, M, Spec<none>>::from_host(mesh, {2}, negative);
        CHECK_THROWS_WITH_AS(sl::take<0>(table, neg), doctest::Contains("id -3 at position 1"), std::out_of_range);
        const std::vector<std::int32_t> good = {9, 0};
        CHECK(sl::take<0>(table, sl::DistributedTensor<std::int32_t, M, Spec<none>>::from_host(mesh, {2}, good)).to_host() ==
              std::vector<std::int32_t>(6, 0));
      },
      device_counts);
}
}
