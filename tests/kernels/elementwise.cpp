// SPDX-License-Identifier: Apache-2.0
// The GPU's dense elementwise path (kernels::detail::elementwise_vectors: 16 bytes per load and
// store), run here on a host instance against the scalar functor: every length's tail, every
// misalignment (which it refuses, leaving the output alone), 16-bit, 32- and 64-bit elements and
// mixed input types; and the GPU's strided form (a team per row, elementwise_strided_teams) against
// the host's row form, on broadcasting and transposed inputs.
#include <doctest/doctest.h>
#include <shardlib/kernels/elementwise.hpp>
#include <shardlib/half.hpp>
#include <shardlib/ops/elementwise.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace k = shardlib::kernels;
namespace kd = shardlib::kernels::detail;
namespace fn = shardlib::fn;
using shardlib::bf16;

namespace {

using I64 = std::int64_t;
/// The host instance the kernels run on, made when first used: after Kokkos is initialised (an
/// instance made before, at namespace scope, is an error with an OpenMP Kokkos 4.6).
const Kokkos::DefaultHostExecutionSpace& exec() {
  static const Kokkos::DefaultHostExecutionSpace e{};
  return e;
}

template <class T>
std::vector<T> values(std::mt19937_64& g, std::size_t n) {
  std::uniform_real_distribution<float> u(-4, 4);
  std::vector<T> v(n);
  for (auto& x : v) x = T(u(g));
  return v;
}

/// out = f(a, b) through elementwise_vectors at element offsets (oo, oa, ob) of the buffers, for
/// n = 0 .. 40; checks it against the scalar functor where the offsets keep every pointer aligned
/// and that it refuses (writing nothing) where one is not.
template <class Out, class A, class B, class F>
void check_two(F f) {
  constexpr int V = kd::vector_width<Out, A, B>;
  static_assert(V >= 2);
  std::mt19937_64 g(sizeof(Out) * 100 + sizeof(A) * 10 + sizeof(B));
  const std::vector<A> a = values<A>(g, 64);
  const std::vector<B> b = values<B>(g, 64);
  for (int oo : {0, 1})
    for (int oa : {0, 1})
      for (int ob : {0, V})
        for (I64 n = 0; n <= 40; ++n) {
          CAPTURE(n);
          std::vector<Out> out(64, Out(-7.0f));
          const bool aligned = oo == 0 && oa == 0;  // std::vector's blocks are 16-byte aligned
          const bool ran = kd::elementwise_vectors(exec(), out.data() + oo, n, f, a.data() + oa, b.data() + ob);
          REQUIRE(ran == aligned);
          for (I64 e = 0; e < 64; ++e) {
            const bool written = ran && e >= oo && e < oo + n;
            const Out want = written ? Out(f(a[std::size_t(e - oo + oa)], b[std::size_t(e - oo + ob)])) : Out(-7.0f);
            REQUIRE(float(out[std::size_t(e)]) == float(want));
          }
        }
}

}  // namespace

TEST_SUITE("kernels_elementwise") {
  TEST_CASE("vector widths: 16 bytes of the widest element type, none for odd sizes") {
    CHECK(kd::vector_width<float, float> == 4);
    CHECK(kd::vector_width<bf16, bf16, bf16> == 8);
    CHECK(kd::vector_width<float, bf16> == 4);
    CHECK(kd::vector_width<double, float> == 2);
    CHECK(kd::vector_width<std::int8_t, std::int8_t> == 16);
    struct Three {
      char c[3];
    };
    CHECK(kd::vector_width<float, Three> == 1);
    struct Big {
      double d[4];
    };
    CHECK(kd::vector_width<Big> == 1);
  }

  TEST_CASE("the vector path gives the scalar functor's values, tails and offsets included") {
    check_two<float, float, float>(fn::add{});
    check_two<double, double, double>(fn::mul{});
    check_two<bf16, bf16, bf16>(fn::widened<fn::add, bf16>{});
    check_two<float, bf16, float>(fn::widened<fn::mul, float>{});
    check_two<std::int8_t, std::int8_t, std::int8_t>(fn::add{});
  }

  TEST_CASE("a unary op on bf16 and a cast, each through the vector path") {
    std::mt19937_64 g(3);
    const auto x = values<bf16>(g, 1003);
    std::vector<bf16> y(1003);
    std::vector<float> z(1003);
    REQUIRE(kd::elementwise_vectors(exec(), y.data(), 1003, fn::widened<fn::gelu, bf16>{}, x.data()));
    REQUIRE(kd::elementwise_vectors(exec(), z.data(), 1003, fn::cast<float>{}, x.data()));
    for (std::size_t e = 0; e < x.size(); ++e) {
      REQUIRE(float(y[e]) == float(bf16(fn::gelu{}(float(x[e])))));
      REQUIRE(z[e] == float(x[e]));
    }
  }

  TEST_CASE("the GPU's strided form (a team per row) gives the row form's values: broadcasts and transposes") {
    std::mt19937_64 g(11);
    const std::array<I64, 3> ext{5, 7, 40};
    const auto x = values<float>(g, 5 * 7 * 40);
    const auto row = values<float>(g, 40);   // [40] broadcast over the leading dims (a bias)
    const auto col = values<float>(g, 5 * 7);  // [5, 7, 1] broadcast along the row
    const auto t = values<float>(g, 40 * 7 * 5);  // [40, 7, 5] read transposed
    const k::Strided<float, 3> sx{x.data(), {280, 40, 1}}, srow{row.data(), {0, 0, 1}}, scol{col.data(), {7, 1, 0}},
        st{t.data(), {1, 5, 35}};
    auto three = [](float a, float b, float c) { return a * b + c; };
    std::vector<float> want(x.size()), got(x.size(), -1.f);
    for (auto [a, b] : {std::pair{sx, srow}, std::pair{scol, st}, std::pair{st, srow}}) {
      k::elementwise(exec(), want.data(), ext, three, a, b, sx);  // the host's row form
      kd::elementwise_strided_teams(exec(), got.data(), ext, 35, three, std::index_sequence_for<float, float, float>{}, a,
                                    b, sx);
      CHECK(got == want);
      std::fill(got.begin(), got.end(), -1.f);
    }
  }
}
