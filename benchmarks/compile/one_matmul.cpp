// SPDX-License-Identifier: Apache-2.0
// Compile-time benchmark: one sharded matmul (column-parallel), what a small user program costs.
#include <shardlib/shardlib.hpp>

namespace sl = shardlib;

int main(int argc, char** argv) {
  auto rt = sl::Runtime::from_args(argc, argv, 2);
  rt.spmd([](sl::Context& ctx) {
    sl::Mesh<"data", "model"> mesh(ctx, {1, ctx.num_devices()});
    using M = decltype(mesh);
    auto x = sl::DistributedTensor<float, M, sl::Spec<"data", sl::none>>::random(mesh, {64, 32}, 1);
    auto w = sl::DistributedTensor<float, M, sl::Spec<sl::none, "model">>::random(mesh, {32, 16}, 2);
    auto y = sl::matmul(x, w);
    return static_cast<void>(y.to_host());
  });
  return 0;
}
