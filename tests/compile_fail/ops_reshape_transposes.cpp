// A reshape pattern that reorders dims (that is a permute).
// expect: reshape_pattern_does_not_parse
// expect-gcc: the reshape pattern does not parse
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x", sl::none>>* a;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::reshape<"a b -> b a">(*a);
#else
  (void)sl::reshape<"a b -> (a b)">(*a);
#endif
}
