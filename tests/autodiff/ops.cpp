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

TEST_CASE("reductions and normalisations along split and whole dims") {
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 13);
    oracle::for_each_type(oracle::List<Rows, ColsY, Grid, Both>{}, [&](auto sa) {
      using A = D<typename decltype(sa)::type>;
      const auto mesh = oracle::random_mesh<M2>(ctx, rng);
      auto shape = oracle::random_shape<2>(rng, 6, false);
      const auto a = A::random(mesh, shape, 5, -1.0, 1.0);
      const auto w = A::random(mesh, shape, 6, -1.0, 1.0);
      gc::check([&](const auto& x) { return sl::sum_all(sl::softmax<1>(x) * w); }, rng, "softmax<1>", 1e-6, 3, a);
      gc::check([&](const auto& x) { return sl::sum_all(sl::softmax<0>(x) * w); }, rng, "softmax<0>", 1e-6, 3, a);
      gc::check([&](const auto& x) { return sl::sum_all(sl::log_softmax<1>(x) * w); }, rng, "log_softmax<1>", 1e-6, 3, a);
      gc::check([&](const auto& x) { return sl::sum_all(sl::layer_norm<1>(x) * w); }, rng, "layer_norm<1>", 1e-5, 3, a);
      gc::check([&](const auto& x) { return sl::sum_all(sl::rms_norm<0>(x) * w); }, rng, "rms_norm<0>", 1e-5, 3, a);
      gc::check([&](const auto& x) { return sl::sum_all(sl::square(sl::mean<1, true>(x) - x)); }, rng,
                "mean<1, keepdim>", 1e-6, 3, a);
      gc::check([&](const auto& x) { return sl::sum_all(sl::exp(sl::sum<0>(x))); }, rng, "sum<0>", 1e-6, 3, a);
      gc::check([&](const auto& x) { return sl::sum_all(sl::exp(sl::max<1>(x))) + sl::sum_all(sl::min<0, true>(x) * 3.0); }, rng,
                "max<1>, min<0, keepdim>", 1e-6, 3, a);
      gc::check([&](const auto& x, const auto& y) { return sl::sum_all(sl::maximum(x, y) - sl::minimum(x, y) * 2.0); },
                rng, "maximum, minimum", 1e-6, 3, a, w);
      gc::check([&](const auto& x) { return sl::sum_all((2.0 - x) / (3.0 + x) + 1.0 / (x + 2.0)); }, rng,
                "scalar on the left", 1e-6, 3, a);
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
    gc::check([&](const auto& x, const auto& w) { return sl::sum_all(sl::exp((sl::matmul(x, w) * 0.5 + c) * 0.3)); },
              rng, "exp(matmul partial)", 1e-6, 4, a, b);
    gc::check([&](const auto& x, const auto& w) { return sl::sum_all(sl::square(sl::matmul(x, w) - sl::matmul(x, w) * c)); },
              rng, "partial * tensor", 1e-6, 4, a, b);
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
    gc::check([](const auto& a, const auto& b) {
      auto h = sl::einsum<"bsd,df->bsf">(a, b);
      return sl::sum_all(sl::tanh(sl::reshard<Spec<none, "x", none>>(h)));
    }, rng, "einsum bsd,df->bsf then reshard", 1e-6, 4, x, w);
    gc::check([](const auto& a) {
      auto t = sl::transpose<0, 2>(a);
      auto r = sl::reshape<"d s b -> d (s b)">(t);
      return sl::sum_all(sl::sigmoid(r) * sl::silu(r));
    }, rng, "transpose, reshape", 1e-6, 4, x);
    gc::check([](const auto& a) {
      auto r = sl::reshape<"b s d -> (b s) d">(a);
      auto back = sl::reshape<"(b s) d -> b s d">(sl::square(r), {3, 4, 6});
      return sl::sum_all(sl::gelu_tanh(back));
    }, rng, "reshape merge and split", 1e-6, 4, x);
    gc::check([](const auto& a) {
      auto s1 = sl::slice<1>(a, 1, 4);
      auto s0 = sl::slice<0>(a, 0, 2);
      return sl::sum_all(sl::exp(s1) * 0.5) + sl::sum_all(sl::square(sl::concat<0>(s0, sl::slice<0>(a, 1, 3))));
    }, rng, "slice, concat", 1e-6, 4, x);
  }, DEVICE_COUNTS);
}

TEST_CASE("take and index_add: embeddings split along the vocabulary or replicated") {
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 17);
    using Ids = sl::DistributedTensor<std::int64_t, M2, Spec<"x", none>>;
    oracle::for_each_type(oracle::List<Spec<"y", none>, Rep, Spec<none, "y">>{}, [&](auto st) {
      using Table = D<typename decltype(st)::type>;
      const auto mesh = oracle::random_mesh<M2>(ctx, rng);
      const auto table = Table::random(mesh, {7, 5}, 14, -1.0, 1.0);
      const auto ids = Ids::random(mesh, {3, 4}, 15, 0, 7);
      const auto w = sl::DistributedTensor<double, M2, Spec<"x", none, none>>::random(mesh, {3, 4, 5}, 16, -1.0, 1.0);
      gc::check([&](const auto& t) { return sl::sum_all(sl::tanh(sl::take<0>(t, ids)) * w); }, rng, "take<0>", 1e-6,
                5, table);
      gc::check([&](const auto& t, const auto& v) { return sl::sum_all(sl::square(sl::index_add<0>(t, ids, v))); }, rng,
                "index_add<0>", 1e-6, 5, table, w);
      // The forward against plain loops; a vocabulary-split table's gradient needs no communication.
      const auto got = sl::index_add<0>(table, ids, w).to_host();
      auto want = table.to_host();
      const auto hi = ids.to_host();
      const auto hw = w.to_host();
      for (std::size_t j = 0; j < hi.size(); ++j)
        for (std::size_t k = 0; k < 5; ++k) want[static_cast<std::size_t>(hi[j]) * 5 + k] += hw[j * 5 + k];
      for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]));
      sl::Param tp(table);
      auto loss = sl::sum_all(sl::take<0>(tp, sl::reshard<Spec<none, none>>(ids)) * sl::reshard<Spec<none, none, none>>(w));
      sl::coll::CommRecorder rec;
      sl::backward(loss);
      if constexpr (std::is_same_v<Table, D<Spec<"y", none>>>) CHECK(rec.total_calls() == 0);
    });
  }, DEVICE_COUNTS);
}

TEST_CASE("cross_entropy: vocab-parallel, against finite differences and with two all_reduces") {
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 16);
    const auto mesh = oracle::random_mesh<M2>(ctx, rng);
    using L = D<Spec<"x", "y">>;
    using Tg = sl::DistributedTensor<std::int64_t, M2, Spec<"x">>;
    const auto logits = L::random(mesh, {7, 9}, 12, -2.0, 2.0);
    const auto targets = Tg::random(mesh, {7}, 13, 0, 9);
    gc::check([&](const auto& z) { return sl::cross_entropy(z, targets); }, rng, "cross_entropy", 1e-6, 6, logits);
    // Against the composition: mean over rows of -log_softmax at the target.
    const auto z = sl::reshard<Rep>(logits).to_host();
    const auto t = targets.to_host();
    double want = 0;
    for (int r = 0; r < 7; ++r) {
      double m = -1e300, s = 0;
      for (int c = 0; c < 9; ++c) m = std::max(m, z[r * 9 + c]);
      for (int c = 0; c < 9; ++c) s += std::exp(z[r * 9 + c] - m);
      want += (m + std::log(s) - z[r * 9 + t[r]]) / 7;
    }
    sl::coll::CommRecorder rec;
    const auto loss = sl::cross_entropy(logits, targets);
    const bool split = mesh.shape().group_size(sl::AxisList{1}) > 1;
    CHECK(rec[sl::coll::Kind::all_reduce].calls == (split ? 2u : 0u));
    CHECK(rec.total_calls() == rec[sl::coll::Kind::all_reduce].calls);
    CHECK(gc::scalar(loss) == doctest::Approx(want).epsilon(1e-12));
    const auto bad = Tg::full(mesh, {7}, 9);
    CHECK_THROWS_WITH_AS(sl::cross_entropy(logits, bad), doctest::Contains("target 9 of row"), std::out_of_range);
  }, DEVICE_COUNTS);
}
}
}  // namespace
