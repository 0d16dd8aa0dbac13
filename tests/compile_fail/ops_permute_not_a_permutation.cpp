// permute<0, 0>: a dim used twice.
// expect: op_has_no_sharding_rule_for_these_specs
// expect-gcc: permute needs a permutation
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x", sl::none>>* a;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::permute<0, 0>(*a);
#else
  (void)sl::permute<1, 0>(*a);
#endif
}
