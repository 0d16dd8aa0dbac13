// where with a condition of floating-point elements.
// expect: where_condition_needs_integer_elements
// expect-gcc: where needs a condition of integer elements
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
sl::DistributedTensor<float, M, sl::Spec<"x">>* a;
sl::DistributedTensor<int, M, sl::Spec<"x">>* c;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::where(*a, *a, *a);
#else
  (void)sl::where(*c, *a, *a);
#endif
}
