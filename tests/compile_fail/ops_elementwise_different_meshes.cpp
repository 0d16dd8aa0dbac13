// An elementwise op on tensors of two mesh types.
// expect: op_operands_are_on_different_meshes
// expect-gcc: different mesh types
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class S>
using F = sl::DistributedTensor<float, M, S>;
using N = sl::Mesh<"x">;
F<sl::Spec<"x">>* a;
sl::DistributedTensor<float, N, sl::Spec<"x">>* b;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)(*a + *b);
#else
  (void)(*a + *a); (void)b;
#endif
}
