// SPDX-License-Identifier: Apache-2.0
/// @file
/// A text picture of which device holds which block of a tensor (jax.debug.visualize_array_sharding
/// in plain text). Rows are the blocks of one dim, columns those of another (dim 0 and the last
/// dim by default); each cell names the devices that hold that block:
///
/// ```
/// f32[7, 5] Spec<"x", "y"> on {x: 2, y: 2}
///           cols 0:3  cols 3:5
/// rows 0:4  0         1
/// rows 4:7  2         3
/// ```
///
/// `0,2` are replicas (the same block on devices 0 and 2); `0+1` are the addends of a pending
/// sum (the block is their sum; `max`/`min` for those reductions). Uneven and empty blocks show
/// with their ranges (`rows 8:8` is an empty part). A tensor of more than two dims shows the
/// slice at index 0 of the dims not pictured (only the devices whose block holds that slice).
///
/// Pure code: the picture follows from the sharding, the mesh and the shape alone.
#pragma once
#include <shardlib/sharding/block.hpp>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace shardlib {

/// The picture (see the file comment) of a tensor of `shape` distributed by `sharding` on
/// `mesh`, under a first line `title` (none when empty), with dims `row_dim` (-1: none) and
/// `col_dim` (-1: none) as rows and columns (defaults: dim 0 and the last dim). Throws
/// std::invalid_argument as shard_box does, or for a pictured dim outside the tensor or twice.
inline std::string visualize(const Sharding& sharding, const MeshShape& mesh, detail::ArrayRef<std::int64_t> shape,
                             std::string_view title = {}, int row_dim = -2, int col_dim = -2) {
  const int rank = sharding.rank;
  if (row_dim == -2) row_dim = rank >= 2 ? 0 : -1;
  if (col_dim == -2) col_dim = rank >= 1 ? rank - 1 : -1;
  if (row_dim < -1 || row_dim >= rank || col_dim < -1 || col_dim >= rank || (row_dim >= 0 && row_dim == col_dim))
    throw std::invalid_argument("shardlib: visualize: dims " + std::to_string(row_dim) + " and " + std::to_string(col_dim) +
                                " cannot be pictured for a tensor of rank " + std::to_string(rank));
  // The parts of a pictured dim: ranges, in order.
  auto parts_of = [&](int dim) {
    std::vector<BlockRange> parts;
    if (dim < 0) return std::vector<BlockRange>{BlockRange{0, 1}};
    const AxisList& axes = sharding.dims[static_cast<std::size_t>(dim)];
    const int n = mesh.group_size(axes);
    for (int i = 0; i < n; ++i) parts.push_back(block_of(shape[static_cast<std::size_t>(dim)], n, i));
    return parts;
  };
  const auto rows = parts_of(row_dim), cols = parts_of(col_dim);
  // Each cell: its devices, grouped by their coordinates on the replicated axes (a group's
  // members differ on the partial axes only: addends of one block).
  const AxisList replicated = sharding.replicated_axes(mesh.rank());
  std::vector<std::vector<std::vector<int>>> cells(rows.size() * cols.size());
  std::vector<std::vector<int>> cell_keys(cells.size());
  for (int d = 0; d < mesh.num_devices(); ++d) {
    const ShardBox box = shard_box(sharding, mesh, shape, d);
    bool in_slice = true;  // holds index 0 of every dim not pictured
    for (int k = 0; k < rank; ++k)
      if (k != row_dim && k != col_dim)
        in_slice = in_slice && box.offset[static_cast<std::size_t>(k)] == 0 && box.extent[static_cast<std::size_t>(k)] > 0;
    if (!in_slice) continue;
    const int r = row_dim < 0 ? 0 : mesh.group_rank(d, sharding.dims[static_cast<std::size_t>(row_dim)]);
    const int c = col_dim < 0 ? 0 : mesh.group_rank(d, sharding.dims[static_cast<std::size_t>(col_dim)]);
    const std::size_t cell = static_cast<std::size_t>(r) * cols.size() + static_cast<std::size_t>(c);
    const int key = mesh.group_rank(d, replicated);
    auto& keys = cell_keys[cell];
    const auto at = std::find(keys.begin(), keys.end(), key);
    if (at == keys.end()) {
      keys.push_back(key);
      cells[cell].push_back({d});
    } else {
      cells[cell][static_cast<std::size_t>(at - keys.begin())].push_back(d);
    }
  }
  const std::string plus = !sharding.is_partial() ? "+" : sharding.op == ReduceOp::sum ? "+" : sharding.op == ReduceOp::max ? " max " : " min ";
  auto cell_text = [&](std::size_t cell) {
    std::string s;
    for (std::size_t g = 0; g < cells[cell].size(); ++g) {
      if (g) s += ",";
      for (std::size_t i = 0; i < cells[cell][g].size(); ++i) s += (i ? plus : "") + std::to_string(cells[cell][g][i]);
    }
    return s.empty() ? std::string("-") : s;
  };
  auto label = [](const char* what, const BlockRange& r) {
    return std::string(what) + " " + std::to_string(r.offset) + ":" + std::to_string(r.offset + r.size);
  };
  std::vector<std::string> row_labels, col_labels;
  for (const auto& r : rows) row_labels.push_back(row_dim < 0 ? "" : label(row_dim == 0 ? "rows" : ("dim " + std::to_string(row_dim)).c_str(), r));
  for (const auto& c : cols) col_labels.push_back(col_dim < 0 ? "" : label(rank == 1 ? "elements" : col_dim == rank - 1 ? "cols" : ("dim " + std::to_string(col_dim)).c_str(), c));
  std::size_t lw = 0;
  for (const auto& l : row_labels) lw = std::max(lw, l.size());
  std::vector<std::size_t> cw(cols.size(), 1);
  for (std::size_t c = 0; c < cols.size(); ++c) {
    cw[c] = col_labels[c].size();
    for (std::size_t r = 0; r < rows.size(); ++r) cw[c] = std::max(cw[c], cell_text(r * cols.size() + c).size());
  }
  auto pad = [](std::string s, std::size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
  auto trim = [](std::string s) {
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::string out;
  if (!title.empty()) out += std::string(title) + "\n";
  std::string header = pad("", lw);
  for (std::size_t c = 0; c < cols.size(); ++c) header += (lw || c ? "  " : "") + pad(col_labels[c], cw[c]);
  if (col_dim >= 0) out += trim(header);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::string line = pad(row_labels[r], lw);
    for (std::size_t c = 0; c < cols.size(); ++c) line += (lw || c ? "  " : "") + pad(cell_text(r * cols.size() + c), cw[c]);
    out += trim(line);
  }
  if (rank > 2) {
    out += "(the slice at index 0 of dims";
    for (int k = 0; k < rank; ++k)
      if (k != row_dim && k != col_dim) out += " " + std::to_string(k);
    out += ")\n";
  }
  if (sharding.is_partial()) {
    std::string axes;
    for (int a : sharding.partial) axes += (axes.empty() ? "" : ", ") + mesh.name(a).str();
    out += "a" + plus + "b: the block is the " + std::string(to_string(sharding.op)) + " of these devices' addends (partial over " +
           axes + ")\n";
  }
  return out;
}

}  // namespace shardlib
