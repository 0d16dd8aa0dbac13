// take with partial-sum indices (addends are not indices).
// expect: op_has_no_sharding_rule_for_these_specs
// expect-gcc: no sharding rule for take
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"y", sl::none>>* table;
sl::DistributedTensor<int, M, sl::Spec<"x", sl::partial_sum<"y">>>* pids;
sl::DistributedTensor<int, M, sl::Spec<"x">>* ids;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::take<0>(*table, *pids);
#else
  (void)sl::take<0>(*table, *ids); (void)pids;
#endif
}
