// The seed of backward(y, seed) must have y's gradient spec (y's spec without partial clause).
// expect: backward_seed_has_another_spec_than_the_gradient
// expect-gcc: must have y's gradient spec
#include <shardlib/autodiff.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using P = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none, sl::partial_sum<"y">>>;
using G = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>;
using Other = sl::DistributedTensor<float, M, sl::Spec<sl::none, "x">>;
sl::Var<P>* v;
G* seed;
Other* other;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  sl::backward(*v, *other);
#else
  sl::backward(*v, *seed); (void)other;
#endif
}
