// A tensor of a non-arithmetic element type.
// expect: tensor_element_type_must_be_arithmetic
// expect-gcc: the element type of a DistributedTensor must be arithmetic
#include <shardlib/tensor.hpp>
#include <string>
using M = shardlib::Mesh<"x">;
using S = shardlib::Spec<"x">;
#ifdef SHARDLIB_SHOULD_FAIL
using T = shardlib::DistributedTensor<std::string, M, S>;
#else
using T = shardlib::DistributedTensor<float, M, S>;
#endif
static_assert(T::rank == 1);
