// An axis cannot both split a dim and carry a pending reduction.
// expect: spec_uses_an_axis_twice
// expect-gcc: AxisName{"model"}
#include <shardlib/spec.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using S = shardlib::Spec<"model", shardlib::partial_sum<"model">>;
#else
using S = shardlib::Spec<"model", shardlib::partial_sum<"data">>;
#endif
static_assert(S::rank == 1);
