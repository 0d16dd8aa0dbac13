// parallel_reduce over two tensors of different specs (a dot product needs one spec: reshard first).
// expect: loop_over_tensors_of_different_specs
// expect: they must have the same spec
#include <shardlib/tensor.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using A = sl::DistributedTensor<double, M, sl::Spec<"x">>;
using B = sl::DistributedTensor<double, M, sl::Spec<"y">>;
double dot(const A& a, const A& a2, const B& b) {
#ifdef SHARDLIB_SHOULD_FAIL
  return sl::parallel_reduce(a, b, [](const sl::Index<1>&, double x, double y) { return x * y; });
#else
  (void)b;
  return sl::parallel_reduce(a, a2, [](const sl::Index<1>&, double x, double y) { return x * y; });
#endif
}
