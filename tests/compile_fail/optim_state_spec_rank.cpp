// An optimizer's state must have the parameter's rank (a rank-1 spec for a matrix's moments).
// expect: optimizer_state_spec_has_another_rank_than_the_parameter
// expect-gcc: an optimizer state spec must have the parameter's rank
#include <shardlib/optim.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"data", "model">;
using W = sl::DistributedTensor<float, M, sl::Spec<sl::none, sl::none>>;
sl::Param<W>* p;
sl::optim::AdamW* opt;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  opt->add<sl::Spec<"data">>(*p);
#else
  opt->add<sl::Spec<"data", sl::none>>(*p);
#endif
}
