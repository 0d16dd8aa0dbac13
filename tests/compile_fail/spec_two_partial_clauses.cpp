// At most one partial clause.
// expect: spec_has_more_than_one_partial_clause
// expect-gcc: Spec has more than one partial clause
#include <shardlib/spec.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using S = shardlib::Spec<"data", shardlib::partial_sum<"model">, shardlib::partial_max<"pipe">>;
#else
using S = shardlib::Spec<"data", shardlib::partial_sum<"model", "pipe">>;
#endif
static_assert(S::rank == 1);
