// SPDX-License-Identifier: Apache-2.0
/// @file
/// The row kernels of blockwise (flash-style) attention, which ring attention runs between its
/// GEMMs: an online softmax that folds one block of keys at a time into a running maximum `m`,
/// sum `l` and output, and the backward's probabilities and score gradients recomputed from the
/// saved log-sum-exp. One row is one query of one (batch, head):
/// `r = (b * heads + h) * queries + i`; a block of scores is `[batch][heads][queries][keys]`,
/// row-major; outputs are laid out as the queries, `[batch][queries][heads][head dim]`.
///
/// Portable kernels (a Kokkos range over rows or elements, on any execution space); every call
/// fences a host instance, as every host kernel does. Knows nothing of tensors or collectives.
#pragma once

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/half.hpp>
#include <shardlib/kernels/exec.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

namespace shardlib::kernels {

/// Where a block of attention's scores sits: local extents (batch, heads, queries of this
/// device, keys of the block), the global positions of its first query and key, the keys of
/// the whole sequence (a mask's row length), and the mask of the scores.
struct AttentionBlock {
  std::int64_t batch = 0, heads = 0, queries = 0, keys = 0;
  std::int64_t query_offset = 0, key_offset = 0, all_keys = 0;
  bool causal = false;  ///< key j hidden from query i when j > i (global positions)
  /// The rows' count.
  KOKKOS_INLINE_FUNCTION std::int64_t rows() const { return batch * heads * queries; }
  /// The keys row `r` sees, a prefix of the block: all, or under `causal` those at or before its
  /// query (0 when the block lies after it).
  KOKKOS_INLINE_FUNCTION std::int64_t visible(std::int64_t r) const {
    if (!causal) return keys;
    const std::int64_t n = query_offset + r % queries - key_offset + 1;
    return n < 0 ? 0 : n < keys ? n : keys;
  }
  /// Whether no row sees a key of the block (it may be skipped).
  bool hidden() const { return keys == 0 || queries == 0 || (causal && key_offset > query_offset + queries - 1); }
};

namespace detail::attention_rows {

/// -infinity, made on the host (device code reads it from the kernel's members).
template <class A>
A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

/// x[k] = value.
template <class X>
struct Fill {
  X* x;
  X value;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const { x[k] = value; }
};

/// Folds one block of raw scores s = q k^T into row r's running state: x = scale s + mask; with
/// m' = max(m, max x), writes p = exp(x - m') over s (0 past the visible keys), alpha = exp(m - m'),
/// l = alpha l + sum p, m = m'. A row that sees no key of the block (or only -infinity) keeps its
/// state: alpha = 1, p = 0.
template <class T, class A>
struct OnlineSoftmax {
  T* s;
  const T* mask;  // [all queries, all keys] or null
  A* m;
  A* l;
  A* alpha;
  AttentionBlock blk;
  A scale;
  A ninf;  // -infinity
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    using std::exp;
    T* row = s + r * blk.keys;
    const std::int64_t n = blk.visible(r);
    const T* mrow = mask ? mask + (blk.query_offset + r % blk.queries) * blk.all_keys + blk.key_offset : nullptr;
    A bm = ninf;
    for (std::int64_t j = 0; j < n; ++j) {
      const A x = scale * static_cast<A>(row[j]) + (mrow ? static_cast<A>(mrow[j]) : A(0));
      bm = x > bm ? x : bm;
    }
    const A m0 = m[r];
    const A m1 = bm > m0 ? bm : m0;
    if (m1 == ninf) {  // nothing seen yet, nor here
      for (std::int64_t j = 0; j < blk.keys; ++j) row[j] = T(0);
      alpha[r] = A(1);
      return;
    }
    A sum = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const A x = scale * static_cast<A>(row[j]) + (mrow ? static_cast<A>(mrow[j]) : A(0));
      const T p = static_cast<T>(exp(x - m1));
      row[j] = p;
      sum += static_cast<A>(p);  // the rounded p, which the product with v reads
    }
    for (std::int64_t j = n; j < blk.keys; ++j) row[j] = T(0);
    const A a = exp(m0 - m1);  // 0 for the first block a row sees (m0 = -infinity)
    alpha[r] = a;
    l[r] = a * l[r] + sum;
    m[r] = m1;
  }
};

/// The row (b * heads + h) * queries + i of element e of an output [batch][queries][heads][dv].
KOKKOS_INLINE_FUNCTION std::int64_t row_of(std::int64_t e, std::int64_t queries, std::int64_t heads, std::int64_t dv) {
  const std::int64_t t = e / dv;  // (b * queries + i) * heads + h
  const std::int64_t h = t % heads, bi = t / heads;
  return (bi / queries * heads + h) * queries + bi % queries;
}

/// Element e of a [batch][queries][heads][dv] tile of queries within an array of `seq` queries
/// per batch index (the tile's first query at the array's start): its offset in the array.
KOKKOS_INLINE_FUNCTION std::int64_t in_run(std::int64_t e, std::int64_t queries, std::int64_t seq, std::int64_t heads,
                                           std::int64_t dv) {
  return e + e / (queries * heads * dv) * (seq - queries) * heads * dv;
}

/// acc = alpha[row] acc + pv over a tile's output elements [batch][queries][heads][dv] (pv
/// compact, acc in its run of `seq` queries).
template <class T, class A>
struct Merge {
  A* acc;
  const T* pv;
  const A* alpha;
  std::int64_t queries, seq, heads, dv;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t e) const {
    const std::int64_t at = in_run(e, queries, seq, heads, dv);
    acc[at] = alpha[row_of(e, queries, heads, dv)] * acc[at] + static_cast<A>(pv[e]);
  }
};

/// o = acc / l[row] (T), over a tile's output elements (both in their runs of `seq` queries).
template <class T, class A>
struct Finish {
  T* o;
  const A* acc;
  const A* l;
  std::int64_t queries, seq, heads, dv;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t e) const {
    const std::int64_t at = in_run(e, queries, seq, heads, dv);
    o[at] = static_cast<T>(acc[at] / l[row_of(e, queries, heads, dv)]);
  }
};

/// lse = m + log(l), the log-sum-exp the backward recomputes the probabilities from.
template <class A>
struct LogSumExp {
  A* m;  // becomes the lse
  const A* l;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    using std::log;
    m[r] = m[r] + log(l[r]);
  }
};

/// delta[row] = sum over the head dim of do * o (the backward's row term), over a tile's rows
/// (g and o in their runs of `seq` queries).
template <class T, class A>
struct Delta {
  A* delta;
  const T* g;
  const T* o;
  std::int64_t queries, seq, heads, dv;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    const std::int64_t i = r % queries, t = r / queries;
    const std::int64_t h = t % heads, b = t / heads;
    const std::int64_t at = ((b * seq + i) * heads + h) * dv;
    A sum = 0;
    for (std::int64_t c = 0; c < dv; ++c) sum += static_cast<A>(g[at + c]) * static_cast<A>(o[at + c]);
    delta[r] = sum;
  }
};

/// p = exp(scale s + mask - lse[row]) over the visible keys, 0 past them (over s).
template <class T, class A>
struct Probabilities {
  T* s;
  const T* mask;
  const A* lse;
  AttentionBlock blk;
  A scale;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    using std::exp;
    T* row = s + r * blk.keys;
    const std::int64_t n = blk.visible(r);
    const T* mrow = mask ? mask + (blk.query_offset + r % blk.queries) * blk.all_keys + blk.key_offset : nullptr;
    const A z = lse[r];
    for (std::int64_t j = 0; j < n; ++j)
      row[j] = static_cast<T>(exp(scale * static_cast<A>(row[j]) + (mrow ? static_cast<A>(mrow[j]) : A(0)) - z));
    for (std::int64_t j = n; j < blk.keys; ++j) row[j] = T(0);
  }
};

/// ds = scale p (dp - delta[row]) (over dp).
template <class T, class A>
struct ScoreGradient {
  T* dp;
  const T* p;
  const A* delta;
  std::int64_t keys;
  A scale;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    T* row = dp + r * keys;
    const T* prow = p + r * keys;
    const A d = delta[r];
    for (std::int64_t j = 0; j < keys; ++j)
      row[j] = static_cast<T>(scale * static_cast<A>(prow[j]) * (static_cast<A>(row[j]) - d));
  }
};

}  // namespace detail::attention_rows

/// x[0, n) = value.
template <class Exec, class X>
void attention_fill(const Exec& exec, X* x, std::int64_t n, X value) {
  if (n > 0) count_kernel(static_cast<std::uint64_t>(n) * sizeof(X));  // x written
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::attention::fill", n, detail::attention_rows::Fill<X>{x, value});
}

/// Starts the online softmax: acc (the output's elements) = 0, m = -infinity, l = 0 (rows).
template <class Exec, class A>
void attention_start(const Exec& exec, A* acc, std::int64_t elements, A* m, A* l, std::int64_t rows) {
  // (three attention_fill calls, each counted, and nothing else in shape-only mode)
  attention_fill(exec, acc, elements, A(0));
  attention_fill(exec, m, rows, detail::attention_rows::neg_inf<A>());
  attention_fill(exec, l, rows, A(0));
}

/// Folds a block of raw scores `s` (q k^T, [batch][heads][queries][keys]) into the rows' m and
/// l, leaving the block's probabilities in `s` and each row's rescaling factor in `alpha`.
template <class Exec, class T, class A>
void attention_online_softmax(const Exec& exec, T* s, const T* mask, A* m, A* l, A* alpha, const AttentionBlock& blk,
                              A scale) {
  if (blk.rows() > 0) {  // s read and written; the block's mask read; m, l read and written, alpha written
    const std::uint64_t scores = static_cast<std::uint64_t>(blk.rows() * blk.keys);
    const std::uint64_t masked = mask != nullptr ? static_cast<std::uint64_t>(blk.queries * blk.keys) : 0;
    count_kernel((2 * scores + masked) * sizeof(T) + 5 * static_cast<std::uint64_t>(blk.rows()) * sizeof(A));
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::attention::online_softmax", blk.rows(),
                        detail::attention_rows::OnlineSoftmax<T, A>{s, mask, m, l, alpha, blk, scale, detail::attention_rows::neg_inf<A>()});
}

/// acc = alpha acc + pv, both laid out as the output ([batch][queries][heads][dv]): pv a compact
/// tile of `queries`, acc that tile within its run of `seq` queries per batch index (acc points at
/// the tile's first query).
template <class Exec, class T, class A>
void attention_merge(const Exec& exec, A* acc, const T* pv, const A* alpha, std::int64_t batch, std::int64_t queries,
                     std::int64_t seq, std::int64_t heads, std::int64_t dv) {
  if (batch * queries * heads * dv > 0) {  // acc read and written, pv read; alpha read
    const std::uint64_t elements = static_cast<std::uint64_t>(batch * queries * heads * dv);
    const std::uint64_t rows = static_cast<std::uint64_t>(batch * heads * queries);
    count_kernel(elements * (2 * sizeof(A) + sizeof(T)) + rows * sizeof(A));
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::attention::merge", batch * queries * heads * dv,
                        detail::attention_rows::Merge<T, A>{acc, pv, alpha, queries, seq, heads, dv});
}

/// o = acc / l over a tile of `queries` (o and acc point at its first query, in runs of `seq`
/// queries per batch index); then m becomes the rows' log-sum-exp, m + log(l).
template <class Exec, class T, class A>
void attention_finish(const Exec& exec, T* o, const A* acc, A* m, const A* l, std::int64_t batch, std::int64_t queries,
                      std::int64_t seq, std::int64_t heads, std::int64_t dv) {
  if (batch * queries * heads > 0) {  // o written, acc read; l read, m read and written (its two kernels)
    const std::uint64_t elements = static_cast<std::uint64_t>(batch * queries * heads * dv);
    const std::uint64_t rows = static_cast<std::uint64_t>(batch * heads * queries);
    count_kernel(elements * (sizeof(T) + sizeof(A)) + 3 * rows * sizeof(A));
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::attention::finish", batch * queries * heads * dv,
                        detail::attention_rows::Finish<T, A>{o, acc, l, queries, seq, heads, dv});
  detail::portable::run(exec, "shardlib::attention::lse", batch * heads * queries, detail::attention_rows::LogSumExp<A>{m, l});
}

/// delta[row] = sum of g * o over the head dim, over a tile of `queries` (g, o laid out as the
/// output, pointing at the tile's first query, in runs of `seq` queries per batch index).
template <class Exec, class T, class A>
void attention_delta(const Exec& exec, A* delta, const T* g, const T* o, std::int64_t batch, std::int64_t queries,
                     std::int64_t seq, std::int64_t heads, std::int64_t dv) {
  if (batch * heads * queries > 0) {  // g, o read; delta written
    const std::uint64_t rows = static_cast<std::uint64_t>(batch * heads * queries);
    count_kernel(rows * (2 * static_cast<std::uint64_t>(dv) * sizeof(T) + sizeof(A)));
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::attention::delta", batch * heads * queries,
                        detail::attention_rows::Delta<T, A>{delta, g, o, queries, seq, heads, dv});
}

/// The block's probabilities from its raw scores (in place) and the rows' log-sum-exp.
template <class Exec, class T, class A>
void attention_probabilities(const Exec& exec, T* s, const T* mask, const A* lse, const AttentionBlock& blk, A scale) {
  if (blk.rows() > 0) {  // s read and written; the block's mask read; lse read
    const std::uint64_t scores = static_cast<std::uint64_t>(blk.rows() * blk.keys);
    const std::uint64_t masked = mask != nullptr ? static_cast<std::uint64_t>(blk.queries * blk.keys) : 0;
    count_kernel((2 * scores + masked) * sizeof(T) + static_cast<std::uint64_t>(blk.rows()) * sizeof(A));
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::attention::probabilities", blk.rows(),
                        detail::attention_rows::Probabilities<T, A>{s, mask, lse, blk, scale});
}

/// The scores' gradient from the probabilities' (in place in `dp`): scale p (dp - delta).
template <class Exec, class T, class A>
void attention_score_gradient(const Exec& exec, T* dp, const T* p, const A* delta, const AttentionBlock& blk, A scale) {
  if (blk.rows() > 0) {  // dp read and written, p read; delta read
    const std::uint64_t scores = static_cast<std::uint64_t>(blk.rows() * blk.keys);
    count_kernel(3 * scores * sizeof(T) + static_cast<std::uint64_t>(blk.rows()) * sizeof(A));
  }
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, "shardlib::attention::score_gradient", blk.rows(),
                        detail::attention_rows::ScoreGradient<T, A>{dp, p, delta, blk.keys, scale});
}

}  // namespace shardlib::kernels
