// cross_entropy of logits in host memory and targets in another memory space (on a GPU build:
// Kokkos::CudaSpace; here Kokkos::AnonymousSpace, a memory space every Kokkos has).
// expect: op_operands_are_in_different_memory_spaces
// expect-gcc: different memory spaces
#include <shardlib/autodiff.hpp>

#include <cstdint>
namespace sl = shardlib;
using M = sl::Mesh<"x">;
sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>, Kokkos::HostSpace>* z;
sl::DistributedTensor<std::int32_t, M, sl::Spec<"x">, Kokkos::HostSpace>* t;
sl::DistributedTensor<std::int32_t, M, sl::Spec<"x">, Kokkos::AnonymousSpace>* u;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::cross_entropy(*z, *u);
#else
  (void)sl::cross_entropy(*z, *t); (void)u;
#endif
}
