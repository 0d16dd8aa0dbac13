// An axis appears at most once per spec.
// expect: spec_uses_an_axis_twice
// expect-gcc: Spec uses an axis twice
// expect-gcc: AxisName{"data"}
#include <shardlib/spec.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using S = shardlib::Spec<"data", shardlib::axes<"model", "data">>;
#else
using S = shardlib::Spec<"data", shardlib::axes<"model">>;
#endif
static_assert(S::rank == 2);
