// slice along dim 3 of a rank-2 tensor.
// expect: op_has_no_sharding_rule_for_these_specs
// expect-gcc: slice: the dim is outside
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x", sl::none>>* a;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::slice<3>(*a, 0, 1);
#else
  (void)sl::slice<1>(*a, 0, 1);
#endif
}
