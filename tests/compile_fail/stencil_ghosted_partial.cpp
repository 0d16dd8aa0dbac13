// A ghosted view of a partial-sum tensor: its blocks hold addends, not cells.
// expect: a_partial_tensor_has_no_cells_to_exchange_reshard_it_first
// expect-gcc: ghosted view of a partial tensor
#include <shardlib/stencil.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using P = sl::DistributedTensor<float, M, sl::Spec<"x", sl::partial_sum<"y">>>;
using R = sl::DistributedTensor<float, M, sl::Spec<"x">>;
void touch(const P& p, const R& r) {
#ifdef SHARDLIB_SHOULD_FAIL
  auto g = sl::ghosted(p, {1});
#else
  auto g = sl::ghosted(r, {1});
  (void)p;
#endif
  (void)g;
}
