// sharding_v's first argument must be a Mesh.
// expect: the first argument must be a shardlib::Mesh<...>
#include <shardlib/spec.hpp>
using S = shardlib::Spec<"data">;
#ifdef SHARDLIB_SHOULD_FAIL
constexpr auto sharding = shardlib::sharding_v<int, S>;
#else
constexpr auto sharding = shardlib::sharding_v<shardlib::Mesh<"data">, S>;
#endif
static_assert(sharding.rank == 1);
