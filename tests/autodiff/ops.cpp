// SPDX-License-Identifier: Apache-2.0
// Backward rules of the differentiable ops (autodiff/) against central finite differences in
// float64, over spec types with split, multi-axis, replicated and partial operands, on random
// meshes and uneven shapes; 1..8 threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/autodiff.hpp>

#include "../collectives/harness.hpp"
#include "gradcheck.hpp"

namespace sl = shardlib;
namespace oracle = shardlib::test::oracle;
namespace gc = shardlib::test::grad;
using oracle::M2;
using sl::axes;
using sl::none;
using sl::partial_sum;
using sl::Spec;

namespace {
template <class S>
using D = sl::DistributedTensor<double, M2, S>;
using Rep = Spec<none, none>;
using Rows = Spec<"x", none>;
using ColsY = Spec<none, "y">;
using Grid = Spec<"y", "x">;
using Both = Spec<axes<"x", "y">, none>;
#define DEVICE_COUNTS {1, 2, 3, 4, 6, 8}

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
      gc::check([](const auto& x, const auto& y) { return sl::sum_all(x * y + x / y - sl::exp(x) * 0.5); }, rng,
                "a * b + a / b - exp(a) / 2", 1e-6, 3, a, b);
      gc::check([](const auto& x, const auto& y) { return sl::sum_all(sl::tanh(x - y) + sl::gelu(x) * sl::sqrt(y)); },
                rng, "tanh(a - b) + gelu(a) sqrt(b)", 1e-6, 3, a, b);
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
      gc::check([](const auto& x, const auto& w) { return sl::sum_all(sl::relu(sl::matmul(x, w)) * sl::matmul(x, w)); },
                rng, "relu(x w) * (x w)", 1e-6, 4, a, b);
      gc::check([](const auto& x, const auto& w) { return sl::mse_loss(sl::softmax<1>(sl::matmul(x, w)), sl::square(sl::matmul(x, w))); },
                rng, "mse(softmax(x w), (x w)^2)", 1e-6, 4, a, b);
    });
  }, DEVICE_COUNTS);
}
}
}  // namespace
