// parallel_for over a partial-sum tensor: its blocks hold addends, not elements.
// expect: loop_over_a_partial_tensor_reshard_it_first
// expect-gcc: parallel_for on a partial tensor
#include <shardlib/tensor.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using P = sl::DistributedTensor<float, M, sl::Spec<"x", sl::partial_sum<"y">>>;
using R = sl::DistributedTensor<float, M, sl::Spec<"x">>;
void touch(P& p, R& r) {
#ifdef SHARDLIB_SHOULD_FAIL
  sl::parallel_for(p, [](const sl::Index<1>&, float& v) { v = 1; });
#else
  sl::parallel_for(r, [](const sl::Index<1>&, float& v) { v = 1; });
  (void)p;
#endif
}
