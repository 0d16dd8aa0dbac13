// einsum subscripts whose output names a label no operand has.
// expect: einsum_subscripts_do_not_parse
// expect-gcc: einsum subscripts do not parse
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x", sl::none>>* a;
F<sl::Spec<sl::none, "y">>* b;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::einsum<"ij,jk->iz">(*a, *b);
#else
  (void)sl::einsum<"ij,jk->ik">(*a, *b);
#endif
}
