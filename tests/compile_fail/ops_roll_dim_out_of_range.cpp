// roll along dim 2 (a template argument) of a rank-2 tensor.
// expect: op_has_no_sharding_rule_for_these_specs
// expect-gcc: roll: the dim is outside
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x", sl::none>>* a;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::roll<2>(*a, 1);
#else
  (void)sl::roll<1>(*a, 1);
#endif
}
