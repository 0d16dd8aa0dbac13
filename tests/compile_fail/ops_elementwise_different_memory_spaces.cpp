// An elementwise op on a tensor in host memory and one in another memory space (on a GPU build:
// Kokkos::CudaSpace; here Kokkos::AnonymousSpace, a memory space every Kokkos has).
// expect: op_operands_are_in_different_memory_spaces
// expect-gcc: different memory spaces
#include <shardlib/ops.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x">;
sl::DistributedTensor<float, M, sl::Spec<"x">, Kokkos::HostSpace>* a;
sl::DistributedTensor<float, M, sl::Spec<"x">, Kokkos::AnonymousSpace>* b;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)(*a + *b);
#else
  (void)(*a + *a); (void)b;
#endif
}
