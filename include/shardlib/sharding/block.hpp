// SPDX-License-Identifier: Apache-2.0
/// @file
/// Block distribution: which block of a global tensor each device holds.
///
/// A dim of extent E split into P parts is cut as torch.chunk cuts it: chunk = ceil(E / P),
/// part i covers [min(i·chunk, E), min((i+1)·chunk, E)), so trailing parts may be smaller or
/// empty. A dim split over several mesh axes (major to minor) has as many parts as their sizes
/// multiply to, and a device's part is its group rank along those axes. Mesh axes that split
/// no dim replicate the block; partial axes hold addends of the same block.
///
/// Pure rules: no Kokkos, no communicator, no allocation outside error messages. Every
/// function is constexpr, so the typed API evaluates it at compile time and a runtime-spec
/// tensor calls the very same code.
#pragma once

#include <shardlib/detail/array_ref.hpp>
#include <shardlib/detail/text.hpp>
#include <shardlib/mesh.hpp>
#include <shardlib/spec.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace shardlib {

/// A half-open range [offset, offset + size) of one dim.
struct BlockRange {
  std::int64_t offset = 0;
  std::int64_t size = 0;
  friend constexpr bool operator==(const BlockRange&, const BlockRange&) = default;
};

/// Part `index` of a dim of `extent` cut into `parts` blocks (torch.chunk semantics, see the
/// file comment). Empty trailing parts sit at offset `extent`. Throws std::invalid_argument
/// when `extent < 0` or `parts < 1`, std::out_of_range when `index` is outside [0, parts).
constexpr BlockRange block_of(std::int64_t extent, int parts, int index) {
  if (extent < 0)
    throw std::invalid_argument("shardlib: block_of: extent " + detail::to_text(extent) +
                                " is negative; extents must be >= 0");
  if (parts < 1)
    throw std::invalid_argument("shardlib: block_of: cannot cut extent " + detail::to_text(extent) + " into " +
                                detail::to_text(parts) + " parts; parts must be >= 1");
  if (index < 0 || index >= parts)
    throw std::out_of_range("shardlib: block_of: part " + detail::to_text(index) + " is outside 0.." +
                            detail::to_text(parts - 1) + " (extent " + detail::to_text(extent) + " in " +
                            detail::to_text(parts) + " parts)");
  const std::int64_t chunk = extent / parts + (extent % parts != 0 ? 1 : 0);
  // min(i * chunk, extent) without overflow: i * chunk <= extent exactly when i <= extent / chunk.
  auto bound = [&](std::int64_t i) { return chunk == 0 || i > extent / chunk ? extent : i * chunk; };
  const std::int64_t begin = bound(index);
  return {begin, bound(std::int64_t{index} + 1) - begin};
}

/// The block of a global tensor one device holds: per dim an offset and an extent, in global
/// indices. Entries past `rank` are unused (zero when made by shard_box).
struct ShardBox {
  int rank = 0;
  std::array<std::int64_t, max_tensor_rank> offset{};
  std::array<std::int64_t, max_tensor_rank> extent{};

  /// Number of elements in the box (1 for rank 0; 0 when any extent is 0).
  constexpr std::int64_t num_elements() const noexcept {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= extent[static_cast<std::size_t>(d)];
    return n;
  }
  /// Whether the global multi-index `index` lies in the box. Throws std::invalid_argument
  /// when `index` does not have `rank` entries.
  constexpr bool contains(detail::ArrayRef<std::int64_t> index) const {
    if (static_cast<int>(index.size()) != rank)
      throw std::invalid_argument("shardlib: ShardBox::contains: an index of rank " + detail::to_text(index.size()) +
                                  " for a box of rank " + detail::to_text(rank));
    for (int d = 0; d < rank; ++d) {
      const auto i = index[static_cast<std::size_t>(d)];
      const auto lo = offset[static_cast<std::size_t>(d)];
      if (i < lo || i - lo >= extent[static_cast<std::size_t>(d)]) return false;
    }
    return true;
  }
  /// Same rank, and the same offset and extent on each of its dims (unused entries ignored).
  friend constexpr bool operator==(const ShardBox& a, const ShardBox& b) noexcept {
    if (a.rank != b.rank) return false;
    for (int d = 0; d < a.rank; ++d)
      if (a.offset[static_cast<std::size_t>(d)] != b.offset[static_cast<std::size_t>(d)] ||
          a.extent[static_cast<std::size_t>(d)] != b.extent[static_cast<std::size_t>(d)])
        return false;
    return true;
  }
};

namespace detail {
/// Checks a Sharding that may have been built by hand (resolve() only makes valid ones): rank
/// within max_tensor_rank, every axis inside `mesh`, no axis used twice. `what` names the caller.
constexpr void check_sharding(const Sharding& s, const MeshShape& mesh, const char* what) {
  if (s.rank < 0 || s.rank > static_cast<int>(max_tensor_rank))
    throw std::invalid_argument(std::string("shardlib: ") + what + ": a sharding of rank " + to_text(s.rank) +
                                "; ranks are 0.." + to_text(max_tensor_rank));
  std::array<int, max_mesh_rank> uses{};
  auto count = [&](const AxisList& l) {
    for (int a : l) {
      if (a >= mesh.rank())
        throw std::out_of_range(std::string("shardlib: ") + what + ": the sharding uses mesh axis " + to_text(a) +
                                ", outside mesh " + mesh.to_string());
      if (++uses[static_cast<std::size_t>(a)] > 1)
        throw std::invalid_argument(std::string("shardlib: ") + what + ": the sharding uses mesh axis '" +
                                    mesh.name(a).str() + "' twice; an axis appears at most once per spec");
    }
  };
  for (int d = 0; d < s.rank; ++d) count(s.dims[static_cast<std::size_t>(d)]);
  count(s.partial);
}
}  // namespace detail

/// The block `device` holds of a tensor of `global_shape` distributed by `sharding` on `mesh`.
/// Dim d is cut into mesh.group_size(dims[d]) parts and the device holds part
/// mesh.group_rank(device, dims[d]) (see block_of); unsplit dims are whole.
///
/// Throws std::invalid_argument when global_shape has not sharding.rank entries, an extent is
/// negative, or the sharding is malformed (an axis twice); std::out_of_range when `device` or
/// an axis of the sharding is outside the mesh.
constexpr ShardBox shard_box(const Sharding& sharding, const MeshShape& mesh,
                             detail::ArrayRef<std::int64_t> global_shape, int device) {
  detail::check_sharding(sharding, mesh, "shard_box");
  if (static_cast<int>(global_shape.size()) != sharding.rank)
    throw std::invalid_argument("shardlib: shard_box: the global shape has rank " +
                                detail::to_text(global_shape.size()) + " but the sharding has rank " +
                                detail::to_text(sharding.rank));
  for (int d = 0; d < sharding.rank; ++d)
    if (global_shape[static_cast<std::size_t>(d)] < 0)
      throw std::invalid_argument("shardlib: shard_box: dim " + detail::to_text(d) +
                                  " of the global shape has extent " +
                                  detail::to_text(global_shape[static_cast<std::size_t>(d)]) + "; extents must be >= 0");
  (void)mesh.coords(device);  // range check, also for rank 0 and fully replicated shardings
  ShardBox box;
  box.rank = sharding.rank;
  for (int d = 0; d < sharding.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const AxisList& axes = sharding.dims[u];
    const BlockRange r = block_of(global_shape[u], mesh.group_size(axes), mesh.group_rank(device, axes));
    box.offset[u] = r.offset;
    box.extent[u] = r.size;
  }
  return box;
}

/// True iff `device` has coordinate 0 on every mesh axis that splits no dim and is not partial:
/// one representative per set of replicas (of a block, or of one addend of it). A global
/// reduction over the devices' blocks counts exactly these. Throws as shard_box does for a bad
/// device or sharding.
constexpr bool is_primary_replica(const Sharding& sharding, const MeshShape& mesh, int device) {
  detail::check_sharding(sharding, mesh, "is_primary_replica");
  const auto c = mesh.coords(device);
  for (int a : sharding.replicated_axes(mesh.rank()))
    if (c[static_cast<std::size_t>(a)] != 0) return false;
  return true;
}

/// True iff `device` has coordinate 0 on every mesh axis that splits no dim, partial axes
/// included: one device per block, standing for all its replicas and addend holders. The
/// boxes of these devices tile the global index space exactly once. Throws as shard_box does.
constexpr bool is_primary(const Sharding& sharding, const MeshShape& mesh, int device) {
  detail::check_sharding(sharding, mesh, "is_primary");
  const auto c = mesh.coords(device);
  for (int a = 0; a < mesh.rank(); ++a)
    if (!sharding.shards_over(a) && c[static_cast<std::size_t>(a)] != 0) return false;
  return true;
}

}  // namespace shardlib
