// SPDX-License-Identifier: Apache-2.0
// Loops over global indices (parallel_for, parallel_reduce, map): the block walk on its own, then
// every loop against a serial oracle computed here from the global arrays, for ranks 0..4, uneven
// and empty blocks, replicated axes and several mesh shapes, with one tensor and several. Every
// body runs on 1..8 threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/tensor.hpp>

#include "../collectives/harness.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace sl = shardlib;
using sl::axes;
using sl::none;

namespace {
using M1 = sl::Mesh<"x">;
using M2 = sl::Mesh<"x", "y">;
using M3 = sl::Mesh<"x", "y", "z">;

M1 mesh1(sl::Context& ctx) { return M1(ctx, {ctx.num_devices()}); }
// {n/2, 2} when n is even, else {n, 1}.
M2 mesh2(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 2 == 0 ? M2(ctx, {n / 2, 2}) : M2(ctx, {n, 1});
}
// {2, 2, n/4} when 4 divides n, {1, n, 1} otherwise (an axis of size 1 on either side).
M3 mesh3(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 4 == 0 ? M3(ctx, {2, 2, n / 4}) : M3(ctx, {1, n, 1});
}
template <class MeshT>
MeshT mesh_of(sl::Context& ctx) {
  if constexpr (std::is_same_v<MeshT, M1>) return mesh1(ctx);
  else if constexpr (std::is_same_v<MeshT, M2>) return mesh2(ctx);
  else return mesh3(ctx);
}

/// The row-major multi-index of linear index `k` in `shape`.
template <std::size_t R>
std::array<std::int64_t, R> unravel(std::int64_t k, const std::array<std::int64_t, R>& shape) {
  std::array<std::int64_t, R> i{};
  for (std::size_t d = R; d-- > 0;) {
    i[d] = k % shape[d];
    k /= shape[d];
  }
  return i;
}
template <std::size_t R>
std::int64_t size_of(const std::array<std::int64_t, R>& shape) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  return n;
}
/// A value that depends on every component of a global index (and on `salt`).
template <std::size_t R, class I>
double index_value(const I& i, double salt) {
  double v = salt;
  for (std::size_t d = 0; d < R; ++d) v = v * 3.0 + static_cast<double>(i[d]) * (1.0 + static_cast<double>(d));
  return v;
}

/// Every loop on tensors of mesh `MeshT`, spec `SpecT` and `shape`, against the serial oracle.
template <class MeshT, class SpecT, std::size_t R>
void check_loops(sl::Context& ctx, const std::array<std::int64_t, R>& shape) {
  using D = sl::DistributedTensor<double, MeshT, SpecT>;
  const MeshT mesh = mesh_of<MeshT>(ctx);
  const std::int64_t n = size_of(shape);
  INFO("mesh " << mesh.to_string() << ", " << D::spec_string() << ", " << n << " elements, rank " << R);
  auto make = [&](auto tag, auto fill) {
    using T = decltype(tag);
    using Tensor = sl::DistributedTensor<T, MeshT, SpecT>;
    typename Tensor::Shape s{};
    std::copy(shape.begin(), shape.end(), s.begin());
    std::vector<T> host(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k) host[static_cast<std::size_t>(k)] = fill(k);
    return std::pair{Tensor::from_host(mesh, s, host), host};
  };
  const auto [a, ah] = make(double{}, [](std::int64_t k) { return static_cast<double>((k * 37) % 101) - 50.0; });
  const auto [b, bh] = make(double{}, [](std::int64_t k) { return static_cast<double>((k * 11) % 17) * 0.5 + 1.0; });
  const auto [s, sh_] = make(std::int64_t{}, [](std::int64_t k) { return (k * 7) % 5 == 0 ? std::int64_t{-1} : std::int64_t{1}; });

  // One tensor: the functor writes a function of the global index.
  auto w = D::zeros(mesh, a.shape());
  sl::parallel_for(w, [](const sl::Index<R>& i, double& v) { v = index_value<R>(i, 1.0); });
  {
    const auto got = w.to_host();
    REQUIRE(got.size() == static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k) CHECK(got[static_cast<std::size_t>(k)] == index_value<R>(unravel<R>(k, shape), 1.0));
  }
  // Several tensors: c = 2a + b + (a function of the index); b const, its element by const&.
  auto c = D::zeros(mesh, a.shape());
  const D& bc = b;
  sl::parallel_for(c, a, bc, [](const sl::Index<R>& i, double& o, double x, const double& y) {
    o = 2.0 * x + y + index_value<R>(i, 2.0);
  });
  {
    const auto got = c.to_host();
    for (std::int64_t k = 0; k < n; ++k) {
      const auto i = static_cast<std::size_t>(k);
      CHECK(got[i] == 2.0 * ah[i] + bh[i] + index_value<R>(unravel<R>(k, shape), 2.0));
    }
  }
  // The other tensors' elements are lvalues (const for a const tensor): a second tensor may be
  // written too.
  auto d = D::zeros(mesh, a.shape());
  sl::parallel_for(c, d, bc, [](const sl::Index<R>&, auto& o, auto& e, auto& y) {
    static_assert(std::is_same_v<decltype(o), double&> && std::is_same_v<decltype(e), double&> &&
                  std::is_same_v<decltype(y), const double&>);
    e = y + 1.0;
    o = 0.0;
  });
  {
    const auto got = d.to_host();
    for (std::int64_t k = 0; k < n; ++k) CHECK(got[static_cast<std::size_t>(k)] == bh[static_cast<std::size_t>(k)] + 1.0);
    const auto zeros = c.to_host();
    CHECK(std::all_of(zeros.begin(), zeros.end(), [](double v) { return v == 0.0; }));
  }

  // Reductions over one and several tensors, each element counted once.
  double dot = 0, mx = std::numeric_limits<double>::lowest(), mn = std::numeric_limits<double>::max(), wsum = 0;
  std::int64_t prod = 1;  // of s: its elements are 1 and -1
  for (std::int64_t k = 0; k < n; ++k) {
    const auto i = static_cast<std::size_t>(k);
    dot += ah[i] * bh[i];
    mx = std::max(mx, ah[i] - bh[i]);
    mn = std::min(mn, ah[i] + index_value<R>(unravel<R>(k, shape), 0.0));
    wsum += ah[i] * bh[i] * static_cast<double>(sh_[i]);
    prod *= sh_[i];
  }
  // Exact in double: the products are multiples of 0.5 below 2^20, the sums far below 2^53.
  CHECK(sl::parallel_reduce(a, b, [](const sl::Index<R>&, double x, double y) { return x * y; }) == dot);
  CHECK(sl::parallel_reduce<sl::ReduceOp::max>(a, b, [](const sl::Index<R>&, double x, double y) { return x - y; }) == mx);
  CHECK(sl::parallel_reduce<sl::coll::Op::min>(a, [](const sl::Index<R>& i, double x) { return x + index_value<R>(i, 0.0); }) == mn);
  CHECK(sl::parallel_reduce(a, b, s, [](const sl::Index<R>&, const double& x, double y, std::int64_t z) {
          return x * y * static_cast<double>(z);
        }) == wsum);
  CHECK(sl::parallel_reduce<sl::ReduceOp::prod>(s, [](const sl::Index<R>&, std::int64_t z) { return z; }) == prod);
  CHECK(sl::parallel_reduce(a, [](const sl::Index<R>&, double) { return std::int64_t{1}; }) == n);
  // The identities: a device (or a whole tensor) without elements contributes 0, 1, lowest, max.
  if (n == 0) {
    CHECK(sl::parallel_reduce<sl::ReduceOp::prod>(a, [](const sl::Index<R>&, double) { return 2.0; }) == 1.0);
    CHECK(sl::parallel_reduce<sl::ReduceOp::max>(a, [](const sl::Index<R>&, double) { return 2.0; }) ==
          std::numeric_limits<double>::lowest());
  }

  // map, with and without the index.
  auto m = sl::map(a, [](const sl::Index<R>& i, double x) { return static_cast<float>(x + index_value<R>(i, 3.0)); });
  static_assert(std::is_same_v<decltype(m), sl::DistributedTensor<float, MeshT, SpecT>>);
  auto mi = sl::map(s, [](std::int64_t z) { return z * 3; });
  {
    const auto got = m.to_host();
    const auto goti = mi.to_host();
    for (std::int64_t k = 0; k < n; ++k) {
      const auto i = static_cast<std::size_t>(k);
      CHECK(got[i] == static_cast<float>(ah[i] + index_value<R>(unravel<R>(k, shape), 3.0)));
      CHECK(goti[i] == sh_[i] * 3);
    }
  }
}

/// check_loops for each shape of rank R in `shapes`.
template <class MeshT, class SpecT, std::size_t R>
void check_shapes(sl::Context& ctx, std::initializer_list<std::array<std::int64_t, R>> shapes) {
  for (const auto& s : shapes) check_loops<MeshT, SpecT, R>(ctx, s);
}
}  // namespace

TEST_SUITE("tensor_loops") {
TEST_CASE("the block walk visits every element once, in order, with its global index") {
  auto walk_all = [](auto rank_tag, const sl::ShardBox& box, std::int64_t max_items) {
    constexpr std::size_t R = decltype(rank_tag)::value;
    const sl::detail::BlockWalk<R> walk(box, max_items);
    CHECK(walk.chunks() <= std::max<std::int64_t>(max_items, 0));
    std::int64_t next = 0;
    for (std::int64_t c = 0; c < walk.chunks(); ++c)
      walk(c, [&](const sl::Index<R>& g, std::int64_t k) {
        CHECK(k == next++);
        std::int64_t rest = k;
        for (std::size_t d = R; d-- > 0;) {
          CHECK(g[d] == box.offset[d] + rest % box.extent[d]);
          rest /= box.extent[d];
        }
      });
    CHECK(next == box.num_elements());
  };
  auto box_of = [](std::initializer_list<std::int64_t> offset, std::initializer_list<std::int64_t> extent) {
    sl::ShardBox b;
    b.rank = static_cast<int>(extent.size());
    std::size_t d = 0;
    for (auto o : offset) b.offset[d++] = o;
    d = 0;
    for (auto e : extent) b.extent[d++] = e;
    return b;
  };
  for (std::int64_t items : {std::int64_t{1}, std::int64_t{3}, std::int64_t{7}, std::numeric_limits<std::int64_t>::max()}) {
    walk_all(std::integral_constant<std::size_t, 0>{}, box_of({}, {}), items);
    walk_all(std::integral_constant<std::size_t, 1>{}, box_of({5}, {20000}), items);
    walk_all(std::integral_constant<std::size_t, 1>{}, box_of({5}, {0}), items);
    walk_all(std::integral_constant<std::size_t, 2>{}, box_of({3, 2}, {70, 301}), items);  // chunks end mid-row
    walk_all(std::integral_constant<std::size_t, 2>{}, box_of({0, 0}, {9000, 1}), items);
    walk_all(std::integral_constant<std::size_t, 3>{}, box_of({1, 2, 3}, {5, 41, 97}), items);
    walk_all(std::integral_constant<std::size_t, 3>{}, box_of({1, 2, 3}, {5, 0, 97}), items);
    walk_all(std::integral_constant<std::size_t, 4>{}, box_of({0, 4, 1, 2}, {3, 5, 29, 31}), items);
    walk_all(std::integral_constant<std::size_t, 8>{}, box_of({1, 0, 1, 0, 1, 0, 1, 0}, {2, 3, 2, 3, 2, 3, 2, 300}), items);
  }
}

TEST_CASE("loops of rank 0 and 1 match the serial oracle") {
  sl::test::for_each_run([](sl::Context& ctx) {
    check_shapes<M1, sl::Spec<>, 0>(ctx, {{}});
    check_shapes<M2, sl::Spec<>, 0>(ctx, {{}});
    check_shapes<M1, sl::Spec<"x">, 1>(ctx, {{1}, {7}, {0}, {20001}});
    check_shapes<M2, sl::Spec<none>, 1>(ctx, {{5}, {0}});
    check_shapes<M2, sl::Spec<"y">, 1>(ctx, {{9}, {1}});
    check_shapes<M2, sl::Spec<axes<"y", "x">>, 1>(ctx, {{11}, {3}});
  });
}

TEST_CASE("loops of rank 2 match the serial oracle") {
  sl::test::for_each_run([](sl::Context& ctx) {
    check_shapes<M2, sl::Spec<"x", none>, 2>(ctx, {{7, 5}, {3, 1}, {0, 4}, {70, 301}});
    check_shapes<M2, sl::Spec<none, "y">, 2>(ctx, {{4, 9}, {2, 0}});
    check_shapes<M2, sl::Spec<"x", "y">, 2>(ctx, {{7, 5}, {1, 1}});
    check_shapes<M2, sl::Spec<"y", "x">, 2>(ctx, {{6, 13}});
    check_shapes<M2, sl::Spec<axes<"x", "y">, none>, 2>(ctx, {{10, 3}, {5, 2}});
    check_shapes<M2, sl::Spec<none, none>, 2>(ctx, {{5, 7}});
    check_shapes<M1, sl::Spec<none, "x">, 2>(ctx, {{3, 10}});
  });
}

TEST_CASE("loops of rank 3 and 4 match the serial oracle") {
  sl::test::for_each_run([](sl::Context& ctx) {
    check_shapes<M3, sl::Spec<"x", none, "z">, 3>(ctx, {{5, 4, 3}, {1, 2, 0}, {5, 41, 97}});
    check_shapes<M3, sl::Spec<none, axes<"y", "z">, none>, 3>(ctx, {{2, 9, 3}});
    check_shapes<M2, sl::Spec<none, none, none>, 3>(ctx, {{2, 3, 4}});
    check_shapes<M3, sl::Spec<none, "x", none, "y">, 4>(ctx, {{3, 5, 2, 3}, {2, 1, 0, 3}});
    check_shapes<M3, sl::Spec<"z", none, none, axes<"x", "y">>, 4>(ctx, {{2, 3, 4, 7}});
  });
}

TEST_CASE("a loop over tensors of different shapes or meshes names the arguments, shapes and spec") {
  sl::test::for_each_run([](sl::Context& ctx) {
    using T = sl::DistributedTensor<double, M2, sl::Spec<"x", none>>;
    const M2 mesh = mesh2(ctx);
    auto a = T::zeros(mesh, {4, 6}), b = T::zeros(mesh, {4, 6}), c = T::zeros(mesh, {4, 5});
    const std::string msg =
        "shardlib: parallel_for: tensor arguments 0 and 2 have different shapes, [4, 6] and [4, 5] (both "
        "Spec<\"x\", none>); a loop walks tensors of one shape";
    CHECK_THROWS_WITH_AS(sl::parallel_for(a, b, c, [](const sl::Index<2>&, double& v, double, double) { v = 1; }),
                         msg.c_str(), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::parallel_reduce(a, c, [](const sl::Index<2>&, double x, double y) { return x * y; }),
                         doctest::Contains("parallel_reduce: tensor arguments 0 and 1 have different shapes, [4, 6] and [4, 5]"),
                         std::invalid_argument);
    // The same mesh type with other axis sizes: another distribution of the same shape.
    if (ctx.num_devices() % 2 == 0) {
      auto other = T::zeros(M2(ctx, {ctx.num_devices(), 1}), {4, 6});
      CHECK_THROWS_WITH_AS(sl::parallel_for(a, other, [](const sl::Index<2>&, double& v, double) { v = 1; }),
                           doctest::Contains("tensor arguments 0 and 1 are on different meshes"), std::invalid_argument);
    }
    // Nothing was written before the check.
    sl::parallel_for(a, b, [](const sl::Index<2>&, double& v, double w) { v = w + 1; });
    const auto got = a.to_host();
    CHECK(std::all_of(got.begin(), got.end(), [](double v) { return v == 1.0; }));
  });
}

TEST_CASE("ReduceOp is coll::Op: one enum for loops, collectives and partial specs") {
  static_assert(std::is_same_v<sl::ReduceOp, sl::coll::Op>);
  static_assert(sl::coll::Op::max == sl::ReduceOp::max && sl::coll::Op::prod == sl::ReduceOp::prod);
  static_assert(sl::to_string(sl::coll::Op::prod) == "prod" && sl::coll::name(sl::ReduceOp::min) == "min");
  static_assert(sl::partial_max<"x">.reduce_op() == sl::coll::Op::max);
  sl::test::for_each_run([](sl::Context& ctx) {
    auto t = sl::DistributedTensor<double, M1, sl::Spec<"x">>::iota(mesh1(ctx), {10});
    auto f = [](const sl::Index<1>&, double v) { return v; };
    CHECK(sl::parallel_reduce<sl::coll::Op::max>(t, f) == sl::parallel_reduce<sl::ReduceOp::max>(t, f));
    CHECK(sl::parallel_reduce<sl::coll::Op::max>(t, f) == 9.0);
    CHECK(sl::parallel_reduce<sl::ReduceOp::prod>(t, [](const sl::Index<1>& i, double v) { return i[0] == 0 ? 1.0 : v; }) ==
          362880.0);  // 9!
  });
}
}
