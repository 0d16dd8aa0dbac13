// SPDX-License-Identifier: Apache-2.0
// Oracle property tests of the contractions (einsum, matmul): for fixed lists of operand specs on
// Mesh<"x", "y">, random meshes (every factorisation of the run's devices), random shapes (uneven,
// extents 1 and 0) and random data, the result gathered on every device must equal the product
// computed here in double on the gathered operands. Partial-sum operands hold genuine addends
// (spread over their partial group). Also: output spec types, the collectives each layout costs
// (none for column- and row-parallel products; one all_reduce or one reduce_scatter when the
// partial result is resolved), and the error for mismatched extents. Runs on 1..8 threads devices
// and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/ops.hpp>

#include "../collectives/harness.hpp"
#include "oracle.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
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
using oracle::List;
using sl::test::Rng;
using M = oracle::M2;
template <class S, class T = float>
using Tensor = sl::DistributedTensor<T, M, S>;

constexpr std::initializer_list<int> device_counts = {1, 2, 3, 4, 6, 8};

template <class A, class B>
struct Pair {
  using a = A;
  using b = B;
};

/// A random extent: mostly 1..7, sometimes 0 or 1.
std::int64_t random_extent(Rng& r) { return r.below(6) == 0 ? r.below(2) : 1 + r.below(7); }

/// A random operand of spec S: values in [-1, 1), partial addends spread over the group.
template <class S>
Tensor<S> operand(const M& mesh, const typename Tensor<S>::Shape& shape, std::uint64_t seed) {
  return oracle::operand<Tensor<S>>(mesh, shape, seed);
}

/// The parsed subscripts of the oracle (independent of the library's parser): operand labels and
/// output labels, numpy's implicit output (labels used once, ASCII order) without "->".
struct Subscripts {
  std::string a, b, out;
};
Subscripts parse(std::string_view s) {
  Subscripts r;
  std::string* cur = &r.a;
  bool explicit_out = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == ',') cur = &r.b;
    else if (c == '-') {
      cur = &r.out;
      explicit_out = true;
      ++i;
    } else if (c != ' ') cur->push_back(c);
  }
  if (!explicit_out)
    for (int c = 0; c < 128; ++c) {
      const auto n = std::count(r.a.begin(), r.a.end(), c) + std::count(r.b.begin(), r.b.end(), c);
      if (n == 1) r.out.push_back(static_cast<char>(c));
    }
  return r;
}

/// The one-device oracle: out = the sum over the labels not in the output of a * b, in double
/// (plain loops over every label). `scale` is the largest sum of |a * b| of an output element: the
/// size of the rounding error to allow.
template <std::size_t R>
struct Expected {
  oracle::Ref<R> value;
  double scale = 0;
  /// Float accumulation error of the terms and of spread partial addends (small integers).
  oracle::Tol tol() const { return oracle::Tol::rel_abs(1e-5, 1e-5 * scale + 1e-4); }
};
template <std::size_t R>
Expected<R> einsum_oracle(const Subscripts& s, const std::vector<double>& a, const std::vector<double>& b,
                          const std::array<std::int64_t, 128>& extent) {
  std::string labels = s.a;
  for (char c : s.b)
    if (labels.find(c) == std::string::npos) labels.push_back(c);
  auto size_of = [&](const std::string& l) {
    std::int64_t n = 1;
    for (char c : l) n *= extent[static_cast<std::size_t>(c)];
    return n;
  };
  oracle::Idx<R> shape{};
  for (std::size_t d = 0; d < R; ++d) shape[d] = extent[static_cast<std::size_t>(s.out[d])];
  Expected<R> e{oracle::Ref<R>(shape), 0.0};
  std::vector<double> scale(e.value.v.size(), 0.0);
  std::array<std::int64_t, 128> at{};
  auto linear = [&](const std::string& l) {
    std::int64_t k = 0;
    for (char c : l) k = k * extent[static_cast<std::size_t>(c)] + at[static_cast<std::size_t>(c)];
    return static_cast<std::size_t>(k);
  };
  for (std::int64_t n = size_of(labels); n > 0; --n) {
    const double p = a[linear(s.a)] * b[linear(s.b)];
    e.value.v[linear(s.out)] += p;
    scale[linear(s.out)] += std::abs(p);
    for (std::size_t d = labels.size(); d-- > 0;) {  // odometer over every label
      const auto c = static_cast<std::size_t>(labels[d]);
      if (++at[c] < extent[c]) break;
      at[c] = 0;
    }
  }
  for (double x : scale) e.scale = std::max(e.scale, x);
  return e;
}

/// A global shape of the given labels' extents.
template <std::size_t R>
std::array<std::int64_t, R> shape_of(const std::string& labels, const std::array<std::int64_t, 128>& extent) {
  std::array<std::int64_t, R> s{};
  for (std::size_t d = 0; d < R; ++d) s[d] = extent[static_cast<std::size_t>(labels[d])];
  return s;
}

/// One random case's mesh, label extents (by label character) and data seed, drawn alike on
/// every device.
struct Draw {
  M mesh;
  std::array<std::int64_t, 128> extent{};
  std::uint64_t seed = 0;
};
Draw draw(sl::Context& ctx, Rng& r) {
  Draw d{oracle::random_mesh<M>(ctx, r)};
  for (auto& e : d.extent) e = random_extent(r);
  d.seed = static_cast<std::uint64_t>(r.below(1 << 20));
  return d;
}

/// `cases` random cases of einsum<Sub> (or matmul, with the subscripts it stands for) with operand
/// specs SA, SB: random mesh, label extents and data; every device gathers the operands and the
/// result and checks the result against the oracle.
template <sl::OpName Sub, bool Matmul, class SA, class SB>
void einsum_cases(sl::Context& ctx, Rng& r, int cases) {
  const Subscripts s = parse(Sub.text);
  for (int c = 0; c < cases; ++c) {
    const Draw d = draw(ctx, r);
    const M& mesh = d.mesh;
    const auto& extent = d.extent;
    const auto seed = d.seed;
    const auto a = operand<SA>(mesh, shape_of<SA::rank>(s.a, extent), seed);
    const auto b = operand<SB>(mesh, shape_of<SB::rank>(s.b, extent), seed + 1);
    auto run = [&] {
      if constexpr (Matmul) return sl::matmul(a, b);
      else return sl::einsum<Sub>(a, b);
    };
    // The result type must carry the rule's output sharding (g++ 12 can take two different
    // Sharding template arguments for one; then the kernel would write a block of another shape).
    using Out = decltype(run());
    constexpr sl::Sharding rule_out = sl::einsum_rule(sl::parse_einsum(Sub.text), Tensor<SA>::sharding, Tensor<SB>::sharding).out;
    if (!(Out::sharding == rule_out)) {
      FAIL_CHECK((Matmul ? "matmul" : "einsum") << " \"" << Sub.text << "\" of " << oracle::describe(a, b)
                                                << ": the result type's spec " << Out::spec_string()
                                                << " is not the sharding the rule answers (skipped)");
      continue;
    }
    const auto out = run();
    const std::vector<double> ah = oracle::host(a).v, bh = oracle::host(b).v;
    const auto want = einsum_oracle<decltype(out)::rank>(s, ah, bh, extent);
    const std::string what = std::string(Matmul ? "matmul" : "einsum") + " \"" + Sub.text + "\" of " +
                             oracle::describe(a, b) + " -> " + decltype(out)::spec_string();
    oracle::expect_tensor(out, want.value, want.tol(), what);
  }
}

/// The spec of einsum_add's `c` in einsum_add_cases: the product's own (the folded path).
struct AsProduct {};

/// `cases` random cases of einsum_add<Sub> (matmul_add when Matmul) with operands of specs SA, SB
/// and a `c` of spec SC (AsProduct: the product's spec; else a spec of the product's rank): the
/// result must have the type of `c + einsum<Sub>(a, b)` and its values; `c` given as an lvalue
/// is left as it was, and an rvalue whose block nobody shares lends its block to the result
/// where the GEMM adds into it (`Folds`).
template <sl::OpName Sub, bool Matmul, class SA, class SB, class SC, bool Folds>
void einsum_add_cases(sl::Context& ctx, Rng& r, int cases) {
  const Subscripts s = parse(Sub.text);
  for (int k = 0; k < cases; ++k) {
    const Draw d = draw(ctx, r);
    const M& mesh = d.mesh;
    const auto& extent = d.extent;
    const auto seed = d.seed;
    const auto a = operand<SA>(mesh, shape_of<SA::rank>(s.a, extent), seed);
    const auto b = operand<SB>(mesh, shape_of<SB::rank>(s.b, extent), seed + 1);
    auto product = [&] {
      if constexpr (Matmul) return sl::matmul(a, b);
      else return sl::einsum<Sub>(a, b);
    };
    using Prod = decltype(product());
    using C = std::conditional_t<std::is_same_v<SC, AsProduct>, Prod, Tensor<SC>>;
    const auto c = oracle::operand<C>(mesh, shape_of<C::rank>(s.out, extent), seed + 2);
    auto fused = [&](auto&& cc) {
      if constexpr (Matmul) return sl::matmul_add(a, b, std::forward<decltype(cc)>(cc));
      else return sl::einsum_add<Sub>(a, b, std::forward<decltype(cc)>(cc));
    };
    const auto two_ops = c + product();
    const std::string what = std::string(Matmul ? "matmul_add" : "einsum_add") + " \"" + Sub.text + "\" of " +
                             oracle::describe(a, b, c);
    const auto c_before = oracle::host(c);
    const auto got = fused(c);
    static_assert(std::is_same_v<decltype(got), decltype(two_ops)>, "einsum_add's type is that of c + einsum");
    const auto want = einsum_oracle<Prod::rank>(s, oracle::host(a).v, oracle::host(b).v, extent);
    auto sum = want.value;
    for (std::size_t i = 0; i < sum.v.size(); ++i) sum.v[i] += c_before.v[i];
    oracle::expect_tensor(got, sum, want.tol(), what + " (c an lvalue)");
    oracle::expect_tensor(two_ops, sum, want.tol(), what + ": c + einsum, the oracle's own check");
    oracle::expect_tensor(c, c_before, oracle::Tol::exact(), what + ": c after einsum_add");
    // An rvalue's block: taken over where the product folds into it, so the result's block is it.
    auto moved = c.clone();
    const float* block = moved.local().data();
    const bool has_elements = moved.block().num_elements() > 0;
    const auto got_moved = fused(std::move(moved));
    oracle::expect_tensor(got_moved, sum, want.tol(), what + " (c an rvalue)");
    if (has_elements) CHECK_MESSAGE((got_moved.local().data() == block) == Folds, what << ": the rvalue's block " << (Folds ? "was not" : "was") << " reused");
    // A shared rvalue's block is not written: `shared` sees c's values afterwards.
    auto lent = c.clone();
    const auto shared = lent;
    const auto got_shared = fused(std::move(lent));
    oracle::expect_tensor(shared, c_before, oracle::Tol::exact(), what + ": a tensor sharing the rvalue's block");
    oracle::expect_tensor(got_shared, sum, want.tol(), what + " (c an rvalue whose block is shared)");
  }
}

/// Spec A with each spec of a list.
template <sl::OpName Sub, bool Matmul, class SA, class... SB>
void with_each(sl::Context& ctx, Rng& r, int cases, List<SB...>) {
  (einsum_cases<Sub, Matmul, SA, SB>(ctx, r, cases), ...);
}
/// Every pair of a list of A specs and a list of B specs.
template <sl::OpName Sub, bool Matmul, class... SA, class BList>
void all_pairs(sl::Context& ctx, Rng& r, int cases, List<SA...>, BList bs) {
  (with_each<Sub, Matmul, SA>(ctx, r, cases, bs), ...);
}
/// Listed pairs.
template <sl::OpName Sub, class... P>
void listed_pairs(sl::Context& ctx, Rng& r, int cases, List<P...>) {
  (einsum_cases<Sub, false, typename P::a, typename P::b>(ctx, r, cases), ...);
}

// Rank-2 operand specs on Mesh<"x", "y">.
using Rep2 = Spec<none, none>;
using Rows = Spec<"x", none>;
using ColsY = Spec<none, "y">;
using Grid = Spec<"y", "x">;
using Both = Spec<axes<"x", "y">, none>;
using PSum = Spec<none, none, partial_sum<"x">>;
using RowsY = Spec<"y", none>;
using PMax = Spec<none, "y", partial_max<"x">>;
using Rank2 = List<Rep2, Rows, ColsY, Grid, Both, PSum>;
using Rank2b = List<Rep2, Rows, ColsY, RowsY, PSum, PMax>;
}  // namespace

TEST_SUITE("ops_linalg") {
TEST_CASE("matmul of rank-2 operands matches the oracle for every pair of specs") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 1);
        all_pairs<"ij,jk->ik", true>(ctx, r, 5, Rank2{}, Rank2b{});
      },
      device_counts);
}

TEST_CASE("batched matmul (equal ranks, and a shared rank-2 right operand) matches the oracle") {
  using A3 = List<Spec<none, none, none>, Spec<"x", none, none>, Spec<none, "y", "x">, Spec<none, none, "y">,
                  Spec<"y", none, none, partial_sum<"x">>>;
  using B3 = List<Spec<"x", none, none>, Spec<none, "y", none>, Spec<none, none, axes<"y", "x">>, Spec<none, none, none, partial_sum<"y">>>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 2);
        all_pairs<"bij,bjk->bik", true>(ctx, r, 3, A3{}, B3{});
        all_pairs<"bij,jk->bik", true>(ctx, r, 2, List<Spec<"x", none, "y">, Spec<none, "y", none>>{},
                                       List<Spec<"y", none>, Spec<none, "x">, Rep2>{});
        all_pairs<"abij,abjk->abik", true>(ctx, r, 2, List<Spec<"x", none, none, "y">>{},
                                           List<Spec<none, "x", "y", none>>{});
      },
      device_counts);
}

TEST_CASE("einsum with transposed operand orders, permuted outputs, summed-only labels") {
  using P2 = List<Pair<Rep2, Rep2>, Pair<Rows, ColsY>, Pair<ColsY, RowsY>, Pair<Grid, Both>, Pair<PSum, Rows>,
                  Pair<Rows, PSum>>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 3);
        listed_pairs<"ji,jk->ik">(ctx, r, 3, P2{});  // a transposed
        listed_pairs<"ij,kj->ik">(ctx, r, 3, P2{});  // b transposed
        listed_pairs<"ij,jk->ki">(ctx, r, 3, P2{});  // the output transposed
        listed_pairs<"ji,kj->ki">(ctx, r, 3, P2{});  // all three
        listed_pairs<"ij,kl->ik">(ctx, r, 3, P2{});  // j summed in a only, l in b only
        listed_pairs<"ij,kj->i">(ctx, r, 3, P2{});   // contracted j, summed k
        using P3 = List<Pair<Spec<none, none, none>, Spec<none, none, none>>, Pair<Spec<"x", none, "y">, Spec<"y", "x", none>>,
                        Pair<Spec<none, "y", none, partial_sum<"x">>, Spec<none, none, "x">>,
                        Pair<Spec<axes<"y", "x">, none, none>, Spec<none, "x", none>>>;
        listed_pairs<"ibj,kjb->bki">(ctx, r, 3, P3{});  // every operand permuted: packed
        listed_pairs<"bij,bjk->kbi">(ctx, r, 3, P3{});  // output in permuted order
        listed_pairs<"bij,bjk->ib">(ctx, r, 3, P3{});   // k summed in b, and a permuted output
        listed_pairs<"abc,cde->eba">(ctx, r, 3, P3{});  // summed labels in both, permuted output
      },
      device_counts);
}

TEST_CASE("attention's products on [B, S, H, K] blocks: read and written in place (a GEMM per b over a batch of h)") {
  using R4 = Spec<none, none, none, none>;
  using P4 = List<Pair<R4, R4>, Pair<Spec<"x", none, "y", none>, Spec<"x", none, "y", none>>,
                  Pair<Spec<"x", "y", none, none>, Spec<"x", none, "y", none>>, Pair<Spec<none, "y", none, none>, Spec<"x", none, none, "y">>>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 13);
        listed_pairs<"bshk,bthk->bhst">(ctx, r, 3, P4{});  // scores: q k^T
        listed_pairs<"bhst,bthk->bshk">(ctx, r, 3, P4{});  // output: p v, written into [B, S, H, K]
        listed_pairs<"bhst,bshk->bthk">(ctx, r, 3, P4{});  // dv = p^T do, dk = ds^T q
        listed_pairs<"bshk,bhst->bthk">(ctx, r, 3, P4{});  // the same with the operands swapped
        listed_pairs<"hbsk,bthk->bhst">(ctx, r, 3, P4{});  // an outer label that is no batch's first
      },
      device_counts);
  // No copy of an operand or of the output: the only block taken from the cache is the result's
  // (blocks of 64 KiB and more go through it on the host; the permuting path took 6 here).
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M mesh(ctx, {1, ctx.num_devices()});
        const auto q = Tensor<Spec<none, none, "y", none>>::random(mesh, {2, 128, 4 * ctx.num_devices(), 32}, 1);
        const auto k = Tensor<Spec<none, none, "y", none>>::random(mesh, {2, 128, 4 * ctx.num_devices(), 32}, 2);
        const auto p = sl::einsum<"bshk,bthk->bhst">(q, k);
        auto taken = [&] {
          const auto st = sl::block_cache_stats(ctx);
          return st.hits + st.space_allocations;
        };
        for (int round = 0; round < 2; ++round) {  // the first round fills the cache
          const auto before = taken();
          const auto scores = sl::einsum<"bshk,bthk->bhst">(q, k);
          const auto out = sl::einsum<"bhst,bthk->bshk">(p, k);
          if (round == 1) CHECK(taken() - before == 2);
        }
      },
      {1, 2});
}

TEST_CASE("einsum's implicit mode: the output is the labels used once, in ASCII order") {
  static_assert(std::is_same_v<decltype(sl::einsum<"jb,aj">(std::declval<Tensor<Rows>>(), std::declval<Tensor<ColsY>>()))::spec_type,
                               Spec<none, none, partial_sum<"x">>>);  // output "ab"; j contracted over x
  using P = List<Pair<Rep2, Rep2>, Pair<Rows, ColsY>, Pair<Grid, Both>, Pair<PSum, RowsY>>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 4);
        listed_pairs<"ij,jk">(ctx, r, 3, P{});  // ik
        listed_pairs<"jb,aj">(ctx, r, 3, P{});  // ab: not the order of appearance
        listed_pairs<"Bi,iA">(ctx, r, 3, P{});  // AB: upper case first
        listed_pairs<"ij,kl">(ctx, r, 3, P{});  // ijkl: an outer product
      },
      device_counts);
}

TEST_CASE("output specs: column-parallel and row-parallel products, partial operands") {
  // Column-parallel: nothing contracted is split; row-parallel: the contraction is split alike.
  static_assert(std::is_same_v<decltype(sl::matmul(std::declval<Tensor<Rows>>(), std::declval<Tensor<ColsY>>()))::spec_type,
                               Spec<"x", "y">>);
  static_assert(std::is_same_v<decltype(sl::matmul(std::declval<Tensor<Spec<"x", "y">>>(), std::declval<Tensor<RowsY>>()))::spec_type,
                               Spec<"x", none, partial_sum<"y">>>);
  static_assert(std::is_same_v<decltype(sl::matmul(std::declval<Tensor<ColsY>>(), std::declval<Tensor<Rep2>>()))::spec_type,
                               Spec<none, none, partial_sum<"y">>>);
  // A partial-sum operand stays partial; a partial max is reduced; both partial: b is reduced.
  static_assert(std::is_same_v<decltype(sl::matmul(std::declval<Tensor<PSum>>(), std::declval<Tensor<ColsY>>()))::spec_type,
                               Spec<none, "y", partial_sum<"x">>>);
  static_assert(std::is_same_v<decltype(sl::matmul(std::declval<Tensor<Rows>>(), std::declval<Tensor<PMax>>()))::spec_type,
                               Spec<"x", "y">>);
  static_assert(std::is_same_v<decltype(sl::matmul(std::declval<Tensor<PSum>>(), std::declval<Tensor<Spec<none, none, partial_sum<"y">>>>()))::spec_type,
                               PSum>);
  // Summed-only labels of a split dim leave a partial sum too.
  static_assert(std::is_same_v<decltype(sl::einsum<"ij,kl->ik">(std::declval<Tensor<ColsY>>(), std::declval<Tensor<Rows>>()))::spec_type,
                               Spec<none, "x", partial_sum<"y">>>);
  // The layouts cost no collective before the partial result is resolved.
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 5);
        for (int c = 0; c < 3; ++c) {
          const M mesh = oracle::random_mesh<M>(ctx, r);
          const std::int64_t m = random_extent(r), k = random_extent(r), n = random_extent(r);
          const auto x = operand<Rows>(mesh, {m, k}, 1);
          const auto w = operand<ColsY>(mesh, {k, n}, 2);
          const auto h = operand<Spec<"x", "y">>(mesh, {m, k}, 3);
          const auto v = operand<RowsY>(mesh, {k, n}, 4);
          coll::CommRecorder rec;
          const auto col = sl::matmul(x, w);
          const auto row = sl::matmul(h, v);
          const auto col_t = sl::einsum<"ij,jk->ki">(x, w);
          CHECK_MESSAGE(rec.total_calls() == 0, rec.to_string());
          static_assert(std::is_same_v<decltype(col_t)::spec_type, Spec<"y", "x">>);
          (void)col;
          (void)row;
        }
      },
      device_counts);
}

TEST_CASE("Megatron MLP: column-parallel then row-parallel; one all_reduce or one reduce_scatter resolves it") {
  using DM = sl::Mesh<"data", "model">;
  using X = sl::DistributedTensor<float, DM, Spec<"data", none, none>>;
  using W1 = sl::DistributedTensor<float, DM, Spec<none, "model">>;
  using W2 = sl::DistributedTensor<float, DM, Spec<"model", none>>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 6);
        const int n = ctx.num_devices();
        for (int c = 0; c < 6; ++c) {
          std::vector<int> divisors;
          for (int d = 1; d <= n; ++d)
            if (n % d == 0) divisors.push_back(d);
          const int data = divisors[static_cast<std::size_t>(r.below(static_cast<int>(divisors.size())))];
          const int model = n / data;
          const DM mesh(ctx, {data, model});
          // Even sequence length in half the cases (then every block is as large), uneven otherwise.
          const std::int64_t b = 1 + r.below(4), s = c % 2 == 0 ? model * (1 + r.below(3)) : 1 + r.below(7),
                             d = 1 + r.below(6), f = 1 + r.below(9);
          const auto x = X::random(mesh, {b, s, d}, 11, -1.0f, 1.0f);
          const auto w1 = W1::random(mesh, {d, f}, 12, -1.0f, 1.0f);
          const auto w2 = W2::random(mesh, {f, d}, 13, -1.0f, 1.0f);
          coll::CommRecorder rec;
          const auto h = sl::einsum<"bsd,df->bsf">(x, w1);
          static_assert(std::is_same_v<decltype(h)::spec_type, Spec<"data", none, "model">>);
          CHECK_MESSAGE(rec.total_calls() == 0, rec.to_string());
          const auto y = sl::einsum<"bsf,fd->bsd">(h, w2);
          static_assert(std::is_same_v<decltype(y)::spec_type, Spec<"data", none, none, partial_sum<"model">>>);
          CHECK_MESSAGE(rec.total_calls() == 0, rec.to_string());
          const std::uint64_t one = model > 1 ? 1 : 0;  // a group of one device needs no collective
          std::vector<float> replicated, seq_split;
          {
            coll::CommRecorder resolve;
            sl::DistributedTensor<float, DM, Spec<"data", none, none>> z = y;
            CHECK(resolve[coll::Kind::all_reduce].calls == one);
            CHECK_MESSAGE(resolve.total_calls() == one, resolve.to_string());
            replicated = z.to_host();
          }
          {
            coll::CommRecorder resolve;
            const auto z = sl::reshard<Spec<"data", "model", none>>(y);
            CHECK(resolve[coll::Kind::reduce_scatter].calls == one);
            CHECK_MESSAGE(resolve.total_calls() == one, resolve.to_string() << " for s = " << s << " on " << mesh.to_string());
            seq_split = z.to_host();
          }
          // The step's trace: the same collectives, groups and bytes every time it runs (they follow
          // from types, shapes and mesh), so one trace describes every later step.
          {
            auto step = [&] {
              const auto yy = sl::einsum<"bsf,fd->bsd">(sl::einsum<"bsd,df->bsf">(x, w1), w2);
              sl::DistributedTensor<float, DM, Spec<"data", none, none>> z = yy;
            };
            const auto before = coll::dry_run(step);  // described before it runs
            const auto first = coll::trace(step), second = coll::trace(step);
            REQUIRE(first.calls.size() == one);
            CHECK(first.to_string() == second.to_string());
            CHECK(before.to_string() == first.to_string());
            if (one) {
              CHECK(first.calls[0].kind == coll::Kind::all_reduce);
              CHECK(first.calls[0].group_size == model);
              CHECK_MESSAGE(first.calls[0].group.find("{model}") != std::string::npos, first.calls[0].group);
            }
          }
          // Values: the MLP (without its nonlinearity) on one device.
          std::array<std::int64_t, 128> extent{};
          extent['b'] = b, extent['s'] = s, extent['d'] = d, extent['f'] = f;
          const auto hh = oracle::host(h);
          const auto want_h = einsum_oracle<3>(parse("bsd,df->bsf"), oracle::host(x).v, oracle::host(w1).v, extent);
          oracle::expect_values(hh.v, want_h.value, want_h.tol(), "h = x w1 on " + mesh.to_string());
          const auto want_y = einsum_oracle<3>(parse("bsf,fd->bsd"), hh.v, oracle::host(w2).v, extent);
          oracle::expect_tensor(y, want_y.value, want_y.tol(), "y = h w2 on " + mesh.to_string());
          oracle::expect_values(replicated, want_y.value, want_y.tol(), "y resolved to replicated on " + mesh.to_string());
          oracle::expect_values(seq_split, want_y.value, want_y.tol(), "y resolved to sequence-split on " + mesh.to_string());
        }
      },
      device_counts);
}

TEST_CASE("einsum_add and matmul_add: c + the product, c folded into the GEMM where it lies as the product") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 9);
        // Folded: c has the product's spec (split, 2-D split, partial-sum) and the output comes
        // out of the GEMM in order or transposed.
        einsum_add_cases<"ij,jk->ik", true, Rows, Rep2, AsProduct, true>(ctx, r, 3);
        einsum_add_cases<"ij,jk->ik", true, Rows, ColsY, AsProduct, true>(ctx, r, 3);
        einsum_add_cases<"ij,jk->ik", false, ColsY, RowsY, AsProduct, true>(ctx, r, 3);  // partial over y
        einsum_add_cases<"ij,jk->ki", false, Rows, ColsY, AsProduct, true>(ctx, r, 3);   // transposed output
        einsum_add_cases<"bij,bjk->bik", true, Spec<"x", none, none>, Spec<"x", none, "y">, AsProduct, true>(ctx, r, 3);
        // As written (c + einsum): c in another spec, a permuted output.
        einsum_add_cases<"ij,jk->ik", true, Rows, ColsY, Rep2, false>(ctx, r, 3);
        einsum_add_cases<"ij,jk->ik", false, ColsY, RowsY, Rows, false>(ctx, r, 3);
        einsum_add_cases<"bij,bjk->kbi", false, Spec<"x", none, none>, Spec<"x", none, "y">, AsProduct, false>(ctx, r, 3);
      },
      device_counts);
}

TEST_CASE("einsum_add broadcasts a lower-rank c as the add does, and refuses a c that does not broadcast") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M mesh(ctx, {ctx.num_devices(), 1});
        const auto a = Tensor<Rows>::iota(mesh, {5, 3});
        const auto b = Tensor<Rep2>::full(mesh, {3, 4}, 1.0f);
        const auto bias = sl::DistributedTensor<float, M, Spec<none>>::iota(mesh, {4});
        const auto got = sl::matmul_add(a, b, bias);  // a bias: the add's broadcast, not folded
        static_assert(std::is_same_v<std::remove_const_t<decltype(got)>, decltype(bias + sl::matmul(a, b))>);
        CHECK(got.to_host() == (bias + sl::matmul(a, b)).to_host());
        const auto wrong = Tensor<Rows>::zeros(mesh, {5, 3});
        CHECK_THROWS_WITH_AS(sl::matmul_add(a, b, wrong),
                             "shardlib: matmul_add: shapes do not broadcast (output dim 1): [5, 3] with Spec<\"x\", none>, "
                             "[5, 4] with Spec<\"x\", none>",
                             std::invalid_argument);
        const auto other = Tensor<Rep2>::zeros(mesh, {4, 5});
        CHECK_THROWS_WITH_AS(sl::einsum_add<"ij,jk->ik">(a, other, wrong), doctest::Contains("label 'j' has extent 3"),
                             std::invalid_argument);
        // Nothing was left half-done: the devices still agree on a collective afterwards.
        CHECK(sl::matmul_add(a, b, Tensor<Rows>::zeros(mesh, {5, 4})).to_host() == sl::matmul(a, b).to_host());
        // c moved in while it is also an operand: copied (the GEMM's C is never its A or B).
        auto sq = Tensor<Rows>::iota(mesh, {4, 4});
        const auto rep = Tensor<Rep2>(sq);
        const auto want = (sq + sl::matmul(sq, rep)).to_host();
        const auto got_sq = sl::matmul_add(sq, rep, std::move(sq));
        CHECK(got_sq.to_host() == want);
      },
      device_counts);
}

TEST_CASE("einsum and matmul reject mismatched extents, naming the label, shapes and specs") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M mesh(ctx, {ctx.num_devices(), 1});
        const auto a = Tensor<Rows>::zeros(mesh, {3, 4});
        const auto b = Tensor<ColsY>::zeros(mesh, {5, 2});
        CHECK_THROWS_WITH_AS(sl::einsum<"ij,jk->ik">(a, b),
                             "shardlib: einsum \"ij,jk->ik\": label 'j' has extent 4 in [3, 4] with Spec<\"x\", none> "
                             "but 5 in [5, 2] with Spec<none, \"y\">",
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::matmul(a, b), doctest::Contains("has extent 4 in [3, 4] with Spec<\"x\", none> but 5 in [5, 2]"),
                             std::invalid_argument);
        const auto c = Tensor<Spec<"x", none, none>>::zeros(mesh, {2, 3, 4});
        const auto d = Tensor<Spec<none, none, "y">>::zeros(mesh, {3, 4, 6});
        CHECK_THROWS_WITH_AS(sl::einsum<"bij,bjk->bik">(c, d), doctest::Contains("label 'b' has extent 2 in [2, 3, 4]"),
                             std::invalid_argument);
        // Nothing was left half-done: the devices still agree on a collective afterwards.
        CHECK(sl::matmul(a, Tensor<ColsY>::zeros(mesh, {4, 2})).to_host() == std::vector<float>(6, 0.0f));
      },
      device_counts);
}
}
