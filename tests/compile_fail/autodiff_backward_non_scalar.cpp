// backward(y) from a y that is not a scalar needs a seed gradient.
// expect: backward_without_a_seed_needs_a_scalar
// expect-gcc: without a seed needs a scalar
#include <shardlib/autodiff.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using F = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>;
sl::Var<F>* v;
F* seed;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  sl::backward(*v);
#else
  sl::backward(*v, *seed);
#endif
}
