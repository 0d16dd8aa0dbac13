// parallel_for over two tensors of different specs: their blocks do not line up.
// expect: loop_over_tensors_of_different_specs
// expect: they must have the same spec
// expect-gcc: loop_over_tensors_of_different_specs<1, shardlib::Spec<shardlib::SpecEntry{0, 0, ""}, shardlib::SpecEntry{0, 0, "x"}>
#include <shardlib/tensor.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x">;
using Rows = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>;
using Cols = sl::DistributedTensor<float, M, sl::Spec<sl::none, "x">>;
void touch(Rows& out, const Rows& rows, const Cols& cols) {
#ifdef SHARDLIB_SHOULD_FAIL
  sl::parallel_for(out, cols, [](const sl::Index<2>&, float& o, float x) { o = x; });
#else
  sl::parallel_for(out, rows, [](const sl::Index<2>&, float& o, float x) { o = x; });
  (void)cols;
#endif
}
