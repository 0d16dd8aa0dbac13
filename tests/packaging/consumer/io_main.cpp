// An outside program using shardlib's checkpoints (<shardlib/io.hpp>, HDF5): built through the
// shardlib-io dependency (Meson, pkg-config) and the shardlib::io target (CMake).
#include <shardlib/io.hpp>
#include <shardlib/shardlib.hpp>

#include <cstdio>

namespace sl = shardlib;
using M = sl::Mesh<"d">;

int main(int argc, char** argv) {
  auto rt = sl::Runtime::from_args(argc, argv, 2);
  bool ok = true;
  rt.spmd([&](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices()});
    auto t = sl::DistributedTensor<float, M, sl::Spec<"d", sl::none>>::iota(mesh, {4, 3});
    sl::io::save("consumer_io.h5", {{"t", t}});
    auto r = sl::io::load<sl::DistributedTensor<float, M, sl::Spec<sl::none, "d">>>(mesh, "consumer_io.h5", "t");
    const bool same = r.to_host() == t.to_host();  // collective: every device calls it
    if (ctx.device() == 0) ok = same;
  });
  std::printf("consumer_io: checkpoint %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
