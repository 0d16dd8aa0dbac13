// A reduction along dim 2 of a rank-2 tensor.
// expect: op_has_no_sharding_rule_for_these_specs
// expect-gcc: no sharding rule for this reduction
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x", sl::none>>* a;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::sum<2>(*a);
#else
  (void)sl::sum<1>(*a);
#endif
}
