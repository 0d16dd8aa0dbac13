// A tensor on one mesh type converted into a tensor on another.
// expect: tensors_on_different_meshes_cannot_be_resharded_into_each_other
// expect-gcc: tensors on different meshes cannot be resharded into each other
#include <shardlib/tensor.hpp>
namespace sl = shardlib;
using A = sl::Mesh<"x">;
using B = sl::Mesh<"x", "y">;
using TA = sl::DistributedTensor<float, A, sl::Spec<"x", sl::none>>;
using TB = sl::DistributedTensor<float, B, sl::Spec<sl::none, "y">>;
void convert(const TA& a, const TB& b) {
#ifdef SHARDLIB_SHOULD_FAIL
  TB c = a;
#else
  TB c = b;
#endif
  (void)c;
}
