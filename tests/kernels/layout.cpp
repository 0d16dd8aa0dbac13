// SPDX-License-Identifier: Apache-2.0
// permute, take and copy_sub_box (kernels/layout.hpp) against index arithmetic on random
// shapes: every perm of rank 3, random perms of ranks 1..5, transposes that are not square and
// not multiples of the 32 x 32 tile, take over blocks of a table summed like the vocab-parallel
// embedding, and bad arguments rejected before anything is written; the device forms
// (detail::portable) run on a host instance against the host kernels.
#include <doctest/doctest.h>
#include <shardlib/kernels/layout.hpp>

#include "../errors.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace k = shardlib::kernels;

namespace {

using I64 = std::int64_t;
/// The host instance the kernels run on, made when first used: after Kokkos is initialised (an
/// instance made before, at namespace scope, is an error with an OpenMP Kokkos 4.6).
const Kokkos::DefaultHostExecutionSpace& exec() {
  static const Kokkos::DefaultHostExecutionSpace e{};
  return e;
}

I64 count(const std::vector<I64>& e) {
  return std::accumulate(e.begin(), e.end(), I64{1}, [](I64 a, I64 b) { return a * b; });
}

std::vector<double> iota(I64 n) {
  std::vector<double> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 1.0);
  return v;
}

// Row-major multi-index of a linear index.
std::vector<I64> unravel(I64 lin, const std::vector<I64>& e) {
  std::vector<I64> idx(e.size());
  for (std::size_t d = e.size(); d-- > 0;) {
    idx[d] = lin % e[d];
    lin /= e[d];
  }
  return idx;
}
I64 ravel(const std::vector<I64>& idx, const std::vector<I64>& e) {
  I64 k = 0;
  for (std::size_t d = 0; d < e.size(); ++d) k = k * e[d] + idx[d];
  return k;
}

// Checks permute on one shape and perm against the definition out[idx] = in[idx mapped back].
template <class T>
void check_permute(const std::vector<I64>& ext, const std::vector<int>& perm) {
  const int rank = int(ext.size());
  const I64 n = count(ext);
  std::vector<T> in(static_cast<std::size_t>(n));
  for (I64 i = 0; i < n; ++i) in[std::size_t(i)] = static_cast<T>(i + 1);
  std::vector<I64> oext(ext.size());
  for (int k2 = 0; k2 < rank; ++k2) oext[std::size_t(k2)] = ext[std::size_t(perm[std::size_t(k2)])];
  std::vector<T> out(std::size_t(n) + 1, T(-7));  // one sentinel past the end
  k::permute(exec(), in.data(), out.data(), rank, ext.data(), perm.data());
  for (I64 o = 0; o < n; ++o) {
    const auto oi = unravel(o, oext);
    std::vector<I64> ii(ext.size());
    for (int k2 = 0; k2 < rank; ++k2) ii[std::size_t(perm[std::size_t(k2)])] = oi[std::size_t(k2)];
    REQUIRE(out[std::size_t(o)] == in[std::size_t(ravel(ii, ext))]);
  }
  REQUIRE(out[std::size_t(n)] == T(-7));
}

std::string shape_text(const std::vector<I64>& e, const std::vector<int>& p) {
  std::string s = "extent";
  for (I64 x : e) s += " " + std::to_string(x);
  s += " perm";
  for (int x : p) s += " " + std::to_string(x);
  return s;
}

using shardlib::test::message_of;

}  // namespace

TEST_SUITE("kernels_layout") {
  TEST_CASE("permute: every perm of rank 3 and random perms of ranks 1..5 on random extents") {
    std::mt19937_64 g(11);
    const I64 ext_choice[] = {0, 1, 1, 2, 3, 5, 17, 32, 33, 40};
    for (int c = 0; c < 60; ++c) {
      std::vector<I64> ext(3);
      for (auto& x : ext) x = ext_choice[g() % std::size(ext_choice)];
      std::vector<int> perm = {0, 1, 2};
      do {
        CAPTURE(shape_text(ext, perm));
        check_permute<float>(ext, perm);
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
    for (int c = 0; c < 400; ++c) {
      const int rank = 1 + int(g() % 5);
      std::vector<I64> ext(std::size_t(rank), 1);
      for (auto& x : ext) x = ext_choice[g() % std::size(ext_choice)];
      while (count(ext) > 40000) ext[g() % ext.size()] = 2;
      std::vector<int> perm(static_cast<std::size_t>(rank));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), g);
      CAPTURE(shape_text(ext, perm));
      if (c % 2 == 0) check_permute<double>(ext, perm);
      else check_permute<std::int16_t>(ext, perm);
    }
  }

  TEST_CASE("permute: transposes that are not square nor tile multiples, batched, identities, rank 0") {
    const std::vector<std::pair<std::vector<I64>, std::vector<int>>> cases = {
        {{37, 70}, {1, 0}},          {{70, 37}, {1, 0}},           {{1, 100}, {1, 0}},
        {{100, 1}, {1, 0}},          {{33, 1}, {1, 0}},            {{3, 45, 33}, {0, 2, 1}},
        {{2, 31, 65, 3}, {0, 1, 3, 2}}, {{4, 1, 97, 1, 35}, {0, 4, 2, 1, 3}}, {{64, 96}, {1, 0}},
        {{130, 300}, {1, 0}},        {{2, 129, 257}, {0, 2, 1}},   {{3, 200, 5, 150}, {0, 3, 2, 1}},  // > 1 tile
        {{5, 6, 7}, {2, 0, 1}},      {{3, 4, 5, 6}, {1, 0, 2, 3}},  // last dim kept: run copies
        {{40000}, {0}},              {{2, 20000}, {0, 1}},          // identity: contiguous, chunked
        {{1, 1, 1}, {2, 0, 1}},      {{}, {}},                      // one element
    };
    for (const auto& c : cases) {
      const auto& ext = c.first;  // (clang 14 cannot capture structured bindings in CAPTURE)
      const auto& perm = c.second;
      CAPTURE(shape_text(ext, perm));
      check_permute<float>(ext, perm);
      check_permute<char>(ext, perm);
    }
  }

  TEST_CASE("permute: a bad rank or perm throws before writing") {
    const std::vector<I64> ext = {2, 3, 4};
    std::vector<float> in(24, 1), out(24, 0);
    const int repeat[3] = {0, 1, 1}, outside[3] = {0, 3, 1};
    CHECK(message_of<std::invalid_argument>([&] { k::permute(exec(), in.data(), out.data(), 3, ext.data(), repeat); }) ==
          "shardlib::kernels::permute: perm[2] = 1 repeats a dim: perm must be a permutation of 0..2");
    CHECK(message_of<std::invalid_argument>([&] { k::permute(exec(), in.data(), out.data(), 3, ext.data(), outside); }) ==
          "shardlib::kernels::permute: perm[1] = 3 is outside [0, 3): perm must be a permutation of 0..2");
    CHECK(message_of<std::invalid_argument>([&] { k::permute(exec(), in.data(), out.data(), 9, ext.data(), repeat); })
              .find("rank 9 is outside [0, 8]") != std::string::npos);
    const I64 neg[2] = {2, -1};
    const int id2[2] = {0, 1};
    CHECK(message_of<std::invalid_argument>([&] { k::permute(exec(), in.data(), out.data(), 2, neg, id2); })
              .find("extent -1 of dim 1 is negative") != std::string::npos);
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0; }));
  }

  TEST_CASE("copy_sub_box: random boxes of ranks 0..4 match index arithmetic") {
    std::mt19937_64 g(12);
    for (int c = 0; c < 500; ++c) {
      const int rank = int(g() % 5);
      std::vector<I64> ext(static_cast<std::size_t>(rank)), start(ext.size()), cnt(ext.size());
      for (int d = 0; d < rank; ++d) {
        const auto u = std::size_t(d);
        ext[u] = I64(g() % 12);
        if (g() % 4 == 0) ext[u] = 40;  // > tile, several runs
        start[u] = ext[u] == 0 ? 0 : I64(g() % std::uint64_t(ext[u] + 1));
        cnt[u] = I64(g() % std::uint64_t(ext[u] - start[u] + 1));
        if (g() % 3 == 0) start[u] = 0, cnt[u] = ext[u];  // whole dims merge into runs
      }
      const auto in = iota(count(ext));
      const I64 n = count(cnt);
      std::vector<double> out(std::size_t(n) + 1, -7);
      k::copy_sub_box(exec(), in.data(), rank, ext.data(), start.data(), cnt.data(), out.data());
      for (I64 o = 0; o < n; ++o) {
        auto idx = unravel(o, cnt);
        for (std::size_t d = 0; d < idx.size(); ++d) idx[d] += start[d];
        REQUIRE(out[std::size_t(o)] == in[std::size_t(ravel(idx, ext))]);
      }
      REQUIRE(out[std::size_t(n)] == -7);
    }
    // Long contiguous runs (chunked copies).
    const std::vector<I64> ext = {3, 50000}, start = {1, 7}, cnt = {2, 49990};
    const auto in = iota(count(ext));
    std::vector<double> out(std::size_t(count(cnt)));
    k::copy_sub_box(exec(), in.data(), 2, ext.data(), start.data(), cnt.data(), out.data());
    CHECK(out.front() == in[50007]);
    CHECK(out.back() == in[2 * 50000 + 7 + 49989]);
    CHECK(out[49990] == in[100007]);
  }

  TEST_CASE("copy_sub_box: a box leaving the input throws naming the dim") {
    const std::vector<I64> ext = {4, 5}, cnt = {2, 3};
    const std::vector<I64> bad = {2, 3};  // 3 + 3 > 5
    std::vector<float> in(20, 1), out(6, 0);
    CHECK(message_of<std::out_of_range>([&] { k::copy_sub_box(exec(), in.data(), 2, ext.data(), bad.data(), cnt.data(), out.data()); }) ==
          "shardlib::kernels::copy_sub_box: dim 1: [3, 3 + 3) is not inside [0, 5)");
    const std::vector<I64> negstart = {-1, 0};
    CHECK(message_of<std::out_of_range>([&] { k::copy_sub_box(exec(), in.data(), 2, ext.data(), negstart.data(), cnt.data(), out.data()); })
              .find("dim 0") != std::string::npos);
    const std::vector<I64> negcnt = {2, -1}, zero = {0, 0};
    CHECK(message_of<std::invalid_argument>([&] { k::copy_sub_box(exec(), in.data(), 2, ext.data(), zero.data(), negcnt.data(), out.data()); }) ==
          "shardlib::kernels::copy_sub_box: dim 1 has a negative count -1");
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0; }));
  }

  TEST_CASE("take: blocks of the table, summed over devices, give numpy.take; ids outside a block give zeros") {
    std::mt19937_64 g(13);
    for (int c = 0; c < 300; ++c) {
      const I64 outer = I64(g() % 4), extent = I64(g() % 20), inner = I64(g() % 5);
      const I64 n_ids = I64(g() % 9);
      const auto table = iota(outer * extent * inner);
      std::vector<std::int32_t> ids(static_cast<std::size_t>(n_ids));
      for (auto& id : ids) id = extent == 0 ? 0 : std::int32_t(g() % std::uint64_t(extent));
      if (extent == 0) ids.clear();
      const I64 m_ids = I64(ids.size());
      // Cut the dim into up to 4 blocks at random points.
      std::vector<I64> cuts = {0, extent};
      for (int b = 0; b < 3; ++b) cuts.push_back(extent == 0 ? 0 : I64(g() % std::uint64_t(extent + 1)));
      std::sort(cuts.begin(), cuts.end());
      std::vector<double> sum(std::size_t(outer * m_ids * inner), 0.0);
      for (std::size_t b = 0; b + 1 < cuts.size(); ++b) {
        const I64 lo = cuts[b], n_local = cuts[b + 1] - cuts[b];
        std::vector<double> block;
        for (I64 o = 0; o < outer; ++o)
          for (I64 j = lo; j < lo + n_local; ++j)
            for (I64 i = 0; i < inner; ++i) block.push_back(table[std::size_t((o * extent + j) * inner + i)]);
        std::vector<double> out(sum.size(), -7);
        k::take(exec(), block.data(), outer, n_local, inner, lo, extent, ids.data(), m_ids, out.data(), true);
        for (I64 o = 0; o < outer; ++o)
          for (I64 m = 0; m < m_ids; ++m)
            for (I64 i = 0; i < inner; ++i) {
              const I64 id = ids[std::size_t(m)];
              const double v = out[std::size_t((o * m_ids + m) * inner + i)];
              if (id >= lo && id < lo + n_local) REQUIRE(v == table[std::size_t((o * extent + id) * inner + i)]);
              else REQUIRE(v == 0.0);
              sum[std::size_t((o * m_ids + m) * inner + i)] += v;
            }
      }
      for (I64 o = 0; o < outer; ++o)
        for (I64 m = 0; m < m_ids; ++m)
          for (I64 i = 0; i < inner; ++i)
            REQUIRE(sum[std::size_t((o * m_ids + m) * inner + i)] ==
                    table[std::size_t((o * extent + ids[std::size_t(m)]) * inner + i)]);
    }
    // Wide rows (chunked copies), unsigned and 64-bit ids.
    const I64 inner = 40000;
    const auto table = iota(3 * inner);
    const std::uint16_t uids[2] = {2, 0};
    std::vector<double> out(2 * inner);
    k::take(exec(), table.data(), 1, 3, inner, 0, 3, uids, 2, out.data(), true);
    CHECK(out[0] == table[2 * inner]);
    CHECK(out[2 * inner - 1] == table[inner - 1]);
    CHECK(out[inner - 1] == table[3 * inner - 1]);
    const std::int64_t lids[3] = {5, 6, 4};  // block holds global rows [5, 8) of 10
    std::vector<float> t2 = {1, 2, 3}, o2(3, -1);
    k::take(exec(), t2.data(), 1, 3, 1, 5, 10, lids, 3, o2.data(), true);
    CHECK(o2 == std::vector<float>{1, 2, 0});
  }

  TEST_CASE("index_add: rows around its column runs, repeated ids in order, ids outside the block skipped") {
    // A block holding rows [3, 3 + 5) of 9, ids repeated and outside it; widths around the host
    // form's runs of columns. Values of mixed sizes make the order of the adds show in double.
    for (const I64 inner : {I64{1}, I64{7}, k::detail::index_add_chunk - 1, k::detail::index_add_chunk,
                            2 * k::detail::index_add_chunk + 3}) {
      const I64 outer = 2, n_local = 5, lo = 3;
      const std::int32_t ids[] = {4, 0, 4, 7, 8, 3, 4, 2};
      const I64 n_ids = 8;
      std::vector<double> values(std::size_t(outer * n_ids * inner)), out(std::size_t(outer * n_local * inner));
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = (i % 3 == 0 ? 1e16 : 1.0) * double(i % 11) - 3;
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = double(i % 5);
      std::vector<double> want = out;
      for (I64 o = 0; o < outer; ++o)
        for (I64 m = 0; m < n_ids; ++m)
          if (ids[m] >= lo && ids[m] < lo + n_local)
            for (I64 i = 0; i < inner; ++i)
              want[std::size_t((o * n_local + ids[m] - lo) * inner + i)] += values[std::size_t((o * n_ids + m) * inner + i)];
      k::index_add(exec(), out.data(), outer, n_local, inner, lo, 9, ids, n_ids, values.data(), true);
      INFO("inner = " << inner);
      CHECK(out == want);
    }
  }

  TEST_CASE("the device forms (detail::portable: a thread per element) match the host kernels") {
    namespace p = k::detail::portable;
    using View = k::detail::StridedView;
    std::mt19937_64 g(17);
    auto random_view = [&](int rank, bool any_strides) {
      View v;
      v.rank = rank;
      I64 span = 1;
      for (int d = rank - 1; d >= 0; --d) {
        v.extent[d] = I64(g() % 6);
        v.stride[d] = any_strides ? I64(g() % 7) - 3 : span;  // negative and zero too
        span *= v.extent[d] + 1;
      }
      return v;
    };
    // The input's smallest and largest offsets a view reaches, to place it in a buffer.
    auto reach = [](View& v) {
      I64 lo = 0, hi = 0;
      for (int d = 0; d < v.rank; ++d) {
        if (v.extent[d] == 0) return I64(0);
        const I64 step = (v.extent[d] - 1) * v.stride[d];
        (step < 0 ? lo : hi) += step;
      }
      v.offset = -lo;
      return hi - lo + 1;
    };
    for (int c = 0; c < 400; ++c) {
      const int rank = int(g() % 6);
      CAPTURE(c);
      // strided_copy (permute's and copy_sub_box's engine): a view into a row-major output.
      View v = random_view(rank, true);
      for (int d = 0; d < rank; ++d) v.stride[d] = v.stride[d] < 0 ? -v.stride[d] : v.stride[d];
      const auto in = iota(reach(v) + 3);
      std::vector<double> want(std::size_t(v.count()) + 1, -7), got(want);
      k::detail::strided_copy_host(exec(), "test", in.data(), want.data(), v);
      p::strided_copy(exec(), "test", in.data(), got.data(), k::detail::normalise(v));
      REQUIRE(got == want);
      // copy_strided: a mirrored / repeated input view into a box of a bigger output.
      View a = random_view(rank, true), b = random_view(rank, false);
      for (int d = 0; d < rank; ++d) a.extent[d] = b.extent[d];
      const auto src = iota(reach(a) + 1);
      std::vector<double> bw(std::size_t(reach(b)) + 2, -7), bg(bw);
      k::copy_strided(exec(), "test", src.data(), a, bw.data(), b);
      p::copy_strided(exec(), "test", src.data(), a, bg.data(), b);
      REQUIRE(bg == bw);
      k::fill_strided(exec(), "test", 2.5, bw.data(), b);
      p::fill_strided(exec(), "test", 2.5, bg.data(), b);
      REQUIRE(bg == bw);
      // copy_pieces: 0 to 4 such copies from two sources into two destinations (each piece its own
      // part of them), one kernel, against copy_strided piece by piece.
      {
        std::vector<k::detail::StridedPiece> pieces(g() % 5);
        std::vector<double> from[2] = {iota(40), iota(50)}, to_want[2], to_got[2];
        I64 first = 0, end[2] = {0, 0};
        for (auto& q : pieces) {
          const int r = int(g() % 4);
          q.in = random_view(r, true);
          q.out = random_view(r, false);
          for (int d = 0; d < r; ++d) q.in.extent[d] = q.out.extent[d];
          q.from = int(g() % 2);
          q.to = int(g() % 2);
          const I64 need = reach(q.in) + 1;
          from[q.from].resize(std::max(from[q.from].size(), std::size_t(need)));
          const I64 span = reach(q.out);
          q.out.offset += end[q.to];
          end[q.to] += span + 1;
          q.first = first;
          first += q.in.count();
        }
        for (int t = 0; t < 2; ++t) to_want[t] = to_got[t] = std::vector<double>(std::size_t(end[t]) + 1, -7);
        for (const auto& q : pieces) k::copy_strided(exec(), "test", from[q.from].data(), q.in, to_want[q.to].data(), q.out);
        const std::uint64_t calls = k::flop_count().kernel_calls;
        k::copy_pieces(exec(), "test", std::span<const k::detail::StridedPiece>(pieces), pieces.data(), from[0].data(), from[1].data(),
                       to_got[0].data(), to_got[1].data());
        CHECK(k::flop_count().kernel_calls - calls == (first > 0 ? 1u : 0u));
        REQUIRE(to_got[0] == to_want[0]);
        REQUIRE(to_got[1] == to_want[1]);
        for (int t = 0; t < 2; ++t) to_got[t].assign(to_got[t].size(), -7);
        if (first > 0)
          p::copy_pieces(exec(), "test", pieces.data(), int(pieces.size()), first, from[0].data(), from[1].data(), to_got[0].data(),
                         to_got[1].data());
        REQUIRE(to_got[0] == to_want[0]);
        REQUIRE(to_got[1] == to_want[1]);
      }
      // take and index_add on a block of rows [lo, lo + n_local) of `extent`, ids in and out of it
      // (unchecked: ids outside the dim give zeros / are skipped).
      const I64 outer = I64(g() % 4), extent = I64(g() % 12), inner = I64(g() % 5), n_ids = I64(g() % 9);
      const I64 lo = extent == 0 ? 0 : I64(g() % std::uint64_t(extent)), n_local = extent == 0 ? 0 : I64(g() % std::uint64_t(extent - lo + 1));
      std::vector<std::int32_t> ids(static_cast<std::size_t>(n_ids));
      for (auto& id : ids) id = std::int32_t(g() % std::uint64_t(extent + 4)) - 2;
      const auto table = iota(outer * n_local * inner);
      std::vector<double> tw(std::size_t(outer * n_ids * inner) + 1, -7), tg(tw);
      k::take(exec(), table.data(), outer, n_local, inner, lo, extent, ids.data(), n_ids, tw.data(), false);
      p::take(exec(), table.data(), outer, n_local, inner, lo, ids.data(), n_ids, tg.data());
      REQUIRE(tg == tw);
      const auto values = iota(outer * n_ids * inner);
      std::vector<double> aw(table), ag(table);
      k::index_add(exec(), aw.data(), outer, n_local, inner, lo, extent, ids.data(), n_ids, values.data(), false);
      p::index_add(exec(), ag.data(), outer, n_local, inner, lo, ids.data(), n_ids, values.data());
      REQUIRE(ag == aw);
      // The id check: the first id outside [0, extent), as the host finds it.
      const auto first = p::first_bad_id(exec(), ids.data(), n_ids, extent);
      I64 m = n_ids;
      for (I64 j = n_ids; j-- > 0;)
        if (ids[std::size_t(j)] < 0 || ids[std::size_t(j)] >= extent) m = j;
      REQUIRE(first.val == m);
      if (m < n_ids) REQUIRE(first.loc == ids[std::size_t(m)]);
    }
    const std::uint64_t huge[2] = {1, ~std::uint64_t{0}};
    const auto first = p::first_bad_id(exec(), huge, 2, 4);
    CHECK(first.val == 1);
    CHECK(static_cast<std::uint64_t>(first.loc) == ~std::uint64_t{0});
  }

  TEST_CASE("copy_pieces: a piece of unequal views, a buffer other than 0 or 1, or a wrong start throws; nothing written") {
    using View = k::detail::StridedView;
    View a, b;
    a.rank = b.rank = 1;
    a.extent[0] = b.extent[0] = 2;
    a.stride[0] = b.stride[0] = 1;
    const std::vector<double> in = {1, 2, 3};
    std::vector<double> out(4, -1);
    std::vector<k::detail::StridedPiece> pieces(2);
    pieces[0].in = pieces[1].in = a;
    pieces[0].out = pieces[1].out = b;
    pieces[1].out.offset = 2;
    pieces[1].first = 2;
    auto run = [&] {
      k::copy_pieces(exec(), "test", std::span<const k::detail::StridedPiece>(pieces), pieces.data(), in.data(), in.data(), out.data(),
                     out.data());
    };
    pieces[1].first = 1;
    CHECK(message_of<std::invalid_argument>(run) == "shardlib::kernels::copy_pieces: piece 1 starts at element 1 of the batch, after 2 elements");
    pieces[1].first = 2;
    pieces[1].out.extent[0] = 3;
    CHECK(message_of<std::invalid_argument>(run) ==
          "shardlib::kernels::copy_pieces: piece 1 has views of different ranks or extents, or a buffer other than 0 or 1");
    pieces[1].out.extent[0] = 2;
    pieces[1].to = 2;
    CHECK(message_of<std::invalid_argument>(run) ==
          "shardlib::kernels::copy_pieces: piece 1 has views of different ranks or extents, or a buffer other than 0 or 1");
    CHECK(out == std::vector<double>(4, -1));
    pieces[1].to = 0;
    run();
    CHECK(out == std::vector<double>{1, 2, 1, 2});
  }

  TEST_CASE("take: out-of-range ids throw with the id, its position and the extent; nothing written") {
    std::vector<float> table = {1, 2, 3, 4}, out(3, -1);
    const int neg[3] = {0, -1, 1}, high[3] = {1, 0, 4};
    CHECK(message_of<std::out_of_range>([&] { k::take(exec(), table.data(), 1, 2, 2, 0, 4, neg, 3, out.data(), true); }) ==
          "shardlib::kernels::take: id -1 at position 1 is outside [0, 4)");
    CHECK(message_of<std::out_of_range>([&] { k::take(exec(), table.data(), 1, 2, 1, 2, 4, high, 3, out.data(), true); }) ==
          "shardlib::kernels::take: id 4 at position 2 is outside [0, 4)");
    const std::uint64_t huge[1] = {~std::uint64_t{0}};
    CHECK(message_of<std::out_of_range>([&] { k::take(exec(), table.data(), 1, 4, 1, 0, 4, huge, 1, out.data(), true); }) ==
          "shardlib::kernels::take: id 18446744073709551615 at position 0 is outside [0, 4)");
    CHECK(out == std::vector<float>{-1, -1, -1});
    // Unchecked: such ids give zeros (no wrap-around, no read outside the block).
    k::take(exec(), table.data(), 1, 4, 1, 0, 4, neg, 3, out.data(), false);
    CHECK(out == std::vector<float>{1, 0, 2});
    k::take(exec(), table.data(), 1, 4, 1, 0, 4, huge, 1, out.data(), false);
    CHECK(out[0] == 0);
    CHECK(message_of<std::invalid_argument>([&] { k::take(exec(), table.data(), 1, -4, 1, 0, 4, neg, 3, out.data(), true); }) ==
          "shardlib::kernels::take: negative extent in outer = 1, n_local = -4, inner = 1, n_ids = 3");
    // A block that does not lie inside the dim.
    CHECK(message_of<std::invalid_argument>([&] { k::take(exec(), table.data(), 1, 4, 1, 2, 5, neg, 0, out.data(), true); }) ==
          "shardlib::kernels::take: the block [2, 2 + 4) does not lie inside the dim [0, 5)");
  }
}
