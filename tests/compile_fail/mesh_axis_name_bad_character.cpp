// Axis names are made of [A-Za-z0-9_.-]; ',' and ':' are reserved.
// expect: axis_name_may_only_use_letters_digits_underscore_dot_or_dash
#include <shardlib/mesh.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using M = shardlib::Mesh<"data,model">;
#else
using M = shardlib::Mesh<"data.model">;
#endif
static_assert(M::rank == 1);
