// A mesh names the same axis twice.
// expect: mesh_names_an_axis_twice
// expect-gcc: Mesh names the same axis twice
// expect-gcc: AxisName{"data"}
#include <shardlib/mesh.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using M = shardlib::Mesh<"data", "model", "data">;
#else
using M = shardlib::Mesh<"data", "model">;
#endif
static_assert(M::rank >= 2);
