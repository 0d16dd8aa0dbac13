// A newcomer's block with its input in host memory and a weight in another memory space (on a
// GPU build: Kokkos::CudaSpace; here Kokkos::AnonymousSpace, which every Kokkos has): the
// first op that meets both says so.
// expect: op_operands_are_in_different_memory_spaces
// expect-errors: 1
// expect-max-bytes: 12000
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using Mesh = sl::Mesh<"data", "model">;
using X = sl::DistributedTensor<float, Mesh, sl::Spec<"data", sl::none>, Kokkos::HostSpace>;
#ifdef SHARDLIB_SHOULD_FAIL
using W = sl::DistributedTensor<float, Mesh, sl::Spec<sl::none, "model">, Kokkos::AnonymousSpace>;
#else
using W = sl::DistributedTensor<float, Mesh, sl::Spec<sl::none, "model">, Kokkos::HostSpace>;
#endif
X* x;
W* w;
void block() {
  auto h = sl::gelu(sl::matmul(*x, *w));
  (void)sl::sum<1>(sl::softmax<1>(h * 2.0f));
}
