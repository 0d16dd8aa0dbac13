// SPDX-License-Identifier: Apache-2.0
/// @file
/// Einsum subscripts ("bij,bjk->bik") and the sharding rule of einsum with one or two operands.
///
/// Labels fall into four classes: **batch** (in both operands and in the output),
/// **contracted** (in both operands, not in the output), **free** (in one operand and in the
/// output) and **summed** (in one operand only, not in the output: a local sum).
///
/// The rule (`in[i]`: the sharding operand i must have when the local kernel runs):
///  1. Partial operands (einsum is bilinear): a partial-sum operand stays partial (it is not
///     reduced and the output is partial over its axes) when the other operand is not partial;
///     when both are partial, operand b is reduced and a stays partial if it is a partial sum.
///     Partial max/min operands are always reduced. The other operand is replicated over the
///     kept partial axes.
///  2. Each label is given mesh axes, in this order: contracted labels (in order of first
///     appearance in a), batch labels, free labels of a, free labels of b, summed labels. A
///     label's offers are each operand's axis list for its dim, less the axes already taken
///     (by earlier labels or the kept partial clause); the offer with the most axes wins, ties
///     to a's. Contractions thus stay local wherever an operand is sharded along them.
///  3. Both operands take their labels' axes (a label is split alike wherever it appears); the
///     output's dims take its labels' axes, and the output is partial-sum over the kept partial
///     axes and the axes of contracted and summed labels (each device holds the sum over its
///     slice only).
///
/// Pure rules: constexpr, no Kokkos, no communicator; never throw for bad input.
#pragma once

#include <shardlib/mesh.hpp>
#include <shardlib/sharding/rule.hpp>
#include <shardlib/spec.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardlib {

/// Parsed einsum subscripts: "bij,bjk->bik". Letters a-z and A-Z are labels, spaces are
/// ignored. Without "->" (implicit mode) the output is the labels that appear exactly once
/// overall, in ASCII order (upper case first), numpy's rule.
struct EinsumSubscripts {
  OpRule::Status status = OpRule::ok;  ///< bad_subscripts when the string does not parse
  int error_pos = -1;                  ///< character position of the error, or -1
  const char* error = "";              ///< what is wrong (a string literal), or ""
  int n_in = 0;                        ///< number of operands: 1 or 2
  std::array<int, 2> rank{};           ///< labels per operand
  std::array<std::array<char, max_tensor_rank>, 2> in{};  ///< labels of each operand's dims
  int out_rank = 0;                    ///< labels of the output
  std::array<char, max_tensor_rank> out{};  ///< labels of the output's dims

  constexpr explicit operator bool() const noexcept { return status == OpRule::ok; }
};

/// The class of an einsum label (see the file comment); `absent` when no operand has it.
enum class EinsumLabel : std::uint8_t { absent, batch, contracted, free, summed };

namespace detail::einsum_impl {
constexpr bool is_label(char c) noexcept { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
/// Position of label `c` in the first `n` entries of `l`, or -1.
constexpr int find(const std::array<char, max_tensor_rank>& l, int n, char c) noexcept {
  for (int i = 0; i < n; ++i)
    if (l[static_cast<std::size_t>(i)] == c) return i;
  return -1;
}
/// A slot per label: A-Z are 0-25, a-z 26-51.
constexpr std::size_t slot(char c) noexcept {
  return static_cast<std::size_t>(c >= 'a' ? 26 + (c - 'a') : c - 'A');
}
}  // namespace detail::einsum_impl

/// Parses einsum subscripts. Never throws: a string that does not parse gives status
/// bad_subscripts, the position of the first offending character (the string's length when
/// the fault is at its end) and a reason: a bad character, "->" twice, a comma after "->",
/// more than two operands, an operand with no labels ("ab,->"), a label repeated within one
/// operand (diagonals are not supported) or within the output, an output label in no
/// operand, more than max_tensor_rank labels in an operand or the output.
constexpr EinsumSubscripts parse_einsum(std::string_view subscripts) {
  using detail::einsum_impl::find;
  using detail::einsum_impl::is_label;
  EinsumSubscripts r;
  auto fail = [](std::size_t pos, const char* why) {
    EinsumSubscripts e;
    e.status = OpRule::bad_subscripts;
    e.error_pos = static_cast<int>(pos);
    e.error = why;
    return e;
  };
  r.n_in = 1;
  bool explicit_out = false;
  const std::size_t n = subscripts.size();
  for (std::size_t i = 0; i < n; ++i) {
    const char c = subscripts[i];
    const std::size_t op = static_cast<std::size_t>(r.n_in - 1);
    if (c == ' ') continue;
    if (is_label(c)) {
      if (explicit_out) {
        if (find(r.out, r.out_rank, c) >= 0) return fail(i, "a label repeats in the output");
        bool found = false;
        for (std::size_t k = 0; k < static_cast<std::size_t>(r.n_in); ++k) found = found || find(r.in[k], r.rank[k], c) >= 0;
        if (!found) return fail(i, "an output label appears in no operand");
        if (r.out_rank == static_cast<int>(max_tensor_rank)) return fail(i, "too many dims: the output has more than max_tensor_rank labels");
        r.out[static_cast<std::size_t>(r.out_rank++)] = c;
      } else {
        if (find(r.in[op], r.rank[op], c) >= 0) return fail(i, "a label repeats in one operand (diagonals are not supported)");
        if (r.rank[op] == static_cast<int>(max_tensor_rank)) return fail(i, "too many dims: an operand has more than max_tensor_rank labels");
        r.in[op][static_cast<std::size_t>(r.rank[op]++)] = c;
      }
    } else if (c == ',') {
      if (explicit_out) return fail(i, "a comma after '->': the output is one list of labels");
      if (r.rank[op] == 0) return fail(i, "an operand has no labels");
      if (r.n_in == 2) return fail(i, "more than two operands");
      r.n_in = 2;
    } else if (c == '-' && i + 1 < n && subscripts[i + 1] == '>') {
      if (explicit_out) return fail(i, "'->' appears twice");
      if (r.rank[op] == 0) return fail(i, "an operand has no labels");
      explicit_out = true;
      ++i;
    } else {
      return fail(i, "bad character: labels are letters a-z A-Z, ',' separates operands, '->' starts the output");
    }
  }
  if (!explicit_out) {
    if (r.rank[static_cast<std::size_t>(r.n_in - 1)] == 0) return fail(n, "an operand has no labels");
    auto add_once = [&](char c) {
      int uses = 0;
      for (std::size_t k = 0; k < static_cast<std::size_t>(r.n_in); ++k) uses += find(r.in[k], r.rank[k], c) >= 0 ? 1 : 0;
      if (uses != 1) return true;
      if (r.out_rank == static_cast<int>(max_tensor_rank)) return false;
      r.out[static_cast<std::size_t>(r.out_rank++)] = c;
      return true;
    };
    for (char c = 'A'; c <= 'Z'; ++c)
      if (!add_once(c)) return fail(n, "too many dims: the implicit output has more than max_tensor_rank labels");
    for (char c = 'a'; c <= 'z'; ++c)
      if (!add_once(c)) return fail(n, "too many dims: the implicit output has more than max_tensor_rank labels");
  }
  return r;
}

/// The class of `label` in `s`: batch, contracted, free, summed, or absent.
constexpr EinsumLabel einsum_label(const EinsumSubscripts& s, char label) noexcept {
  using detail::einsum_impl::find;
  const bool in_a = s.n_in >= 1 && find(s.in[0], s.rank[0], label) >= 0;
  const bool in_b = s.n_in >= 2 && find(s.in[1], s.rank[1], label) >= 0;
  const bool in_out = find(s.out, s.out_rank, label) >= 0;
  if (!in_a && !in_b) return EinsumLabel::absent;
  if (in_a && in_b) return in_out ? EinsumLabel::batch : EinsumLabel::contracted;
  return in_out ? EinsumLabel::free : EinsumLabel::summed;
}

namespace detail::einsum_impl {
constexpr OpRule rule(const EinsumSubscripts& s, const Sharding* ops, int count) {
  OpRule r;
  if (s.status != OpRule::ok) {
    r.status = OpRule::bad_subscripts;
    r.dim = s.error_pos;
    return r;
  }
  if (s.n_in != count) {  // the second operand is missing, or one too many
    r.status = OpRule::rank_mismatch;
    r.operand = s.n_in < count ? s.n_in : count;
    return r;
  }
  r.count = count;
  for (int i = 0; i < count; ++i)
    if (ops[i].rank != s.rank[static_cast<std::size_t>(i)]) {
      r.status = OpRule::rank_mismatch;
      r.operand = i;
      return r;
    }

  // Partial clauses: a kept when a partial sum; b only when a is not partial at all.
  std::array<bool, 2> keep{};
  keep[0] = is_partial_sum(ops[0]);
  keep[1] = count == 2 && is_partial_sum(ops[1]) && !ops[0].is_partial();
  const AxisList kept = keep[0] ? sorted_axes(ops[0].partial) : keep[1] ? sorted_axes(ops[1].partial) : AxisList{};

  // Axes per label, in the documented order; the larger offer wins, ties to a's.
  AxisList used = kept;
  std::array<AxisList, 52> axes{};
  auto assign = [&](char c) {
    AxisList best;
    bool offered = false;
    for (int i = 0; i < count; ++i) {
      const int d = find(s.in[static_cast<std::size_t>(i)], s.rank[static_cast<std::size_t>(i)], c);
      if (d < 0) continue;
      const AxisList offer = without(ops[i].dims[static_cast<std::size_t>(d)], used);
      if (!offered || offer.size() > best.size()) best = offer;
      offered = true;
    }
    axes[slot(c)] = best;
    for (int a : best) used.push_back(a);
  };
  auto each = [&](int i, EinsumLabel kind) {
    for (int d = 0; d < s.rank[static_cast<std::size_t>(i)]; ++d) {
      const char c = s.in[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)];
      if (einsum_label(s, c) == kind) assign(c);
    }
  };
  each(0, EinsumLabel::contracted);
  each(0, EinsumLabel::batch);
  each(0, EinsumLabel::free);
  if (count == 2) each(1, EinsumLabel::free);
  each(0, EinsumLabel::summed);
  if (count == 2) each(1, EinsumLabel::summed);

  for (int i = 0; i < count; ++i) {
    Sharding& in = r.in[static_cast<std::size_t>(i)];
    in.rank = ops[i].rank;
    for (int d = 0; d < in.rank; ++d)
      in.dims[static_cast<std::size_t>(d)] = axes[slot(s.in[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)])];
    if (keep[static_cast<std::size_t>(i)]) {
      in.partial = ops[i].partial;  // its own order: a kept clause is never resharded
      in.op = ops[i].op;
    }
  }
  r.out.rank = s.out_rank;
  for (int o = 0; o < s.out_rank; ++o) r.out.dims[static_cast<std::size_t>(o)] = axes[slot(s.out[static_cast<std::size_t>(o)])];
  AxisList partial = kept;
  for (char c : {'A', 'a'})
    for (char l = c; l < c + 26; ++l) {
      const EinsumLabel k = einsum_label(s, l);
      if (k == EinsumLabel::contracted || k == EinsumLabel::summed)
        for (int a : axes[slot(l)]) partial.push_back(a);
    }
  r.out.partial = sorted_axes(partial);
  return r;
}
}  // namespace detail::einsum_impl

/// The sharding rule of einsum over two operands `a` and `b` (see the file comment); `count`
/// = 2, `comm` empty. Status bad_subscripts (with `dim` = the error position) when `s` did not
/// parse; rank_mismatch with `operand` = i when operand i's rank differs from its subscripts,
/// or `operand` = 1 when `s` names one operand only.
constexpr OpRule einsum_rule(const EinsumSubscripts& s, const Sharding& a, const Sharding& b) {
  const std::array<Sharding, 2> ops{a, b};
  return detail::einsum_impl::rule(s, ops.data(), 2);
}

/// The sharding rule of einsum over one operand ("ij->ji", "ij->i"); `count` = 1. As above;
/// rank_mismatch with `operand` = 1 when `s` names two operands.
constexpr OpRule einsum_rule(const EinsumSubscripts& s, const Sharding& a) {
  return detail::einsum_impl::rule(s, &a, 1);
}

}  // namespace shardlib
