// SPDX-License-Identifier: Apache-2.0
// The reduction and layout sharding rules (sharding/reduce.hpp, sharding/layout.hpp): examples
// at compile time, the reshape pattern parser, and property tests of the reshape shape check and
// of reshape_blocks_align against brute-force oracles.
#include <doctest/doctest.h>
#include <shardlib/sharding/block.hpp>
#include <shardlib/sharding/layout.hpp>
#include <shardlib/sharding/reduce.hpp>
#include <shardlib/sharding/reshard.hpp>

#include "random.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace sl = shardlib;
using sl::none;
using R = sl::Reduction;
using S = sl::OpRule::Status;

namespace {
using M = sl::Mesh<"x", "y">;
template <class Sp>
constexpr sl::Sharding sh = sl::sharding_v<M, Sp>;

// ---- Reductions -----------------------------------------------------------------------------
constexpr auto xy = sh<sl::Spec<"x", "y">>;
// Along a split dim: partial over its axes; the operand is used as it is.
constexpr auto sum1 = sl::reduce_rule(R::sum, xy, 1, false);
static_assert(sum1 && sum1.count == 1 && sum1.in[0] == xy && sum1.comm.empty());
static_assert(sum1.out == sl::sharding_v<M, sl::Spec<"x", sl::partial_sum<"y">>>);
static_assert(std::is_same_v<sl::spec_t<M, sum1.out>, sl::Spec<"x", sl::partial_sum<"y">>>);
static_assert(sl::reduce_rule(R::sum, xy, 1, true).out == sh<sl::Spec<"x", none, sl::partial_sum<"y">>>);
static_assert(sl::reduce_rule(R::mean, xy, 0, false).out == sl::sharding_v<M, sl::Spec<"y", sl::partial_sum<"x">>>);
static_assert(sl::reduce_rule(R::max, xy, 0, true).out == sh<sl::Spec<none, "y", sl::partial_max<"x">>>);
static_assert(sl::reduce_rule(R::min, xy, 1, false).out == sl::sharding_v<M, sl::Spec<"x", sl::partial_min<"y">>>);
// Along a replicated dim: nothing pending, op sum.
constexpr auto xn = sh<sl::Spec<"x", none>>;
static_assert(sl::reduce_rule(R::max, xn, 1, false).out == sl::sharding_v<M, sl::Spec<"x">>);
static_assert(sl::reduce_rule(R::max, xn, 1, false).out.op == sl::ReduceOp::sum);
static_assert(sl::reduce_rule(R::sum, sh<sl::Spec<"x">>, 0, false).out == sl::sharding_v<M, sl::Spec<sl::partial_sum<"x">>>);
// A partial operand is kept when the reductions commute, and the partial axes join (sorted).
constexpr auto ps = sh<sl::Spec<none, "x", sl::partial_sum<"y">>>;
static_assert(sl::reduce_rule(R::sum, ps, 1, false).in[0] == ps);
static_assert(sl::reduce_rule(R::sum, ps, 1, false).out == sl::sharding_v<M, sl::Spec<none, sl::partial_sum<"x", "y">>>);
static_assert(sl::reduce_rule(R::mean, ps, 0, false).out == sl::sharding_v<M, sl::Spec<"x", sl::partial_sum<"y">>>);
static_assert(sl::reduce_rule(R::max, ps, 1, false).in[0] == sh<sl::Spec<none, "x">>);
static_assert(sl::reduce_rule(R::max, ps, 1, false).out == sl::sharding_v<M, sl::Spec<none, sl::partial_max<"x">>>);
constexpr auto pmax = sh<sl::Spec<"x", none, sl::partial_max<"y">>>;
static_assert(sl::reduce_rule(R::max, pmax, 0, false).in[0] == pmax);
static_assert(sl::reduce_rule(R::max, pmax, 0, false).out == sl::sharding_v<M, sl::Spec<none, sl::partial_max<"x", "y">>>);
static_assert(sl::reduce_rule(R::min, pmax, 0, false).in[0] == xn);
static_assert(sl::reduce_rule(R::sum, pmax, 1, false).in[0] == xn);
static_assert(sl::reduce_rule(R::min, sh<sl::Spec<none, sl::partial_min<"y", "x">>>, 0, true).out ==
              sh<sl::Spec<none, sl::partial_min<"x", "y">>>);  // kept, sorted
// argmax: reduced operand, no partial, the op's own collective over the dim's axes.
constexpr auto am = sl::reduce_rule(R::argmax, sh<sl::Spec<sl::axes<"y", "x">, none>>, 0, false);
static_assert(am.in[0] == sh<sl::Spec<sl::axes<"y", "x">, none>> && am.comm == sl::AxisList{1, 0});
static_assert(am.out == sl::sharding_v<M, sl::Spec<none>> && !am.out.is_partial());
static_assert(sl::reduce_rule(R::argmax, ps, 1, true).in[0] == sh<sl::Spec<none, "x">>);
static_assert(sl::reduce_rule(R::argmax, ps, 1, true).out == sh<sl::Spec<none, none>>);
// Bad dims.
static_assert(sl::reduce_rule(R::sum, xy, 2, false).status == S::dim_out_of_range && sl::reduce_rule(R::sum, xy, 2, false).dim == 2);
static_assert(sl::reduce_rule(R::sum, xy, -1, false).status == S::dim_out_of_range);
static_assert(sl::reduce_rule(R::argmax, sl::sharding_v<M, sl::Spec<>>, 0, false).status == S::dim_out_of_range);
// Normalisations.
constexpr auto sm = sl::normalize_rule(ps, 1);
static_assert(sm && sm.in[0] == sh<sl::Spec<none, "x">> && sm.out == sm.in[0] && sm.comm == sl::AxisList{0});
static_assert(sl::normalize_rule(xn, 1).comm.empty() && sl::normalize_rule(xn, 1).out == xn);
static_assert(sl::normalize_rule(xn, 2).status == S::dim_out_of_range && sl::normalize_rule(xn, 2).dim == 2);

// ---- permute, slice, concat -------------------------------------------------------------------
constexpr auto x_none_y = sh<sl::Spec<"x", none, "y">>;
constexpr std::array<int, 3> p201{2, 0, 1};
static_assert(sl::permute_rule(x_none_y, p201).out == sh<sl::Spec<"y", "x", none>>);
static_assert(sl::permute_rule(x_none_y, p201).in[0] == x_none_y);
static_assert(sl::permute_rule(sh<sl::Spec<"x", none, sl::partial_max<"y">>>, std::array<int, 2>{1, 0}).out ==
              sh<sl::Spec<none, "x", sl::partial_max<"y">>>);
static_assert(sl::permute_rule(x_none_y, std::array<int, 2>{1, 0}).status == S::bad_permutation);
static_assert(sl::permute_rule(x_none_y, std::array<int, 2>{1, 0}).dim == -1);
static_assert(sl::permute_rule(x_none_y, std::array<int, 3>{0, 3, 1}).dim == 1);
static_assert(sl::permute_rule(x_none_y, std::array<int, 3>{0, 1, 0}).dim == 2);
static_assert(sl::permute_rule(x_none_y, std::array<int, 3>{-1, 1, 2}).dim == 0);

static_assert(sl::slice_rule(ps, 1).in[0] == ps && sl::slice_rule(ps, 1).out == ps && sl::slice_rule(ps, 1).comm == sl::AxisList{0});
static_assert(sl::slice_rule(ps, 0).comm.empty());
static_assert(sl::slice_rule(ps, 2).status == S::dim_out_of_range && sl::slice_rule(ps, 2).dim == 2);

constexpr auto cat = sl::concat_rule(sh<sl::Spec<"x", none>>, sh<sl::Spec<none, "y">>, 0);
static_assert(cat.count == 2 && cat.in[0] == xn && cat.in[1] == xn && cat.out == xn && cat.comm == sl::AxisList{0});
static_assert(sl::concat_rule(xn, xy, 1).comm.empty());
// Partial sums over the same axes stay partial (each operand keeps its own order).
constexpr auto cat_p = sl::concat_rule(sh<sl::Spec<none, sl::partial_sum<"x", "y">>>, sh<sl::Spec<none, sl::partial_sum<"y", "x">>>, 0);
static_assert(cat_p.in[0] == sh<sl::Spec<none, sl::partial_sum<"x", "y">>> && cat_p.in[1] == sh<sl::Spec<none, sl::partial_sum<"y", "x">>>);
static_assert(cat_p.out == sh<sl::Spec<none, sl::partial_sum<"x", "y">>>);
// Otherwise both are reduced.
constexpr auto cat_r = sl::concat_rule(sh<sl::Spec<none, sl::partial_sum<"x">>>, sh<sl::Spec<none, sl::partial_sum<"x", "y">>>, 0);
static_assert(cat_r.in[0] == sh<sl::Spec<none>> && cat_r.in[1] == sh<sl::Spec<none>> && !cat_r.out.is_partial());
static_assert(!sl::concat_rule(sh<sl::Spec<none, sl::partial_sum<"x">>>, sh<sl::Spec<none>>, 0).out.is_partial());
static_assert(!sl::concat_rule(sh<sl::Spec<none, sl::partial_max<"x">>>, sh<sl::Spec<none, sl::partial_max<"x">>>, 0).out.is_partial());
static_assert(sl::concat_rule(xn, sh<sl::Spec<"x">>, 0).status == S::rank_mismatch && sl::concat_rule(xn, sh<sl::Spec<"x">>, 0).operand == 1);
static_assert(sl::concat_rule(xn, xn, 2).status == S::dim_out_of_range && sl::concat_rule(xn, xn, 2).dim == 2);

// ---- take (gather / embedding) ----------------------------------------------------------------
using MD = sl::Mesh<"data", "model">;
// Vocab-parallel embedding: table [V, H] split over model on V, ids [B, S] over data.
constexpr auto emb_table = sl::sharding_v<MD, sl::Spec<"model", none>>;
constexpr auto emb_ids = sl::sharding_v<MD, sl::Spec<"data", none>>;
constexpr auto emb = sl::take_rule(emb_table, emb_ids, 0);
static_assert(emb && emb.count == 2 && emb.in[0] == emb_table && emb.in[1] == emb_ids && emb.comm.empty());
static_assert(std::is_same_v<sl::spec_t<MD, emb.out>, sl::Spec<"data", none, none, sl::partial_sum<"model">>>);
// Indices lose the axes the table uses; a partial-sum table stays partial, max is reduced.
constexpr auto tk = sl::take_rule(sh<sl::Spec<none, "x">>, sh<sl::Spec<"x", "y">>, 0);
static_assert(tk.in[1] == sh<sl::Spec<none, "y">> && tk.out == sh<sl::Spec<none, "y", "x">>);
constexpr auto tk1 = sl::take_rule(sh<sl::Spec<"x", "y">>, sl::sharding_v<M, sl::Spec<"y">>, 1);
static_assert(tk1.in[1] == sl::sharding_v<M, sl::Spec<none>> && tk1.out == sh<sl::Spec<"x", none, sl::partial_sum<"y">>>);
constexpr auto tk_ps = sl::take_rule(sh<sl::Spec<none, none, sl::partial_sum<"y">>>, sl::sharding_v<M, sl::Spec<"y">>, 0);
static_assert(tk_ps.in[0].is_partial() && tk_ps.in[1] == sl::sharding_v<M, sl::Spec<none>>);
static_assert(tk_ps.out == sh<sl::Spec<none, none, sl::partial_sum<"y">>>);
constexpr auto tk_pm = sl::take_rule(sh<sl::Spec<none, none, sl::partial_max<"y">>>, sl::sharding_v<M, sl::Spec<"y">>, 0);
static_assert(!tk_pm.in[0].is_partial() && tk_pm.in[1] == sl::sharding_v<M, sl::Spec<"y">> && tk_pm.out == sh<sl::Spec<"y", none>>);
// take along the last dim, rank-0 indices: the dim disappears.
static_assert(sl::take_rule(xy, sl::sharding_v<M, sl::Spec<>>, 1).out == sl::sharding_v<M, sl::Spec<"x", sl::partial_sum<"y">>>);
static_assert(sl::take_rule(xy, sh<sl::Spec<none, sl::partial_sum<"x">>>, 0).status == S::partial_indices);
static_assert(sl::take_rule(xy, sh<sl::Spec<none, sl::partial_sum<"x">>>, 0).operand == 1);
static_assert(sl::take_rule(xy, xy, 2).status == S::dim_out_of_range && sl::take_rule(xy, xy, 2).dim == 2);
constexpr sl::Sharding rank(int r) {
  sl::Sharding s;
  s.rank = r;
  return s;
}
static_assert(sl::take_rule(rank(5), rank(4), 0).status == S::ok && sl::take_rule(rank(5), rank(4), 0).out.rank == 8);
static_assert(sl::take_rule(rank(5), rank(5), 0).status == S::too_many_dims);

// ---- reshape patterns -------------------------------------------------------------------------
constexpr auto merge = sl::parse_reshape("b s h -> (b s) h");
static_assert(merge && merge.n_atoms == 3 && merge.in_rank == 3 && merge.out_rank == 2);
static_assert(merge.in_first[0] == 0 && merge.in_first[1] == 1 && merge.in_first[2] == 2 && merge.in_first[3] == 3);
static_assert(merge.out_first[0] == 0 && merge.out_first[1] == 2 && merge.out_first[2] == 3);
static_assert(merge.name(0) == "b" && merge.name(2) == "h" && merge.in_dim_of(2) == 2 && merge.out_dim_of(1) == 0);
constexpr auto split = sl::parse_reshape("batch seq(n_heads d_head)->batch seq n_heads d_head");
static_assert(split && split.in_rank == 3 && split.out_rank == 4 && split.in_first[2] == 2 && split.name(3) == "d_head");
static_assert(sl::parse_reshape(" -> ") && sl::parse_reshape("->").n_atoms == 0);
static_assert(sl::parse_reshape("(a) -> a").in_rank == 1);
constexpr bool fails_at(std::string_view pattern, int pos, std::string_view why) {
  const auto p = sl::parse_reshape(pattern);
  return p.status == S::bad_pattern && p.error_pos == pos && std::string_view(p.error).find(why) != std::string_view::npos;
}
static_assert(fails_at("a b -> b a", 7, "does not transpose"));
static_assert(fails_at("a b -> a", 8, "missing on the right"));
static_assert(fails_at("a b -> a b c", 11, "not on the left"));
static_assert(fails_at("a b -> a a b", 9, "twice on the right"));
static_assert(fails_at("a a -> a", 2, "twice on the left"));
static_assert(fails_at("a () -> a", 2, "empty group"));
static_assert(fails_at("(a (b)) -> a b", 3, "nest"));
static_assert(fails_at("(a b -> a b", 0, "not closed before '->'"));
static_assert(fails_at("a b -> (a b", 7, "not closed"));
static_assert(fails_at("a) -> a", 1, "without a matching"));
static_assert(fails_at("a b", 3, "no '->'"));
static_assert(fails_at("a -> a -> a", 7, "twice"));
static_assert(fails_at("a - a", 2, "'-' not followed"));
static_assert(fails_at("a 1 -> a", 2, "digit"));
static_assert(fails_at("a ... -> a", 2, "unexpected character"));
static_assert(fails_at("abcdefghijklmnop -> abcdefghijklmnop", 0, "longer than"));
static_assert(sl::parse_reshape("abcdefghijklmno -> abcdefghijklmno"));  // 15 characters
static_assert(fails_at("a b c d e f g h i -> (a b c d e f g h i)", 16, "max_tensor_rank"));
static_assert(fails_at("(a b c d e f g h i j k l m n o p q) -> q", 33, "max_reshape_atoms"));

// ---- reshape rule -----------------------------------------------------------------------------
constexpr auto rs_merge = sl::reshape_rule(merge, sh<sl::Spec<"x", none, "y">>);
static_assert(rs_merge && rs_merge.in[0] == sh<sl::Spec<"x", none, "y">> && rs_merge.out == sh<sl::Spec<"x", "y">>);
constexpr auto rs_rep = sl::reshape_rule(sl::parse_reshape("b s h -> b (s h)"), sh<sl::Spec<none, none, "y">>);
static_assert(rs_rep.in[0] == sh<sl::Spec<none, none, none>> && rs_rep.out == sh<sl::Spec<none, none>>);
constexpr auto rs_split = sl::reshape_rule(sl::parse_reshape("b (n d) -> b n d"), sh<sl::Spec<none, "y">>);
static_assert(rs_split.in[0] == sh<sl::Spec<none, "y">> && rs_split.out == sh<sl::Spec<none, "y", none>>);
constexpr auto rs_mix = sl::reshape_rule(sl::parse_reshape("(a b) c -> a (b c)"), sh<sl::Spec<"x", "y">>);
static_assert(rs_mix.in[0] == sh<sl::Spec<"x", none>> && rs_mix.out == sh<sl::Spec<"x", none>>);
constexpr auto rs_part = sl::reshape_rule(merge, sh<sl::Spec<none, none, "x", sl::partial_max<"y">>>);
static_assert(rs_part.in[0].is_partial() && rs_part.out == sh<sl::Spec<none, "x", sl::partial_max<"y">>>);
static_assert(sl::reshape_rule(merge, xy).status == S::rank_mismatch && sl::reshape_rule(merge, xy).operand == 0);
static_assert(sl::reshape_rule(sl::parse_reshape("a b -> b a"), xy).status == S::bad_pattern);
static_assert(sl::reshape_rule(sl::parse_reshape("a b -> b a"), xy).dim == 7);

// ---- reshape shapes ---------------------------------------------------------------------------
using A2 = std::array<std::int64_t, 2>;
using A3 = std::array<std::int64_t, 3>;
using A4 = std::array<std::int64_t, 4>;
static_assert(sl::reshape_out_shape(merge, A3{2, 3, 4}).valid && sl::reshape_out_shape(merge, A3{2, 3, 4}).first_unknown == -1);
static_assert(sl::reshape_out_shape(merge, A3{2, 3, 4}).extent[0] == 6 && sl::reshape_out_shape(merge, A3{2, 3, 4}).extent[1] == 4);
static_assert(sl::reshape_out_shape(split, A3{2, 3, 12}).first_unknown == 2 && sl::reshape_out_shape(split, A3{2, 3, 12}).extent[1] == 3);
static_assert(!sl::reshape_out_shape(merge, A2{2, 3}).valid && !sl::reshape_out_shape(merge, A3{2, -3, 4}).valid);
static_assert(sl::check_reshape_shapes(merge, A3{2, 3, 4}, A2{6, 4}) == -1);
static_assert(sl::check_reshape_shapes(merge, A3{2, 3, 4}, A2{5, 4}) == 0);
static_assert(sl::check_reshape_shapes(merge, A3{2, 3, 4}, A2{6, 5}) == 1);
static_assert(sl::check_reshape_shapes(merge, A3{2, 3, 4}, A2{6, -4}) == 1);
static_assert(sl::check_reshape_shapes(merge, A3{2, 3, 4}, A3{6, 4, 1}) == -2);
static_assert(sl::check_reshape_shapes(merge, A3{2, -3, 4}, A2{6, 4}) == -2);
static_assert(sl::check_reshape_shapes(split, A3{2, 3, 12}, A4{2, 3, 4, 3}) == -1);
static_assert(sl::check_reshape_shapes(split, A3{2, 3, 12}, A4{2, 3, 5, 3}) == 2);  // 5 does not divide 12
static_assert(sl::check_reshape_shapes(split, A3{2, 3, 12}, A4{2, 3, 4, 4}) == 3);
constexpr auto abc = sl::parse_reshape("(a b) c -> a (b c)");
static_assert(sl::check_reshape_shapes(abc, A2{6, 5}, A2{3, 10}) == -1);
static_assert(sl::check_reshape_shapes(abc, A2{6, 5}, A2{5, 6}) == 0);  // same size, but a = 5 does not divide 6
static_assert(sl::check_reshape_shapes(abc, A2{6, 5}, A2{2, 16}) == 1);
// Atoms alone on neither side: only products count.
constexpr auto same = sl::parse_reshape("(a b) -> (a b)");
static_assert(sl::check_reshape_shapes(same, std::array<std::int64_t, 1>{7}, std::array<std::int64_t, 1>{7}) == -1);
static_assert(sl::check_reshape_shapes(same, std::array<std::int64_t, 1>{7}, std::array<std::int64_t, 1>{8}) == 0);
// Zero extents: the zero must come from an atom of the zero dims.
static_assert(sl::check_reshape_shapes(merge, A3{0, 3, 4}, A2{0, 4}) == -1);
static_assert(sl::check_reshape_shapes(merge, A3{0, 3, 4}, A2{0, 5}) == 1);
static_assert(sl::check_reshape_shapes(sl::parse_reshape("a (b c) -> (a b) c"), A2{0, 6}, A2{0, 4}) == 1);  // b = 6/4
static_assert(sl::check_reshape_shapes(sl::parse_reshape("a (b c) -> (a b) c"), A2{0, 6}, A2{0, 3}) == -1);
static_assert(sl::check_reshape_shapes(sl::parse_reshape("(a b) -> a b"), std::array<std::int64_t, 1>{0}, A2{3, 0}) == -1);
static_assert(sl::check_reshape_shapes(sl::parse_reshape("(a b) -> a b"), std::array<std::int64_t, 1>{0}, A2{3, 2}) == 1);
// Overflowing products have no solution.
constexpr std::int64_t big = std::int64_t{1} << 62;
static_assert(sl::check_reshape_shapes(sl::parse_reshape("a b -> (a b)"), A2{big, 4}, std::array<std::int64_t, 1>{big}) == 0);

// ---- reshape without data movement ------------------------------------------------------------
constexpr sl::MeshShape mesh22(M::axis_names, std::array<int, 2>{2, 2});
constexpr auto hsplit = sl::parse_reshape("b (n d) -> b n d");
constexpr auto ny = sh<sl::Spec<none, "y">>;
constexpr auto ny_ = sh<sl::Spec<none, "y", none>>;
static_assert(sl::reshape_blocks_align(hsplit, ny, ny_, mesh22, A2{3, 12}, A3{3, 4, 3}));
static_assert(!sl::reshape_blocks_align(hsplit, ny, ny_, mesh22, A2{3, 6}, A3{3, 3, 2}));  // [0,3) vs [0,4)
static_assert(sl::reshape_blocks_align(hsplit, ny, ny_, mesh22, A2{3, 0}, A3{3, 0, 2}));   // no elements
static_assert(!sl::reshape_blocks_align(hsplit, ny, ny_, mesh22, A2{3, 12}, A3{3, 5, 3}));  // shapes do not fit
static_assert(!sl::reshape_blocks_align(hsplit, ny, sh<sl::Spec<none, none, "y">>, mesh22, A2{3, 12}, A3{3, 4, 3}));  // not the rule's out
static_assert(sl::reshape_blocks_align(merge, sh<sl::Spec<"x", none, "y">>, sh<sl::Spec<"x", "y">>, mesh22, A3{4, 3, 2}, A2{12, 2}));
static_assert(!sl::reshape_blocks_align(merge, sh<sl::Spec<"x", none, "y">>, sh<sl::Spec<"x", "y">>, mesh22, A3{3, 3, 2}, A2{9, 2}));

// ---- helpers for the property tests -----------------------------------------------------------
using sl::test::Rng;
using Shape = std::vector<std::int64_t>;

std::string str(const Shape& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// A random pattern over n atoms: both sides cut the atom sequence at random places.
struct RandomPattern {
  std::string text;
  std::vector<int> in_first, out_first;  // with the sentinel n
};
RandomPattern random_pattern(Rng& r, int n) {
  RandomPattern p;
  auto side = [&](std::vector<int>& first) {
    std::string s;
    for (int a = 0; a < n; ++a) {
      if (a == 0 || r.below(2) == 0) first.push_back(a);
    }
    first.push_back(n);
    for (std::size_t d = 0; d + 1 < first.size(); ++d) {
      const int len = first[d + 1] - first[d];
      const bool group = len > 1 || r.below(4) == 0;
      s += d ? (r.below(3) ? " " : "  ") : "";
      if (group) s += "(";
      for (int a = first[d]; a < first[d + 1]; ++a) {
        if (a > first[d]) s += " ";
        s += std::string("at") + static_cast<char>('a' + a);
      }
      if (group) s += r.below(2) ? ")" : " )";
    }
    return s;
  };
  const std::string lhs = side(p.in_first);
  const std::string rhs = side(p.out_first);
  p.text = lhs + (r.below(2) ? " -> " : "->") + rhs;
  return p;
}

// Extents of the dims of one side from atom extents.
Shape dims_of(const std::vector<int>& first, const std::vector<std::int64_t>& atoms) {
  Shape s;
  for (std::size_t d = 0; d + 1 < first.size(); ++d) {
    std::int64_t e = 1;
    for (int a = first[d]; a < first[d + 1]; ++a) e *= atoms[static_cast<std::size_t>(a)];
    s.push_back(e);
  }
  return s;
}

// Brute force for check_reshape_shapes: the longest prefix of output dims that some atom
// extents satisfy together with every input dim. Each atom is 0 or a divisor of the extent of
// a nonzero dim that holds it (any solution can be brought to that form).
int brute_shapes(const sl::ReshapePattern& p, const Shape& in, const Shape& out) {
  const int n = p.n_atoms;
  std::vector<std::vector<std::int64_t>> cand(static_cast<std::size_t>(n));
  auto add_divisors = [&](int first, int end, std::int64_t e) {
    for (int a = first; a < end; ++a) {
      auto& c = cand[static_cast<std::size_t>(a)];
      for (std::int64_t k = 1; k <= e; ++k)
        if (e % k == 0 && std::find(c.begin(), c.end(), k) == c.end()) c.push_back(k);
    }
  };
  for (int d = 0; d < p.in_rank; ++d) add_divisors(p.in_first[static_cast<std::size_t>(d)], p.in_first[static_cast<std::size_t>(d + 1)], in[static_cast<std::size_t>(d)]);
  for (int o = 0; o < p.out_rank; ++o) add_divisors(p.out_first[static_cast<std::size_t>(o)], p.out_first[static_cast<std::size_t>(o + 1)], out[static_cast<std::size_t>(o)]);
  for (auto& c : cand) c.push_back(0);
  std::vector<std::int64_t> atoms(static_cast<std::size_t>(n));
  std::vector<std::size_t> pick(static_cast<std::size_t>(n), 0);
  const std::vector<int> fi(p.in_first.begin(), p.in_first.begin() + p.in_rank + 1),
      fo(p.out_first.begin(), p.out_first.begin() + p.out_rank + 1);
  int best = -1;  // -1: no assignment satisfies the input dims
  while (true) {
    for (int a = 0; a < n; ++a) atoms[static_cast<std::size_t>(a)] = cand[static_cast<std::size_t>(a)][pick[static_cast<std::size_t>(a)]];
    if (dims_of(fi, atoms) == in) {
      const Shape o = dims_of(fo, atoms);
      int k = 0;
      while (k < p.out_rank && o[static_cast<std::size_t>(k)] == out[static_cast<std::size_t>(k)]) ++k;
      best = std::max(best, k);
    }
    int a = n - 1;
    for (; a >= 0; --a) {
      if (++pick[static_cast<std::size_t>(a)] < cand[static_cast<std::size_t>(a)].size()) break;
      pick[static_cast<std::size_t>(a)] = 0;
    }
    if (a < 0) break;
  }
  return best == p.out_rank ? -1 : best;
}

// Global row-major linear indices of a device's block, walked in the block's own row-major order.
std::vector<std::int64_t> block_indices(const sl::ShardBox& b, const Shape& shape) {
  std::vector<std::int64_t> v;
  if (b.num_elements() == 0) return v;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(b.rank));
  for (int d = 0; d < b.rank; ++d) idx[static_cast<std::size_t>(d)] = b.offset[static_cast<std::size_t>(d)];
  while (true) {
    std::int64_t k = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) k = k * shape[d] + idx[d];
    v.push_back(k);
    int d = b.rank - 1;
    for (; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      if (++idx[u] < b.offset[u] + b.extent[u]) break;
      idx[u] = b.offset[u];
    }
    if (d < 0) return v;
  }
}

// Every mesh axis appears at most once over the dims and the partial clause.
bool valid(const sl::Sharding& s, int mesh_rank) {
  std::vector<int> uses(static_cast<std::size_t>(mesh_rank), 0);
  for (int d = 0; d < s.rank; ++d)
    for (int a : s.dims[static_cast<std::size_t>(d)]) ++uses[static_cast<std::size_t>(a)];
  for (int a : s.partial) ++uses[static_cast<std::size_t>(a)];
  return std::all_of(uses.begin(), uses.end(), [](int u) { return u <= 1; });
}
}  // namespace

TEST_SUITE("sharding_rules_layout") {
TEST_CASE("random patterns parse back to the cuts they were made from") {
  Rng r{std::mt19937_64(515)};
  for (int c = 0; c < 500; ++c) {
    const int n = 1 + r.below(8);
    const RandomPattern rp = random_pattern(r, n);
    const auto p = sl::parse_reshape(rp.text);
    INFO(rp.text);
    REQUIRE(p);
    CHECK(p.n_atoms == n);
    CHECK(p.in_rank + 1 == static_cast<int>(rp.in_first.size()));
    CHECK(p.out_rank + 1 == static_cast<int>(rp.out_first.size()));
    for (std::size_t d = 0; d < rp.in_first.size(); ++d) CHECK(p.in_first[d] == rp.in_first[d]);
    for (std::size_t d = 0; d < rp.out_first.size(); ++d) CHECK(p.out_first[d] == rp.out_first[d]);
    for (int a = 0; a < n; ++a) {
      CHECK(p.name(a) == std::string("at") + static_cast<char>('a' + a));
      CHECK(p.in_first[static_cast<std::size_t>(p.in_dim_of(a))] <= a);
      CHECK(a < p.in_first[static_cast<std::size_t>(p.in_dim_of(a) + 1)]);
      CHECK(p.out_first[static_cast<std::size_t>(p.out_dim_of(a))] <= a);
      CHECK(a < p.out_first[static_cast<std::size_t>(p.out_dim_of(a) + 1)]);
    }
  }
}

TEST_CASE("check_reshape_shapes agrees with a brute-force search (3000 random cases)") {
  Rng r{std::mt19937_64(20261201)};
  int fits = 0, misfits = 0;
  for (int c = 0; c < 3000; ++c) {
    const int n = 1 + r.below(4);
    const RandomPattern rp = random_pattern(r, n);
    const auto p = sl::parse_reshape(rp.text);
    REQUIRE(p);
    std::vector<std::int64_t> atoms;
    for (int a = 0; a < n; ++a) atoms.push_back(r.below(8) == 0 ? 0 : 1 + r.below(4));
    Shape in = dims_of(rp.in_first, atoms), out = dims_of(rp.out_first, atoms);
    // Perturb: another shape of the same atoms' size, or one extent changed.
    const int how = r.below(4);
    if (how == 1) {
      out[static_cast<std::size_t>(r.below(p.out_rank))] = r.below(13);
    } else if (how == 2) {
      in[static_cast<std::size_t>(r.below(p.in_rank))] = r.below(13);
    } else if (how == 3 && p.out_rank >= 2) {  // move a factor between two output dims
      const auto i = static_cast<std::size_t>(r.below(p.out_rank)), j = static_cast<std::size_t>(r.below(p.out_rank));
      const std::int64_t f = 2 + r.below(2);
      if (i != j && out[i] % f == 0) {
        out[i] /= f;
        out[j] *= f;
      }
    }
    const int got = sl::check_reshape_shapes(p, in, out), want = brute_shapes(p, in, out);
    INFO(rp.text << " in " << str(in) << " out " << str(out));
    CHECK(got == want);
    (got == -1 ? fits : misfits)++;
  }
  MESSAGE(fits << " fit, " << misfits << " do not");
  CHECK(fits > 1000);
  CHECK(misfits > 500);
}

TEST_CASE("reshape_rule gives valid shardings that only replicate input dims") {
  Rng r{std::mt19937_64(77)};
  for (int c = 0; c < 2000; ++c) {
    const int n = 1 + r.below(6), mesh_rank = 1 + r.below(4);
    const RandomPattern rp = random_pattern(r, n);
    const auto p = sl::parse_reshape(rp.text);
    const sl::Sharding in = sl::test::random_sharding(r, mesh_rank, p.in_rank, true);
    const sl::OpRule rule = sl::reshape_rule(p, in);
    INFO(rp.text);
    REQUIRE(rule);
    CHECK(rule.count == 1);
    CHECK(rule.in[0].rank == in.rank);
    CHECK(rule.in[0].partial == in.partial);
    for (int d = 0; d < in.rank; ++d) {
      const auto& got = rule.in[0].dims[static_cast<std::size_t>(d)];
      CHECK((got == in.dims[static_cast<std::size_t>(d)] || got.empty()));
    }
    CHECK(rule.out.rank == p.out_rank);
    CHECK(valid(rule.out, mesh_rank));
    CHECK(rule.out.partial == sl::detail::sorted_axes(in.partial));
    // Applying the rule to its own operand sharding changes nothing more.
    CHECK(sl::reshape_rule(p, rule.in[0]).in[0] == rule.in[0]);
    // Every axis of the operand survives in the output, on the dim of the same first atom.
    for (int d = 0; d < in.rank; ++d) {
      const int a = p.in_first[static_cast<std::size_t>(d)];
      const auto& axes = rule.in[0].dims[static_cast<std::size_t>(d)];
      if (!axes.empty()) {
        const int o = p.out_dim_of(a);
        CHECK(p.out_first[static_cast<std::size_t>(o)] == a);
        CHECK(rule.out.dims[static_cast<std::size_t>(o)] == axes);
      }
    }
  }
}

TEST_CASE("reshape_blocks_align agrees with comparing every device's elements (5000 random cases)") {
  Rng r{std::mt19937_64(4242)};
  const sl::AxisName names[] = {"a", "b", "c"};
  int aligned = 0, misaligned = 0, sharded_aligned = 0;
  for (int c = 0; c < 5000; ++c) {
    const int mesh_rank = 1 + r.below(3);
    std::vector<int> sizes;
    for (int i = 0; i < mesh_rank; ++i) sizes.push_back(1 + r.below(4));
    const sl::MeshShape mesh(sl::detail::ArrayRef<sl::AxisName>(names, static_cast<std::size_t>(mesh_rank)), sizes);
    const int n = 1 + r.below(4);
    const RandomPattern rp = random_pattern(r, n);
    const auto p = sl::parse_reshape(rp.text);
    std::vector<std::int64_t> atoms;
    for (int a = 0; a < n; ++a) atoms.push_back(r.below(12) == 0 ? 0 : 1 + r.below(5));
    const Shape in_shape = dims_of(rp.in_first, atoms), out_shape = dims_of(rp.out_first, atoms);
    const sl::OpRule rule = sl::reshape_rule(p, sl::test::random_sharding(r, mesh_rank, p.in_rank, r.below(4) == 0));
    REQUIRE(rule);
    bool want = true;
    for (int dev = 0; dev < mesh.num_devices() && want; ++dev)
      want = block_indices(sl::shard_box(rule.in[0], mesh, in_shape, dev), in_shape) ==
             block_indices(sl::shard_box(rule.out, mesh, out_shape, dev), out_shape);
    const bool got = sl::reshape_blocks_align(p, rule.in[0], rule.out, mesh, in_shape, out_shape);
    INFO(rp.text << " in " << str(in_shape) << " out " << str(out_shape) << " mesh "
                 << mesh.to_string() << " " << sl::to_spec(rule.in[0], mesh).to_string() << " -> "
                 << sl::to_spec(rule.out, mesh).to_string());
    CHECK(got == want);
    (want ? aligned : misaligned)++;
    bool sharded = false;
    for (int d = 0; d < rule.in[0].rank; ++d)
      sharded = sharded || mesh.group_size(rule.in[0].dims[static_cast<std::size_t>(d)]) > 1;
    if (want && sharded) ++sharded_aligned;
  }
  MESSAGE(aligned << " aligned (" << sharded_aligned << " of them split), " << misaligned << " not");
  CHECK(aligned > 500);
  CHECK(misaligned > 300);
  CHECK(sharded_aligned > 300);
}

TEST_CASE("random shardings through the reduction and layout rules stay valid") {
  Rng r{std::mt19937_64(9)};
  for (int c = 0; c < 2000; ++c) {
    const int mesh_rank = 1 + r.below(4), rank = 1 + r.below(4);
    const sl::Sharding a = sl::test::random_sharding(r, mesh_rank, rank, true);
    const sl::Sharding b = sl::test::random_sharding(r, mesh_rank, rank, true);
    const int dim = r.below(rank);
    for (auto red : {R::sum, R::mean, R::max, R::min, R::argmax})
      for (bool keep : {false, true}) {
        const auto rule = sl::reduce_rule(red, a, dim, keep);
        REQUIRE(rule);
        CHECK(valid(rule.out, mesh_rank));
        CHECK(rule.out.rank == rank - (keep ? 0 : 1));
        CHECK(rule.out.partial == sl::detail::sorted_axes(rule.out.partial));
        CHECK((rule.out.is_partial() || rule.out.op == sl::ReduceOp::sum));
        CHECK((rule.in[0] == a || rule.in[0] == sl::detail::reduced(a)));
      }
    const auto cr = sl::concat_rule(a, b, dim);
    REQUIRE(cr);
    CHECK(valid(cr.in[1], mesh_rank));
    CHECK(valid(cr.out, mesh_rank));
    const auto tr = sl::take_rule(sl::detail::reduced(b), a, dim);  // table b, indices a
    if (a.is_partial()) {
      CHECK(tr.status == S::partial_indices);
      continue;
    }
    REQUIRE(tr);
    CHECK(tr.out.rank == 2 * rank - 1);
    CHECK(valid(tr.out, mesh_rank));
    CHECK(tr.in[0] == sl::detail::reduced(b));
    std::vector<int> perm(static_cast<std::size_t>(rank));
    for (int i = 0; i < rank; ++i) perm[static_cast<std::size_t>(i)] = i;
    std::shuffle(perm.begin(), perm.end(), r.g);
    const auto pr = sl::permute_rule(a, perm);
    REQUIRE(pr);
    for (int i = 0; i < rank; ++i) CHECK(pr.out.dims[static_cast<std::size_t>(i)] == a.dims[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])]);
  }
}

TEST_CASE("run-time patterns: errors name the position") {
  const std::string text = "b s h -> h (b s)";
  const auto p = sl::parse_reshape(text);
  CHECK(p.status == S::bad_pattern);
  CHECK(p.error_pos == 9);
  CHECK(std::string(p.error).find("does not transpose") != std::string::npos);
  CHECK(sl::describe(sl::reshape_rule(p, sl::Sharding{}).status) == "the reshape pattern does not parse or its sides differ");
}
}  // TEST_SUITE
