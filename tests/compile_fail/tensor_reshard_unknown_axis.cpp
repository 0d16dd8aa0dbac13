// reshard to a spec that names an axis the mesh does not have.
// expect: spec_uses_an_axis_that_is_not_in_the_mesh
// expect-gcc: AxisName{"z"}
#include <shardlib/tensor.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using T = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>;
void move(const T& t) {
#ifdef SHARDLIB_SHOULD_FAIL
  auto u = sl::reshard<sl::Spec<"z", sl::none>>(t);
#else
  auto u = sl::reshard<sl::Spec<"y", sl::none>>(t);
#endif
  (void)u;
}
