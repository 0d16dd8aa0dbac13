// An empty axis name.
// expect: an axis name must not be empty
#include <shardlib/mesh.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using M = shardlib::Mesh<"data", "">;
#else
using M = shardlib::Mesh<"data", "x">;
#endif
static_assert(M::rank == 2);
