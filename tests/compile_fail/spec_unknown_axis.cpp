// A spec names an axis that is not in the mesh.
// expect: spec_uses_an_axis_that_is_not_in_the_mesh
// expect-gcc: Spec uses an axis that is not in the Mesh
// expect-gcc: AxisName{"pipe"}
#include <shardlib/spec.hpp>
using M = shardlib::Mesh<"data", "model">;
#ifdef SHARDLIB_SHOULD_FAIL
using S = shardlib::Spec<"pipe", shardlib::none>;
#else
using S = shardlib::Spec<"data", shardlib::none>;
#endif
constexpr auto sharding = shardlib::sharding_v<M, S>;
static_assert(sharding.rank == 2);
