// A mesh needs at least one axis.
// expect: Mesh needs at least one axis name
#include <shardlib/mesh.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using M = shardlib::Mesh<>;
#else
using M = shardlib::Mesh<"x">;
#endif
static_assert(M::rank <= 1);
