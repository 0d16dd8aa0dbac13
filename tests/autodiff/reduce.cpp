// SPDX-License-Identifier: Apache-2.0
// Backward rules of the differentiable reductions, normalisations, take/index_add and
// cross_entropy (autodiff/) against central finite differences in float64, over spec types with
// split, multi-axis and replicated operands, on random meshes and uneven shapes; the forward of
// index_add and cross_entropy against plain loops and their collectives; 1..8 threads devices
// and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/autodiff.hpp>

#include "../collectives/harness.hpp"
#include "gradcheck.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace {
using namespace shardlib::test::grad::specs;

TEST_SUITE("autodiff_reduce") {
TEST_CASE("norm backward's row sums: the host's interleaved lanes give the one chain's sums, every length and stride") {
  namespace ad = shardlib::autodiff::detail;
  for (const std::int64_t inner : {1, 3})
    for (std::int64_t n = 0; n <= 41; ++n) {
      const std::int64_t rows = 2 * inner, size = 2 * n * inner;  // [2, n, inner]: rows (outer, inner)
      std::vector<float> x(static_cast<std::size_t>(size)), y(x.size()), g(x.size());
      for (std::int64_t i = 0; i < size; ++i) {  // small integers: every order sums them exactly
        x[static_cast<std::size_t>(i)] = static_cast<float>(i % 5 - 2);
        y[static_cast<std::size_t>(i)] = static_cast<float>(i % 3 - 1);
        g[static_cast<std::size_t>(i)] = static_cast<float>(i % 7 - 3);
      }
      for (const bool layer : {true, false}) {
        std::vector<double> one(static_cast<std::size_t>(4 * rows), -1), lanes(one.size(), -2);
        for (std::int64_t r = 0; r < rows; ++r) {
          ad::NormBackwardSums<float>{x.data(), y.data(), g.data(), one.data(), n, inner, layer}(r);
          ad::NormBackwardSums<float, true>{x.data(), y.data(), g.data(), lanes.data(), n, inner, layer}(r);
        }
        INFO("n = " << n << ", inner = " << inner << (layer ? ", layer_norm" : ", rms_norm"));
        const auto k = static_cast<std::ptrdiff_t>((layer ? 4 : 2) * rows);  // the sums written
        CHECK(std::equal(one.begin(), one.begin() + k, lanes.begin()));
        if (n > 2) CHECK(std::any_of(one.begin(), one.begin() + k, [](double v) { return v != 0; }));
      }
    }
}
TEST_CASE("reductions and normalisations along split and whole dims") {
  sl::test::for_each_run([](sl::Context& ctx) {
    auto rng = oracle::rng_for(ctx, 13);
    oracle::for_each_type(oracle::List<ColsY, Grid, Both>{}, [&](auto sa) {  // dim 1, both, dim 0 on two axes
      using A = D<typename decltype(sa)::type>;
      const auto mesh = oracle::random_mesh<M2>(ctx, rng);
      auto shape = oracle::random_shape<2>(rng, 6, false);
      const auto a = A::random(mesh, shape, 5, -1.0, 1.0);
      const auto w = A::random(mesh, shape, 6, -1.0, 1.0);
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::softmax<1>(x) * w); }, rng, "softmax<1>", 1e-6, 3, a));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::softmax<0>(x) * w); }, rng, "softmax<0>", 1e-6, 3, a));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::log_softmax<1>(x) * w); }, rng, "log_softmax<1>", 1e-6, 3, a));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::softmax<1>(x, 0.7) * w); }, rng, "softmax<1>(x, 0.7)", 1e-6, 3, a));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::softmax<0>(x, -1.5) * w); }, rng, "softmax<0>(x, -1.5)", 1e-6, 3, a));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::log_softmax<1>(x, 2.0) * w); }, rng, "log_softmax<1>(x, 2)", 1e-6, 3, a));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::layer_norm<1>(x) * w); }, rng, "layer_norm<1>", 1e-5, 3, a));
      {
        using V = sl::DistributedTensor<double, M2, sl::Spec<sl::none>>;
        const auto g = V::random(mesh, {shape[1]}, 7, -1.0, 1.0), b = V::random(mesh, {shape[1]}, 8, -1.0, 1.0);
        CHECK(gc::check([&](const auto& x, const auto& gg, const auto& bb) { return sl::sum_all(sl::layer_norm<1>(x, gg, bb) * w); },
                        rng, "layer_norm<1>(x, gain, bias)", 1e-5, 3, a, g, b));
      }
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::rms_norm<0>(x) * w); }, rng, "rms_norm<0>", 1e-5, 3, a));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::square(sl::mean<1, true>(x) - x)); }, rng,
                "mean<1, keepdim>", 1e-6, 3, a));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::exp(sl::sum<0>(x))); }, rng, "sum<0>", 1e-6, 3, a));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all(sl::exp(sl::max<1>(x))) + sl::sum_all(sl::min<0, true>(x) * 3.0); }, rng,
                "max<1>, min<0, keepdim>", 1e-6, 3, a));
      CHECK(gc::check([&](const auto& x, const auto& y) { return sl::sum_all(sl::maximum(x, y) - sl::minimum(x, y) * 2.0); },
                rng, "maximum, minimum", 1e-6, 3, a, w));
      CHECK(gc::check([&](const auto& x) { return sl::sum_all((2.0 - x) / (3.0 + x) + 1.0 / (x + 2.0)); }, rng,
                "scalar on the left", 1e-6, 3, a));
    });
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
      CHECK(gc::check([&](const auto& t) { return sl::sum_all(sl::tanh(sl::take<0>(t, ids)) * w); }, rng, "take<0>", 1e-6,
                5, table));
      CHECK(gc::check([&](const auto& t, const auto& v) { return sl::sum_all(sl::square(sl::index_add<0>(t, ids, v))); }, rng,
                "index_add<0>", 1e-6, 5, table, w));
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
    CHECK(gc::check([&](const auto& z) { return sl::cross_entropy(z, targets); }, rng, "cross_entropy", 1e-6, 6, logits));
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
    // A bad target throws on the devices whose rows hold it (docs/04: the check is local); a
    // device with no rows (7 rows over 5 devices under mpirun -np 5) has none to check.
    const auto bad = Tg::full(mesh, {7}, 9);
    if (bad.block().num_elements() > 0)
      CHECK_THROWS_WITH_AS(sl::cross_entropy(logits, bad), doctest::Contains("target 9 of row"), std::out_of_range);
    else
      CHECK_NOTHROW((void)sl::cross_entropy(logits, bad));
  }, DEVICE_COUNTS);
}

TEST_CASE("cross_entropy's gradient of a vocabulary block is the whole's bit for bit, wherever the block starts") {
  // The same saved log-sum-exps, the logits' columns cut in two blocks at every point: each
  // value of the gradient as the unsplit one gives it (its exp takes whole packets wherever it
  // sits: kernels/vmath.hpp, assign_packets), so vocab-parallel and data-parallel runs agree.
  namespace ad = sl::autodiff::detail;
  const std::int64_t rows = 3, cols = 77;
  std::vector<float> z(rows * cols);
  for (std::size_t i = 0; i < z.size(); ++i) z[i] = static_cast<float>(std::sin(0.37 * double(i)) * 6.0);
  ad::CrossEntropySaved<float> saved{{4.1f, 5.3f, 3.7f}, {5, 40, 76}};
  auto block = [&](const float* data, std::int64_t c0, std::int64_t c) {
    sl::detail::Block<float> b{nullptr, data, {}};
    b.box.rank = 2;
    b.box.offset = {0, c0};
    b.box.extent = {rows, c};
    return b;
  };
  std::vector<float> whole(z.size());
  ad::cross_entropy_grad<float>(block(z.data(), 0, cols), 8, saved, 1.5f, whole.data());
  int differ = 0;
  for (std::int64_t cut = 1; cut < cols; ++cut)
    for (const auto& [c0, c] : {std::pair{std::int64_t(0), cut}, std::pair{cut, cols - cut}}) {
      std::vector<float> part(static_cast<std::size_t>(rows * c) + 1), out(part.size());  // +1: another alignment
      for (std::int64_t r = 0; r < rows; ++r)
        std::copy_n(z.begin() + r * cols + c0, c, part.begin() + 1 + r * c);
      ad::cross_entropy_grad<float>(block(part.data() + 1, c0, c), 8, saved, 1.5f, out.data() + 1);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < c; ++j)
          differ += std::bit_cast<std::uint32_t>(out[static_cast<std::size_t>(1 + r * c + j)]) !=
                    std::bit_cast<std::uint32_t>(whole[static_cast<std::size_t>(r * cols + c0 + j)]);
    }
  CHECK(differ == 0);
}

TEST_CASE("softmax's backward on the host: one kernel over whole rows, the ops' form's values, the same bits at any address") {
  // softmax_backward_rows_host against scale y (g - sum(g y)) in double, rows shorter than a
  // packet to past vmath::chunk, in place too; every row's values equal at 5 misalignments.
  namespace ad = sl::autodiff::detail;
  const Kokkos::DefaultHostExecutionSpace exec;
  for (const std::int64_t n : {1, 3, 7, 16, 17, 40, 128, 129, 2500})
    for (const double scale : {1.0, 0.125}) {
      const std::int64_t rows = 3, size = rows * n;
      std::vector<float> y(static_cast<std::size_t>(size)), g(y.size());
      for (std::int64_t i = 0; i < size; ++i) {
        y[static_cast<std::size_t>(i)] = static_cast<float>(0.5 + 0.5 * std::sin(0.71 * double(i))) / static_cast<float>(n);
        g[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(0.37 * double(i)) * 3.0);
      }
      std::vector<float> out(y.size(), -7.f);
      ad::softmax_backward_rows_host(exec, y.data(), g.data(), out.data(), rows, n, scale);
      INFO("n = " << n << ", scale = " << scale);
      for (std::int64_t r = 0; r < rows; ++r) {
        double sum = 0;
        for (std::int64_t j = 0; j < n; ++j) sum += double(y[static_cast<std::size_t>(r * n + j)]) * double(g[static_cast<std::size_t>(r * n + j)]);
        for (std::int64_t j = 0; j < n; ++j) {
          const auto k = static_cast<std::size_t>(r * n + j);
          const double want = scale * double(y[k]) * (double(g[k]) - sum);
          CHECK(double(out[k]) == doctest::Approx(want).epsilon(1e-5).scale(1e-6 * (std::abs(sum) + 3) / double(n)));
        }
      }
      for (std::size_t shift = 1; shift <= 5; ++shift) {  // another address of the same rows: the same bits
        std::vector<float> ys(y.size() + shift), gs(ys.size()), outs(ys.size());
        std::copy(y.begin(), y.end(), ys.begin() + static_cast<std::ptrdiff_t>(shift));
        std::copy(g.begin(), g.end(), gs.begin() + static_cast<std::ptrdiff_t>(shift));
        ad::softmax_backward_rows_host(exec, ys.data() + shift, gs.data() + shift, outs.data() + shift, rows, n, scale);
        CHECK(std::equal(out.begin(), out.end(), outs.begin() + static_cast<std::ptrdiff_t>(shift)));
        ad::softmax_backward_rows_host(exec, ys.data() + shift, gs.data() + shift, gs.data() + shift, rows, n, scale);  // in place
        CHECK(std::equal(out.begin(), out.end(), gs.begin() + static_cast<std::ptrdiff_t>(shift)));
      }
    }
  // Through a Var: softmax along a whole last dim is one backward kernel, reading y and g and writing
  // the gradient once (the ops' form: five kernels); its values are the ops' form's.
  auto rt = sl::Runtime::threads(1);
  rt.spmd([](sl::Context& ctx) {
    using M1 = sl::Mesh<"x">;
    const M1 mesh(ctx, {1});
    using T3 = sl::DistributedTensor<float, M1, sl::Spec<sl::none, sl::none, sl::none>>;
    const std::int64_t b = 2, s = 5, n = 37;
    const auto x = T3::random(mesh, {b, s, n}, 21, -2.0, 2.0), w = T3::random(mesh, {b, s, n}, 22, -1.0, 1.0);
    sl::Param p(x);
    auto loss = sl::sum_all(sl::softmax<2>(p, 0.5) * w);
    const auto before = sl::kernels::flop_count();
    sl::backward(loss);
    const auto after = sl::kernels::flop_count();
    // softmax's one kernel and the seed's, sum_all's and the product's five (the ops' form: 10 in all)
    CHECK(after.kernel_calls - before.kernel_calls == 6);
    const auto got = p.grad().to_host();
    const auto y = sl::softmax<2>(x, 0.5);
    const auto want = ((y * 0.5f) * (w - sl::sum<2, true>(w * y))).to_host();
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5).scale(1e-6));
  });
}

TEST_CASE("layer_norm's and rms_norm's backward on the host: one kernel over whole rows, the formula's values, the same bits at any address") {
  // norm_backward_rows_host against rstd (g - mean(g) - y mean(g y)) in double (rms_norm: no
  // mean(g)), y the forward's output, on rows whose mean is far from zero too; in place; every
  // row's values equal at 5 misalignments.
  namespace ad = sl::autodiff::detail;
  const Kokkos::DefaultHostExecutionSpace exec;
  for (const bool layer : {true, false})
    for (const std::int64_t n : {1, 2, 7, 16, 33, 256, 2500})
      for (const double offset : {0.0, 40.0}) {
        const std::int64_t rows = 3, size = rows * n;
        const double eps = 1e-5;
        std::vector<float> x(static_cast<std::size_t>(size)), y(x.size()), g(x.size());
        std::vector<double> want(x.size());
        for (std::int64_t i = 0; i < size; ++i) {
          x[static_cast<std::size_t>(i)] = static_cast<float>(offset + std::sin(0.71 * double(i)) * 2.0);
          g[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(0.37 * double(i)) * 3.0);
        }
        for (std::int64_t r = 0; r < rows; ++r) {  // the forward (y) and the gradient, in double
          auto at = [&](const std::vector<float>& v, std::int64_t j) { return double(v[static_cast<std::size_t>(r * n + j)]); };
          double mean = 0, var = 0, mg = 0, mgy = 0;
          for (std::int64_t j = 0; j < n; ++j) mean += at(x, j) / double(n);
          for (std::int64_t j = 0; j < n; ++j) var += (layer ? (at(x, j) - mean) * (at(x, j) - mean) : at(x, j) * at(x, j)) / double(n);
          const double rstd = 1 / std::sqrt(var + eps);
          for (std::int64_t j = 0; j < n; ++j)
            y[static_cast<std::size_t>(r * n + j)] = static_cast<float>((at(x, j) - (layer ? mean : 0.0)) * rstd);
          for (std::int64_t j = 0; j < n; ++j) mg += at(g, j) / double(n), mgy += at(g, j) * at(y, j) / double(n);
          for (std::int64_t j = 0; j < n; ++j)
            want[static_cast<std::size_t>(r * n + j)] = rstd * (at(g, j) - (layer ? mg : 0.0) - at(y, j) * mgy);
        }
        std::vector<float> out(x.size(), -7.f);
        ad::norm_backward_rows_host(exec, x.data(), y.data(), g.data(), out.data(), rows, n, eps, layer);
        INFO((layer ? "layer_norm" : "rms_norm") << ", n = " << n << ", offset = " << offset);
        double worst = 0;
        for (std::size_t k = 0; k < out.size(); ++k) worst = std::max(worst, std::abs(double(out[k]) - want[k]));
        double scale = 0;  // the gradient's size in the row
        for (double w : want) scale = std::max(scale, std::abs(w));
        CHECK(worst <= 2e-5 * (scale + 1));
        for (std::size_t shift = 1; shift <= 5; ++shift) {
          const auto d = static_cast<std::ptrdiff_t>(shift);
          std::vector<float> xs(x.size() + shift), ys(xs.size()), gs(xs.size()), outs(xs.size());
          std::copy(x.begin(), x.end(), xs.begin() + d);
          std::copy(y.begin(), y.end(), ys.begin() + d);
          std::copy(g.begin(), g.end(), gs.begin() + d);
          ad::norm_backward_rows_host(exec, xs.data() + shift, ys.data() + shift, gs.data() + shift, outs.data() + shift, rows, n, eps, layer);
          CHECK(std::equal(out.begin(), out.end(), outs.begin() + d));
          ad::norm_backward_rows_host(exec, xs.data() + shift, ys.data() + shift, gs.data() + shift, gs.data() + shift, rows, n, eps, layer);
          CHECK(std::equal(out.begin(), out.end(), gs.begin() + d));  // in place
        }
      }
  // Through a Var: one backward kernel reading x, y and g and writing the gradient once (the two
  // kernels before it read y and g twice), its bytes counted as in GPU memory.
  auto rt = sl::Runtime::threads(1);
  rt.spmd([](sl::Context& ctx) {
    using M1 = sl::Mesh<"x">;
    const M1 mesh(ctx, {1});
    using T2 = sl::DistributedTensor<float, M1, sl::Spec<sl::none, sl::none>>;
    const std::int64_t rows = 6, n = 40;
    const auto x = T2::random(mesh, {rows, n}, 31, -2.0, 2.0), w = T2::random(mesh, {rows, n}, 32, -1.0, 1.0);
    for (const bool layer : {true, false}) {
      sl::Param p(x);
      auto loss = layer ? sl::sum_all(sl::layer_norm<1>(p) * w) : sl::sum_all(sl::rms_norm<1>(p) * w);
      auto before = sl::kernels::flop_count();
      sl::backward(loss);
      auto after = sl::kernels::flop_count();
      // the norm's one kernel and the seed's, sum_all's and the product's four (before: 6 in all)
      CHECK(after.kernel_calls - before.kernel_calls == 5);
      const double eps = 1e-5;  // the gradient against the formula in double, as above
      const auto hx = x.to_host(), hw = w.to_host(), got = p.grad().to_host();
      for (std::int64_t r = 0; r < rows; ++r) {
        auto at = [&](const std::vector<float>& v, std::int64_t j) { return double(v[static_cast<std::size_t>(r * n + j)]); };
        double mean = 0, var = 0, mg = 0, mgy = 0;
        for (std::int64_t j = 0; j < n; ++j) mean += at(hx, j) / double(n);
        if (!layer) mean = 0;
        for (std::int64_t j = 0; j < n; ++j) var += (at(hx, j) - mean) * (at(hx, j) - mean) / double(n);
        const double rstd = 1 / std::sqrt(var + eps);
        for (std::int64_t j = 0; j < n; ++j) mg += at(hw, j) / double(n), mgy += at(hw, j) * (at(hx, j) - mean) * rstd / double(n);
        for (std::int64_t j = 0; j < n; ++j)
          CHECK(double(got[static_cast<std::size_t>(r * n + j)]) ==
                doctest::Approx(rstd * (at(hw, j) - (layer ? mg : 0.0) - (at(hx, j) - mean) * rstd * mgy)).epsilon(1e-5).scale(1));  // (float's error on gradients of size 1)
      }
    }
  });
}

TEST_CASE("the backward pass's own kernels count their bytes (the planner's cost model)") {
  // Each reads and writes its elements once: a gradient's accumulation 3 n, a conversion n
  // (sizeof in + sizeof out); cross_entropy's passes (host logits: its own loops), its gradient
  // the logits read and written.
  auto rt = sl::Runtime::threads(1);
  rt.spmd([](sl::Context& ctx) {
    namespace ad = sl::autodiff::detail;
    std::vector<float> a(1000, 1.f), b(1000, 2.f), out(1000);
    std::vector<double> wide(1000);
    auto f0 = sl::kernels::flop_count();
    ad::add_blocks<float, Kokkos::HostSpace>(ctx, out.data(), a.data(), b.data(), 1000);
    auto f1 = sl::kernels::flop_count();
    CHECK(f1.kernel_bytes - f0.kernel_bytes == 3 * 1000 * sizeof(float));
    CHECK(f1.kernel_calls - f0.kernel_calls == 1);
    CHECK(out[999] == 3.f);
    ad::convert_block<double, float, Kokkos::HostSpace>(ctx, wide.data(), b.data(), 1000);
    auto f2 = sl::kernels::flop_count();
    CHECK(f2.kernel_bytes - f1.kernel_bytes == 1000 * (sizeof(double) + sizeof(float)));

    using M1 = sl::Mesh<"x">;
    const M1 mesh(ctx, {1});
    using L = sl::DistributedTensor<float, M1, sl::Spec<sl::none, sl::none>>;
    using Tg = sl::DistributedTensor<std::int64_t, M1, sl::Spec<sl::none>>;
    const std::int64_t rows = 6, cols = 50;
    const auto targets = Tg::random(mesh, {rows}, 13, 0, cols);
    sl::Param z(L::random(mesh, {rows, cols}, 12, -2.0, 2.0));
    const auto before = sl::kernels::flop_count();
    auto loss = sl::cross_entropy(z, targets);
    const auto mid = sl::kernels::flop_count();
    // the row max (the block read, a row's max written), the sum of exponentials (the block and
    // the max read, the sum written), the loss (per row: max, sum, target, its logit read;
    // log-sum-exp and target kept)
    const std::uint64_t logits = rows * cols * sizeof(float);
    CHECK(mid.kernel_bytes - before.kernel_bytes == 2 * logits + rows * (3 * sizeof(float) + 4 * sizeof(float) + 16));
    CHECK(mid.kernel_calls - before.kernel_calls == 3);
    sl::backward(loss);
    const auto after = sl::kernels::flop_count();
    CHECK(after.kernel_bytes - mid.kernel_bytes == 2 * logits + sizeof(float));  // (and the seed's fill)
  });
}
}
}  // namespace
