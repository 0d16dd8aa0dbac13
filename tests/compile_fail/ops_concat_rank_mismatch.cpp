// concat of a rank-2 and a rank-1 tensor.
// expect: op_has_no_sharding_rule_for_these_specs
// expect-gcc: concat needs operands of one rank
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x", sl::none>>* a;
F<sl::Spec<"x">>* b;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::concat<0>(*a, *b);
#else
  (void)sl::concat<0>(*a, *a); (void)b;
#endif
}
