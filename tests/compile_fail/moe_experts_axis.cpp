// moe with the experts split over an axis that does not split the tokens (GShard places the
// experts on the devices of the tokens).
// expect: the experts live on the devices of the tokens
#include <shardlib/moe.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"data", "model">;
sl::DistributedTensor<float, M, sl::Spec<"data", sl::none>>* x;
sl::DistributedTensor<float, M, sl::Spec<sl::none, sl::none>>* router;
sl::DistributedTensor<float, M, sl::Spec<"model", sl::none, sl::none>>* over_model;
sl::DistributedTensor<float, M, sl::Spec<"data", sl::none, sl::none>>* over_data;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::moe(*x, *router, *over_model, *over_model);
#else
  (void)sl::moe(*x, *router, *over_data, *over_data); (void)over_model;
#endif
}
