// SPDX-License-Identifier: Apache-2.0
/// @file
/// Sharding rules of the layout ops: permute, slice, concat, take (gather / embedding) and
/// einops-style reshape, with the reshape pattern parser and its shape checks.
///
/// | op | operands when the kernel runs | output | op's own collective |
/// |---|---|---|---|
/// | permute(perm) | unchanged | out dim i = in dim perm[i]; partial kept | none |
/// | slice along `dim` | unchanged | the operand's sharding; partial kept | over the axes of `dim` (blocks shift) |
/// | concat(a, b) along `dim` | both in a's layout; partial sum kept when both are partial sum over the same axes, else both reduced | a's layout | over the axes of `dim` (blocks shift) |
/// | take(table, indices) along `dim` | table: partial sum kept, max/min reduced; indices: axes the table uses removed | table dims before `dim`, indices' dims, table dims after; partial sum over the table's partial and the axes of `dim` (each device looks up its own block of the table, zero elsewhere) | none |
/// | reshape("b s h -> (b s) h") | an input dim is replicated when its first atom (which carries its axes) is not the first atom of its output dim | each output dim takes the axes of its first atom; partial kept | none (see reshape_blocks_align) |
///
/// Pure rules: every function is constexpr and answers bad input with a status, never a throw.
#pragma once

#include <shardlib/detail/array_ref.hpp>
#include <shardlib/mesh.hpp>
#include <shardlib/sharding/rule.hpp>
#include <shardlib/spec.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardlib {

namespace detail::layout_rules {
constexpr OpRule failure(OpRule::Status s, int operand, int dim, int count) {
  OpRule r;
  r.status = s;
  r.operand = operand;
  r.dim = dim;
  r.count = count;
  return r;
}
constexpr bool dim_in_range(const Sharding& s, int dim) noexcept { return dim >= 0 && dim < s.rank; }
/// `s` as an output: partial clause in mesh order, op sum when not partial.
constexpr Sharding as_output(Sharding s) {
  s.partial = sorted_axes(s.partial);
  if (s.partial.empty()) s.op = ReduceOp::sum;
  return s;
}
/// `a` followed by the axes of `b` it lacks.
constexpr AxisList with(AxisList a, const AxisList& b) {
  for (int x : b)
    if (!a.contains(x)) a.push_back(x);
  return a;
}
}  // namespace detail::layout_rules

/// The rule of permute: output dim i is input dim perm[i] with its axes, the partial clause is
/// kept (a permutation is linear). bad_permutation when `perm` is not a permutation of
/// 0..in.rank-1, with `dim` the position in `perm` of the first bad or repeated entry (-1 when
/// `perm` has the wrong length).
constexpr OpRule permute_rule(const Sharding& in, detail::ArrayRef<int> perm) {
  using namespace detail::layout_rules;
  if (static_cast<int>(perm.size()) != in.rank) return failure(OpRule::bad_permutation, 0, -1, 1);
  std::array<bool, max_tensor_rank> seen{};
  for (int i = 0; i < in.rank; ++i) {
    const int p = perm[static_cast<std::size_t>(i)];
    if (p < 0 || p >= in.rank || seen[static_cast<std::size_t>(p)]) return failure(OpRule::bad_permutation, 0, i, 1);
    seen[static_cast<std::size_t>(p)] = true;
  }
  OpRule r;
  r.count = 1;
  r.in[0] = in;
  r.out = as_output(in);
  for (int i = 0; i < in.rank; ++i)
    r.out.dims[static_cast<std::size_t>(i)] = in.dims[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])];
  return r;
}

/// The rule of a slice (a range or a stride) along `dim`: operand and output keep the operand's
/// sharding, partial included (slicing is linear); when `dim` is split, the wanted elements sit
/// in other devices' blocks, so the op exchanges them over the axes of `dim` (`comm`).
/// dim_out_of_range for a bad dim.
constexpr OpRule slice_rule(const Sharding& in, int dim) {
  using namespace detail::layout_rules;
  if (!dim_in_range(in, dim)) return failure(OpRule::dim_out_of_range, 0, dim, 1);
  OpRule r;
  r.count = 1;
  r.in[0] = in;
  r.out = as_output(in);
  r.comm = in.dims[static_cast<std::size_t>(dim)];
  return r;
}

/// The rule of concat(a, b) along `dim` (count 2): both operands take a's layout, and so does
/// the output. Partial sums over the same axes stay partial (concat is linear in both); any
/// other partial operand is reduced. Along a split `dim` the blocks of the result straddle the
/// operands', so the op exchanges them over the axes of `dim` (`comm`). rank_mismatch (operand 1)
/// when the ranks differ; dim_out_of_range (operand 0) for a bad dim.
constexpr OpRule concat_rule(const Sharding& a, const Sharding& b, int dim) {
  using namespace detail::layout_rules;
  if (b.rank != a.rank) return failure(OpRule::rank_mismatch, 1, -1, 2);
  if (!dim_in_range(a, dim)) return failure(OpRule::dim_out_of_range, 0, dim, 2);
  const bool keep = a.is_partial() && b.is_partial() && a.op == ReduceOp::sum && b.op == ReduceOp::sum &&
                    detail::sorted_axes(a.partial) == detail::sorted_axes(b.partial);
  OpRule r;
  r.count = 2;
  r.in[0] = keep ? a : detail::reduced(a);
  r.in[1] = r.in[0];
  if (keep) r.in[1].partial = b.partial;  // the same set in b's own order: no reshard for the order
  r.out = as_output(r.in[0]);
  r.comm = a.dims[static_cast<std::size_t>(dim)];
  return r;
}

/// The rule of take(table, indices, dim), numpy's `take(table, indices, axis=dim)` and torch's
/// embedding (count 2). The output has table.rank - 1 + indices.rank dims: the table's dims
/// before `dim`, the indices' dims, the table's dims after `dim`. The table keeps its layout
/// and a partial sum (a gather is linear in the table; partial max/min are reduced). Its axes on
/// `dim` are not gathered (vocab-parallel embedding, as Megatron): each device looks up the
/// indices in its own block and writes zero for the others, so the output is partial sum over
/// the table's kept partial axes and the axes of `dim`. The indices keep their dims' axes except
/// those the table already uses (its other dims, or that partial clause): those are replicated.
/// Statuses: dim_out_of_range (operand 0), partial_indices (operand 1: indices cannot be
/// partial), too_many_dims (the output would have more than max_tensor_rank dims).
constexpr OpRule take_rule(const Sharding& table, const Sharding& indices, int dim) {
  using namespace detail::layout_rules;
  if (!dim_in_range(table, dim)) return failure(OpRule::dim_out_of_range, 0, dim, 2);
  if (indices.is_partial()) return failure(OpRule::partial_indices, 1, -1, 2);
  if (table.rank - 1 + indices.rank > static_cast<int>(max_tensor_rank)) return failure(OpRule::too_many_dims, -1, -1, 2);
  const auto ud = static_cast<std::size_t>(dim);
  OpRule r;
  r.count = 2;
  r.in[0] = detail::is_partial_sum(table) ? table : detail::reduced(table);
  Sharding& out = r.out;
  out.partial = detail::sorted_axes(with(r.in[0].partial, table.dims[ud]));
  AxisList used = out.partial;
  for (int d = 0; d < table.rank; ++d)
    if (d != dim) used = with(used, table.dims[static_cast<std::size_t>(d)]);
  r.in[1] = indices;
  for (int d = 0; d < indices.rank; ++d)
    r.in[1].dims[static_cast<std::size_t>(d)] = detail::without(indices.dims[static_cast<std::size_t>(d)], used);
  for (int d = 0; d < dim; ++d) out.dims[static_cast<std::size_t>(out.rank++)] = table.dims[static_cast<std::size_t>(d)];
  for (int d = 0; d < indices.rank; ++d) out.dims[static_cast<std::size_t>(out.rank++)] = r.in[1].dims[static_cast<std::size_t>(d)];
  for (int d = dim + 1; d < table.rank; ++d) out.dims[static_cast<std::size_t>(out.rank++)] = table.dims[static_cast<std::size_t>(d)];
  return r;
}

/// The rule of index_add(base, indices, values, dim) (count 3), the transpose of take: `values`
/// (shaped as take(base, indices)'s output) added into `base` at the indices along `dim`. Each
/// device scatters the values of its block of indices into its block of the base (laid out as
/// take lays out the table: a base split along `dim` over vocabulary axes takes only the indices
/// it holds, with no communication); the output has the base's layout and is partial-sum over the
/// axes that split the indices (each device adds its own positions; the base counts once, on
/// coordinate 0 of those axes). A partial base is reduced first; `values` is read in take's
/// output layout without its partial clause. Statuses: as take_rule; rank_mismatch (operand 2)
/// when values does not have take's output rank.
constexpr OpRule index_add_rule(const Sharding& base, const Sharding& indices, const Sharding& values, int dim) {
  const Sharding b = base.is_partial() ? detail::reduced(base) : base;
  OpRule t = take_rule(b, indices, dim);
  if (!t) {
    t.count = 3;
    return t;
  }
  if (values.rank != t.out.rank) return detail::layout_rules::failure(OpRule::rank_mismatch, 2, -1, 3);
  OpRule r;
  r.count = 3;
  r.in[0] = t.in[0];
  r.in[1] = t.in[1];
  r.in[2] = t.out;
  r.in[2].partial = AxisList{};
  r.in[2].op = ReduceOp::sum;
  r.out = t.in[0];
  AxisList p;
  for (int d = 0; d < indices.rank; ++d) p = detail::layout_rules::with(p, t.in[1].dims[static_cast<std::size_t>(d)]);
  r.out.partial = detail::sorted_axes(p);
  return r;
}

// ---- reshape -------------------------------------------------------------------------------

/// Most atoms (names) in a reshape pattern.
inline constexpr int max_reshape_atoms = 16;
/// Longest atom name in a reshape pattern.
inline constexpr int max_reshape_name_length = 15;

/// A parsed einops-style reshape pattern: `"b s h -> (b s) h"`, `"b s (n d) -> b s n d"`.
///
/// Each side lists dims; a bare name is a dim of one atom, a parenthesised group one dim made of
/// several atoms (major to minor). Both sides list the same atoms in the same order, each once
/// per side (a reshape merges and splits dims; it does not transpose). Atoms are numbered in
/// that order; dim d of the input is made of atoms [in_first[d], in_first[d + 1]), and likewise
/// for the output (in_first[in_rank] = out_first[out_rank] = n_atoms).
struct ReshapePattern {
  OpRule::Status status = OpRule::ok;  ///< ok, or bad_pattern
  int error_pos = -1;                  ///< character position of the error, or -1
  const char* error = "";              ///< what is wrong (a string literal), or ""
  int n_atoms = 0;
  int in_rank = 0;
  int out_rank = 0;
  std::array<int, max_tensor_rank + 1> in_first{};
  std::array<int, max_tensor_rank + 1> out_first{};
  std::array<std::array<char, max_reshape_name_length + 1>, max_reshape_atoms> names{};

  constexpr explicit operator bool() const noexcept { return status == OpRule::ok; }
  /// The name of atom `a`.
  constexpr std::string_view name(int a) const noexcept {
    const auto& n = names[static_cast<std::size_t>(a)];
    std::size_t len = 0;
    while (len < n.size() && n[len] != '\0') ++len;
    return {n.data(), len};
  }
  /// The input dim made (partly) of atom `a`.
  constexpr int in_dim_of(int a) const noexcept {
    int d = 0;
    while (d + 1 < in_rank && in_first[static_cast<std::size_t>(d + 1)] <= a) ++d;
    return d;
  }
  /// The output dim made (partly) of atom `a`.
  constexpr int out_dim_of(int a) const noexcept {
    int d = 0;
    while (d + 1 < out_rank && out_first[static_cast<std::size_t>(d + 1)] <= a) ++d;
    return d;
  }
};

/// Parses a reshape pattern. Never throws: a pattern that does not parse, or whose sides do not
/// list the same atoms in the same order, comes back with status bad_pattern, the position of
/// the offending character and a sentence saying what is wrong. Names are
/// [A-Za-z_][A-Za-z0-9_]*, at most max_reshape_name_length characters; at most max_tensor_rank
/// dims per side and max_reshape_atoms atoms; groups do not nest and are not empty.
constexpr ReshapePattern parse_reshape(std::string_view s) {
  ReshapePattern p;
  auto fail = [&](std::size_t pos, const char* why) {
    ReshapePattern e;
    e.status = OpRule::bad_pattern;
    e.error_pos = static_cast<int>(pos);
    e.error = why;
    return e;
  };
  auto is_alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  auto is_alnum = [&](char c) { return is_alpha(c) || (c >= '0' && c <= '9'); };
  int side = 0;               // 0: input, 1: output
  int right_atoms = 0;        // atoms seen on the right side
  bool in_group = false;
  int group_atoms = 0;
  std::size_t group_pos = 0;  // position of the open '('
  auto start_dim = [&]() {
    int& rank = side == 0 ? p.in_rank : p.out_rank;
    if (rank >= static_cast<int>(max_tensor_rank)) return false;
    (side == 0 ? p.in_first : p.out_first)[static_cast<std::size_t>(rank++)] = side == 0 ? p.n_atoms : right_atoms;
    return true;
  };
  constexpr const char* too_many_dims = "a side has more than max_tensor_rank (8) dims";
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    if (c == '-') {
      if (i + 1 >= s.size() || s[i + 1] != '>') return fail(i, "'-' not followed by '>'; the sides are separated by '->'");
      if (side == 1) return fail(i, "'->' appears twice");
      if (in_group) return fail(group_pos, "'(' is not closed before '->'");
      side = 1;
      ++i;
      continue;
    }
    if (c == '(') {
      if (in_group) return fail(i, "groups do not nest: '(' inside a group");
      if (!start_dim()) return fail(i, too_many_dims);
      in_group = true;
      group_atoms = 0;
      group_pos = i;
      continue;
    }
    if (c == ')') {
      if (!in_group) return fail(i, "')' without a matching '('");
      if (group_atoms == 0) return fail(group_pos, "an empty group '()'; a dim has at least one atom");
      in_group = false;
      continue;
    }
    if (!is_alpha(c)) {
      if (c >= '0' && c <= '9') return fail(i, "an atom name starts with a digit; names are [A-Za-z_][A-Za-z0-9_]*");
      return fail(i, "unexpected character; a pattern holds names, '(', ')' and '->'");
    }
    std::size_t end = i;
    while (end < s.size() && is_alnum(s[end])) ++end;
    const std::string_view name = s.substr(i, end - i);
    if (name.size() > static_cast<std::size_t>(max_reshape_name_length))
      return fail(i, "an atom name is longer than max_reshape_name_length (15) characters");
    if (!in_group && !start_dim()) return fail(i, too_many_dims);
    ++group_atoms;
    int found = -1;
    for (int a = 0; a < p.n_atoms; ++a)
      if (p.name(a) == name) found = a;
    if (side == 0) {
      if (found >= 0) return fail(i, "an atom appears twice on the left side");
      if (p.n_atoms >= max_reshape_atoms) return fail(i, "more than max_reshape_atoms (16) atoms");
      auto& n = p.names[static_cast<std::size_t>(p.n_atoms++)];
      for (std::size_t k = 0; k < name.size(); ++k) n[k] = name[k];
    } else {
      if (found < 0) return fail(i, "an atom of the right side is not on the left side");
      if (found < right_atoms) return fail(i, "an atom appears twice on the right side");
      if (found > right_atoms)
        return fail(i, "the right side lists the atoms in another order or leaves one out; a reshape does not "
                       "transpose (permute first)");
      ++right_atoms;
    }
    i = end - 1;
  }
  if (in_group) return fail(group_pos, "'(' is not closed");
  if (side == 0) return fail(s.size(), "no '->' between the two sides");
  if (right_atoms < p.n_atoms) return fail(s.size(), "an atom of the left side is missing on the right side");
  p.in_first[static_cast<std::size_t>(p.in_rank)] = p.n_atoms;
  p.out_first[static_cast<std::size_t>(p.out_rank)] = p.n_atoms;
  return p;
}

/// The rule of reshape by pattern `p` (count 1). The axes of each input dim go to its first
/// (major) atom; each output dim takes the axes of its first atom. An atom that carries axes but
/// is not first in its output dim cannot stay split (its blocks would not be contiguous in the
/// merged dim): the input dim holding it is replicated first (in[0]). The partial clause is kept
/// (a reshape is linear). The op moves no data when reshape_blocks_align says so. Statuses:
/// bad_pattern (`dim`: p.error_pos), rank_mismatch (operand 0) when in.rank != p.in_rank.
/// E.g. "b s h -> (b s) h": Spec<"data", none, "model"> -> Spec<"data", "model">;
/// "b s h -> b (s h)": Spec<none, none, "model"> is first replicated, output Spec<none, none>.
constexpr OpRule reshape_rule(const ReshapePattern& p, const Sharding& in) {
  using namespace detail::layout_rules;
  if (!p) return failure(OpRule::bad_pattern, -1, p.error_pos, 1);
  if (in.rank != p.in_rank) return failure(OpRule::rank_mismatch, 0, -1, 1);
  std::array<AxisList, max_reshape_atoms> atom_axes{};
  for (int d = 0; d < in.rank; ++d)
    atom_axes[static_cast<std::size_t>(p.in_first[static_cast<std::size_t>(d)])] = in.dims[static_cast<std::size_t>(d)];
  OpRule r;
  r.count = 1;
  r.in[0] = in;
  for (int o = 0; o < p.out_rank; ++o)
    for (int a = p.out_first[static_cast<std::size_t>(o)] + 1; a < p.out_first[static_cast<std::size_t>(o + 1)]; ++a)
      if (!atom_axes[static_cast<std::size_t>(a)].empty()) {
        r.in[0].dims[static_cast<std::size_t>(p.in_dim_of(a))] = AxisList{};
        atom_axes[static_cast<std::size_t>(a)] = AxisList{};
      }
  r.out = as_output(in);
  r.out.rank = p.out_rank;
  r.out.dims = {};
  for (int o = 0; o < p.out_rank; ++o)
    r.out.dims[static_cast<std::size_t>(o)] = atom_axes[static_cast<std::size_t>(p.out_first[static_cast<std::size_t>(o)])];
  return r;
}

/// The output extents that the input shape determines: those of output dims that merge whole
/// input dims (both their ends are input-dim boundaries). A split output dim needs its extent
/// from the caller (then check_reshape_shapes checks it).
struct ReshapeOutShape {
  bool valid = false;   ///< the pattern parsed and in_shape has p.in_rank extents, none negative
  int first_unknown = -1;  ///< first output dim whose extent the input does not determine, or -1
  int rank = 0;
  std::array<std::int64_t, max_tensor_rank> extent{};  ///< -1 where not determined
};

/// The output shape of reshape `p` of a tensor of `in_shape`, as far as it determines it (see
/// ReshapeOutShape).
constexpr ReshapeOutShape reshape_out_shape(const ReshapePattern& p, detail::ArrayRef<std::int64_t> in_shape) {
  ReshapeOutShape r;
  if (!p || static_cast<int>(in_shape.size()) != p.in_rank) return r;
  for (auto e : in_shape)
    if (e < 0) return r;
  r.valid = true;
  r.rank = p.out_rank;
  auto in_boundary = [&](int pos) {
    for (int d = 0; d <= p.in_rank; ++d)
      if (p.in_first[static_cast<std::size_t>(d)] == pos) return d;
    return -1;
  };
  for (int o = 0; o < p.out_rank; ++o) {
    const int b = in_boundary(p.out_first[static_cast<std::size_t>(o)]);
    const int e = in_boundary(p.out_first[static_cast<std::size_t>(o + 1)]);
    std::int64_t x = -1;
    if (b >= 0 && e >= 0) {
      x = 1;
      for (int d = b; d < e; ++d) x *= in_shape[static_cast<std::size_t>(d)];
    } else if (r.first_unknown < 0) {
      r.first_unknown = o;
    }
    r.extent[static_cast<std::size_t>(o)] = x;
  }
  return r;
}

namespace detail::layout_rules {
constexpr std::int64_t gcd(std::int64_t a, std::int64_t b) noexcept {
  while (b != 0) {
    const std::int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}
constexpr std::int64_t int64_max = 0x7fffffffffffffff;
/// a * b for a, b >= 1, or -1 when it overflows.
constexpr std::int64_t checked_mul(std::int64_t a, std::int64_t b) noexcept { return a > int64_max / b ? -1 : a * b; }
/// lcm(a, b) for a, b >= 1, or -1 when it overflows.
constexpr std::int64_t checked_lcm(std::int64_t a, std::int64_t b) noexcept { return checked_mul(a / gcd(a, b), b); }

/// Whether atom extents (integers >= 0) exist such that every input dim's extent is the product
/// of its atoms', and so is that of each of the first `n_out` output dims (the others are free).
///
/// Atoms in no nonzero dim can be 0 (call them Z): every zero dim must hold one, and a nonzero
/// dim holds none. The other atoms are >= 1; dropping Z, write P(k) for the product of the
/// first k of them. A nonzero dim over [s, e) with extent E asks P(e) = P(s) * E, and atoms
/// >= 1 ask P(k) | P(k + 1). Per prime these are difference constraints on exponents
/// (S(e) - S(s) = v, S(k + 1) >= S(k)), feasible iff their graph has no positive cycle; the
/// least solution is found by Bellman-Ford run on all primes at once (max of exponents = lcm,
/// S - v clipped at 0 = P / gcd(P, E)). It divides every solution, so it overflows only when
/// no solution fits in 64 bits.
constexpr bool reshape_extents_exist(const ReshapePattern& p, ArrayRef<std::int64_t> in_shape,
                                     ArrayRef<std::int64_t> out_shape, int n_out) {
  struct Dim {
    int first, end;
    std::int64_t extent;
  };
  std::array<Dim, 2 * max_tensor_rank> dims{};
  int n_dims = 0;
  for (int d = 0; d < p.in_rank; ++d)
    dims[static_cast<std::size_t>(n_dims++)] = {p.in_first[static_cast<std::size_t>(d)], p.in_first[static_cast<std::size_t>(d + 1)],
                                                in_shape[static_cast<std::size_t>(d)]};
  for (int o = 0; o < n_out; ++o)
    dims[static_cast<std::size_t>(n_dims++)] = {p.out_first[static_cast<std::size_t>(o)], p.out_first[static_cast<std::size_t>(o + 1)],
                                                out_shape[static_cast<std::size_t>(o)]};
  std::array<bool, max_reshape_atoms> positive{};  // in some nonzero dim
  for (int i = 0; i < n_dims; ++i)
    if (dims[static_cast<std::size_t>(i)].extent != 0)
      for (int a = dims[static_cast<std::size_t>(i)].first; a < dims[static_cast<std::size_t>(i)].end; ++a) positive[static_cast<std::size_t>(a)] = true;
  for (int i = 0; i < n_dims; ++i) {
    if (dims[static_cast<std::size_t>(i)].extent != 0) continue;
    bool has_zero_atom = false;
    for (int a = dims[static_cast<std::size_t>(i)].first; a < dims[static_cast<std::size_t>(i)].end; ++a)
      has_zero_atom = has_zero_atom || !positive[static_cast<std::size_t>(a)];
    if (!has_zero_atom) return false;
  }
  std::array<int, max_reshape_atoms + 1> pos{};  // position of each atom among the positive ones
  int m = 0;
  for (int a = 0; a < p.n_atoms; ++a) {
    pos[static_cast<std::size_t>(a)] = m;
    if (positive[static_cast<std::size_t>(a)]) ++m;
  }
  std::array<std::int64_t, max_reshape_atoms + 1> P{};
  for (auto& x : P) x = 1;
  auto raise = [&](int k, std::int64_t v, bool& changed) {  // P(k) = lcm(P(k), v)
    const std::int64_t l = v < 0 ? -1 : checked_lcm(P[static_cast<std::size_t>(k)], v);
    if (l < 0) return false;
    if (l != P[static_cast<std::size_t>(k)]) {
      P[static_cast<std::size_t>(k)] = l;
      changed = true;
    }
    return true;
  };
  for (int round = 0; round <= m + 1; ++round) {
    bool changed = false;
    for (int k = 0; k < m; ++k)
      if (!raise(k + 1, P[static_cast<std::size_t>(k)], changed)) return false;
    for (int i = 0; i < n_dims; ++i) {
      const Dim& d = dims[static_cast<std::size_t>(i)];
      if (d.extent == 0) continue;
      const int s = pos[static_cast<std::size_t>(d.first)], e = s + (d.end - d.first);
      const std::int64_t ps = P[static_cast<std::size_t>(s)], pe = P[static_cast<std::size_t>(e)];
      if (!raise(e, checked_mul(ps, d.extent), changed)) return false;
      if (!raise(s, pe / gcd(pe, d.extent), changed)) return false;
    }
    if (!changed) return true;
  }
  return false;  // still rising after every path was relaxed: a positive cycle, no solution
}
}  // namespace detail::layout_rules

/// Checks that a tensor of `in_shape` can be reshaped by `p` into `out_shape`: that atom extents
/// exist making every dim's extent on both sides the product of its atoms' extents (an atom alone
/// in a dim on either side takes that dim's extent; atoms never alone, as in "(a b) -> (a b)",
/// are only constrained through the products). Exact, zero extents included. Returns -1 when
/// the shapes fit; otherwise the first output dim o such that the input shape and output dims
/// 0..o together admit no atom extents (o itself when its extent is negative); -2 when the
/// pattern did not parse, a shape has the wrong number of extents, or an input extent is negative.
constexpr int check_reshape_shapes(const ReshapePattern& p, detail::ArrayRef<std::int64_t> in_shape,
                                   detail::ArrayRef<std::int64_t> out_shape) {
  if (!p || static_cast<int>(in_shape.size()) != p.in_rank || static_cast<int>(out_shape.size()) != p.out_rank) return -2;
  for (auto e : in_shape)
    if (e < 0) return -2;
  for (int o = 0; o < p.out_rank; ++o)
    if (out_shape[static_cast<std::size_t>(o)] < 0 || !detail::layout_rules::reshape_extents_exist(p, in_shape, out_shape, o + 1))
      return o;
  return -1;
}

/// True iff every device can reshape its own block locally, with no data movement, from `in`
/// (the operand's sharding when the kernel runs: reshape_rule(p, ·).in[0]) to `out` (that
/// rule's output); false as well when `in`/`out` are not such a pair or the shapes do not fit
/// (check_reshape_shapes). An op falls back to gathering otherwise.
///
/// Each split dim carries its axes (G devices) on its first atom (extent e1, the dim's other
/// atoms multiplying to r, E = e1 * r). Blocks follow torch.chunk: a dim of E over G parts is
/// cut in chunks of ceil(E / G). The block of the dim is whole rows of the other atoms, the
/// same rows on both sides, exactly when ceil(E / G) == ceil(e1 / G) * r; it must hold for
/// every split dim of the input and of the output. Uneven blocks can break it: E = 6 = 3 x 2 over
/// G = 2 is cut [0, 3) [3, 6) but its first atom is cut in rows [0, 2) [2, 3), i.e. [0, 4) [4, 6).
/// Adjacent atoms that share their dim on both sides act as one atom (their split is not
/// determined by the shapes and does not matter). A tensor with no elements always aligns.
constexpr bool reshape_blocks_align(const ReshapePattern& p, const Sharding& in, const Sharding& out,
                                    const MeshShape& mesh, detail::ArrayRef<std::int64_t> in_shape,
                                    detail::ArrayRef<std::int64_t> out_shape) {
  const OpRule r = reshape_rule(p, in);
  if (!r || !(r.in[0] == in) || !(r.out == out)) return false;
  if (check_reshape_shapes(p, in_shape, out_shape) != -1) return false;
  for (auto e : in_shape)
    if (e == 0) return true;
  // Products of the extents before each dim boundary (no overflow: they divide the size).
  std::array<std::int64_t, max_reshape_atoms + 1> prefix{};
  std::array<bool, max_reshape_atoms + 1> boundary{};
  std::int64_t x = 1;
  for (int d = 0; d <= p.in_rank; ++d) {
    const auto b = static_cast<std::size_t>(p.in_first[static_cast<std::size_t>(d)]);
    prefix[b] = x;
    boundary[b] = true;
    if (d < p.in_rank) x *= in_shape[static_cast<std::size_t>(d)];
  }
  x = 1;
  for (int o = 0; o <= p.out_rank; ++o) {
    const auto b = static_cast<std::size_t>(p.out_first[static_cast<std::size_t>(o)]);
    prefix[b] = x;
    boundary[b] = true;
    if (o < p.out_rank) x *= out_shape[static_cast<std::size_t>(o)];
  }
  auto aligned = [&](int first, std::int64_t extent, const AxisList& axes) {
    if (axes.empty()) return true;
    int next = first + 1;
    while (!boundary[static_cast<std::size_t>(next)]) ++next;
    const std::int64_t e1 = prefix[static_cast<std::size_t>(next)] / prefix[static_cast<std::size_t>(first)];
    const std::int64_t rest = extent / e1;
    const std::int64_t g = mesh.group_size(axes);
    return (extent + g - 1) / g == (e1 + g - 1) / g * rest;
  };
  for (int d = 0; d < p.in_rank; ++d)
    if (!aligned(p.in_first[static_cast<std::size_t>(d)], in_shape[static_cast<std::size_t>(d)], in.dims[static_cast<std::size_t>(d)]))
      return false;
  for (int o = 0; o < p.out_rank; ++o)
    if (!aligned(p.out_first[static_cast<std::size_t>(o)], out_shape[static_cast<std::size_t>(o)], out.dims[static_cast<std::size_t>(o)]))
      return false;
  return true;
}

}  // namespace shardlib
