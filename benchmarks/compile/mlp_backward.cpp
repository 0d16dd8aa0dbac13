// SPDX-License-Identifier: Apache-2.0
// Compile-time benchmark: the gradient of a data-parallel two-layer MLP (<shardlib/autodiff.hpp>:
// forward on Params, backward, the gradients), what a small training program costs.
#include <shardlib/autodiff.hpp>

namespace sl = shardlib;

int main(int argc, char** argv) {
  auto rt = sl::Runtime::from_args(argc, argv, 2);
  rt.spmd([](sl::Context& ctx) {
    sl::Mesh<"data", "model"> mesh(ctx, {ctx.num_devices(), 1});
    using M = decltype(mesh);
    using Rep = sl::Spec<sl::none, sl::none>;
    auto x = sl::DistributedTensor<float, M, sl::Spec<"data", sl::none>>::random(mesh, {64, 32}, 1);
    auto y = sl::DistributedTensor<float, M, sl::Spec<"data", sl::none>>::random(mesh, {64, 8}, 2);
    sl::Param w1(sl::DistributedTensor<float, M, Rep>::random(mesh, {32, 16}, 3));
    sl::Param w2(sl::DistributedTensor<float, M, Rep>::random(mesh, {16, 8}, 4));
    sl::backward(sl::mse_loss(sl::matmul(sl::gelu(sl::matmul(x, w1)), w2), y));
    return static_cast<void>(w1.grad().to_host());
  });
  return 0;
}
