// More axes than max_mesh_rank (8).
// expect: mesh_has_more_axes_than_max_mesh_rank
// expect-gcc: Mesh has more axes than shardlib::max_mesh_rank
#include <shardlib/mesh.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using M = shardlib::Mesh<"a", "b", "c", "d", "e", "f", "g", "h", "i">;
#else
using M = shardlib::Mesh<"a", "b", "c", "d", "e", "f", "g", "h">;
#endif
static_assert(M::rank >= 8);
