// Three extents for a spec of two dims.
// expect: shape_has_a_different_number_of_extents_than_the_spec
// expect-gcc: the shape has a different number of extents than the spec has dims
#include <shardlib/tensor.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x">;
using T = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>;
void make(const M& mesh) {
#ifdef SHARDLIB_SHOULD_FAIL
  auto t = T::zeros(mesh, {4, 5, 6});
#else
  auto t = T::zeros(mesh, {4, 5});
#endif
  (void)t;
}
