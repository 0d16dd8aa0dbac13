// softmax along dim -1 (dims are 0..rank-1).
// expect: op_has_no_sharding_rule_for_these_specs
// expect-gcc: no sharding rule for this normalisation
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x", sl::none>>* a;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::softmax<-1>(*a);
#else
  (void)sl::softmax<1>(*a);
#endif
}
