// An axis name longer than the fixed string holds (31 characters).
// expect: axis name longer than shardlib::max_axis_name_length (31) characters
#include <shardlib/mesh.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using M = shardlib::Mesh<"a_name_that_is_much_too_long_for_a_mesh_axis">;
#else
using M = shardlib::Mesh<"a_name_that_is_just_short_enoug">;
#endif
static_assert(M::rank == 1);
