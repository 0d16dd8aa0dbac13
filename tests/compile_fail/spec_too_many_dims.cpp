// More dims than max_tensor_rank (8).
// expect: spec_has_more_dims_than_max_tensor_rank
// expect-gcc: Spec has more dims than shardlib::max_tensor_rank
#include <shardlib/spec.hpp>
using shardlib::none;
#ifdef SHARDLIB_SHOULD_FAIL
using S = shardlib::Spec<none, none, none, none, none, none, none, none, none>;
#else
using S = shardlib::Spec<none, none, none, none, none, none, none, none>;
#endif
static_assert(S::rank >= 8);
