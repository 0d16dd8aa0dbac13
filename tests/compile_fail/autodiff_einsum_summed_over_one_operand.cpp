// einsum whose label is summed over one operand alone ("ij,jk->k": i) has no backward einsum.
// expect: einsum_label_summed_over_one_operand_is_not_differentiable
// expect-gcc: summed over one operand alone is not differentiable
#include <shardlib/autodiff.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using F = sl::DistributedTensor<float, M, sl::Spec<sl::none, sl::none>>;
sl::Param<F>* a;
F* b;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::einsum<"ij,jk->k">(*a, *b);
#else
  (void)sl::einsum<"ij,jk->ik">(*a, *b);
#endif
}
