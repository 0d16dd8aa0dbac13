// SPDX-License-Identifier: Apache-2.0
// Reductions along a dim, softmax and norm pieces (kernels/reduce.hpp) against plain loops in
// double, on random [outer, n, inner] shapes (0 and 1 extents, and inner across the 64-row
// blocks), including the split-dim protocol: stats per block, combined, then apply per block.
#include <doctest/doctest.h>
#include <shardlib/kernels/reduce.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace k = shardlib::kernels;
using k::ReduceKind;

namespace {

using I64 = std::int64_t;
/// The host instance the kernels run on, made when first used: after Kokkos is initialised (an
/// instance made before, at namespace scope, is an error with an OpenMP Kokkos 4.6).
const Kokkos::DefaultHostExecutionSpace& exec() {
  static const Kokkos::DefaultHostExecutionSpace e{};
  return e;
}
constexpr double inf = std::numeric_limits<double>::infinity();

struct Shape {
  I64 outer, n, inner;
  I64 size() const { return outer * n * inner; }
  I64 rows() const { return outer * inner; }
  I64 at(I64 o, I64 j, I64 i) const { return (o * n + j) * inner + i; }
};

// Case c's shape: extents that hit 0, 1, the 16-lane tail, and the row-block edges (64 .. 1024
// rows); the first cases are fixed shapes whose blocks have 1024 rows and a remainder.
Shape random_shape(std::mt19937_64& g, int c) {
  static const Shape fixed[] = {{8, 3, 1100}, {4, 2, 2048}, {1, 5, 1100}, {2, 40, 1}};
  if (c < int(std::size(fixed))) return fixed[c];
  static const I64 ext[] = {0, 1, 1, 2, 3, 5, 7, 8, 13, 16, 17, 33, 64, 65, 130, 1100};
  auto pick = [&] { return ext[g() % std::size(ext)]; };
  Shape s{pick(), pick(), pick()};
  while (s.size() > 20000) s.outer = s.outer > 1 ? 1 : 0;
  return s;
}

template <class T>
std::vector<T> random_values(std::mt19937_64& g, I64 n, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<T>(u(g));
  return v;
}

// The rows' values of a block in double: ref[row][j].
template <class T>
std::vector<std::vector<double>> rows_of(const Shape& s, const std::vector<T>& x) {
  std::vector<std::vector<double>> r(static_cast<std::size_t>(s.rows()));
  for (I64 o = 0; o < s.outer; ++o)
    for (I64 i = 0; i < s.inner; ++i)
      for (I64 j = 0; j < s.n; ++j) r[static_cast<std::size_t>(o * s.inner + i)].push_back(double(x[std::size_t(s.at(o, j, i))]));
  return r;
}

// Splits dim n of `x` at `cut`: two blocks [outer, cut, inner] and [outer, n - cut, inner].
template <class T>
std::vector<T> part(const Shape& s, const std::vector<T>& x, I64 j0, I64 len) {
  std::vector<T> p;
  for (I64 o = 0; o < s.outer; ++o)
    for (I64 j = j0; j < j0 + len; ++j)
      for (I64 i = 0; i < s.inner; ++i) p.push_back(x[std::size_t(s.at(o, j, i))]);
  return p;
}

template <class T>
void check_reduce(std::mt19937_64& g, bool integer_data) {
  for (int c = 0; c < 300; ++c) {
    const Shape s = random_shape(g, c);
    std::vector<T> x = random_values<T>(g, s.size(), -100, 100);
    if (integer_data)
      for (auto& v : x) v = static_cast<T>(std::round(double(v)));
    const auto rows = rows_of(s, x);
    CAPTURE(s.outer);
    CAPTURE(s.n);
    CAPTURE(s.inner);
    std::vector<double> sum(std::size_t(s.rows()), -1);
    std::vector<T> mx(std::size_t(s.rows()), T(-1)), mn(std::size_t(s.rows()), T(-1));
    k::reduce_dim<Kokkos::DefaultHostExecutionSpace, T, double>(exec(), x.data(), sum.data(), s.outer, s.n, s.inner,
                                                                 ReduceKind::sum);
    k::reduce_dim(exec(), x.data(), mx.data(), s.outer, s.n, s.inner, ReduceKind::max);
    k::reduce_dim(exec(), x.data(), mn.data(), s.outer, s.n, s.inner, ReduceKind::min);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      double rs = 0, rmax = -inf, rmin = inf;
      for (double v : rows[r]) {
        rs += v;
        rmax = std::max(rmax, v);
        rmin = std::min(rmin, v);
      }
      REQUIRE(sum[r] == doctest::Approx(rs).epsilon(1e-12).scale(100));
      if constexpr (std::numeric_limits<T>::has_infinity) {
        REQUIRE(double(mx[r]) == rmax);
        REQUIRE(double(mn[r]) == rmin);
      } else {
        REQUIRE(mx[r] == (rows[r].empty() ? std::numeric_limits<T>::lowest() : T(rmax)));
        REQUIRE(mn[r] == (rows[r].empty() ? std::numeric_limits<T>::max() : T(rmin)));
      }
    }
  }
}

// Reference first arg-max / arg-min of a row (NaN wins, first one).
I64 ref_arg(const std::vector<double>& row, bool max) {
  I64 best = -1;
  for (I64 j = 0; j < I64(row.size()); ++j) {
    const double v = row[std::size_t(j)];
    if (std::isnan(v)) return j;
    if (best < 0 || (max ? v > row[std::size_t(best)] : v < row[std::size_t(best)])) best = j;
  }
  return best;
}

double ref_softmax_denominator(const std::vector<double>& row, double m) {
  double z = 0;
  for (double v : row) z += std::exp(v - m);
  return z;
}

}  // namespace

TEST_SUITE("kernels_reduce") {
  TEST_CASE("reduce_dim: sum, max, min match loops on random shapes (float->double, double, int)") {
    std::mt19937_64 g(1);
    check_reduce<float>(g, false);
    check_reduce<double>(g, false);
    check_reduce<int>(g, true);
    // Accumulating in int64 avoids int overflow.
    std::vector<int> big(1000, 3'000'000);
    std::int64_t out = 0;
    k::reduce_dim(exec(), big.data(), &out, 1, 1000, 1, ReduceKind::sum);
    CHECK(out == 3'000'000'000LL);
  }

  TEST_CASE("reduce_dim: n == 0 gives the identity, max/min propagate NaN") {
    std::vector<float> none;
    float s[3] = {7, 7, 7}, mx[3] = {7, 7, 7}, mn[3] = {7, 7, 7};
    k::reduce_dim(exec(), none.data(), s, 1, 0, 3, ReduceKind::sum);
    k::reduce_dim(exec(), none.data(), mx, 3, 0, 1, ReduceKind::max);
    k::reduce_dim(exec(), none.data(), mn, 1, 0, 3, ReduceKind::min);
    for (int r = 0; r < 3; ++r) {
      CHECK(s[r] == 0);
      CHECK(mx[r] == -std::numeric_limits<float>::infinity());
      CHECK(mn[r] == std::numeric_limits<float>::infinity());
    }
    std::vector<int> inone;
    int imx = 7, imn = 7;
    k::reduce_dim(exec(), inone.data(), &imx, 1, 0, 1, ReduceKind::max);
    k::reduce_dim(exec(), inone.data(), &imn, 1, 0, 1, ReduceKind::min);
    CHECK(imx == std::numeric_limits<int>::lowest());
    CHECK(imn == std::numeric_limits<int>::max());
    // NaN anywhere in a row (any lane position, either layout) makes max and min NaN.
    const double nan = std::nan("");
    for (I64 pos = 0; pos < 9; ++pos)
      for (I64 inner : {I64(1), I64(2)}) {
        std::vector<double> x(std::size_t(9 * inner), 1.0);
        x[std::size_t(pos * inner)] = nan;
        double m[2] = {0, 0}, n[2] = {0, 0};
        k::reduce_dim(exec(), x.data(), m, 1, 9, inner, ReduceKind::max);
        k::reduce_dim(exec(), x.data(), n, 1, 9, inner, ReduceKind::min);
        CHECK(std::isnan(m[0]));
        CHECK(std::isnan(n[0]));
        if (inner == 2) CHECK(m[1] == 1.0);
      }
  }

  TEST_CASE("argmax / argmin: first extremum, NaN wins, offset added, blocks combine with arg_better") {
    std::mt19937_64 g(2);
    for (int c = 0; c < 400; ++c) {
      const Shape s = random_shape(g, c);
      // Few distinct values: many ties. Some NaNs in some cases.
      std::vector<float> x = random_values<float>(g, s.size(), 0, 4);
      for (auto& v : x) v = std::floor(v);
      if (c % 3 == 0)
        for (auto& v : x)
          if (g() % 50 == 0) v = std::nanf("");
      const auto rows = rows_of(s, x);
      const I64 offset = I64(g() % 100);
      CAPTURE(s.outer);
      CAPTURE(s.n);
      CAPTURE(s.inner);
      for (bool max : {true, false}) {
        std::vector<float> best(std::size_t(s.rows()), 9);
        std::vector<I64> idx(std::size_t(s.rows()), 9);
        if (max) k::argmax_dim(exec(), x.data(), best.data(), idx.data(), s.outer, s.n, s.inner, offset);
        else k::argmin_dim(exec(), x.data(), best.data(), idx.data(), s.outer, s.n, s.inner, offset);
        // The same row split in two blocks (second block at offset + cut), combined with arg_better.
        const I64 cut = s.n == 0 ? 0 : I64(g() % std::uint64_t(s.n + 1));
        const auto a = part(s, x, 0, cut), b = part(s, x, cut, s.n - cut);
        std::vector<float> ba(best.size()), bb(best.size());
        std::vector<I64> ia(best.size()), ib(best.size());
        if (max) {
          k::argmax_dim(exec(), a.data(), ba.data(), ia.data(), s.outer, cut, s.inner, offset);
          k::argmax_dim(exec(), b.data(), bb.data(), ib.data(), s.outer, s.n - cut, s.inner, offset + cut);
        } else {
          k::argmin_dim(exec(), a.data(), ba.data(), ia.data(), s.outer, cut, s.inner, offset);
          k::argmin_dim(exec(), b.data(), bb.data(), ib.data(), s.outer, s.n - cut, s.inner, offset + cut);
        }
        for (std::size_t r = 0; r < rows.size(); ++r) {
          const I64 want = ref_arg(rows[r], max);
          REQUIRE(idx[r] == (want < 0 ? -1 : want + offset));
          if (want < 0) REQUIRE(best[r] == (max ? -1 : 1) * std::numeric_limits<float>::infinity());
          else if (std::isnan(rows[r][std::size_t(want)])) REQUIRE(std::isnan(best[r]));
          else REQUIRE(double(best[r]) == rows[r][std::size_t(want)]);
          // Combine in either order.
          const bool b_wins = max ? k::arg_better<true>(bb[r], ib[r], ba[r], ia[r]) : k::arg_better<false>(bb[r], ib[r], ba[r], ia[r]);
          REQUIRE((b_wins ? ib[r] : ia[r]) == idx[r]);
          const bool a_wins = max ? k::arg_better<true>(ba[r], ia[r], bb[r], ib[r]) : k::arg_better<false>(ba[r], ia[r], bb[r], ib[r]);
          REQUIRE((a_wins ? ia[r] : ib[r]) == idx[r]);
        }
      }
    }
    // Explicit NaN cases: NaN beats +inf; the first NaN wins; ints have no NaN.
    const float nan = std::nanf(""), finf = std::numeric_limits<float>::infinity();
    const float row[6] = {1, finf, nan, 5, nan, finf};
    float b = 0;
    I64 i = 0;
    k::argmax_dim(exec(), row, &b, &i, 1, 6, 1, 10);
    CHECK(i == 12);
    CHECK(std::isnan(b));
    k::argmax_dim(exec(), row, &b, &i, 1, 2, 1, 0);
    CHECK(i == 1);
    CHECK(b == finf);
    CHECK(k::arg_better<true>(nan, 7, finf, 1));
    CHECK(!k::arg_better<true>(nan, 7, nan, 1));
    CHECK(k::arg_better<true>(1.0f, 7, 0.0f, -1));  // anything beats an empty block
    CHECK(!k::arg_better<true>(1.0f, -1, 0.0f, 3));  // an empty block never wins
    const int irow[5] = {3, 9, 2, 9, 2};
    int ib = 0;
    k::argmax_dim(exec(), irow, &ib, &i, 1, 5, 1, 0);
    CHECK((ib == 9 && i == 1));
    k::argmin_dim(exec(), irow, &ib, &i, 1, 5, 1, 0);
    CHECK((ib == 2 && i == 2));
  }

  TEST_CASE("exp_sum: a row's sum does not depend on its address") {
    // Whole packets from each chunk's start (vmath::sum_packets): the same rows 1 to 7 values
    // apart give the same bits; Eigen's sum began at a row's first aligned value.
    std::mt19937_64 g(31);
    for (I64 n : {I64(5), I64(33), I64(100), I64(2051)}) {
      const I64 outer = 3;
      const std::vector<float> x = random_values<float>(g, outer * n, -6, 6);
      std::vector<float> mx(static_cast<std::size_t>(outer)), z0(mx.size());
      k::reduce_dim(exec(), x.data(), mx.data(), outer, n, 1, ReduceKind::max);
      k::exp_sum(exec(), x.data(), mx.data(), z0.data(), outer, n, 1);
      for (std::size_t shift = 1; shift < 8; ++shift) {
        std::vector<float> moved(x.size() + shift), z(mx.size());
        std::copy(x.begin(), x.end(), moved.begin() + std::ptrdiff_t(shift));
        k::exp_sum(exec(), moved.data() + shift, mx.data(), z.data(), outer, n, 1);
        CAPTURE(n);
        CAPTURE(shift);
        CHECK(z == z0);
      }
    }
  }

  TEST_CASE("softmax and log_softmax match double loops, also with the dim split in two blocks") {
    std::mt19937_64 g(3);
    for (int c = 0; c < 300; ++c) {
      const Shape s = random_shape(g, c);
      const double spread = c % 4 == 0 ? 1e4 : 10;  // large values: no overflow thanks to the max
      const double shift = c % 4 == 0 ? 5e4 : 0;
      const std::vector<float> x = random_values<float>(g, s.size(), shift - spread, shift + spread);
      const auto rows = rows_of(s, x);
      CAPTURE(s.outer);
      CAPTURE(s.n);
      CAPTURE(s.inner);
      std::vector<float> mx(std::size_t(s.rows())), z(std::size_t(s.rows())), y(x.size()), ly(x.size());
      k::reduce_dim(exec(), x.data(), mx.data(), s.outer, s.n, s.inner, ReduceKind::max);
      k::exp_sum(exec(), x.data(), mx.data(), z.data(), s.outer, s.n, s.inner);
      k::softmax_apply(exec(), x.data(), y.data(), mx.data(), z.data(), s.outer, s.n, s.inner, false);
      k::softmax_apply(exec(), x.data(), ly.data(), mx.data(), z.data(), s.outer, s.n, s.inner, true);
      // Split protocol: block stats, max of maxes, exp sums with the global max, added.
      const I64 cut = s.n == 0 ? 0 : I64(g() % std::uint64_t(s.n + 1));
      const auto a = part(s, x, 0, cut), b = part(s, x, cut, s.n - cut);
      std::vector<float> ma(mx.size()), mb(mx.size()), za(mx.size()), zb(mx.size()), ya(a.size()), yb(b.size());
      k::reduce_dim(exec(), a.data(), ma.data(), s.outer, cut, s.inner, ReduceKind::max);
      k::reduce_dim(exec(), b.data(), mb.data(), s.outer, s.n - cut, s.inner, ReduceKind::max);
      for (std::size_t r = 0; r < ma.size(); ++r) ma[r] = mb[r] = std::max(ma[r], mb[r]);
      k::exp_sum(exec(), a.data(), ma.data(), za.data(), s.outer, cut, s.inner);
      k::exp_sum(exec(), b.data(), mb.data(), zb.data(), s.outer, s.n - cut, s.inner);
      for (std::size_t r = 0; r < za.size(); ++r) za[r] = zb[r] = za[r] + zb[r];
      // With the whole rows' statistics, the pieces' outputs are the whole's bit for bit: a value's
      // exp does not depend on where its block starts (kernels/vmath.hpp, assign_packets).
      for (const bool log : {false, true}) {
        std::vector<float> pa(a.size()), pb(b.size());
        k::softmax_apply(exec(), a.data(), pa.data(), mx.data(), z.data(), s.outer, cut, s.inner, log);
        k::softmax_apply(exec(), b.data(), pb.data(), mx.data(), z.data(), s.outer, s.n - cut, s.inner, log);
        const std::vector<float>& w = log ? ly : y;
        int differ = 0;
        for (I64 o = 0; o < s.outer; ++o)
          for (I64 i = 0; i < s.inner; ++i)
            for (I64 j = 0; j < s.n; ++j) {
              const float got = j < cut ? pa[std::size_t((o * cut + j) * s.inner + i)]
                                        : pb[std::size_t((o * (s.n - cut) + j - cut) * s.inner + i)];
              differ += std::bit_cast<std::uint32_t>(got) != std::bit_cast<std::uint32_t>(w[std::size_t(s.at(o, j, i))]);
            }
        CAPTURE(log);
        REQUIRE(differ == 0);
      }
      k::softmax_apply(exec(), a.data(), ya.data(), ma.data(), za.data(), s.outer, cut, s.inner, false);
      k::softmax_apply(exec(), b.data(), yb.data(), mb.data(), zb.data(), s.outer, s.n - cut, s.inner, false);
      const auto split_rows = [&] {  // ya ++ yb along the dim, as rows
        std::vector<float> whole(x.size());
        for (I64 o = 0; o < s.outer; ++o)
          for (I64 i = 0; i < s.inner; ++i)
            for (I64 j = 0; j < s.n; ++j)
              whole[std::size_t(s.at(o, j, i))] = j < cut ? ya[std::size_t((o * cut + j) * s.inner + i)]
                                                          : yb[std::size_t((o * (s.n - cut) + j - cut) * s.inner + i)];
        return rows_of(s, whole);
      }();
      const auto yr = rows_of(s, y), lyr = rows_of(s, ly);
      for (std::size_t r = 0; r < rows.size(); ++r) {
        if (rows[r].empty()) {
          REQUIRE(z[r] == 0);
          continue;
        }
        const double m = *std::max_element(rows[r].begin(), rows[r].end());
        const double zr = ref_softmax_denominator(rows[r], m);
        double total = 0;
        for (std::size_t j = 0; j < rows[r].size(); ++j) {
          const double want = std::exp(rows[r][j] - m) / zr;
          REQUIRE(yr[r][j] == doctest::Approx(want).epsilon(1e-5).scale(1e-6));
          REQUIRE(split_rows[r][j] == doctest::Approx(want).epsilon(1e-5).scale(1e-6));
          REQUIRE(std::isfinite(lyr[r][j]));
          REQUIRE(lyr[r][j] == doctest::Approx(rows[r][j] - m - std::log(zr)).epsilon(1e-6).scale(1));
          total += yr[r][j];
        }
        REQUIRE(total == doctest::Approx(1.0).epsilon(1e-5));
      }
    }
    // In place, and a row of one huge value.
    std::vector<double> x = {1000, 1000, 999, -1e300};
    double m = 0, zz = 0;
    k::reduce_dim(exec(), x.data(), &m, 1, 4, 1, ReduceKind::max);
    k::exp_sum(exec(), x.data(), &m, &zz, 1, 4, 1);
    k::softmax_apply(exec(), x.data(), x.data(), &m, &zz, 1, 4, 1, false);
    const double e = std::exp(-1.0);
    CHECK(x[0] == doctest::Approx(1 / (2 + e)));
    CHECK(x[2] == doctest::Approx(e / (2 + e)));
    CHECK(x[3] >= 0);  // e^-(1e300): 0, or a subnormal from the vectorised exp (kernels/vmath.hpp)
    CHECK(x[3] <= std::numeric_limits<double>::min());
  }

  TEST_CASE("layer_norm and rms_norm match a two-pass reference, whole and with the dim split") {
    std::mt19937_64 g(4);
    for (int c = 0; c < 300; ++c) {
      const Shape s = random_shape(g, c);
      const double shift = c % 3 == 0 ? 100 : 0;  // mean far from 0
      const std::vector<float> x = random_values<float>(g, s.size(), shift - 3, shift + 3);
      const auto rows = rows_of(s, x);
      const double eps = c % 2 == 0 ? 1e-5 : 0.5;
      CAPTURE(s.outer);
      CAPTURE(s.n);
      CAPTURE(s.inner);
      const I64 cut = s.n == 0 ? 0 : I64(g() % std::uint64_t(s.n + 1));
      const auto a = part(s, x, 0, cut), b = part(s, x, cut, s.n - cut);
      // Stats per block, added (the all-reduce), then each block normalised with the global count.
      std::vector<double> sa(std::size_t(s.rows())), qa(sa.size()), sb(sa.size()), qb(sa.size()), q2(sa.size());
      k::moments(exec(), a.data(), sa.data(), qa.data(), s.outer, cut, s.inner);
      k::moments(exec(), b.data(), sb.data(), qb.data(), s.outer, s.n - cut, s.inner);
      k::moments(exec(), x.data(), static_cast<double*>(nullptr), q2.data(), s.outer, s.n, s.inner);
      for (std::size_t r = 0; r < sa.size(); ++r) {
        sa[r] += sb[r];
        qa[r] += qb[r];
        REQUIRE(q2[r] == doctest::Approx(qa[r]).epsilon(1e-12));
      }
      std::vector<float> la(a.size()), lb(b.size()), ra(a.size()), rb(b.size());
      k::layer_norm_apply(exec(), a.data(), la.data(), sa.data(), qa.data(), s.outer, cut, s.inner, s.n, eps);
      k::layer_norm_apply(exec(), b.data(), lb.data(), sa.data(), qa.data(), s.outer, s.n - cut, s.inner, s.n, eps);
      k::rms_norm_apply(exec(), a.data(), ra.data(), qa.data(), s.outer, cut, s.inner, s.n, eps);
      k::rms_norm_apply(exec(), b.data(), rb.data(), qa.data(), s.outer, s.n - cut, s.inner, s.n, eps);
      for (I64 o = 0; o < s.outer; ++o)
        for (I64 i = 0; i < s.inner; ++i) {
          const auto& row = rows[std::size_t(o * s.inner + i)];
          double mean = 0, ms = 0, var = 0;
          for (double v : row) mean += v / double(s.n), ms += v * v / double(s.n);
          for (double v : row) var += (v - mean) * (v - mean) / double(s.n);
          for (I64 j = 0; j < s.n; ++j) {
            const bool in_a = j < cut;
            const std::size_t at = std::size_t(in_a ? (o * cut + j) * s.inner + i : (o * (s.n - cut) + j - cut) * s.inner + i);
            const double ln = (row[std::size_t(j)] - mean) / std::sqrt(var + eps);
            const double rn = row[std::size_t(j)] / std::sqrt(ms + eps);
            // float data, stats in double: the error is the float rounding of the result (plus
            // cancellation of sumsq/N - mean^2 when the mean is far from 0 and the variance tiny).
            REQUIRE(double(in_a ? la[at] : lb[at]) == doctest::Approx(ln).epsilon(1e-5).scale(1e-3));
            REQUIRE(double(in_a ? ra[at] : rb[at]) == doctest::Approx(rn).epsilon(1e-6).scale(1e-6));
          }
        }
    }
    // A constant row: variance 0 (never negative after cancellation), output 0.
    std::vector<float> c(10, 12345.678f), y(10, 1);
    double sm = 0, sq = 0;
    k::moments(exec(), c.data(), &sm, &sq, 1, 10, 1);
    k::layer_norm_apply(exec(), c.data(), y.data(), &sm, &sq, 1, 10, 1, 10, 1e-5);
    for (float v : y) CHECK(std::abs(v) < 1e-2f);
    // In place.
    std::vector<double> d = {3, 4};
    double dq = 0;
    k::moments(exec(), d.data(), static_cast<double*>(nullptr), &dq, 1, 2, 1);
    k::rms_norm_apply(exec(), d.data(), d.data(), &dq, 1, 2, 1, 2, 0.0);
    CHECK(d[0] == doctest::Approx(3 / std::sqrt(12.5)));
    CHECK(d[1] == doctest::Approx(4 / std::sqrt(12.5)));
  }

  TEST_CASE("the device forms (detail::portable: a thread per row or element) match the host kernels") {
    // What a GPU runs, run here on a host instance: reduce_dim, and softmax's and the norms' stats
    // and apply kernels, on the random shapes, NaN and -inf in some rows.
    namespace p = k::detail::portable;
    const auto same = [](double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
    std::mt19937_64 g(6);
    for (int c = 0; c < 300; ++c) {
      const Shape s = random_shape(g, c);
      std::vector<float> x = random_values<float>(g, s.size(), -20, 20);
      if (c % 5 == 1 && !x.empty()) x[g() % x.size()] = std::numeric_limits<float>::quiet_NaN();
      if (c % 5 == 2 && !x.empty()) x[g() % x.size()] = -std::numeric_limits<float>::infinity();
      CAPTURE(s.outer);
      CAPTURE(s.n);
      CAPTURE(s.inner);
      const auto rows = std::size_t(s.rows());
      std::vector<double> sum(rows, -1), psum(rows, -2);
      std::vector<float> mx(rows, -1), pmx(rows, -2), mn(rows, -1), pmn(rows, -2);
      k::reduce_dim<Kokkos::DefaultHostExecutionSpace, float, double>(exec(), x.data(), sum.data(), s.outer, s.n, s.inner,
                                                                       ReduceKind::sum);
      p::reduce_dim(exec(), x.data(), psum.data(), s.outer, s.n, s.inner, ReduceKind::sum);
      k::reduce_dim(exec(), x.data(), mx.data(), s.outer, s.n, s.inner, ReduceKind::max);
      p::reduce_dim(exec(), x.data(), pmx.data(), s.outer, s.n, s.inner, ReduceKind::max);
      k::reduce_dim(exec(), x.data(), mn.data(), s.outer, s.n, s.inner, ReduceKind::min);
      p::reduce_dim(exec(), x.data(), pmn.data(), s.outer, s.n, s.inner, ReduceKind::min);
      for (std::size_t r = 0; r < rows; ++r) {
        REQUIRE((same(psum[r], sum[r]) || psum[r] == doctest::Approx(sum[r]).epsilon(1e-12).scale(1e-9)));
        REQUIRE(same(pmx[r], mx[r]));
        REQUIRE(same(pmn[r], mn[r]));
      }
      // scale (a mean's 1 / count).
      std::vector<float> sc = x, psc = x;
      k::scale(exec(), sc.data(), I64(sc.size()), 0.37f);
      p::scale(exec(), psc.data(), I64(psc.size()), 0.37f);
      for (std::size_t e = 0; e < x.size(); ++e) REQUIRE(same(psc[e], sc[e]));
      // argmax and argmin: the first best value and its index (NaN first), offset by 5.
      std::vector<float> ab(rows, -1), pab(rows, -2);
      std::vector<std::int64_t> ai(rows, -3), pai(rows, -4);
      k::argmax_dim(exec(), x.data(), ab.data(), ai.data(), s.outer, s.n, s.inner, 5);
      p::arg_dim<Kokkos::DefaultHostExecutionSpace, float, true>(exec(), x.data(), pab.data(), pai.data(), s.outer, s.n, s.inner, 5);
      for (std::size_t r = 0; r < rows; ++r) REQUIRE((same(pab[r], ab[r]) && pai[r] == ai[r]));
      k::argmin_dim(exec(), x.data(), ab.data(), ai.data(), s.outer, s.n, s.inner, 5);
      p::arg_dim<Kokkos::DefaultHostExecutionSpace, float, false>(exec(), x.data(), pab.data(), pai.data(), s.outer, s.n, s.inner, 5);
      for (std::size_t r = 0; r < rows; ++r) REQUIRE((same(pab[r], ab[r]) && pai[r] == ai[r]));
      // softmax: the row max, the sum of exponentials, the apply (and in place).
      std::vector<float> z(rows, -1), pz(rows, -2), y(x.size()), py(x.size()), ly(x.size()), ply(x.size());
      k::exp_sum(exec(), x.data(), mx.data(), z.data(), s.outer, s.n, s.inner);
      p::exp_sum(exec(), x.data(), mx.data(), pz.data(), s.outer, s.n, s.inner);
      for (std::size_t r = 0; r < rows; ++r) REQUIRE((same(pz[r], z[r]) || pz[r] == doctest::Approx(z[r]).epsilon(1e-6)));
      k::softmax_apply(exec(), x.data(), y.data(), mx.data(), z.data(), s.outer, s.n, s.inner, false);
      p::softmax_apply(exec(), x.data(), py.data(), mx.data(), z.data(), s.outer, s.n, s.inner, false);
      k::softmax_apply(exec(), x.data(), ly.data(), mx.data(), z.data(), s.outer, s.n, s.inner, true);
      p::softmax_apply(exec(), x.data(), ply.data(), mx.data(), z.data(), s.outer, s.n, s.inner, true);
      for (std::size_t e = 0; e < x.size(); ++e) {
        REQUIRE((same(py[e], y[e]) || py[e] == doctest::Approx(y[e]).epsilon(1e-5).scale(1e-7)));
        REQUIRE((same(ply[e], ly[e]) || ply[e] == doctest::Approx(ly[e]).epsilon(1e-6)));
      }
      std::vector<float> inplace = x;
      p::softmax_apply(exec(), inplace.data(), inplace.data(), mx.data(), z.data(), s.outer, s.n, s.inner, false);
      for (std::size_t e = 0; e < x.size(); ++e) REQUIRE(same(inplace[e], py[e]));
      // The norms: the moments, then layer_norm's and rms_norm's apply.
      std::vector<double> ms(rows), mq(rows), pms(rows), pmq(rows);
      k::moments(exec(), x.data(), ms.data(), mq.data(), s.outer, s.n, s.inner);
      p::moments(exec(), x.data(), pms.data(), pmq.data(), s.outer, s.n, s.inner);
      for (std::size_t r = 0; r < rows; ++r) {
        REQUIRE((same(pms[r], ms[r]) || pms[r] == doctest::Approx(ms[r]).epsilon(1e-12).scale(1e-9)));
        REQUIRE((same(pmq[r], mq[r]) || pmq[r] == doctest::Approx(mq[r]).epsilon(1e-12)));
      }
      const double eps = c % 2 == 0 ? 1e-5 : 0.5;
      std::vector<float> ln(x.size()), pln(x.size()), rn(x.size()), prn(x.size());
      k::layer_norm_apply(exec(), x.data(), ln.data(), ms.data(), mq.data(), s.outer, s.n, s.inner, s.n, eps);
      p::norm_apply(exec(), x.data(), pln.data(), ms.data(), mq.data(), s.outer, s.n, s.inner, s.n, eps);
      k::rms_norm_apply(exec(), x.data(), rn.data(), mq.data(), s.outer, s.n, s.inner, s.n, eps);
      p::norm_apply(exec(), x.data(), prn.data(), static_cast<const double*>(nullptr), mq.data(), s.outer, s.n, s.inner, s.n, eps);
      for (std::size_t e = 0; e < x.size(); ++e) {
        REQUIRE((same(pln[e], ln[e]) || pln[e] == doctest::Approx(ln[e]).epsilon(1e-6).scale(1e-6)));
        REQUIRE((same(prn[e], rn[e]) || prn[e] == doctest::Approx(rn[e]).epsilon(1e-6).scale(1e-6)));
      }
    }
  }

  TEST_CASE("row sums with a team per row (the GPU's form for contiguous rows) give ReduceDimKernel's") {
    namespace p = k::detail::portable;
    std::mt19937_64 g(67);
    for (const std::int64_t n : {1, 31, 32, 100, 777})
      for (const std::int64_t rows : {1, 5, 64}) {
        // integers: exact whatever the order of the sums
        std::vector<double> x(static_cast<std::size_t>(rows * n));
        for (auto& v : x) v = static_cast<double>(static_cast<int>(g() % 21) - 10);
        std::vector<double> got(static_cast<std::size_t>(rows), -1), want(got.size(), -2);
        p::row_sums(exec(), x.data(), got.data(), rows, n);
        for (std::int64_t r = 0; r < rows; ++r)
          p::ReduceDimKernel<double, double, k::ReduceKind::sum>{x.data(), want.data(), n, 1, 0.0}(r);
        CAPTURE(n);
        CAPTURE(rows);
        CHECK(got == want);
        // 32 elements a thread in registers (rows up to 32 whole, longer ones in chunks)
        std::fill(got.begin(), got.end(), -1.0);
        p::row_sums(exec(), x.data(), got.data(), rows, n, k::RowGroups{1, 1, 32});
        CHECK(got == want);
      }
  }

  TEST_CASE("a chunked row walk: each in the row's order, store the last chunk first (the most recently read)") {
    // A group of one thread, 8 elements a chunk: rows of 20 are chunks [0, 8), [8, 16), [16, 20).
    for (const I64 kept : {I64(20), I64(18), I64(10)}) {
      std::vector<float> a(20), b(20);
      for (int j = 0; j < 20; ++j) a[static_cast<std::size_t>(j)] = static_cast<float>(j), b[static_cast<std::size_t>(j)] = 100.0f * j;
      const float* rows[2] = {a.data(), b.data()};
      const k::RowWalk<float, 8, 2, true> walk(rows, 0, 20, kept, 1, 0, false, true, -1.0f);
      float sum = 0;
      std::vector<I64> order;
      walk.each([&](I64 j, const auto& v) {
        sum += v[0] + v[1];
        order.push_back(j);
      });
      CAPTURE(kept);
      CHECK(sum == static_cast<float>(101 * (kept * (kept - 1) / 2)));
      std::vector<I64> ascending(static_cast<std::size_t>(kept));
      std::iota(ascending.begin(), ascending.end(), I64(0));
      CHECK(order == ascending);  // each: in the row's order
      for (auto& v : a) v += 1000.0f;  // a store reads the row again
      std::vector<float> out(20, 0.0f);
      std::vector<I64> stored;
      walk.store(out.data(), 0, false, [&](I64 j, const auto& v) {
        stored.push_back(j);
        return v[0] + v[1];
      });
      for (int j = 0; j < 20; ++j) {
        CAPTURE(j);
        CHECK(out[static_cast<std::size_t>(j)] == (j < kept ? 101.0f * j + 1000.0f : -2.0f));  // past `kept`: pad, pad
      }
      // the chunks last first, each chunk's elements in order
      CHECK(stored == std::vector<I64>{16, 17, 18, 19, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    }
  }

  TEST_CASE("a row launch that needs more teams than Kokkos' int league holds is refused, naming the kernel") {
    using Member = Kokkos::TeamPolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::LaunchBounds<1024, 1>>::member_type;
    bool ran = false;
    const auto kernel = [&ran](const Member&) { ran = true; };
    CHECK_THROWS_WITH_AS(k::launch_row_groups(exec(), "test::rows", I64(1) << 40, k::RowGroups{1, 1, 8}, 0, kernel),
                         "shardlib: test::rows: 1099511627776 rows of 1 a team need 1099511627776 teams, more than one "
                         "launch takes (2^31 - 1)",
                         std::length_error);
    CHECK_FALSE(ran);
    k::launch_row_groups(exec(), "test::rows", 3, k::RowGroups{1, 1, 8}, 0, kernel);  // a small one runs
    CHECK(ran);
  }

  TEST_CASE("rows_fused (a team per row, one launch) gives what the stats and apply kernels give") {
    // The GPU's kernel for whole contiguous rows, run here on a host instance (a thread per team),
    // against detail::portable's stats and apply kernels on the same rows: softmax and
    // log_softmax of scale * x, layer_norm and rms_norm; NaN, +-inf, empty rows, in place.
    namespace p = k::detail::portable;
    using p::RowOp;
    const auto same = [](double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
    std::mt19937_64 g(61);
    for (int c = 0; c < 200; ++c) {
      Shape s = random_shape(g, c);
      s.outer *= s.inner;  // contiguous rows: inner 1
      s.inner = 1;
      while (s.size() > 20000) s.outer /= 2;
      std::vector<float> x = random_values<float>(g, s.size(), -20, 20);
      if (c % 5 == 1 && !x.empty()) x[g() % x.size()] = std::numeric_limits<float>::quiet_NaN();
      if (c % 5 == 2 && !x.empty()) x[g() % x.size()] = -std::numeric_limits<float>::infinity();
      if (c % 5 == 3 && !x.empty()) x[g() % x.size()] = std::numeric_limits<float>::infinity();
      CAPTURE(s.outer);
      CAPTURE(s.n);
      const float scale = c % 3 == 0 ? 0.125f : 1.0f;
      const auto rows = std::size_t(s.rows());
      std::vector<float> xs = x;  // what the two-kernel path reads: scale * x, rounded
      for (auto& v : xs) v *= scale;
      std::vector<float> mx(rows), z(rows), want(x.size()), got(x.size());
      p::reduce_dim(exec(), xs.data(), mx.data(), s.outer, s.n, s.inner, ReduceKind::max);
      p::exp_sum(exec(), xs.data(), mx.data(), z.data(), s.outer, s.n, s.inner);
      for (const bool log : {false, true}) {
        p::softmax_apply(exec(), xs.data(), want.data(), mx.data(), z.data(), s.outer, s.n, s.inner, log);
        p::rows_fused(exec(), log ? RowOp::log_softmax : RowOp::softmax, x.data(), got.data(), s.outer, s.n, scale, 0.0);
        for (std::size_t e = 0; e < x.size(); ++e) REQUIRE(same(got[e], want[e]));
        // the tile of 32 elements a thread (rows up to 32 in registers, longer ones in chunks)
        std::fill(got.begin(), got.end(), -7.0f);
        p::rows_fused(exec(), log ? RowOp::log_softmax : RowOp::softmax, x.data(), got.data(), s.outer, s.n, scale, 0.0,
                      k::RowGroups{1, 1, 32});
        for (std::size_t e = 0; e < x.size(); ++e) REQUIRE(same(got[e], want[e]));
        std::vector<float> inplace = x;
        p::rows_fused(exec(), log ? RowOp::log_softmax : RowOp::softmax, inplace.data(), inplace.data(), s.outer, s.n, scale, 0.0);
        for (std::size_t e = 0; e < x.size(); ++e) REQUIRE(same(inplace[e], want[e]));
      }
      std::vector<double> ms(rows), mq(rows);
      p::moments(exec(), x.data(), ms.data(), mq.data(), s.outer, s.n, s.inner);
      const double eps = c % 2 == 0 ? 1e-5 : 0.5;
      p::norm_apply(exec(), x.data(), want.data(), ms.data(), mq.data(), s.outer, s.n, s.inner, s.n, eps);
      p::rows_fused(exec(), RowOp::layer_norm, x.data(), got.data(), s.outer, s.n, 1.0f, eps);
      for (std::size_t e = 0; e < x.size(); ++e) REQUIRE(same(got[e], want[e]));
      std::fill(got.begin(), got.end(), -7.0f);
      p::rows_fused(exec(), RowOp::layer_norm, x.data(), got.data(), s.outer, s.n, 1.0f, eps, k::RowGroups{1, 1, 32});
      for (std::size_t e = 0; e < x.size(); ++e) REQUIRE(same(got[e], want[e]));
      p::norm_apply(exec(), x.data(), want.data(), static_cast<const double*>(nullptr), mq.data(), s.outer, s.n, s.inner, s.n, eps);
      p::rows_fused(exec(), RowOp::rms_norm, x.data(), got.data(), s.outer, s.n, 1.0f, eps);
      for (std::size_t e = 0; e < x.size(); ++e) REQUIRE(same(got[e], want[e]));
    }
  }

  TEST_CASE("rows_fused's causal softmax: what an additive -infinity bias above the diagonal gives") {
    // Attention's unfused form in GPU memory: rows of [..., sq, n] scores, row r the query r % sq,
    // element j masked where j > r % sq (read up to the diagonal only); both layouts.
    namespace p = k::detail::portable;
    using p::RowOp;
    std::mt19937_64 g(71);
    for (const std::int64_t sq : {1, 3, 8, 17})
      for (const std::int64_t n : {1, 5, 8, 40}) {
        const std::int64_t rows = 3 * sq;
        std::vector<float> x = random_values<float>(g, rows * n, -20, 20), biased = x;
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = r % sq + 1; j < n; ++j) biased[static_cast<std::size_t>(r * n + j)] = -std::numeric_limits<float>::infinity();
        for (const bool log : {false, true})
          for (const auto layout : {k::RowGroups{}, k::RowGroups{1, 1, 32}}) {
            const RowOp op = log ? RowOp::log_softmax : RowOp::softmax;
            std::vector<float> want(x.size()), got(x.size(), 5.0f);
            p::rows_fused(exec(), op, biased.data(), want.data(), rows, n, 0.5f, 0.0);
            p::rows_fused(exec(), op, x.data(), got.data(), rows, n, 0.5f, 0.0, layout, sq);
            CAPTURE(sq);
            CAPTURE(n);
            CAPTURE(log);
            CHECK(got == want);
          }
      }
    std::vector<float> x(4);
    CHECK_THROWS_WITH_AS(p::rows_fused(exec(), RowOp::layer_norm, x.data(), x.data(), 2, 2, 1.0f, 1e-5, {}, 2),
                         doctest::Contains("a causal mask is softmax's"), std::invalid_argument);
  }

  TEST_CASE("scale, and bad arguments named in the message") {
    std::vector<float> v(10000);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i);
    k::scale(exec(), v.data(), I64(v.size()), 0.5f);
    for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == float(i) * 0.5f);
    k::scale(exec(), v.data(), 0, 0.0f);
    CHECK(v[1] == 0.5f);
    float out = 0;
    double sq = 1;
    auto message = [](auto&& f) {
      try {
        f();
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string("no throw");
    };
    CHECK(message([&] { k::reduce_dim(exec(), v.data(), &out, 1, -2, 1, ReduceKind::sum); }).find("[1, -2, 1]") !=
          std::string::npos);
    CHECK(message([&] { k::rms_norm_apply(exec(), v.data(), v.data(), &sq, 1, 5, 1, 4, 0.0); }).find("global count 4") !=
          std::string::npos);
    CHECK(message([&] { k::rms_norm_apply(exec(), v.data(), v.data(), &sq, 1, 5, 1, 5, -1.0); }).find("eps") !=
          std::string::npos);
    CHECK(message([&] { k::scale(exec(), v.data(), -1, 1.0f); }).find("negative count -1") != std::string::npos);
    CHECK(message([&] { k::reduce_dim(exec(), v.data(), &out, 1, 2, 1, ReduceKind(9)); }).find("ReduceKind 9") !=
          std::string::npos);
  }
}
