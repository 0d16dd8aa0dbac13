// stencil_for into a tensor of another spec: its blocks are not the input's.
// expect: stencil_for_needs_output_and_input_of_one_mesh_and_spec
// expect-gcc: the output needs the input's spec
#include <shardlib/stencil.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using A = sl::DistributedTensor<float, M, sl::Spec<"x", "y">>;
using Bt = sl::DistributedTensor<float, M, sl::Spec<"y", "x">>;
void touch(A& in, A& out, Bt& other) {
  auto g = sl::ghosted(in, {1, 1});
  auto f = [](const sl::Index<2>&, const auto& nb) { return nb(1, 0); };
#ifdef SHARDLIB_SHOULD_FAIL
  sl::stencil_for(other, g, f);
  (void)out;
#else
  sl::stencil_for(out, g, f);
  (void)other;
#endif
}
