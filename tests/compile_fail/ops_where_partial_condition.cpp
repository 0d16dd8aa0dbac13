// where with a condition that holds addends of a pending sum.
// expect: where_condition_has_a_pending_reduction_reshard_it_first
// expect-gcc: where's condition holds addends of a pending reduction
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
sl::DistributedTensor<int, M, sl::Spec<"x", sl::partial_sum<"y">>>* pc;
sl::DistributedTensor<int, M, sl::Spec<"x">>* c;
sl::DistributedTensor<float, M, sl::Spec<"x">>* a;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::where(*pc, *a, *a);
#else
  (void)sl::where(*c, *a, *a);
  (void)pc;
#endif
}
