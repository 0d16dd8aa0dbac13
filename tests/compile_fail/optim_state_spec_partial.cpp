// Optimizer state is a value, not addends: its spec cannot be partial.
// expect: optimizer_state_spec_cannot_be_partial
// expect-gcc: an optimizer state spec cannot be partial
#include <shardlib/optim.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"data", "model">;
using W = sl::DistributedTensor<float, M, sl::Spec<sl::none, sl::none>>;
sl::Param<W>* p;
sl::optim::SGD* opt;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  opt->add<sl::Spec<"data", sl::none, sl::partial_sum<"model">>>(*p);
#else
  opt->add<sl::Spec<"data", sl::none>>(*p);
#endif
}
