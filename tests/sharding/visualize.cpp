// SPDX-License-Identifier: Apache-2.0
// sl::visualize: the text picture of which device holds which block, for grids, uneven and empty
// blocks, replicas, pending sums, 1-D, 3-D (a slice) and scalars; and its tensor overload.
#include <doctest/doctest.h>
#include <shardlib/visualize.hpp>

#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {
const sl::MeshShape m22({sl::AxisName("x"), sl::AxisName("y")}, {2, 2});
const sl::MeshShape m41({sl::AxisName("x"), sl::AxisName("y")}, {4, 1});

template <class S>
std::string picture(const sl::MeshShape& mesh, std::vector<std::int64_t> shape, int rows = -2, int cols = -2) {
  const sl::Sharding s = sl::resolve(S::value, mesh, S::rank);
  return sl::visualize(s, mesh, sl::detail::ArrayRef<std::int64_t>(shape.data(), shape.size()), "", rows, cols);
}
}  // namespace

TEST_SUITE("sharding_visualize") {
TEST_CASE("a grid: one device per block, ranges on the margins") {
  CHECK(picture<sl::Spec<"x", "y">>(m22, {7, 5}) ==
        "          cols 0:3  cols 3:5\n"
        "rows 0:4  0         1\n"
        "rows 4:7  2         3\n");
  CHECK(picture<sl::Spec<"y", "x">>(m22, {7, 5}) ==
        "          cols 0:3  cols 3:5\n"
        "rows 0:4  0         2\n"
        "rows 4:7  1         3\n");
}

TEST_CASE("uneven and empty blocks show with their ranges; two axes on one dim") {
  CHECK(picture<sl::Spec<"x", none>>(m41, {2, 3}) ==
        "          cols 0:3\n"
        "rows 0:1  0\n"
        "rows 1:2  1\n"
        "rows 2:2  2\n"
        "rows 2:2  3\n");
  CHECK(picture<sl::Spec<sl::axes<"y", "x">, none>>(m22, {9, 2}) ==
        "          cols 0:2\n"
        "rows 0:3  0\n"
        "rows 3:6  2\n"
        "rows 6:9  1\n"
        "rows 9:9  3\n");
}

TEST_CASE("replicas are listed with commas, the addends of a pending reduction with its operator") {
  CHECK(picture<sl::Spec<none, "y">>(m22, {4, 6}) ==
        "          cols 0:3  cols 3:6\n"
        "rows 0:4  0,2       1,3\n");
  CHECK(picture<sl::Spec<none, "x", sl::partial_sum<"y">>>(m22, {3, 4}) ==
        "          cols 0:2  cols 2:4\n"
        "rows 0:3  0+1       2+3\n"
        "a+b: the block is the sum of these devices' addends (partial over y)\n");
  CHECK(picture<sl::Spec<none, none, sl::partial_max<"x">>>(m22, {2, 2}) ==
        "          cols 0:2\n"
        "rows 0:2  0 max 2,1 max 3\n"
        "a max b: the block is the max of these devices' addends (partial over x)\n");
}

TEST_CASE("1-D, scalars, a 3-D tensor's slice, chosen dims, and bad dims") {
  CHECK(picture<sl::Spec<"y">>(m22, {5}) ==
        "elements 0:3  elements 3:5\n"
        "0,2           1,3\n");
  CHECK(picture<sl::Spec<>>(m22, {}) == "0,1,2,3\n");
  CHECK(picture<sl::Spec<"x", none, "y">>(m22, {4, 3, 6}) ==
        "          cols 0:3  cols 3:6\n"
        "rows 0:2  0         1\n"
        "rows 2:4  2         3\n"
        "(the slice at index 0 of dims 1)\n");
  // Dims 1 and 2 pictured: only the devices whose block holds index 0 of dim 0.
  CHECK(picture<sl::Spec<"x", none, "y">>(m22, {4, 3, 6}, 1, 2) ==
        "           cols 0:3  cols 3:6\n"
        "dim 1 0:3  0         1\n"
        "(the slice at index 0 of dims 0)\n");
  using XY = sl::Spec<"x", "y">;
  CHECK_THROWS_WITH_AS(picture<XY>(m22, {4, 4}, 1, 1),
                       "shardlib: visualize: dims 1 and 1 cannot be pictured for a tensor of rank 2", std::invalid_argument);
  CHECK_THROWS_AS(picture<XY>(m22, {4, 4}, 0, 2), std::invalid_argument);
}

TEST_CASE("the tensor overload: titled with type, shape, spec and mesh; the same on every device") {
  sl::Runtime::threads(4).spmd([](sl::Context& ctx) {
    sl::Mesh<"x", "y"> mesh(ctx, {2, 2});
    auto t = sl::DistributedTensor<float, sl::Mesh<"x", "y">, sl::Spec<"x", "y">>::zeros(mesh, {7, 5});
    CHECK(sl::visualize(t) ==
          "f32[7, 5] Spec<\"x\", \"y\"> on {x: 2, y: 2}\n"
          "          cols 0:3  cols 3:5\n"
          "rows 0:4  0         1\n"
          "rows 4:7  2         3\n");
  });
}
}
