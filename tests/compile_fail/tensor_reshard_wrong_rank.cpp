// reshard to a spec of another rank.
// expect: reshard_changes_the_rank
// expect-gcc: a reshard cannot change the rank of a tensor
#include <shardlib/tensor.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using T = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>;
void move(const T& t) {
#ifdef SHARDLIB_SHOULD_FAIL
  auto u = sl::reshard<sl::Spec<"y">>(t);
#else
  auto u = sl::reshard<sl::Spec<"y", sl::none>>(t);
#endif
  (void)u;
}
