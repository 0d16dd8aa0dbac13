// A pending product: partial clauses are sum, max or min (no sharding rule knows a pending prod).
// expect: spec_partial_clause_must_be_sum_max_or_min
// expect: partial clause over an op other than sum, max or min
#include <shardlib/spec.hpp>
namespace sl = shardlib;
#ifdef SHARDLIB_SHOULD_FAIL
using S = sl::Spec<"x", sl::partial<sl::ReduceOp::prod, "y">>;
#else
using S = sl::Spec<"x", sl::partial<sl::ReduceOp::max, "y">>;
#endif
static_assert(S::rank == 1);
