// A partial tensor holds addends, not values: saving it is refused at compile time.
// expect: a_partial_tensor_cannot_be_saved_reshard_it_to_a_spec_without_partial_first
// expect-gcc: reshard it to a spec without partial first
#include <shardlib/io.hpp>
namespace sl = shardlib;
using M = sl::Mesh<"x", "y">;
using P = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none, sl::partial_sum<"y">>>;
using F = sl::DistributedTensor<float, M, sl::Spec<"x", sl::none>>;
P* p;
F* f;
void use() {
#ifdef SHARDLIB_SHOULD_FAIL
  sl::io::save("x.h5", {{"p", *p}});
#else
  sl::io::save("x.h5", {{"f", *f}}); (void)p;
#endif
}
