// grad() of a Var that is not a Param (only parameters keep a gradient).
// expect: grad_is_asked_of_a_var_that_is_not_a_param
// expect-gcc: grad() is asked of a Var that is not a Param
#include <shardlib/autodiff.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using F = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>;
sl::Var<F>* v;
sl::Param<F>* p;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  v->grad();
#else
  (void)p->grad(); (void)v;
#endif
}
