// A loop over several tensors whose functor takes the written (first) tensor's element by const&.
// expect: parallel_for_functor_must_take_the_written_element_by_non_const_reference
// expect: must take the first tensor's element by non-const reference
#include <shardlib/tensor.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x">;
using R = sl::DistributedTensor<float, M, sl::Spec<"x">>;
void touch(R& out, const R& in) {
#ifdef SHARDLIB_SHOULD_FAIL
  sl::parallel_for(out, in, [](const sl::Index<1>&, const float& o, float x) { (void)o, (void)x; });
#else
  sl::parallel_for(out, in, [](const sl::Index<1>&, float& o, const float& x) { o = x; });
#endif
}
