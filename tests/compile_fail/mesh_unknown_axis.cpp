// Asking a mesh for an axis it does not have.
// expect: axis_is_not_in_the_mesh
// expect-gcc: axis is not in the mesh
// expect-gcc: AxisName{"pipe"}
#include <shardlib/mesh.hpp>
using M = shardlib::Mesh<"data", "model">;
#ifdef SHARDLIB_SHOULD_FAIL
constexpr int i = M::index_of<"pipe">();
#else
constexpr int i = M::index_of<"model">();
#endif
static_assert(i >= 0);
