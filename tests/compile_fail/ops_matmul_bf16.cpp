// matmul of bf16 tensors (products, reductions, norms and losses take float32 for now).
// expect: op_does_not_take_f16_or_bf16_cast_to_float_first
// expect-gcc: cast<float>() first
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
template <class T>
using Ten = sl::DistributedTensor<T, M, sl::Spec<"x", sl::none>>;
Ten<sl::bf16>* a;
Ten<sl::bf16>* b;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::matmul(*a, *b);
#else
  (void)sl::matmul(sl::cast<float>(*a), sl::cast<float>(*b));
#endif
}
