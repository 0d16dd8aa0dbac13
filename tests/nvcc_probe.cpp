// SPDX-License-Identifier: Apache-2.0
// Compiled by nvcc (-x cu) in tests/nvcc_headers.py: nvcc re-emits class-type template
// arguments as brace lists of their members, which breaks structural types that lack a
// constructor taking all members. This uses every kind of template argument we take.
#include <shardlib/mesh.hpp>
#include <shardlib/sharding/block.hpp>
#include <shardlib/spec.hpp>
#include <shardlib/version.hpp>

namespace sl = shardlib;
using M = sl::Mesh<"data", "model">;
using S = sl::Spec<sl::axes<"model", "data">, sl::none, sl::partial_max<"expert">>;
using P = sl::Spec<"data", sl::partial_sum<"model">>;
static_assert(M::index_of<"model">() == 1);
static_assert(S::rank == 2);
static_assert(sl::sharding_v<M, P>.partial == sl::AxisList{1});
static_assert(sl::sharding_v<M, sl::Spec<"model", sl::none>>.dims[0] == sl::AxisList{1});
static_assert(sl::shard_box(sl::sharding_v<M, P>, sl::MeshShape(M::axis_names, std::array<int, 2>{4, 2}), {10}, 5).offset[0] == 6);

int main() {
  M mesh({4, 2}, 8);
  return mesh.coords(5)[1] == 1 ? 0 : 1;
}
