// moe with each expert's hidden dim F split over the axis that splits the tokens (tensor
// parallelism of the experts splits F over an axis the tokens are replicated over).
// expect: must not be split over an axis that splits x's tokens
#include <shardlib/moe.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"data", "model">;
sl::DistributedTensor<float, M, sl::Spec<"data", sl::none>>* x;
sl::DistributedTensor<float, M, sl::Spec<sl::none, sl::none>>* router;
sl::DistributedTensor<float, M, sl::Spec<sl::none, sl::none, "data">>* hidden_over_data;
sl::DistributedTensor<float, M, sl::Spec<sl::none, sl::none, "model">>* hidden_over_model;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  (void)sl::moe(*x, *router, *hidden_over_data, *hidden_over_model);
#else
  (void)sl::moe(*x, *router, *hidden_over_model, *hidden_over_model); (void)hidden_over_data;
#endif
}
