// einsum subscripts of rank 3 for a rank-2 operand.
// expect: op_has_no_sharding_rule_for_these_specs
// expect-gcc: no sharding rule for this contraction
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
F<sl::Spec<"x", sl::none>>* a;
F<sl::Spec<sl::none, "y">>* b;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::einsum<"ijk,kl->ijl">(*a, *b);
#else
  (void)sl::einsum<"ij,jl->il">(*a, *b);
#endif
}
