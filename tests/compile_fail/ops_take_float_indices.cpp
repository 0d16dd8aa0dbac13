// take with float indices.
// expect: take_needs_integer_indices
// expect-gcc: take needs integer indices
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"y", sl::none>>* table;
F<sl::Spec<"x">>* fids;
sl::DistributedTensor<int, M, sl::Spec<"x">>* ids;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::take<0>(*table, *fids);
#else
  (void)sl::take<0>(*table, *ids); (void)fids;
#endif
}
