// matmul of a rank-1 tensor (numpy would treat it as a vector; shardlib asks for einsum).
// expect: op_has_no_sharding_rule_for_these_specs
// expect-gcc: matmul needs rank >= 2 operands
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x">>* a;
F<sl::Spec<sl::none, "y">>* b;
F<sl::Spec<"x", sl::none>>* c;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::matmul(*a, *b);
#else
  (void)sl::matmul(*c, *b); (void)a;
#endif
}
