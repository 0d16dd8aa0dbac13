// SPDX-License-Identifier: Apache-2.0
// Random shardings for the property tests (the same draws on every device for a seed).
#pragma once

#include <shardlib/mesh.hpp>
#include <shardlib/spec.hpp>

#include <array>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace shardlib::test {

struct Rng {
  std::mt19937_64 g;
  int below(int n) { return static_cast<int>(g() % static_cast<std::uint64_t>(n)); }
};

/// Each of `mesh_rank` axes, in random order, splits a random dim (appended: its position in
/// the dim's list is random too), replicates, or, with `allow_partial`, is partial; the op of a
/// partial sharding is random.
inline Sharding random_sharding(Rng& r, int mesh_rank, int rank, bool allow_partial) {
  Sharding s;
  s.rank = rank;
  std::array<int, 8> order{0, 1, 2, 3, 4, 5, 6, 7};
  for (int i = mesh_rank - 1; i > 0; --i) std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(r.below(i + 1))]);
  for (int i = 0; i < mesh_rank; ++i) {
    const int a = order[static_cast<std::size_t>(i)];
    const int where = r.below(rank + 2);  // a dim, replicated, or partial
    if (where < rank) s.dims[static_cast<std::size_t>(where)].push_back(a);
    else if (where == rank + 1 && allow_partial) s.partial.push_back(a);
  }
  constexpr ReduceOp partial_ops[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::min};  // what a partial clause may pend
  s.op = s.partial.empty() ? ReduceOp::sum : partial_ops[r.below(3)];
  return s;
}

/// A mesh of 1 to 3 axes named a, b, c whose sizes multiply to `devices` (each a random divisor
/// of what is left; the last takes the rest).
inline MeshShape random_mesh(Rng& r, int devices) {
  static const AxisName names[] = {"a", "b", "c"};
  const int mesh_rank = 1 + r.below(3);
  std::vector<int> sizes;
  int left = devices;
  for (int i = 0; i < mesh_rank - 1; ++i) {
    std::vector<int> divisors;
    for (int d = 1; d <= left; ++d)
      if (left % d == 0) divisors.push_back(d);
    sizes.push_back(divisors[static_cast<std::size_t>(r.below(static_cast<int>(divisors.size())))]);
    left /= sizes.back();
  }
  sizes.push_back(left);
  return MeshShape(detail::ArrayRef<AxisName>(names, static_cast<std::size_t>(mesh_rank)), sizes);
}

}  // namespace shardlib::test
