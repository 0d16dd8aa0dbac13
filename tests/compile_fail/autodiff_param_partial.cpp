// A Param cannot be partial: its blocks would be addends, not the value being trained.
// expect: a_param_cannot_have_a_partial_spec
// expect-gcc: a Param cannot have a partial spec
#include <shardlib/autodiff.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using P = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none, sl::partial_sum<"y">>>;
using F = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>;
P* t;
F* f;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  sl::Param<P> p(*t);
#else
  sl::Param<F> p(*f); (void)t;
#endif
}
