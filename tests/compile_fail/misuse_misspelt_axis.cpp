// A newcomer's attention block with a misspelt axis in one weight's spec: the error says so once,
// and the ops that use the weight say nothing more (they see it replicated; clang also says once
// that the spec is not a constant).
// expect: spec_uses_an_axis_that_is_not_in_the_mesh
// expect-gcc: AxisName{"modle"}
// expect-errors-gcc: 1
// expect-errors-clang: 3
// expect-max-bytes: 12000
#include <shardlib/autodiff.hpp>
namespace sl = shardlib;
using Mesh = sl::Mesh<"data", "model">;
using X = sl::DistributedTensor<float, Mesh, sl::Spec<"data", sl::none, sl::none>>;
#ifdef SHARDLIB_SHOULD_FAIL
using Wq = sl::DistributedTensor<float, Mesh, sl::Spec<sl::none, "modle", sl::none>>;
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
