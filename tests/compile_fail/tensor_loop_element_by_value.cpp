// parallel_for's functor takes the written element by value: its writes would be lost.
// expect: parallel_for_functor_must_take_the_written_element_by_non_const_reference
// expect: must take the first tensor's element by non-const reference
#include <shardlib/tensor.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x">;
using R = sl::DistributedTensor<double, M, sl::Spec<"x", sl::none>>;
void touch(R& r) {
#ifdef SHARDLIB_SHOULD_FAIL
  sl::parallel_for(r, [](sl::Index<2>, double v) { v = 1; });
#else
  sl::parallel_for(r, [](sl::Index<2>, double& v) { v = 1; });
#endif
}
