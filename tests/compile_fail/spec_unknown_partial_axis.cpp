// A partial clause names an axis that is not in the mesh.
// expect: spec_uses_an_axis_that_is_not_in_the_mesh
// expect-gcc: AxisName{"expert"}
#include <shardlib/spec.hpp>
using M = shardlib::Mesh<"data", "model">;
#ifdef SHARDLIB_SHOULD_FAIL
using S = shardlib::Spec<"data", shardlib::partial_sum<"expert">>;
#else
using S = shardlib::Spec<"data", shardlib::partial_sum<"model">>;
#endif
constexpr auto sharding = shardlib::sharding_v<M, S>;
static_assert(sharding.rank == 1);
