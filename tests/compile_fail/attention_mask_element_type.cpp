// attention of bf16 tensors with a float32 mask: the mask is added to the scores in q's type.
// expect: attention_mask_is_a_rank_2_tensor_of_qs_element_type_mesh_and_memory
// expect-gcc: the mask is a [Sq, Sk] tensor of q's element type
#include <shardlib/attention.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x">;
sl::DistributedTensor<sl::bf16, M, sl::Spec<"x", sl::none, sl::none, sl::none>>* q;
sl::DistributedTensor<float, M, sl::Spec<sl::none, sl::none>>* fmask;
sl::DistributedTensor<sl::bf16, M, sl::Spec<sl::none, sl::none>>* mask;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::attention(*q, *q, *q, *fmask);
#else
  (void)sl::attention(*q, *q, *q, *mask); (void)fmask;
#endif
}
