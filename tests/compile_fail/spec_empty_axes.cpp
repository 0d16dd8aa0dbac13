// axes<> with no axis (write `none` for a replicated dim).
// expect: axes<...> and partial<...> need at least one axis name
#include <shardlib/spec.hpp>
#ifdef SHARDLIB_SHOULD_FAIL
using S = shardlib::Spec<"data", shardlib::axes<>>;
#else
using S = shardlib::Spec<"data", shardlib::none>;
#endif
static_assert(S::rank == 2);
