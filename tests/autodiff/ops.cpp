// SPDX-License-Identifier: Apache-2.0
// Backward rules of the differentiable ops (autodiff/) against central finite differences in
// float64, over spec types with split, multi-axis, replicated and partial operands, on random
// meshes and uneven shapes; 1..8 threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/autodiff.hpp>

#include "../collectives/harness.hpp"
#include "gradcheck.hpp"

namespace {
using namespace shardlib::test::grad::specs;

TEST_SUITE("autodiff_ops") {
TEST_CASE("elementwise: binary ops with broadcasting, scalars and unary math") {
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 11);
    oracle::for_each_pair(oracle::List<Rows, Grid>{}, oracle::List<ColsY, Both>{}, [&](auto sa, auto sb) {
      using A = D<typename decltype(sa)::type>;
      using B = D<typename decltype(sb)::type>;
      const auto mesh = oracle::random_mesh<M2>(ctx, rng);
      auto shape = oracle::random_shape<2>(rng, 6, false);
      const auto a = A::random(mesh, shape, 1, -1.0, 1.0);
      const auto b = B::random(mesh, shape, 2, 0.5, 1.5);
      CHECK(gc::check([](const auto& x, const auto& y) { return sl::sum_all(x * y + x / y - sl::exp(x) * 0.5); }, rng,
                "a * b + a / b - exp(a) / 2", 1e-6, 3, a, b));
      CHECK(gc::check([](const auto& x, const auto& y) { return sl::sum_all(sl::tanh(x - y) + sl::gelu(x) * sl::sqrt(y)); },
                rng, "tanh(a - b) + gelu(a) sqrt(b)", 1e-6, 3, a, b));
    });
  }, DEVICE_COUNTS);
}

TEST_CASE("matmul: data-parallel and Megatron layouts") {
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 12);
    oracle::for_each_pair(oracle::List<Rows, ColsY>{}, oracle::List<Rep, Spec<"y", none>>{}, [&](auto sa, auto sb) {
      using A = D<typename decltype(sa)::type>;
      using B = D<typename decltype(sb)::type>;
      const auto mesh = oracle::random_mesh<M2>(ctx, rng);
      const auto a = A::random(mesh, {5, 4}, 3, -1.0, 1.0);
      const auto b = B::random(mesh, {4, 3}, 4, -1.0, 1.0);
      CHECK(gc::check([](const auto& x, const auto& w) { return sl::sum_all(sl::relu(sl::matmul(x, w)) * sl::matmul(x, w)); },
                rng, "relu(x w) * (x w)", 1e-6, 4, a, b));
      CHECK(gc::check([](const auto& x, const auto& w) { return sl::mse_loss(sl::softmax<1>(sl::matmul(x, w)), sl::square(sl::matmul(x, w))); },
                rng, "mse(softmax(x w), (x w)^2)", 1e-6, 4, a, b));
      // c + x w with c folded into the GEMM (c lies as the product does), gradients to all three.
      using P = decltype(sl::matmul(a, b));
      if constexpr (!P::sharding.is_partial()) {
        const auto c = P::random(mesh, {5, 3}, 5, -1.0, 1.0);
        CHECK(gc::check([](const auto& x, const auto& w, const auto& r) { return sl::sum_all(sl::tanh(sl::matmul_add(x, w, r)) * r); },
                  rng, "tanh(c + x w) * c", 1e-6, 4, a, b, c));
      }
    });
  }, DEVICE_COUNTS);
}

TEST_CASE("partial operands: linear ops keep them partial, nonlinear ones resolve them") {
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 14);
    const auto mesh = oracle::random_mesh<M2>(ctx, rng);
    const auto a = D<Spec<none, "y">>::random(mesh, {5, 6}, 7, -1.0, 1.0);
    const auto b = D<Spec<"y", none>>::random(mesh, {6, 4}, 8, -1.0, 1.0);
    const auto c = D<Rep>::random(mesh, {5, 4}, 9, -1.0, 1.0);
    // matmul over the split dim is partial over "y"; +, * scalar stay partial; exp resolves.
    CHECK(gc::check([&](const auto& x, const auto& w) { return sl::sum_all(sl::exp((sl::matmul(x, w) * 0.5 + c) * 0.3)); },
              rng, "exp(matmul partial)", 1e-6, 4, a, b));
    CHECK(gc::check([&](const auto& x, const auto& w) { return sl::sum_all(sl::square(sl::matmul(x, w) - sl::matmul(x, w) * c)); },
              rng, "partial * tensor", 1e-6, 4, a, b));
    // einsum_add with a partial product: c replicated (the add resolves the product), and a bias
    // broadcast over the rows (its gradient summed over them).
    CHECK(gc::check([&](const auto& x, const auto& w) { return sl::sum_all(sl::exp(sl::einsum_add<"ij,jk->ik">(x, w, c) * 0.3)); },
              rng, "exp(c + x w), x w partial", 1e-6, 4, a, b));
    const auto bias = D<Spec<none>>::random(mesh, {4}, 10, -1.0, 1.0);
    CHECK(gc::check([](const auto& x, const auto& w, const auto& v) { return sl::sum_all(sl::square(sl::matmul_add(x, w, v))); },
              rng, "(bias + x w)^2", 1e-6, 4, a, b, bias));
  }, DEVICE_COUNTS);
}

TEST_CASE("einsum of rank 3, reshard in the graph, layout ops") {
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 15);
    using X3 = sl::DistributedTensor<double, M2, Spec<"x", none, "y">>;
    using W = D<Spec<"y", none>>;
    const auto mesh = oracle::random_mesh<M2>(ctx, rng);
    const auto x = X3::random(mesh, {3, 4, 6}, 10, -1.0, 1.0);
    const auto w = W::random(mesh, {6, 5}, 11, -1.0, 1.0);
    CHECK(gc::check([](const auto& a, const auto& b) {
      auto h = sl::einsum<"bsd,df->bsf">(a, b);
      return sl::sum_all(sl::tanh(sl::reshard<Spec<none, "x", none>>(h)));
    }, rng, "einsum bsd,df->bsf then reshard", 1e-6, 4, x, w));
    CHECK(gc::check([](const auto& a) {
      auto t = sl::transpose<0, 2>(a);
      auto r = sl::reshape<"d s b -> d (s b)">(t);
      return sl::sum_all(sl::sigmoid(r) * sl::silu(r));
    }, rng, "transpose, reshape", 1e-6, 4, x));
    CHECK(gc::check([](const auto& a) {
      auto r = sl::reshape<"b s d -> (b s) d">(a);
      auto back = sl::reshape<"(b s) d -> b s d">(sl::square(r), {3, 4, 6});
      return sl::sum_all(sl::gelu_tanh(back));
    }, rng, "reshape merge and split", 1e-6, 4, x));
    CHECK(gc::check([](const auto& a) {
      auto s1 = sl::slice<1>(a, 1, 4);
      auto s0 = sl::slice<0>(a, 0, 2);
      return sl::sum_all(sl::exp(s1) * 0.5) + sl::sum_all(sl::square(sl::concat<0>(s0, sl::slice<0>(a, 1, 3))));
    }, rng, "slice, concat", 1e-6, 4, x));
  }, DEVICE_COUNTS);
}

TEST_CASE("roll, shift, pad (constant boundaries) and where") {
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 16);
    oracle::for_each_type(oracle::List<Rows, Grid>{}, [&](auto sa) {
      using A = D<typename decltype(sa)::type>;
      const auto mesh = oracle::random_mesh<M2>(ctx, rng);
      const auto shape = oracle::random_shape<2>(rng, 6, false);
      const auto x = A::random(mesh, shape, 20, -1.0, 1.0);
      const auto y = A::random(mesh, shape, 21, -1.0, 1.0);
      const auto c = sl::DistributedTensor<std::int32_t, M2, Spec<"x", none>>::random(mesh, shape, 22, 0, 2);
      CHECK(gc::check([](const auto& a) {
        auto r = sl::roll(a, 2, 0) * sl::roll<1>(a, -3);
        return sl::sum_all(sl::tanh(r) + sl::square(sl::shift(a, 1, 1, 0.5)));
      }, rng, "roll, shift", 1e-6, 4, x));
      CHECK(gc::check([](const auto& a) {
        return sl::sum_all(sl::exp(sl::pad(a, {{1, 2}, {0, 3}}, sl::Boundary::dirichlet(0.25))) * 0.5);
      }, rng, "pad (dirichlet)", 1e-6, 4, x));
      CHECK(gc::check([&c](const auto& a, const auto& b) { return sl::sum_all(sl::square(sl::where(c, a, b * 2.0))); }, rng,
                      "where", 1e-6, 4, x, y));
      // A boundary that copies cells has no backward yet: refused at the forward.
      CHECK_THROWS_WITH_AS(sl::pad(sl::Param<A>(x), {{1, 1}, {1, 1}}, sl::Boundary::periodic()),
                           doctest::Contains("periodic boundary: its backward is not implemented"), std::invalid_argument);
    });
  }, DEVICE_COUNTS);
}


TEST_CASE("16-bit Vars: gradients through products, softmax, norms and elementwise ops are the float32 ones, rounded") {
  // The same function on bf16 parameters and on float32 ones of the same values: every op of
  // the bf16 graph computes in float32 and rounds its output, so the gradients agree to a few
  // steps of bf16 (relative to the largest; measured: 0.0073 of it).
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 21);
    const auto mesh = oracle::random_mesh<M2>(ctx, rng);
    using A16 = sl::DistributedTensor<sl::bf16, M2, Rows>;
    using W16 = sl::DistributedTensor<sl::bf16, M2, Spec<none, "y">>;
    const auto a = A16::random(mesh, {6, 5}, 3, -1.f, 1.f);
    const auto w = W16::random(mesh, {5, 4}, 4, -1.f, 1.f);
    auto f = [](const auto& x, const auto& v) {
      auto h = sl::layer_norm<1>(sl::gelu(sl::matmul(x, v)) * 2.0f + sl::softmax<1>(sl::matmul(x, v)));
      return sl::sum_all(sl::cast<float>(h * sl::tanh(sl::matmul(x, v))));
    };
    sl::Param a16(a);
    sl::Param w16(w);
    sl::backward(f(a16, w16));
    sl::Param a32(sl::cast<float>(a));
    sl::Param w32(sl::cast<float>(w));
    sl::backward(f(a32, w32));
    auto expect_close = [](const auto& got, const auto& want, const char* what) {
      static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(got)>::value_type, sl::bf16>);
      const auto g = got.to_host();
      const auto r = want.to_host();
      double scale = 0, worst = 0;
      for (float x : r) scale = std::max(scale, std::abs(double(x)));
      for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(double(float(g[i])) - double(r[i])));
      CHECK_MESSAGE(worst <= scale / 32, std::string(what) << ": worst difference " << worst << " of " << scale);
      CHECK(scale > 0);
    };
    expect_close(a16.grad(), a32.grad(), "d/da");
    expect_close(w16.grad(), w32.grad(), "d/dw");
  }, DEVICE_COUNTS);
}

TEST_CASE("16-bit Vars: every reduction compiles and has the float32 gradient, rounded (a bf16 loss too)") {
  // sum, mean, max and min along a dim, sum_all and mean_all, log_softmax and rms_norm of bf16
  // Vars, the loss itself a bf16 scalar: the gradients agree with float32's to a few bf16 steps.
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 22);
    const auto mesh = oracle::random_mesh<M2>(ctx, rng);
    using A16 = sl::DistributedTensor<sl::bf16, M2, Rows>;
    const auto a = A16::random(mesh, {6, 5}, 7, -1.f, 1.f);
    auto f = [](const auto& x) {
      auto cols = sl::sum<0>(x) * 0.5f + sl::max<0>(x);         // [5]
      auto rows = sl::mean<1>(sl::square(x)) - sl::min<1>(x);   // [6]
      return sl::mean_all(sl::log_softmax<1>(x) * sl::rms_norm<1>(x)) + sl::sum_all(cols) + sl::sum_all(rows) +
             sl::mean_all(sl::mean<0>(x));
    };
    sl::Param a16(a);
    auto loss16 = f(a16);
    static_assert(std::is_same_v<typename decltype(loss16)::tensor_type::value_type, sl::bf16>, "a bf16 loss");
    sl::backward(loss16);
    sl::Param a32(sl::cast<float>(a));
    auto loss32 = f(a32);
    sl::backward(loss32);
    const double l16 = float(loss16.value().to_host()[0]), l32 = loss32.value().to_host()[0];
    CHECK(l16 == doctest::Approx(l32).epsilon(0.02));
    const auto g = a16.grad().to_host();
    const auto r = a32.grad().to_host();
    double scale = 0, worst = 0;
    for (float x : r) scale = std::max(scale, std::abs(double(x)));
    for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(double(float(g[i])) - double(r[i])));
    CHECK_MESSAGE(worst <= scale / 32, "worst difference " << worst << " of " << scale);
    CHECK(scale > 0);
  }, DEVICE_COUNTS);
}

TEST_CASE("16-bit Vars: a broadcast operand's gradient is summed in float32 and rounded once") {
  // 300 rows of ones summed into a bias: 300 in float32, and in bf16 (300 = 2^8 + 44 is a bf16).
  // Rounded after each row the sum would stop at 256 (256 + 1 rounds to 256). Both of
  // sum_to_shape's kernels: the summed dim leading (a row bias) and trailing (a column bias).
  sl::test::for_each_run([](sl::Context& ctx) {
    const sl::Mesh<"x", "y"> mesh(ctx, {ctx.num_devices(), 1});
    using R2 = Spec<none, none>;  // replicated: every device sums all 300 rows itself
    using X = sl::DistributedTensor<sl::bf16, sl::Mesh<"x", "y">, R2>;
    const auto x = X::full(mesh, {300, 8}, sl::bf16(1.0f)), xt = X::full(mesh, {8, 300}, sl::bf16(1.0f));
    sl::Param row(X::zeros(mesh, {1, 8})), col(X::zeros(mesh, {8, 1}));
    sl::backward(sl::sum_all(sl::cast<float>(x * row + x)) + sl::sum_all(sl::cast<float>(xt * col)));
    for (const auto& p : {row.grad().to_host(), col.grad().to_host()}) {
      REQUIRE(p.size() == 8);
      for (sl::bf16 v : p) CHECK(float(v) == 300.0f);
    }
  }, {1, 2});
}

}
}  // namespace
