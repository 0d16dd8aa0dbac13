// A newcomer's attention block with a spec of 2 dims for a weight of 3: the shape's extents say
// so, and the one einsum that takes the weight (a rank-2 operand for 3 subscripts); nothing
// more (neither the ops after it nor the backward's einsums).
// expect: shape_has_a_different_number_of_extents_than_the_spec
// expect: op_has_no_sharding_rule_for_these_specs
// expect-errors: 2
// expect-max-bytes: 16000
#include <shardlib/autodiff.hpp>
namespace sl = shardlib;
using Mesh = sl::Mesh<"data", "model">;
using X = sl::DistributedTensor<float, Mesh, sl::Spec<"data", sl::none, sl::none>>;
#ifdef SHARDLIB_SHOULD_FAIL
using Wq = sl::DistributedTensor<float, Mesh, sl::Spec<sl::none, "model">>;
#else
using Wq = sl::DistributedTensor<float, Mesh, sl::Spec<sl::none, "model", sl::none>>;
#endif
void block(const Mesh& mesh) {
  auto x = X::random(mesh, {2, 8, 16}, 1);
  sl::Param wq(Wq::random(mesh, {16, 4, 4}, 2));
  auto q = sl::einsum<"bsd,dhk->bshk">(x, wq);
  auto s = sl::einsum<"bshk,bthk->bhst">(q, q);
  sl::backward(sl::sum_all(sl::softmax<3>(s)));
}
