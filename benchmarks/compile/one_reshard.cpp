// SPDX-License-Identifier: Apache-2.0
// Compile-time benchmark: one reshard (rows split to columns split: an all_to_all).
#include <shardlib/shardlib.hpp>

namespace sl = shardlib;

int main(int argc, char** argv) {
  auto rt = sl::Runtime::from_args(argc, argv, 2);
  rt.spmd([](sl::Context& ctx) {
    sl::Mesh<"x"> mesh(ctx, {ctx.num_devices()});
    using M = decltype(mesh);
    auto a = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>::random(mesh, {64, 32}, 1);
    sl::DistributedTensor<float, M, sl::Spec<sl::none, "x">> b = a;
    return static_cast<void>(b.to_host());
  });
  return 0;
}
