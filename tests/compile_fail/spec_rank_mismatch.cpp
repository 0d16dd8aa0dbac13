// The spec has 2 dims, the tensor 3.
// expect: spec_rank_does_not_match_tensor_rank
// expect-gcc: Spec's rank (number of entries other than partial<...>) differs from the tensor's rank
// expect-gcc: 2, 3>
#include <shardlib/spec.hpp>
using M = shardlib::Mesh<"data", "model">;
using S = shardlib::Spec<"data", shardlib::none>;
#ifdef SHARDLIB_SHOULD_FAIL
constexpr auto sharding = shardlib::sharding_v<M, S, 3>;
#else
constexpr auto sharding = shardlib::sharding_v<M, S, 2>;
#endif
static_assert(sharding.rank >= 0);
