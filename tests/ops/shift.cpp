// SPDX-License-Identifier: Apache-2.0
// Oracle property tests of the whole-array neighbour ops (roll, shift, pad, where): for fixed
// lists of operand specs on Mesh<"x", "y">, random meshes (every factorisation of the run's
// devices), random shapes (uneven, extents 1 and 0), random shifts (negative, longer than a block
// or than the dim), widths and boundaries, and random integer data (exact comparisons, partial
// addends included), the result gathered on every device must equal the op applied here to the
// gathered operand with plain index loops (numpy's roll, pad modes and where). Also: the bytes
// roll, shift and pad move (exactly the cells that change device; nothing along an unsplit dim),
// and the errors for bad dims and widths. Runs on 1..8 threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/ops.hpp>

#include "../collectives/harness.hpp"
#include "oracle.hpp"

#include <array>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace sl = shardlib;
namespace coll = shardlib::coll;
using sl::axes;
using sl::Boundary;
using sl::none;
using sl::partial_max;
using sl::partial_sum;
using sl::Spec;

namespace {
namespace oracle = sl::test::oracle;
using oracle::Idx;
using oracle::List;
using oracle::Ref;
using oracle::Tol;
using sl::test::Rng;
using M = oracle::M2;
template <class S, class T = std::int32_t>
using Tensor = sl::DistributedTensor<T, M, S>;

constexpr std::initializer_list<int> device_counts = {1, 2, 3, 4, 6, 8};

template <class S, class T = std::int32_t>
Tensor<S, T> operand(const M& mesh, const typename Tensor<S, T>::Shape& shape, std::uint64_t seed, T lo = T{-50}, T hi = T{50}) {
  return oracle::operand<Tensor<S, T>>(mesh, shape, seed, lo, hi);
}

// Operand specs on Mesh<"x", "y">.
using Rep2 = Spec<none, none>;
using Rows = Spec<"x", none>;
using ColsY = Spec<none, "y">;
using Grid = Spec<"y", "x">;
using Both = Spec<axes<"x", "y">, none>;
using PSum = Spec<"y", none, partial_sum<"x">>;
using PMax = Spec<none, "y", partial_max<"x">>;
using Rank2 = List<Rep2, Rows, ColsY, Grid, Both, PSum, PMax>;
using Rank3 = List<Spec<none, none, none>, Spec<"x", none, "y">, Spec<none, axes<"y", "x">, none>,
                   Spec<"y", none, none, partial_sum<"x">>>;

std::int64_t mod(std::int64_t a, std::int64_t n) { return ((a % n) + n) % n; }

/// The part of a dim of extent n cut into `parts` blocks that holds index i.
int part_of(std::int64_t i, std::int64_t n, int parts) {
  for (int r = 0; r < parts; ++r) {
    const sl::BlockRange b = sl::block_of(n, parts, r);
    if (i >= b.offset && i < b.offset + b.size) return r;
  }
  return -1;
}

/// Elements of this device's block of `out` whose source (global index `src(i)`, per dim; -1 for a
/// constant) lies in another device's block of the operand (`in_shape`, same sharding); with
/// `distinct`, the number of different such sources instead.
template <class Out, std::size_t R, class F>
std::int64_t moved_cells(const Out& out, const Idx<R>& in_shape, F src, bool distinct = false) {
  std::set<std::int64_t> sources;
  const sl::ShardBox& b = out.block();
  const auto& mesh = out.mesh().shape();
  const int me = out.context().device();
  Idx<R> extent{};
  for (std::size_t d = 0; d < R; ++d) extent[d] = b.extent[d];
  std::int64_t n = 0;
  oracle::for_each_index(extent, [&](const Idx<R>& local) {
    Idx<R> g{};
    for (std::size_t d = 0; d < R; ++d) g[d] = b.offset[d] + local[d];
    bool other = false;
    std::int64_t k = 0;
    for (std::size_t d = 0; d < R; ++d) {
      const std::int64_t s = src(g, d);
      if (s < 0) return;  // a constant
      const sl::AxisList& ax = Out::sharding.dims[d];
      other = other || part_of(s, in_shape[d], mesh.group_size(ax)) != mesh.group_rank(me, ax);
      k = k * in_shape[d] + s;
    }
    if (other) sources.insert(k);
    n += other ? 1 : 0;
  });
  return distinct ? static_cast<std::int64_t>(sources.size()) : n;
}

/// Whether the result's spec is the operand's (as every rule here answers).
template <class Out, class In>
bool same_spec(const std::string& what) {
  if (Out::sharding == sl::pad_rule(In::sharding).out) return true;
  FAIL_CHECK(what << ": the result type's spec " << Out::spec_string() << " is not the operand's " << In::spec_string());
  return false;
}

/// Where pad's output index g of dim d (operand extent n, low width lo) reads, or -1 for a constant.
std::int64_t pad_source(std::int64_t g, std::int64_t lo, std::int64_t n, const Boundary& b) {
  const std::int64_t i = g - lo;
  if (i >= 0 && i < n) return i;
  switch (b.kind) {
    case Boundary::Kind::periodic: return mod(i, n);  // numpy 'wrap'
    case Boundary::Kind::reflect: {                   // numpy 'symmetric'
      const std::int64_t m = mod(i, 2 * n);
      return m < n ? m : 2 * n - 1 - m;
    }
    case Boundary::Kind::edge: return i < 0 ? 0 : n - 1;
    default: return -1;
  }
}

Boundary random_boundary(Rng& r) {
  switch (r.below(5)) {
    case 0: return Boundary::zero();
    case 1: return Boundary::dirichlet(7);
    case 2: return Boundary::periodic();
    case 3: return Boundary::reflect();
    default: return Boundary::edge();
  }
}
}  // namespace

TEST_SUITE("ops_shift") {
TEST_CASE("roll matches numpy.roll along split and unsplit dims; only cells that change device travel") {
  static_assert(std::is_same_v<decltype(sl::roll<0>(std::declval<Tensor<Grid>>(), 1))::spec_type, Grid>);
  static_assert(std::is_same_v<decltype(sl::roll(std::declval<Tensor<PSum>>(), 1, 0))::spec_type, PSum>);
  static_assert(sl::roll_rule(Tensor<Grid>::sharding, 1).comm.size() == 1 && sl::roll_rule(Tensor<Grid>::sharding, 1).comm[0] == 0);
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 21);
        oracle::for_each_type(Rank2{}, [&](auto tag) {
          using S = typename decltype(tag)::type;
          using A = Tensor<S>;
          for (int c = 0; c < 8; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const auto shape = oracle::random_shape<2>(r, 11);
            const auto a = operand<S>(mesh, shape, 60 + static_cast<std::uint64_t>(c));
            const auto values = oracle::host(a);
            for (int d = 0; d < 2; ++d) {
              const std::int64_t n = shape[static_cast<std::size_t>(d)];
              const std::int64_t s = r.below(41) - 20;
              const std::string what = "roll(" + std::to_string(s) + ", dim " + std::to_string(d) + ") of " + oracle::describe(a);
              if (!same_spec<decltype(sl::roll(a, s, d)), A>(what)) return;
              coll::CommRecorder rec;
              const auto out = sl::roll(a, s, d);
              const std::uint64_t calls = rec.total_calls(), received = rec.total_bytes_received();
              if (A::sharding.dims[static_cast<std::size_t>(d)].empty()) {
                CHECK_MESSAGE(calls == 0, what << ": " << rec.to_string());
              } else {
                CHECK_MESSAGE(calls <= 1, what << ": " << rec.to_string());
                const std::int64_t cells = moved_cells(out, shape, [&](const Idx<2>& g, std::size_t k) {
                  return static_cast<int>(k) == d ? mod(g[k] - s, n) : g[k];
                });
                CHECK_MESSAGE(received == static_cast<std::uint64_t>(cells) * sizeof(std::int32_t),
                              what << ": received " << received << " B, expected " << cells << " cells");
              }
              Ref<2> want(shape);
              oracle::for_each_index(shape, [&](const Idx<2>& i) {
                Idx<2> j = i;
                j[static_cast<std::size_t>(d)] = mod(i[static_cast<std::size_t>(d)] - s, n);
                want(i) = values(j);
              });
              oracle::expect_tensor(out, want, Tol::exact(), what);
            }
            // The compile-time dim gives the same.
            const std::int64_t s = r.below(9) - 4;
            Ref<2> want(shape);
            oracle::for_each_index(shape, [&](const Idx<2>& i) { want(i) = values({i[0], shape[1] ? mod(i[1] - s, shape[1]) : 0}); });
            oracle::expect_tensor(sl::roll<1>(a, s), want, Tol::exact(), "roll<1> of " + oracle::describe(a));
          }
        });
        // Rank 3: a dim split over both axes, shifts longer than a block (pieces from devices further away).
        oracle::for_each_type(Rank3{}, [&](auto tag) {
          using S = typename decltype(tag)::type;
          for (int c = 0; c < 6; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            auto shape = oracle::random_shape<3>(r, 6);
            shape[1] = r.below(17);
            const auto a = operand<S>(mesh, shape, 70 + static_cast<std::uint64_t>(c));
            const auto values = oracle::host(a);
            const int d = r.below(3);
            const std::int64_t n = shape[static_cast<std::size_t>(d)];
            const std::int64_t s = r.below(61) - 30;
            const std::string what = "roll(" + std::to_string(s) + ", dim " + std::to_string(d) + ") of " + oracle::describe(a);
            if (!same_spec<decltype(sl::roll(a, s, d)), Tensor<S>>(what)) return;
            coll::CommRecorder rec;
            const auto out = sl::roll(a, s, d);
            const std::uint64_t received = rec.total_bytes_received();
            const std::int64_t cells = moved_cells(out, shape, [&](const Idx<3>& g, std::size_t k) {
              return static_cast<int>(k) == d ? mod(g[k] - s, n) : g[k];
            });
            CHECK_MESSAGE(received == static_cast<std::uint64_t>(cells) * sizeof(std::int32_t), what << ": " << rec.to_string());
            Ref<3> want(shape);
            oracle::for_each_index(shape, [&](const Idx<3>& i) {
              Idx<3> j = i;
              j[static_cast<std::size_t>(d)] = mod(i[static_cast<std::size_t>(d)] - s, n);
              want(i) = values(j);
            });
            oracle::expect_tensor(out, want, Tol::exact(), what);
          }
        });
      },
      device_counts);
}

TEST_CASE("shift is roll without wrap-around: vacated cells hold the fill, partial sums count it once") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 22);
        oracle::for_each_type(Rank2{}, [&](auto tag) {
          using S = typename decltype(tag)::type;
          using A = Tensor<S>;
          for (int c = 0; c < 8; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const auto shape = oracle::random_shape<2>(r, 11);
            const auto a = operand<S>(mesh, shape, 80 + static_cast<std::uint64_t>(c));
            const auto values = oracle::host(a);
            const int d = r.below(2);
            const std::int64_t n = shape[static_cast<std::size_t>(d)];
            const std::int64_t s = r.below(31) - 15;
            const std::int32_t fill = r.below(2) ? 0 : 99;
            const std::string what = "shift(" + std::to_string(s) + ", dim " + std::to_string(d) + ", fill " +
                                     std::to_string(fill) + ") of " + oracle::describe(a);
            if (!same_spec<decltype(sl::shift(a, s, d, fill)), A>(what)) return;
            coll::CommRecorder rec;
            const auto out = sl::shift(a, s, d, fill);
            if (A::sharding.dims[static_cast<std::size_t>(d)].empty()) {
              CHECK_MESSAGE(rec.total_calls() == 0, what << ": " << rec.to_string());
            } else {
              CHECK_MESSAGE(rec.total_calls() <= 1, what << ": " << rec.to_string());
              const std::int64_t cells = moved_cells(out, shape, [&](const Idx<2>& g, std::size_t k) -> std::int64_t {
                if (static_cast<int>(k) != d) return g[k];
                const std::int64_t j = g[k] - s;
                return j >= 0 && j < n ? j : -1;
              });
              CHECK_MESSAGE(rec.total_bytes_received() == static_cast<std::uint64_t>(cells) * sizeof(std::int32_t),
                            what << ": " << rec.to_string());
            }
            Ref<2> want(shape);
            oracle::for_each_index(shape, [&](const Idx<2>& i) {
              Idx<2> j = i;
              j[static_cast<std::size_t>(d)] -= s;
              const std::int64_t k = j[static_cast<std::size_t>(d)];
              want(i) = k >= 0 && k < n ? values(j) : fill;
            });
            oracle::expect_tensor(out, want, Tol::exact(), what);
          }
        });
        // Compile-time dim, float elements.
        const M mesh = oracle::random_mesh<M>(ctx, r);
        const auto a = Tensor<Rows, float>::random(mesh, {7, 3}, 5);
        const auto values = oracle::host(a);
        Ref<2> want({7, 3});
        oracle::for_each_index(want.shape, [&](const Idx<2>& i) { want(i) = i[0] >= 2 ? values({i[0] - 2, i[1]}) : -1.5; });
        oracle::expect_tensor(sl::shift<0>(a, 2, -1.5f), want, Tol::exact(), "shift<0>(2, fill -1.5)");
      },
      device_counts);
}

TEST_CASE("pad matches numpy.pad (constant, wrap, symmetric, edge) for any widths; cells move once") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 23);
        oracle::for_each_type(Rank2{}, [&](auto tag) {
          using S = typename decltype(tag)::type;
          using A = Tensor<S>;
          for (int c = 0; c < 10; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const auto shape = oracle::random_shape<2>(r, 9);
            const auto a = operand<S>(mesh, shape, 90 + static_cast<std::uint64_t>(c));
            const auto values = oracle::host(a);
            Boundary b = random_boundary(r);
            std::array<sl::PadWidth, 2> w{};
            for (auto& x : w) x = {r.below(3) ? r.below(4) : r.below(25), r.below(3) ? r.below(4) : r.below(25)};
            if (b.kind != Boundary::Kind::zero && b.kind != Boundary::Kind::value && (shape[0] == 0 || shape[1] == 0))
              b = Boundary::zero();
            const std::string what = "pad({{" + std::to_string(w[0].lo) + ", " + std::to_string(w[0].hi) + "}, {" +
                                     std::to_string(w[1].lo) + ", " + std::to_string(w[1].hi) + "}}, " + b.to_string() +
                                     ") of " + oracle::describe(a);
            const sl::PadWidth widths[2] = {w[0], w[1]};
            if (!same_spec<decltype(sl::pad(a, widths, b)), A>(what)) return;
            coll::CommRecorder rec;
            const auto out = sl::pad(a, widths, b);
            const Idx<2> out_shape{shape[0] + w[0].lo + w[0].hi, shape[1] + w[1].lo + w[1].hi};
            auto src = [&](const Idx<2>& g, std::size_t k) {
              return pad_source(g[k], k == 0 ? w[0].lo : w[1].lo, shape[k], b);
            };
            bool padded_split = false;
            for (std::size_t k = 0; k < 2; ++k)
              padded_split = padded_split || (!A::sharding.dims[k].empty() && (w[k].lo || w[k].hi));
            CHECK_MESSAGE(rec.total_calls() == (padded_split ? 1u : 0u), what << ": " << rec.to_string());
            // Each output cell from another device travels once; an edge boundary sends its edge
            // cell once per piece and repeats it on arrival (at least the distinct cells travel).
            const std::int64_t cells = moved_cells(out, shape, src), least = moved_cells(out, shape, src, true);
            const std::uint64_t got = rec.total_bytes_received() / sizeof(std::int32_t);
            if (b.kind == Boundary::Kind::edge)
              CHECK_MESSAGE((got >= static_cast<std::uint64_t>(least) && got <= static_cast<std::uint64_t>(cells)),
                            what << ": " << rec.to_string() << " expected " << least << " to " << cells << " cells");
            else
              CHECK_MESSAGE(got == static_cast<std::uint64_t>(cells), what << ": " << rec.to_string() << " expected " << cells << " cells");
            Ref<2> want(out_shape);
            oracle::for_each_index(out_shape, [&](const Idx<2>& i) {
              const std::int64_t s0 = src(i, 0), s1 = src(i, 1);
              want(i) = s0 < 0 || s1 < 0 ? (b.kind == Boundary::Kind::value ? b.value : 0.0) : values({s0, s1});
            });
            oracle::expect_tensor(out, want, Tol::exact(), what);
          }
        });
        // Rank 3, one boundary for all dims, a dim split over both axes.
        oracle::for_each_type(Rank3{}, [&](auto tag) {
          using S = typename decltype(tag)::type;
          for (int c = 0; c < 6; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const auto shape = oracle::random_shape<3>(r, 6, false);
            const auto a = operand<S>(mesh, shape, 100 + static_cast<std::uint64_t>(c));
            const auto values = oracle::host(a);
            const Boundary b = random_boundary(r);
            const sl::PadWidth widths[3] = {{r.below(3), r.below(3)}, {r.below(9), r.below(9)}, {r.below(2), r.below(2)}};
            Idx<3> out_shape{};
            for (std::size_t k = 0; k < 3; ++k) out_shape[k] = shape[k] + widths[k].lo + widths[k].hi;
            Ref<3> want(out_shape);
            oracle::for_each_index(out_shape, [&](const Idx<3>& i) {
              Idx<3> j{};
              for (std::size_t k = 0; k < 3; ++k) {
                j[k] = pad_source(i[k], widths[k].lo, shape[k], b);
                if (j[k] < 0) {
                  want(i) = b.kind == Boundary::Kind::value ? b.value : 0.0;
                  return;
                }
              }
              want(i) = values(j);
            });
            oracle::expect_tensor(sl::pad(a, widths, b), want, Tol::exact(), "pad (" + b.to_string() + ") of " + oracle::describe(a));
          }
        });
      },
      device_counts);
}

TEST_CASE("where selects elementwise with broadcasting and the elementwise rule's output spec") {
  using Conds = List<Rep2, Rows, Grid>;
  using Values = List<Rows, ColsY, Both, PSum>;
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        Rng r = oracle::rng_for(ctx, 24);
        oracle::for_each_pair(Conds{}, Values{}, [&](auto ct, auto vt) {
          using SC = typename decltype(ct)::type;
          using SV = typename decltype(vt)::type;
          for (int c = 0; c < 3; ++c) {
            const M mesh = oracle::random_mesh<M>(ctx, r);
            const auto shape = oracle::random_shape<2>(r, 8);
            const auto cond = operand<SC>(mesh, shape, 110 + static_cast<std::uint64_t>(c), -1, 2);
            const auto a = operand<SV>(mesh, shape, 120 + static_cast<std::uint64_t>(c));
            // b broadcasts: a row of the last dim, split over "y".
            const auto b = operand<Spec<"y">>(mesh, {shape[1]}, 130 + static_cast<std::uint64_t>(c));
            const std::string what = "where of " + oracle::describe(cond, a, b);
            static constexpr std::array<sl::Sharding, 3> ops{Tensor<SC>::sharding, Tensor<SV>::sharding, Tensor<Spec<"y">>::sharding};
            constexpr sl::OpRule rule = sl::elementwise_rule(sl::Linearity::nonlinear, sl::detail::ArrayRef<sl::Sharding>(ops.data(), 3));
            using Out = decltype(sl::where(cond, a, b));
            if (!(Out::sharding == rule.out)) {
              FAIL_CHECK(what << ": result spec " << Out::spec_string());
              return;
            }
            const auto out = sl::where(cond, a, b);
            const auto rc = oracle::host(cond);
            const auto ra = oracle::host(a);
            const auto rb = oracle::host(b);
            Ref<2> want(shape);
            oracle::for_each_index(shape, [&](const Idx<2>& i) { want(i) = rc(i) != 0 ? ra(i) : rb.bcast(i); });
            oracle::expect_tensor(out, want, Tol::exact(), what);
          }
        });
        // Specs that agree: no collective; an int8 condition made by zip.
        const M mesh = oracle::random_mesh<M>(ctx, r);
        const auto c = operand<Grid>(mesh, {5, 6}, 7, -3, 3);
        const auto a = operand<Grid>(mesh, {5, 6}, 8);
        const auto b = operand<Grid>(mesh, {5, 6}, 9);
        const auto positive = sl::zip([](std::int32_t v) { return static_cast<std::int8_t>(v > 0); }, c);
        coll::CommRecorder rec;
        const auto out = sl::where(positive, a, b);
        CHECK_MESSAGE(rec.total_calls() == 0, rec.to_string());
        static_assert(std::is_same_v<decltype(out)::spec_type, Grid>);
        const auto rc = oracle::host(c), ra = oracle::host(a), rb = oracle::host(b);
        Ref<2> want({5, 6});
        oracle::for_each_index(want.shape, [&](const Idx<2>& i) { want(i) = rc(i) > 0 ? ra(i) : rb(i); });
        oracle::expect_tensor(out, want, Tol::exact(), "where(c > 0, a, b) with Spec<\"y\", \"x\">");
      },
      device_counts);
}

TEST_CASE("roll, shift and pad reject bad dims and widths, naming the op, dim, shape and spec") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M mesh(ctx, {ctx.num_devices(), 1});
        const auto a = Tensor<Rows>::zeros(mesh, {4, 6});
        CHECK_THROWS_WITH_AS(sl::roll(a, 1, 2),
                             "shardlib: roll along dim 2 of [4, 6] with Spec<\"x\", none>: the dim is outside [0, 2)",
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::shift(a, 1, -1), doctest::Contains("shift along dim -1 of [4, 6]"), std::invalid_argument);
        CHECK_THROWS_WITH_AS(sl::pad(a, {{1, 1}, {0, -2}}),
                             "shardlib: pad of [4, 6] with Spec<\"x\", none>: width (0, -2) on dim 1 is negative (pad only "
                             "adds cells: slice to remove them)",
                             std::invalid_argument);
        const auto e = Tensor<Rows>::zeros(mesh, {0, 6});
        CHECK_THROWS_WITH_AS(sl::pad(e, {{1, 0}, {0, 0}}, Boundary::periodic()),
                             doctest::Contains("dim 0 is empty, so a periodic boundary has no cell to copy"), std::invalid_argument);
        CHECK(sl::pad(e, {{1, 2}, {0, 0}}, Boundary::dirichlet(3)).shape() == std::array<std::int64_t, 2>{3, 6});
        CHECK(sl::roll(e, 5, 0).shape() == e.shape());  // an empty dim rolls to itself
      },
      device_counts);
}
}
