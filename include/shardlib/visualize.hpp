// SPDX-License-Identifier: Apache-2.0
/// @file
/// `sl::visualize(t)`: which device holds which block of a tensor, as text (the picture is
/// described in sharding/visualize.hpp). No communication: every device can print it.
///
/// ```
/// if (ctx.device() == 0) std::fputs(sl::visualize(t).c_str(), stdout);
/// ```
#pragma once
#include <shardlib/sharding/visualize.hpp>
#include <shardlib/tensor.hpp>

#include <string>

namespace shardlib {

/// The picture of `t`'s distribution, titled with its element type, shape, spec and mesh
/// (`f32[7, 5] Spec<"x", "y"> on {x: 2, y: 2}`); dims `row_dim` and `col_dim` as in the pure
/// overload.
template <class T, class M, class S, class Mem>
std::string visualize(const DistributedTensor<T, M, S, Mem>& t, int row_dim = -2, int col_dim = -2) {
  const std::string title = std::string(coll::name(coll::dtype_of<T>())) + detail::shape_text(t.shape()) + " " +
                            S::value.to_string() + " on " + t.mesh().to_string();
  return visualize(DistributedTensor<T, M, S, Mem>::sharding, t.mesh().shape(), t.shape(), title, row_dim, col_dim);
}

}  // namespace shardlib
