// attention of a q that is not [batch, seq, heads, head dim] (a [B, S, D] tensor before its
// heads were split off).
// expect: attention_operand_is_not_rank_4_batch_seq_heads_head_dim
// expect-gcc: q is not [batch, seq, heads, head dim]
#include <shardlib/attention.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x">;
sl::DistributedTensor<float, M, sl::Spec<"x", sl::none, sl::none>>* q3;
sl::DistributedTensor<float, M, sl::Spec<"x", sl::none, sl::none, sl::none>>* q;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::attention(*q3, *q, *q);
#else
  (void)sl::attention(*q, *q, *q); (void)q3;
#endif
}
