// SPDX-License-Identifier: Apache-2.0
// The host GEMM kernel (kernels/gemm.hpp) against a plain triple loop in double (exact in
// int64 for integers): random shapes and layouts, edge cases, errors, concurrent callers, and
// with OpenBLAS underneath, that the BLAS does the work on one thread.
#include <doctest/doctest.h>
#include <shardlib/kernels/gemm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_HAVE_OPENBLAS) && SHARDLIB_HAVE_OPENBLAS && __has_include(<cblas.h>)
#include <cblas.h>
#define SHARDLIB_TEST_CBLAS 1
#endif
#if defined(EIGEN_USE_BLAS) && (defined(__GNUC__) || defined(__clang__))
extern "C" int openblas_get_num_threads(void) __attribute__((weak));
#endif

namespace k = shardlib::kernels;
using k::detail::GemmLayout;

namespace {

// ---- Operand layouts (pure, also at compile time) ------------------------------------------
static_assert(k::detail::gemm_operand(3, 4, 4, 1).layout == GemmLayout::row_major);
static_assert(k::detail::gemm_operand(3, 4, 9, 1).ld == 9);                            // submatrix view
static_assert(k::detail::gemm_operand(3, 4, 1, 5).layout == GemmLayout::col_major);    // transposed
static_assert(k::detail::gemm_operand(3, 4, 1, 5).ld == 5);
static_assert(k::detail::gemm_operand(3, 4, 8, 2).layout == GemmLayout::packed);       // no unit stride
static_assert(k::detail::gemm_operand(3, 4, 2, 1).layout == GemmLayout::packed);       // rows overlap
static_assert(k::detail::gemm_operand(3, 4, 0, 1).layout == GemmLayout::packed);       // broadcast rows
static_assert(k::detail::gemm_operand(3, 4, -4, 1).layout == GemmLayout::packed);      // reversed rows
static_assert(k::detail::gemm_operand(1, 4, 0, 1).ld == 4);                            // one row: its stride is unused
static_assert(k::detail::gemm_operand(5, 1, 3, 77).layout == GemmLayout::row_major);   // one column
static_assert(k::detail::gemm_operand(5, 1, 1, 0).ld == 1);
static_assert(k::detail::gemm_operand(1, 5, 7, 3).layout == GemmLayout::col_major);   // one row, stride 3
static_assert(k::detail::gemm_operand(1, 5, 7, 3).ld == 3);
static_assert(k::detail::gemm_operand(0, 4, 0, 0).layout == GemmLayout::row_major);    // empty: nothing read
// A leading dimension past the BLAS index limit is packed rather than truncated.
static_assert(k::detail::gemm_operand(3, 4, 100, 1, 99).layout == GemmLayout::packed);
static_assert(k::detail::gemm_operand(3, 4, 1, 100, 99).layout == GemmLayout::packed);
static_assert(k::detail::gemm_operand(1, 4, 100, 1, 99).layout == GemmLayout::row_major);

// Transposing swaps extents and strides, and a mutable batch converts to a read-only one.
constexpr k::MatrixBatch<float> mb{nullptr, 3, 4, 4, 1, 12};
static_assert(mb.transposed().rows == 4 && mb.transposed().cols == 3 && mb.transposed().row_stride == 1 &&
              mb.transposed().col_stride == 4 && mb.transposed().batch_stride == 12);
static_assert(k::MatrixBatch<const float>(mb).row_stride == 4);

// ---- A matrix batch placed in a buffer with a chosen layout --------------------------------
enum class Place { row_major, col_major, strided, reversed };

template <class T>
T poison() {
  if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::quiet_NaN();
  else return T(-77);
}

/// A batch of rows x cols matrices in its own buffer: row- or column-major with a padded leading
/// dimension (a submatrix view), fully strided (no unit stride), or row-major with rows in
/// reverse order (negative row stride). Every element outside the matrices is poison (NaN for
/// floating point), so a read outside shows in C and a write outside is caught by `untouched`.
template <class T>
struct Placed {
  std::vector<T> buf;
  k::MatrixBatch<T> view;
  std::int64_t off = 0;  // of element (0, 0, 0) in buf
  std::vector<bool> inside;

  Placed(std::int64_t batch, std::int64_t rows, std::int64_t cols, Place p, std::int64_t pad, bool shared) {
    std::int64_t rs = 0, cs = 0, per = 0;
    switch (p) {
      case Place::row_major: rs = cols + pad; cs = 1; per = std::max<std::int64_t>(rows * rs, 1); break;
      case Place::col_major: rs = 1; cs = rows + pad; per = std::max<std::int64_t>(cols * cs, 1); break;
      case Place::strided: cs = 2; rs = 2 * cols + 1 + pad; per = std::max<std::int64_t>(rows * rs, 1); break;
      case Place::reversed:
        rs = -(cols + pad); cs = 1; per = std::max<std::int64_t>(rows * (cols + pad), 1);
        off = (rows - 1) * (cols + pad);
        if (rows == 0) off = 0;
        break;
    }
    const std::int64_t bs = shared ? 0 : per + pad;
    const std::int64_t n = std::max<std::int64_t>(batch, 1) * (per + pad) + 1;
    buf.assign(static_cast<std::size_t>(n), poison<T>());
    inside.assign(buf.size(), false);
    view = {buf.data() + off, rows, cols, rs, cs, bs};
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) inside[static_cast<std::size_t>(index(b, i, j))] = true;
  }
  std::int64_t index(std::int64_t b, std::int64_t i, std::int64_t j) const {
    return off + b * view.batch_stride + i * view.row_stride + j * view.col_stride;
  }
  T& at(std::int64_t b, std::int64_t i, std::int64_t j) { return buf[static_cast<std::size_t>(index(b, i, j))]; }
  template <class Gen>
  void fill(Gen&& g) {
    for (std::size_t e = 0; e < buf.size(); ++e)
      if (inside[e]) buf[e] = g();
  }
  /// Whether every element outside the matrices still holds its poison.
  bool untouched() const {
    for (std::size_t e = 0; e < buf.size(); ++e)
      if (!inside[e] && std::memcmp(&buf[e], &buf.back(), sizeof(T)) != 0) return false;
    return true;
  }
};

/// Checks `c_after` against `alpha * A * B + beta * c_before` computed in double (int64 for
/// integers), elementwise, within a few ulps of the sum of magnitudes.
template <class T>
void check_result(std::int64_t batch, Placed<T>& a, Placed<T>& b, Placed<T>& c_before, Placed<T>& c_after,
                  T alpha, T beta, const std::string& what) {
  using Acc = std::conditional_t<std::is_integral_v<T>, std::int64_t, double>;
  const double eps = std::is_integral_v<T> ? 0.0 : double(std::numeric_limits<T>::epsilon());
  const std::int64_t rows = a.view.rows, depth = a.view.cols, cols = b.view.cols;
  std::int64_t bad = 0;
  for (std::int64_t bi = 0; bi < batch; ++bi)
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        Acc sum = 0;
        double mag = 0;
        for (std::int64_t l = 0; l < depth; ++l) {
          const Acc p = Acc(a.at(bi, i, l)) * Acc(b.at(bi, l, j));
          sum += p;
          mag += std::abs(double(p));
        }
        Acc want = Acc(alpha) * sum;
        mag *= std::abs(double(alpha));
        if (beta != T(0)) {
          want += Acc(beta) * Acc(c_before.at(bi, i, j));
          mag += std::abs(double(beta) * double(c_before.at(bi, i, j)));
        }
        const double got = double(c_after.at(bi, i, j));
        const double tol = 4 * eps * double(depth + 2) * mag;
        if (!(std::abs(got - double(want)) <= tol) && bad++ < 3)
          FAIL_CHECK(what << ": C[" << bi << "](" << i << ", " << j << ") = " << got << ", want " << double(want));
      }
  CHECK_MESSAGE(bad == 0, what);
  CHECK_MESSAGE(c_after.untouched(), what << ": C was written outside its matrices");
}

std::string describe(Place p) {
  switch (p) {
    case Place::row_major: return "row-major";
    case Place::col_major: return "col-major";
    case Place::strided: return "strided";
    case Place::reversed: return "reversed";
  }
  return "?";
}

/// One product with the given layouts, checked; C's elements start as poison when beta is 0
/// (they must not be read).
template <class T>
void run_case(std::mt19937_64& g, std::int64_t batch, std::int64_t m, std::int64_t kk, std::int64_t n, Place pa,
              Place pb, Place pc, std::int64_t pad, bool shared_b, T alpha, T beta) {
  std::uniform_int_distribution<int> small(-4, 4);
  std::uniform_real_distribution<double> real(-1, 1);
  auto value = [&]() -> T {
    if constexpr (std::is_integral_v<T>) return T(small(g));
    else return T(real(g));
  };
  Placed<T> a(batch, m, kk, pa, pad, false), b(batch, kk, n, pb, pad, shared_b), c(batch, m, n, pc, pad, false);
  a.fill(value);
  b.fill(value);
  if (beta == T(0)) c.fill([] { return poison<T>(); });
  else c.fill(value);
  Placed<T> before = c;
  k::gemm<T>(batch, a.view, b.view, c.view, alpha, beta);
  const std::string what = "batch " + std::to_string(batch) + ", " + std::to_string(m) + "x" + std::to_string(kk) +
                           "x" + std::to_string(n) + ", A " + describe(pa) + ", B " + describe(pb) +
                           (shared_b ? " (shared)" : "") + ", C " + describe(pc) + ", pad " + std::to_string(pad) +
                           ", alpha " + std::to_string(double(alpha)) + ", beta " + std::to_string(double(beta));
  check_result(batch, a, b, before, c, alpha, beta, what);
}

template <class T>
void random_cases(std::uint64_t seed, int cases) {
  std::mt19937_64 g(seed);
  const std::int64_t dims[] = {0, 1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 48, 64, 65, 97};
  const double scalars[] = {0, 1, -1, 0.5, 2, 3};
  auto pick = [&](const auto& arr) { return arr[g() % std::size(arr)]; };
  for (int t = 0; t < cases; ++t) {
    const std::int64_t batch = std::int64_t(g() % 4);
    // Mostly in-place layouts (the fast path), sometimes a strided or reversed operand.
    auto place = [&] {
      const auto r = g() % 8;
      return r == 0 ? Place::strided : r == 1 ? Place::reversed : r < 5 ? Place::row_major : Place::col_major;
    };
    run_case<T>(g, batch, pick(dims), pick(dims), pick(dims), place(), place(), place(), std::int64_t(g() % 3),
                g() % 4 == 0, T(pick(scalars)), T(pick(scalars)));
  }
}

}  // namespace

TEST_SUITE("kernels_gemm") {
  TEST_CASE("random shapes, layouts and scalars match a triple loop") {
    SUBCASE("float") { random_cases<float>(1, 400); }
    SUBCASE("double") { random_cases<double>(2, 400); }
    SUBCASE("int") { random_cases<int>(3, 300); }
  }

  TEST_CASE("all four transposition combinations, on submatrix views, in place") {
    std::mt19937_64 g(4);
    for (Place pa : {Place::row_major, Place::col_major})
      for (Place pb : {Place::row_major, Place::col_major})
        for (Place pc : {Place::row_major, Place::col_major}) {
          run_case<float>(g, 2, 70, 90, 50, pa, pb, pc, 3, false, 1.f, 0.f);
          run_case<double>(g, 1, 70, 90, 50, pa, pb, pc, 5, false, -0.5, 2.0);
        }
  }

  TEST_CASE("an operand with no unit stride is packed, for each of A, B and C") {
    std::mt19937_64 g(5);
    run_case<float>(g, 2, 40, 30, 20, Place::strided, Place::row_major, Place::row_major, 1, false, 1.f, 0.f);
    run_case<float>(g, 2, 40, 30, 20, Place::row_major, Place::strided, Place::col_major, 1, false, 1.f, 1.f);
    run_case<float>(g, 2, 40, 30, 20, Place::col_major, Place::row_major, Place::strided, 1, false, 2.f, 0.f);
    run_case<double>(g, 3, 40, 30, 20, Place::strided, Place::strided, Place::strided, 0, true, 0.5, -1.0);
    run_case<int>(g, 2, 40, 30, 20, Place::reversed, Place::strided, Place::reversed, 2, false, 3, 2);
  }

  TEST_CASE("a weight shared by the batch (B's batch_stride 0)") {
    std::mt19937_64 g(6);
    run_case<float>(g, 4, 33, 64, 17, Place::row_major, Place::row_major, Place::row_major, 0, true, 1.f, 0.f);
    run_case<float>(g, 4, 33, 64, 17, Place::row_major, Place::strided, Place::row_major, 0, true, 1.f, 0.f);
  }

  TEST_CASE("gemv and dot shapes (one row or one column)") {
    std::mt19937_64 g(7);
    for (auto [m, kk, n] : {std::array<std::int64_t, 3>{1, 300, 40}, {40, 300, 1}, {1, 300, 1}, {300, 1, 200}})
      for (Place p : {Place::row_major, Place::col_major}) {
        run_case<float>(g, 2, m, kk, n, p, p, p, 2, false, 1.f, 0.f);
        run_case<double>(g, 1, m, kk, n, p, Place::row_major, p, 1, false, 2.0, 1.0);
      }
  }

  TEST_CASE("edge cases: empty batch, empty extents, K = 0, alpha = 0, beta = 0 over NaN") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> a(64, 1.f), b(64, 1.f), c(64, 5.f);
    SUBCASE("batch 0 touches nothing") {
      k::gemm<float>(0, {a.data(), 4, 4, 4, 1, 16}, {b.data(), 4, 4, 4, 1, 16}, {c.data(), 4, 4, 4, 1, 16});
      CHECK(std::all_of(c.begin(), c.end(), [](float x) { return x == 5.f; }));
    }
    SUBCASE("no rows or no columns: nothing to write") {
      k::gemm<float>(2, {a.data(), 0, 4, 4, 1, 16}, {b.data(), 4, 4, 4, 1, 16}, {c.data(), 0, 4, 4, 1, 16});
      k::gemm<float>(2, {a.data(), 4, 4, 4, 1, 16}, {b.data(), 4, 0, 4, 1, 16}, {c.data(), 4, 0, 4, 1, 16});
      CHECK(std::all_of(c.begin(), c.end(), [](float x) { return x == 5.f; }));
    }
    SUBCASE("K = 0 and beta = 0 zeroes C even where it held NaN; A and B need no data") {
      std::fill(c.begin(), c.end(), nan);
      k::gemm<float>(2, {nullptr, 4, 0, 0, 1, 7}, {nullptr, 0, 4, 4, 1, 7}, {c.data(), 4, 4, 4, 1, 16});
      CHECK(std::all_of(c.begin(), c.begin() + 32, [](float x) { return x == 0.f; }));
      CHECK(std::isnan(c[32]));
    }
    SUBCASE("K = 0 scales C by beta") {
      k::gemm<float>(1, {a.data(), 4, 0, 0, 1, 0}, {b.data(), 0, 4, 4, 1, 0}, {c.data(), 4, 4, 4, 1, 16}, 1.f, 2.f);
      CHECK(std::all_of(c.begin(), c.begin() + 16, [](float x) { return x == 10.f; }));
      CHECK(c[16] == 5.f);
    }
    SUBCASE("alpha = 0 reads neither A nor B (NaN there does not leak), as in BLAS") {
      std::fill(a.begin(), a.end(), nan);
      k::gemm<float>(1, {a.data(), 4, 4, 4, 1, 0}, {b.data(), 4, 4, 4, 1, 0}, {c.data(), 4, 4, 4, 1, 16}, 0.f, 3.f);
      CHECK(std::all_of(c.begin(), c.begin() + 16, [](float x) { return x == 15.f; }));
      k::gemm<float>(1, {a.data(), 4, 4, 4, 1, 0}, {b.data(), 4, 4, 4, 1, 0}, {c.data(), 4, 4, 4, 1, 16}, 0.f, 0.f);
      CHECK(std::all_of(c.begin(), c.begin() + 16, [](float x) { return x == 0.f; }));
    }
    SUBCASE("beta = 0 over NaN, large enough for the BLAS/GEMM path") {
      const std::int64_t n = 64;
      std::vector<float> x(n * n, 1.f), y(n * n, 2.f), z(n * n, nan);
      k::gemm<float>(1, {x.data(), n, n, n, 1, 0}, {y.data(), n, n, n, 1, 0}, {z.data(), n, n, n, 1, 0});
      CHECK(std::all_of(z.begin(), z.end(), [&](float v) { return v == 2.f * float(n); }));
    }
  }

  TEST_CASE("C with batch_stride 0 and beta = 1 accumulates over the batch, in order") {
    std::vector<double> a = {1, 2, 3, 4}, b = {1, 0, 0, 1}, c = {10, 20};
    // A[b] is the 1x2 row b of a; B[b] the identity: C = C + A[0] + A[1].
    k::gemm<double>(2, {a.data(), 1, 2, 2, 1, 2}, {b.data(), 2, 2, 2, 1, 0}, {c.data(), 1, 2, 2, 1, 0}, 1.0, 1.0);
    CHECK(c == std::vector<double>{14, 26});
  }

  TEST_CASE("a mutable batch converts to a read-only operand, and transposed() multiplies by A^T") {
    std::vector<double> a = {1, 2, 3, 4, 5, 6};  // 2x3 row-major
    std::vector<double> c(9, -1);
    const k::MatrixBatch<double> av{a.data(), 2, 3, 3, 1, 0};
    k::gemm<double>(1, av.transposed(), av, {c.data(), 3, 3, 3, 1, 0});  // A^T A
    CHECK(c == std::vector<double>{17, 22, 27, 22, 29, 36, 27, 36, 45});
  }

  TEST_CASE("an execution-space instance: fenced before and after") {
    std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, c(4, 0.f);
    k::gemm(Kokkos::DefaultHostExecutionSpace{}, 1, k::MatrixBatch<const float>{a.data(), 2, 2, 2, 1, 0},
            k::MatrixBatch<const float>{b.data(), 2, 2, 2, 1, 0}, k::MatrixBatch<float>{c.data(), 2, 2, 2, 1, 0});
    CHECK(c == std::vector<float>{19, 22, 43, 50});
  }

  TEST_CASE("set_allow_tf32 exists in every build (a portable program sets it); host products stay float32") {
    // Values whose products need float32's 24-bit mantissa (TF32 keeps 10 bits): 1 + 2^-20.
    const float x = 1.0f + 0x1p-20f;
    std::vector<float> a = {x, x, x, x}, b = {x, 0, 0, x}, off(4), on(4);
    const k::MatrixBatch<const float> av{a.data(), 2, 2, 2, 1, 0}, bv{b.data(), 2, 2, 2, 1, 0};
    CHECK_FALSE(k::tf32_allowed());
    k::gemm<float>(1, av, bv, {off.data(), 2, 2, 2, 1, 0});
    k::set_allow_tf32(true);
    CHECK(k::tf32_allowed());
    k::gemm<float>(1, av, bv, {on.data(), 2, 2, 2, 1, 0});
    k::set_allow_tf32(false);
    CHECK_FALSE(k::tf32_allowed());
    CHECK(on == off);
    CHECK(off[0] == x * x);
  }

  TEST_CASE("inconsistent shapes are refused with a message naming them") {
    std::vector<float> v(64, 0.f);
    auto message = [&](auto f) {
      try {
        f();
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string("no exception");
    };
    const std::string inner = message([&] {
      k::gemm<float>(1, {v.data(), 2, 3, 3, 1, 0}, {v.data(), 4, 2, 2, 1, 0}, {v.data(), 2, 2, 2, 1, 0});
    });
    CHECK(inner.find("A is 2x3, B is 4x2, C is 2x2") != std::string::npos);
    CHECK(inner.find("A's columns (3) must equal B's rows (4)") != std::string::npos);
    const std::string outer = message([&] {
      k::gemm<float>(1, {v.data(), 2, 3, 3, 1, 0}, {v.data(), 3, 2, 2, 1, 0}, {v.data(), 3, 2, 2, 1, 0});
    });
    CHECK(outer.find("C must be 2x2 (A's rows x B's columns)") != std::string::npos);
    CHECK(message([&] {
            k::gemm<float>(-1, {v.data(), 2, 2, 2, 1, 0}, {v.data(), 2, 2, 2, 1, 0}, {v.data(), 2, 2, 2, 1, 0});
          }).find("batch -1 is negative") != std::string::npos);
    CHECK(message([&] {
            k::gemm<float>(1, {v.data(), -2, 2, 2, 1, 0}, {v.data(), 2, 2, 2, 1, 0}, {v.data(), -2, 2, 2, 1, 0});
          }).find("A is -2x2: extents must be >= 0") != std::string::npos);
    CHECK(message([&] {
            k::gemm<float>(1, {v.data(), 2, 2, 2, 1, 0}, {nullptr, 2, 2, 2, 1, 0}, {v.data(), 2, 2, 2, 1, 0});
          }).find("B has no data but 2x2 elements") != std::string::npos);
  }

  TEST_CASE("concurrent callers on four threads each get their own right answer") {
    constexpr std::int64_t n = 192;
    constexpr int threads = 4;
    std::vector<std::vector<float>> a(threads), b(threads), bt(threads), c(threads);
    std::vector<std::vector<double>> want(threads);
    for (int t = 0; t < threads; ++t) {
      std::mt19937_64 g(100 + std::uint64_t(t));
      std::uniform_real_distribution<float> d(-1, 1);
      a[t].resize(n * n);
      b[t].resize(n * n);
      c[t].assign(n * n, std::numeric_limits<float>::quiet_NaN());
      for (auto& x : a[t]) x = d(g);
      for (auto& x : b[t]) x = d(g);
      bt[t].resize(n * n);
      for (std::int64_t l = 0; l < n; ++l)
        for (std::int64_t j = 0; j < n; ++j) bt[t][j * n + l] = b[t][l * n + j];
      want[t].assign(n * n, 0.0);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t l = 0; l < n; ++l)
          for (std::int64_t j = 0; j < n; ++j) want[t][i * n + j] += double(a[t][i * n + l]) * double(b[t][l * n + j]);
    }
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (int rep = 0; rep < 3; ++rep)  // odd threads read B from its transpose (column-major)
          k::gemm<float>(1, {a[t].data(), n, n, n, 1, 0},
                         t % 2 ? k::MatrixBatch<const float>{bt[t].data(), n, n, 1, n, 0}
                               : k::MatrixBatch<const float>{b[t].data(), n, n, n, 1, 0},
                         {c[t].data(), n, n, 1, n, 0});
      });
    for (auto& th : pool) th.join();
    for (int t = 0; t < threads; ++t) {
      double worst = 0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < n; ++j)
          worst = std::max(worst, std::abs(double(c[t][j * n + i]) - want[t][i * n + j]));  // C column-major
      CHECK(worst < 1e-3);
    }
  }

  TEST_CASE("the backend reported is the one configured, and OpenBLAS runs on blas_threads() threads") {
    const std::string backend = k::gemm_backend();
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_HAVE_OPENBLAS) && SHARDLIB_HAVE_OPENBLAS
    CHECK(backend == "openblas");
#elif defined(EIGEN_USE_BLAS)
    CHECK(backend == "blas");
#else
    CHECK(backend == "eigen");
#endif
#if defined(EIGEN_USE_BLAS) && (defined(__GNUC__) || defined(__clang__))
    std::vector<float> x(4, 1.f), y(4, 0.f);
    k::gemm<float>(1, {x.data(), 2, 2, 2, 1, 0}, {x.data(), 2, 2, 2, 1, 0}, {y.data(), 2, 2, 2, 1, 0});
    // One thread unless a runtime of this process set each device's share (kernels/blas.hpp).
    if (openblas_get_num_threads != nullptr) CHECK(openblas_get_num_threads() == k::blas_threads());
#endif
  }

#ifdef SHARDLIB_TEST_CBLAS
  TEST_CASE("with OpenBLAS, in-place operands with leading dimensions go to sgemm (bitwise the same)") {
    // Eigen's own kernel sums in another order, so equality to the last bit shows the BLAS ran.
    constexpr int m = 96, kk = 200, n = 80, lda = kk + 3, ldb = n + 5, ldc = n + 7;
    std::mt19937_64 g(9);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> a(m * lda), b(kk * ldb), c1(m * ldc, 0.f), c2(m * ldc, 0.f);
    for (auto& x : a) x = d(g);
    for (auto& x : b) x = d(g);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, kk, 1.5f, a.data(), lda, b.data(), ldb, 0.f,
                c1.data(), ldc);
    k::gemm<float>(1, {a.data(), m, kk, lda, 1, 0}, {b.data(), kk, n, ldb, 1, 0}, {c2.data(), m, n, ldc, 1, 0}, 1.5f);
    CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0);
    // Transposed A (column-major with a leading dimension): cblas with Trans on A.
    std::vector<float> at(kk * (m + 2));
    for (auto& x : at) x = d(g);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, kk, 1.f, at.data(), m + 2, b.data(), ldb, 0.f,
                c1.data(), ldc);
    k::gemm<float>(1, {at.data(), m, kk, 1, m + 2, 0}, {b.data(), kk, n, ldb, 1, 0}, {c2.data(), m, n, ldc, 1, 0});
    CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0);
  }

  TEST_CASE("with several BLAS threads, a batch of small products is spread over threads of its own, one BLAS thread each") {
    const int before = k::blas_threads();
    // Attention's scores: 8 heads of q [128 x 64] times k^T, read in place from [s, h, e] rows.
    constexpr std::int64_t S = 128, H = 8, E = 64;
    std::mt19937_64 g(11);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> q(S * H * E), kt(S * H * E), want(H * S * S), got(H * S * S, std::nanf(""));
    for (auto& x : q) x = d(g);
    for (auto& x : kt) x = d(g);
    const k::MatrixBatch<const float> a{q.data(), S, E, H * E, 1, E}, b{kt.data(), E, S, 1, H * E, E};
    const k::MatrixBatch<float> c{got.data(), S, S, S, 1, S * S};
    k::set_blas_threads(1);  // the batch in order, one product after the other
    CHECK(k::detail::batch_threads(H, S, S, E, S * S, S * S) == 1);
    k::gemm<float>(H, a, b, {want.data(), S, S, S, 1, S * S}, 0.5f);
    double worst = 0;
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < S; ++i)
        for (std::int64_t j = 0; j < S; ++j) {
          double r = 0;
          for (std::int64_t e = 0; e < E; ++e) r += double(q[i * H * E + h * E + e]) * double(kt[j * H * E + h * E + e]);
          worst = std::max(worst, std::abs(0.5 * r - double(want[h * S * S + i * S + j])));
        }
    CHECK(worst < 1e-4);
    // Spread over two threads: the same calls on the same data (OpenBLAS splits no sum), so the same bits.
    k::set_blas_threads(2);
    CHECK(k::detail::batch_threads(H, S, S, E, S * S, S * S) == 2);
    CHECK(k::detail::batch_threads(H, S, S, E, 0, S * S) == 1);       // C accumulates over the batch: in order
    CHECK(k::detail::batch_threads(H, S, S, E, S, S * S) == 1);       // C's matrices overlap: in order
    CHECK(k::detail::batch_threads(1, S, S, E, S * S, S * S) == 1);   // one product: the BLAS's own threads
    CHECK(k::detail::batch_threads(H, 32, 32, 32, 1024, 1024) == 1);  // too little work to start a thread
    k::gemm<float>(H, a, b, c, 0.5f);
    CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
    if (openblas_get_num_threads != nullptr) CHECK(openblas_get_num_threads() == 2);  // given back
    // Two callers at once (two in-process devices): each right, and the BLAS's threads given back.
    std::vector<float> got2(got.size(), std::nanf(""));
    std::thread other([&] { k::gemm<float>(H, a, b, {got2.data(), S, S, S, 1, S * S}, 0.5f); });
    std::fill(got.begin(), got.end(), std::nanf(""));
    k::gemm<float>(H, a, b, c, 0.5f);
    other.join();
    CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(want.data(), got2.data(), want.size() * sizeof(float)) == 0);
    if (openblas_get_num_threads != nullptr) CHECK(openblas_get_num_threads() == 2);
    k::set_blas_threads(before);
  }
#endif
}
