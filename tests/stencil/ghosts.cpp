// SPDX-License-Identifier: Apache-2.0
// Ghost cells and stencils (<shardlib/stencil.hpp>), on 1..8 threads devices and under mpirun:
// - an oracle property test of the exchange: random meshes (1 to 3 axes), grid ranks 1 to 3,
//   random shardings (a dim split over several axes, replicated axes), shapes with uneven, thin
//   and empty blocks, widths 0 to 3 and every boundary kind; every cell of every widened block
//   against the global array, and the cells and bytes received against the count of ghost
//   cells held by other devices (each travels once);
// - stencil_for against a serial loop over the global array (Jacobi 5-point bit for bit,
//   27-point periodic 3-D), with and without overlap;
// - bad input: widths, boundaries, outputs, reads beyond the width, exchanges out of order;
// - the kernels of tensors in GPU memory (a point per work item) on host memory, against the
//   same oracles;
// - the kernels of an exchange and of a step (kernels::copy_pieces: one per batch of pieces).
#include <doctest/doctest.h>
#include <shardlib/stencil.hpp>

#include "../collectives/harness.hpp"
#include "../sharding/random.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace sl = shardlib;
namespace coll = shardlib::coll;

namespace {
using sl::test::Rng;
using B = sl::Boundary;

double value_of(std::int64_t k) { return static_cast<double>(sl::detail::mix64(static_cast<std::uint64_t>(k)) % 1000); }

/// What ghost cell `g` (global index, possibly outside the domain) must hold: the value of a
/// domain cell (`src` set, returns true) or a constant (`constant` set, returns false).
bool oracle_source(const sl::HaloSpec& h, const std::vector<std::int64_t>& shape, std::array<std::int64_t, 8>& g,
                   double& constant) {
  for (int d = 0; d < h.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const std::int64_t n = shape[u];
    if (g[u] >= 0 && g[u] < n) continue;
    const int side = g[u] < 0 ? 0 : 1;
    const B b = h.boundary[u][static_cast<std::size_t>(side)];
    switch (b.kind) {
      case B::Kind::periodic: g[u] = side == 0 ? g[u] + n : g[u] - n; break;
      case B::Kind::reflect: g[u] = side == 0 ? -1 - g[u] : 2 * n - 1 - g[u]; break;
      case B::Kind::edge: g[u] = side == 0 ? 0 : n - 1; break;
      default: constant = b.kind == B::Kind::value ? b.value : 0.0; return false;
    }
  }
  return true;
}

struct Totals {
  int cases = 0, thin = 0, cells = 0, with_peers = 0;
};

template <class T>
void exchange_case(sl::Context& ctx, const sl::MeshShape& mesh, const std::vector<std::int64_t>& shape,
                   const sl::Sharding& s, const sl::HaloSpec& h, Totals& totals) {
  const int me = ctx.device(), R = s.rank;
  const sl::ShardBox box = sl::shard_box(s, mesh, shape, me);
  std::vector<T> block(static_cast<std::size_t>(box.num_elements()));
  auto linear = [&](const std::array<std::int64_t, 8>& g) {
    std::int64_t k = 0;
    for (int d = 0; d < R; ++d) k = k * shape[static_cast<std::size_t>(d)] + g[static_cast<std::size_t>(d)];
    return k;
  };
  for (std::size_t i = 0; i < block.size(); ++i) {
    std::array<std::int64_t, 8> g{};
    auto rest = static_cast<std::int64_t>(i);
    for (int d = R - 1; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      g[u] = box.offset[u] + rest % box.extent[u];
      rest /= box.extent[u];
    }
    block[i] = static_cast<T>(value_of(linear(g)));
  }
  sl::detail::GhostExchange<T, Kokkos::HostSpace> x(ctx, s, mesh, shape, h, "the test tensor");
  coll::CommRecorder rec;
  const std::uint64_t calls = sl::kernels::flop_count().kernel_calls;
  x.start(block.data());
  x.finish();
  // Packing, the copies within the device and unpacking: one kernel each at most, however many
  // pieces (kernels::copy_pieces).
  CHECK(sl::kernels::flop_count().kernel_calls - calls <= 3);
  if (box.num_elements() == 0) {
    CHECK(x.cells_received() == 0);
    return;
  }
  // Every cell of the widened block, and the ghost cells other devices hold.
  std::int64_t from_peers = 0;
  bool edge = false;
  for (int d = 0; d < R; ++d)
    for (int side = 0; side < 2; ++side) edge = edge || h.boundary[static_cast<std::size_t>(d)][static_cast<std::size_t>(side)].kind == B::Kind::edge;
  std::array<std::int64_t, 8> lo{}, ext{};
  std::int64_t cells = 1;
  for (int d = 0; d < R; ++d) {
    const auto u = static_cast<std::size_t>(d);
    lo[u] = box.offset[u] - h.width[u];
    ext[u] = box.extent[u] + 2 * h.width[u];
    cells *= ext[u];
    if (box.extent[u] < h.width[u]) ++totals.thin;
  }
  const auto coords = mesh.coords(me);
  bool ok = true;
  for (std::int64_t c = 0; c < cells && ok; ++c) {
    std::array<std::int64_t, 8> g{};
    auto rest = c;
    for (int d = R - 1; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      g[u] = lo[u] + rest % ext[u];
      rest /= ext[u];
    }
    const T got = x.at(g.data(), block.data());
    std::array<std::int64_t, 8> src = g;
    double constant = 0;
    const bool from_cell = oracle_source(h, shape, src, constant);
    const T want = static_cast<T>(from_cell ? value_of(linear(src)) : constant);
    if (got != want) {
      std::string idx;
      for (int d = 0; d < R; ++d) idx += (d ? ", " : "") + std::to_string(g[static_cast<std::size_t>(d)]);
      FAIL_CHECK("device " << me << ": cell (" << idx << ") is " << +got << ", expected " << +want);
      ok = false;
    }
    if (!from_cell || sl::ShardBox(box).contains(sl::detail::ArrayRef<std::int64_t>(g.data(), static_cast<std::size_t>(R)))) continue;
    // The owner: the device with this device's coordinates on the axes that split no dim.
    for (int dev = 0; dev < mesh.num_devices(); ++dev) {
      const auto dc = mesh.coords(dev);
      bool same_replica = true;
      for (int a = 0; a < mesh.rank(); ++a)
        if (!s.shards_over(a)) same_replica = same_replica && dc[static_cast<std::size_t>(a)] == coords[static_cast<std::size_t>(a)];
      if (same_replica && sl::shard_box(s, mesh, shape, dev).contains(sl::detail::ArrayRef<std::int64_t>(src.data(), static_cast<std::size_t>(R)))) {
        if (dev != me) ++from_peers;
        break;
      }
    }
  }
  totals.cells += static_cast<int>(cells);
  if (from_peers > 0) ++totals.with_peers;
  CHECK(x.cells_received() == from_peers);
  const std::uint64_t bytes = rec[coll::Kind::all_to_all].bytes_received;
  if (edge) CHECK(bytes <= static_cast<std::uint64_t>(from_peers) * sizeof(T));
  else CHECK(bytes == static_cast<std::uint64_t>(from_peers) * sizeof(T));
  CHECK(rec[coll::Kind::all_to_all].calls == 1);
  ++totals.cases;
}

B random_boundary(Rng& r, bool wrap_ok) {
  switch (r.below(wrap_ok ? 5 : 2)) {
    case 0: return B{};
    case 1: return B::dirichlet(static_cast<double>(1 + r.below(9)));
    case 2: return B::reflect();
    case 3: return B::edge();
    default: return B::zero();
  }
}

void exchange_property(sl::Context& ctx, int cases, std::uint64_t seed) {
  const int n = ctx.num_devices();
  Rng r{std::mt19937_64(seed + static_cast<std::uint64_t>(n))};  // the same draws on every device
  Totals totals;
  for (int c = 0; c < cases; ++c) {
    const sl::MeshShape mesh = sl::test::random_mesh(r, n);
    const int mesh_rank = mesh.rank();
    const int rank = 1 + r.below(3);
    std::vector<std::int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(r.below(6) == 0 ? r.below(3) : 1 + r.below(rank == 3 ? 7 : 12));
    const sl::Sharding s = sl::test::random_sharding(r, mesh_rank, rank, false);
    sl::HaloSpec h;
    h.rank = rank;
    for (int d = 0; d < rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      h.width[u] = r.below(4);
      if (h.width[u] == 0) continue;
      const bool wrap_ok = h.width[u] <= shape[u];  // periodic, reflect and edge map into the dim once
      if (wrap_ok && r.below(3) == 0) {
        h.boundary[u] = {B::periodic(), B::periodic()};
      } else {
        h.boundary[u][0] = random_boundary(r, wrap_ok);
        h.boundary[u][1] = random_boundary(r, wrap_ok);
      }
    }
    CAPTURE(c);
    CAPTURE(mesh.to_string());
    if (r.below(2) == 0) exchange_case<double>(ctx, mesh, shape, s, h, totals);
    else exchange_case<std::int32_t>(ctx, mesh, shape, s, h, totals);
  }
  CAPTURE(totals.cases);
  CHECK(totals.cases > cases / 4);
  CHECK(totals.cells > 0);
  if (n > 1) {
    CHECK(totals.thin > 0);
    CHECK(totals.with_peers > 0);
  }
}

// -- stencil_for against a serial loop ----------------------------------------------------------

using Mesh2 = sl::Mesh<"x", "y">;
using Grid2 = sl::DistributedTensor<double, Mesh2, sl::Spec<"x", "y">>;
using Mesh3 = sl::Mesh<"x", "y", "z">;
using Grid3 = sl::DistributedTensor<double, Mesh3, sl::Spec<"z", sl::axes<"x", "y">, sl::none>>;

/// Two mesh sizes whose product is n: the most square.
std::array<int, 2> split2(int n) {
  int a = 1;
  for (int d = 1; d * d <= n; ++d)
    if (n % d == 0) a = d;
  return {a, n / a};
}

// Jacobi on a 2-D grid with fixed boundary values (Dirichlet 1 on the low side of dim 0, 0
// elsewhere), against the serial loop over the global array: bit for bit.
/// stencil_for, or with PerPoint its GPU work items (one point each) on host memory.
template <bool PerPoint, sl::Check C = sl::Check::off, class Out, class In, class F>
void run_stencil(Out& out, In& in, const F& f, sl::GhostRefresh refresh = sl::GhostRefresh::overlap) {
  if constexpr (PerPoint) sl::detail::run_stencil<C, true>(out, in, f, refresh);
  else sl::stencil_for<C>(out, in, f, refresh);
}

template <bool PerPoint = false>
void jacobi(sl::Context& ctx, sl::GhostRefresh refresh) {
  const auto [px, py] = split2(ctx.num_devices());
  const Mesh2 mesh(ctx, {px, py});
  const std::int64_t nx = 13, ny = 9;  // uneven blocks
  auto u = Grid2::random(mesh, {nx, ny}, 7, 0.0, 1.0), v = Grid2::zeros(mesh, {nx, ny});
  std::vector<double> serial = u.to_host(), next(serial.size());
  auto at = [&](std::int64_t i, std::int64_t j) {
    if (i < 0) return 1.0;
    if (i >= nx || j < 0 || j >= ny) return 0.0;
    return serial[static_cast<std::size_t>(i * ny + j)];
  };
  auto gu = sl::ghosted(u, {1, 1}, {{{B::dirichlet(1), B::zero()}, {B::zero(), B::zero()}}});
  auto step = [](const sl::Index<2>&, const auto& nb) { return 0.25 * (nb(-1, 0) + nb(1, 0) + nb(0, -1) + nb(0, 1)); };
  for (int it = 0; it < 10; ++it) {
    if (refresh == sl::GhostRefresh::none) gu.exchange();
    run_stencil<PerPoint>(v, gu, step, refresh);
    for (std::int64_t i = 0; i < nx; ++i)
      for (std::int64_t j = 0; j < ny; ++j)
        next[static_cast<std::size_t>(i * ny + j)] = 0.25 * (at(i - 1, j) + at(i + 1, j) + at(i, j - 1) + at(i, j + 1));
    serial.swap(next);
    std::swap(u, v);  // the views follow the tensor objects: gu now sees the new values
  }
  const auto got = u.to_host();
  REQUIRE(got.size() == serial.size());
  for (std::size_t k = 0; k < got.size(); ++k)
    if (got[k] != serial[k]) FAIL_CHECK("element " << k << ": " << got[k] << " != " << serial[k]);
}

// A 27-point periodic stencil on a 3-D grid, dims split over one axis, two axes and none.
template <bool PerPoint = false>
void periodic27(sl::Context& ctx) {
  const int n = ctx.num_devices();
  const int z = n % 2 == 0 ? 2 : 1;
  const auto [px, py] = split2(n / z);
  const Mesh3 mesh(ctx, {px, py, z});
  const std::int64_t nx = 5, ny = 7, nz = 4;
  auto u = Grid3::random(mesh, {nx, ny, nz}, 3, -1.0, 1.0), v = Grid3::zeros(mesh, {nx, ny, nz});
  const auto host = u.to_host();
  auto g = sl::ghosted(u, {1, 1, 1}, B::periodic());
  const auto f = [](const sl::Index<3>& i, const auto& nb) {
    double s = 0;
    for (int a = -1; a <= 1; ++a)
      for (int b = -1; b <= 1; ++b)
        for (int c = -1; c <= 1; ++c) s += (1 + a + 3 * b + 9 * c) * nb(a, b, c);
    return s + static_cast<double>(i[0]);
  };
  run_stencil<PerPoint>(v, g, f);
  if constexpr (!PerPoint) {
    // Kernels, however many pieces (26 ghost regions; a slab's padded copy reads up to 18): the
    // exchange packs, copies within the device and unpacks in one kernel each at most; a step
    // with current ghosts runs its rows (one kernel) and, per slab of the shell (4), its padded
    // copy and its points.
    auto calls = [] { return sl::kernels::flop_count().kernel_calls; };
    const std::uint64_t c0 = calls();
    g.exchange();
    const std::uint64_t c1 = calls();
    run_stencil<false>(v, g, f, sl::GhostRefresh::none);
    CHECK(c1 - c0 <= 3);
    CHECK(calls() - c1 <= 1 + 4 * 2);
  } else {
    // The GPU's: the rows (a team each) and the shell (slabs and all, stencil_shell): two kernels.
    const std::uint64_t c1 = sl::kernels::flop_count().kernel_calls;
    run_stencil<true>(v, g, f, sl::GhostRefresh::none);
    CHECK(sl::kernels::flop_count().kernel_calls - c1 <= 2);
  }
  const auto got = v.to_host();
  auto w = [](std::int64_t i, std::int64_t e) { return (i % e + e) % e; };
  for (std::int64_t i = 0; i < nx; ++i)
    for (std::int64_t j = 0; j < ny; ++j)
      for (std::int64_t k = 0; k < nz; ++k) {
        double s = 0;
        for (int a = -1; a <= 1; ++a)
          for (int b = -1; b <= 1; ++b)
            for (int c = -1; c <= 1; ++c)
              s += (1 + a + 3 * b + 9 * c) * host[static_cast<std::size_t>((w(i + a, nx) * ny + w(j + b, ny)) * nz + w(k + c, nz))];
        s += static_cast<double>(i);
        const std::size_t at = static_cast<std::size_t>((i * ny + j) * nz + k);
        if (got[at] != s) FAIL_CHECK("(" << i << ", " << j << ", " << k << "): " << got[at] << " != " << s);
      }
}
// A periodic axis stencil (widths 2 along the first dim, 1 elsewhere) with the global index in
// it on a 1-D and a 4-D grid, the first dim split, against the serial loop, bit for bit: a 1-D
// block is one row (the GPU's tiles, StencilTileKernel, with no rows to march), a 4-D one has
// rows over three dims (the GPU's team per row).
template <bool PerPoint, std::size_t R>
void periodic_axes(sl::Context& ctx, const std::array<std::int64_t, R>& shape) {
  using M1 = sl::Mesh<"x">;
  using Spec = std::conditional_t<R == 1, sl::Spec<"x">, sl::Spec<"x", sl::none, sl::none, sl::none>>;
  using G = sl::DistributedTensor<double, M1, Spec>;
  const M1 mesh(ctx, {ctx.num_devices()});
  auto u = G::random(mesh, shape, 11, -1.0, 1.0), v = G::zeros(mesh, shape);
  const auto host = u.to_host();
  std::array<int, R> widths;
  widths.fill(1);
  widths[0] = 2;
  auto g = sl::ghosted(u, widths, B::periodic());
  run_stencil<PerPoint>(v, g, [](const sl::Index<R>& i, const auto& nb) {
    double s = 0;
    if constexpr (R == 1) {
      s = 3 * nb(0) + nb(-2) - 2 * nb(1) + 0.5 * nb(2);
    } else {
      s = 3 * nb(0, 0, 0, 0) + nb(-2, 0, 0, 0) - 2 * nb(1, 0, 0, 0) + nb(0, -1, 0, 0) + 5 * nb(0, 0, 1, 0) - nb(0, 0, 0, -1) +
          7 * nb(0, 0, 0, 1);
    }
    return s + static_cast<double>(i[R - 1]) + 10 * static_cast<double>(i[0]);
  });
  const auto got = v.to_host();
  std::array<std::int64_t, R> stride;
  stride[R - 1] = 1;
  for (std::size_t d = R - 1; d-- > 0;) stride[d] = stride[d + 1] * shape[d + 1];
  auto at = [&](std::array<std::int64_t, R> p) {
    std::int64_t k = 0;
    for (std::size_t d = 0; d < R; ++d) k += ((p[d] % shape[d] + shape[d]) % shape[d]) * stride[d];
    return host[static_cast<std::size_t>(k)];
  };
  for (std::size_t e = 0; e < got.size(); ++e) {
    std::array<std::int64_t, R> p;
    for (std::size_t d = 0; d < R; ++d) p[d] = static_cast<std::int64_t>(e) / stride[d] % shape[d];
    auto nb = [&](std::array<std::int64_t, R> o) {
      for (std::size_t d = 0; d < R; ++d) o[d] += p[d];
      return at(o);
    };
    double s;
    if constexpr (R == 1) {
      s = 3 * nb({0}) + nb({-2}) - 2 * nb({1}) + 0.5 * nb({2});
    } else {
      s = 3 * nb({0, 0, 0, 0}) + nb({-2, 0, 0, 0}) - 2 * nb({1, 0, 0, 0}) + nb({0, -1, 0, 0}) + 5 * nb({0, 0, 1, 0}) -
          nb({0, 0, 0, -1}) + 7 * nb({0, 0, 0, 1});
    }
    s = s + static_cast<double>(p[R - 1]) + 10 * static_cast<double>(p[0]);  // the functor's order
    if (got[e] != s) FAIL_CHECK("element " << e << " of the " << R << "-D grid: " << got[e] << " != " << s);
  }
}

// The GPU's planes kernel (StencilPlaneKernel, SHARDLIB_STENCIL_PLANES=1) on host memory, a
// team's threads in turn: a stencil reading the corners of its widths and the global index, dim 0
// split and periodic, on blocks whose interiors take several tiles and runs of planes (the last
// ones partial), against the serial loop, bit for bit, for each refresh. Returns the kernels of a
// sweep (ghosts current) on this device.
template <std::size_t R>
std::uint64_t planes_case(sl::Context& ctx, const std::array<std::int64_t, R>& shape, const std::array<int, R>& w) {
  using M1 = sl::Mesh<"x">;
  using Spec = std::conditional_t<R == 2, sl::Spec<"x", sl::none>, sl::Spec<"x", sl::none, sl::none>>;
  using G = sl::DistributedTensor<double, M1, Spec>;
  const M1 mesh(ctx, {ctx.num_devices()});
  auto u = G::random(mesh, shape, 17, -1.0, 1.0);
  const auto host = u.to_host();
  auto g = sl::ghosted(u, w, B::periodic());
  // (offset, weight) pairs: the centre, +-w along each dim, two corners.
  std::vector<std::pair<std::array<int, R>, double>> taps;
  taps.push_back({{}, 3.0});
  for (std::size_t d = 0; d < R; ++d)
    for (int side : {-1, 1}) {
      std::array<int, R> o{};
      o[d] = side * w[d];
      taps.push_back({o, 1.0 + static_cast<double>(d) + 0.25 * side});
    }
  std::array<int, R> c1, c2;
  for (std::size_t d = 0; d < R; ++d) {
    c1[d] = d % 2 ? -w[d] : w[d];
    c2[d] = d % 2 ? w[d] : -w[d];
  }
  taps.push_back({c1, -0.5});
  taps.push_back({c2, 0.75});
  const auto f = [taps](const sl::Index<R>& i, const auto& nb) {
    double s = 0;
    for (const auto& [o, c] : taps) {
      if constexpr (R == 2) s += c * nb(o[0], o[1]);
      else s += c * nb(o[0], o[1], o[2]);
    }
    return s + static_cast<double>(i[0]) + 10 * static_cast<double>(i[R - 1]) + 100 * static_cast<double>(i[1]);
  };
  std::array<std::int64_t, R> stride;
  stride[R - 1] = 1;
  for (std::size_t d = R - 1; d-- > 0;) stride[d] = stride[d + 1] * shape[d + 1];
  std::vector<double> want(host.size());
  for (std::size_t e = 0; e < want.size(); ++e) {
    std::array<std::int64_t, R> p;
    for (std::size_t d = 0; d < R; ++d) p[d] = static_cast<std::int64_t>(e) / stride[d] % shape[d];
    double s = 0;
    for (const auto& [o, c] : taps) {
      std::int64_t k = 0;
      for (std::size_t d = 0; d < R; ++d) k += (((p[d] + o[d]) % shape[d] + shape[d]) % shape[d]) * stride[d];
      s += c * host[static_cast<std::size_t>(k)];
    }
    want[e] = s + static_cast<double>(p[0]) + 10 * static_cast<double>(p[R - 1]) + 100 * static_cast<double>(p[1]);
  }
  std::uint64_t kernels = 0;
  for (const auto refresh : {sl::GhostRefresh::overlap, sl::GhostRefresh::blocking, sl::GhostRefresh::none}) {
    if (refresh == sl::GhostRefresh::none) g.exchange();
    auto v = G::zeros(mesh, shape);
    const std::uint64_t c0 = sl::kernels::flop_count().kernel_calls;
    run_stencil<true>(v, g, f, refresh);
    kernels = sl::kernels::flop_count().kernel_calls - c0;
    const auto got = v.to_host();
    for (std::size_t e = 0; e < got.size(); ++e)
      if (got[e] != want[e]) {
        FAIL_CHECK(R << "-D " << shape[0] << "x" << shape[R - 1] << " on " << ctx.num_devices() << " devices, planes "
                      << sl::detail::stencil_planes_selected() << ", refresh " << static_cast<int>(refresh) << ", element "
                      << e << ": " << got[e] << " != " << want[e]);
        break;
      }
  }
  return kernels;
}

// Launches of Kokkos kernels named `stencil_planes_label` (a Kokkos Tools callback counts them).
constexpr const char* stencil_planes_label = "shardlib::stencil_for(planes)";
std::atomic<int>& planes_launches() {
  static std::atomic<int> n{0};
  return n;
}

// planes_case on each device count with and without the planes kernel: the same values, as many
// kernels counted (the middles as planes, or the rows' team, then the shell's kernel), and the
// planes kernel launched where the widths fit it (`fits`), else not (under mpirun each process
// counts its own launches, and its block may have no interior points).
template <std::size_t R>
void planes_cases(const std::array<std::int64_t, R>& shape, const std::array<int, R>& w, bool fits) {
  const sl::detail::StencilPlanesScope scope(false);
  struct Unhook {
    ~Unhook() { Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr); }
  } unhook;
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback([](const char* name, std::uint32_t, std::uint64_t* id) {
    if (std::string(name) == stencil_planes_label) ++planes_launches();
    *id = 0;
  });
  // (Under mpirun, for_each_run runs once on this process's device, whatever the count asked.)
  for (const int n : {1, 3, 4}) {
    std::map<int, std::array<std::uint64_t, 2>> kernels;  // device -> without, with the planes
    std::mutex m;
    int launches[2];
    for (const bool planes : {false, true}) {
      sl::detail::set_stencil_planes(planes);  // (one setting for the process: all devices alike)
      const int before = planes_launches();
      sl::test::for_each_run(
          [&](sl::Context& ctx) {
            const std::uint64_t k = planes_case<R>(ctx, shape, w);
            const std::lock_guard<std::mutex> lock(m);
            kernels[ctx.device()][planes] = k;
          },
          {n});
      launches[planes] = planes_launches() - before;
    }
    INFO(R << "-D " << shape[0] << "x" << shape[R - 1] << " on " << n << " devices");
    CHECK(launches[0] == 0);
    if (!sl::test::mpi_runtime()) CHECK((launches[1] > 0) == fits);  // (some device has interior points)
    else if (!fits) CHECK(launches[1] == 0);  // (this process's block may have none: 24 over 7 is 4 x 6 + 0)
    for (const auto& dk : kernels) {  // (not a structured binding: clang 14's INFO cannot capture one)
      INFO("device " << dk.first);
      CHECK(dk.second[1] == dk.second[0]);
    }
    if (sl::test::mpi_runtime()) break;
  }
}

// Reads at the full widths (2 and 1, reflect boundaries) pass the checked mode, with one exchange.
template <bool PerPoint>
void checked_within(sl::Context& ctx) {
  const auto [px, py] = split2(ctx.num_devices());
  const Mesh2 mesh(ctx, {px, py});
  auto u = Grid2::iota(mesh, {8, 8}), v = Grid2::zeros(mesh, {8, 8});
  auto g = sl::ghosted(u, {2, 1}, B::reflect());
  coll::CommRecorder rec;
  run_stencil<PerPoint, sl::Check::on>(v, g, [](const sl::Index<2>&, const auto& nb) { return nb(-2, -1) + nb(2, 1); });
  CHECK(rec[coll::Kind::all_to_all].calls == 1);
  CHECK(rec.total_calls() == 1);
  CHECK(rec[coll::Kind::all_to_all].bytes_received == static_cast<std::uint64_t>(g.cells_received()) * sizeof(double));
  // iota: u(i, j) = 8i + j; reflect maps -1 -> 0, -2 -> 1, 8 -> 7, 9 -> 6.
  auto m = [](std::int64_t i) { return i < 0 ? -1 - i : i > 7 ? 15 - i : i; };
  const auto got = v.to_host();
  for (std::int64_t i = 0; i < 8; ++i)
    for (std::int64_t j = 0; j < 8; ++j)
      CHECK(got[static_cast<std::size_t>(i * 8 + j)] == static_cast<double>(8 * m(i - 2) + m(j - 1) + 8 * m(i + 2) + m(j + 1)));
}
}  // namespace

TEST_SUITE("stencil") {
TEST_CASE("ghost cells match the global array, and exactly the ghost cells travel (random meshes, specs, widths, boundaries)") {
  sl::test::for_each_run([](sl::Context& ctx) { exchange_property(ctx, sl::test::mpi_runtime() ? 300 : 400, 7); });
}

TEST_CASE("stencil_for: Jacobi equals the serial loop bit for bit, with and without overlap") {
  for (auto refresh : {sl::GhostRefresh::overlap, sl::GhostRefresh::blocking, sl::GhostRefresh::none})
    sl::test::for_each_run([&](sl::Context& ctx) { jacobi(ctx, refresh); }, {1, 2, 4, 6, 8});
}

TEST_CASE("stencil_for: a 27-point periodic stencil on a 3-D grid") {
  sl::test::for_each_run([](sl::Context& ctx) { periodic27(ctx); }, {1, 2, 3, 4, 8});
}

TEST_CASE("ghosted and stencil_for: bad input is reported with the tensor, dim and width") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const auto [px, py] = split2(ctx.num_devices());
        const Mesh2 mesh(ctx, {px, py});
        // Every device meets each error, a device with an empty block too (on 5 and 7 devices
        // the 12 columns are blocks of 3, 3, 3, 3, 0 and 2 x 6, 0: "the output is the input" was
        // found by the devices with data only, and the empty one went on into the exchange).
        auto u = Grid2::zeros(mesh, {8, 12}), v = Grid2::zeros(mesh, {8, 12}), w = Grid2::zeros(mesh, {9, 12});
        auto has = [](auto&& f, const std::string& text) {
          try {
            f();
          } catch (const std::exception& e) {
            const std::string what = e.what();
            if (what.find(text) == std::string::npos) FAIL_CHECK("the message\n  " << what << "\ndoes not say\n  " << text);
            return;
          }
          FAIL_CHECK("no exception; expected one saying: " << text);
        };
        has([&] { (void)sl::ghosted(u, {9, 1}, B::periodic()); }, "ghost width 9 on dim 0 exceeds its extent 8");
        has([&] { (void)sl::ghosted(u, {-1, 1}); }, "ghost width -1 on dim 0 is negative");
        has([&] { (void)sl::ghosted(u, {0, 1}, {{{B::reflect(), B::zero()}, {B::zero(), B::zero()}}}); },
            "dim 0 has ghost width 0, so its low-side boundary (reflect) has no ghost cells to fill");
        has([&] { (void)sl::ghosted(u, {1, 1}, {{{B::periodic(), B::zero()}, {B::zero(), B::zero()}}}); },
            "dim 0 is periodic on its low side only");
        has([&] { (void)sl::ghosted(u, {1, 1}, {{{B::periodic(), B::zero()}, {B::zero(), B::zero()}}}); },
            "shape [8, 12] with Spec<\"x\", \"y\"> on mesh");
        auto g = sl::ghosted(u, {1, 1});
        auto f = [](const sl::Index<2>&, const auto& nb) { return nb(0, 2); };
        has([&] { sl::stencil_for(w, g, f); }, "the output has shape [9, 12]");
        has([&] { sl::stencil_for(u, g, f); }, "the output is the input");
        has([&] { sl::stencil_for<sl::Check::on>(v, g, f); },
            "reads beyond the ghost widths (1, 1) of the input");
        has([&] { sl::stencil_for<sl::Check::on>(v, g, f); }, "nb(0, 2) at global index (");
        has([&] { g.finish(); }, "finish() without start()");
        g.start();
        has([&] { g.start(); }, "start() while an exchange is in flight");
        has([&] { sl::stencil_for(v, g, f); }, "has an exchange in flight");
        g.finish();
        has([&] { (void)g.at({-2, 0}); }, "index (-2, 0) is outside device");
        u = Grid2::zeros(mesh, {6, 12});
        has([&] { g.exchange(); }, "the tensor now has shape [6, 12]");
        // Without an exchange too: the view's ghost regions and plan are the old blocks'.
        auto v6 = Grid2::zeros(mesh, {6, 12});
        has([&] { sl::stencil_for(v6, g, f, sl::GhostRefresh::none); }, "the tensor now has shape [6, 12]");
        has([&] { (void)g.at({0, 0}); }, "the tensor now has shape [6, 12]");
      },
      {1, 4, 5, 7});
}

TEST_CASE("stencil_for: a functor reading within the widths passes the checked mode, and the counters show one exchange") {
  sl::test::for_each_run([](sl::Context& ctx) { checked_within<false>(ctx); });
}

TEST_CASE("SHARDLIB_STENCIL_PLANES: 1 selects the planes kernel, 0 or unset the default kernels, other values a clear error") {
  const sl::detail::StencilPlanesScope scope(false);  // (the setting as it was, after the case)
  struct Unset {
    ~Unset() { ::unsetenv("SHARDLIB_STENCIL_PLANES"); }
  } unset;
  auto read = [](const char* value) {
    if (value) ::setenv("SHARDLIB_STENCIL_PLANES", value, 1);
    else ::unsetenv("SHARDLIB_STENCIL_PLANES");
    sl::detail::stencil_planes_setting() = -1;  // read the variable again
    return sl::detail::stencil_planes_selected();
  };
  CHECK(!read(nullptr));
  CHECK(!read("0"));
  CHECK(read("1"));
  CHECK_THROWS_WITH_AS(read("yes"), doctest::Contains("SHARDLIB_STENCIL_PLANES is 'yes': 1 runs"), std::invalid_argument);
  sl::detail::set_stencil_planes(true);  // the override stands until the next set
  CHECK(sl::detail::stencil_planes_selected());
  {
    const sl::detail::StencilPlanesScope off(false);  // a scope's setting, then the one before
    CHECK(!sl::detail::stencil_planes_selected());
  }
  CHECK(sl::detail::stencil_planes_selected());
  sl::detail::stencil_planes_setting() = -1;
  {
    const sl::detail::StencilPlanesScope on(true);
    CHECK(sl::detail::stencil_planes_selected());
  }
  CHECK(sl::detail::stencil_planes_setting() == -1);  // not read yet, as before the scope
}

TEST_CASE("stencil_for's GPU work items (a point each, GPU memory's) on host memory: the results of the rows' layout") {
  // What stencil_for runs on tensors in GPU memory, here on host memory (CI has no GPU): the
  // same kernels with a point per work item instead of a row.
  for (auto refresh : {sl::GhostRefresh::overlap, sl::GhostRefresh::blocking, sl::GhostRefresh::none})
    sl::test::for_each_run([&](sl::Context& ctx) { jacobi<true>(ctx, refresh); }, {1, 2, 4, 6});
  sl::test::for_each_run([](sl::Context& ctx) { periodic27<true>(ctx); }, {1, 2, 3, 8});
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        periodic_axes<true, 1>(ctx, {37});
        periodic_axes<false, 1>(ctx, {37});
        periodic_axes<true, 4>(ctx, {9, 4, 7, 11});
        periodic_axes<false, 4>(ctx, {9, 4, 7, 11});
      },
      {1, 2, 3});
  sl::test::for_each_run([](sl::Context& ctx) { checked_within<true>(ctx); }, {1, 4});
  planes_cases<3>({70, 21, 45}, {2, 1, 1}, true);   // tiles 2 x 3, runs of 5 planes (uneven); ring 31.9 KiB
  planes_cases<3>({24, 20, 70}, {1, 3, 2}, true);   // a ring of 31.5 KiB of doubles (a host team's scratch: 32 KiB)
  planes_cases<3>({24, 20, 70}, {1, 4, 8}, false);  // a ring of 48 KiB: the team per row
  planes_cases<3>({24, 20, 40}, {1, 5, 1}, false);  // too wide along dim 1 (4 at most): the team per row
  planes_cases<2>({40, 600}, {2, 3}, true);         // rows of 3 tiles of 256, the last partial
  planes_cases<3>({30, 20, 40}, {1, 0, 2}, true);   // no ghost layers along dim 1
  planes_cases<2>({40, 300}, {2, 0}, true);         // ... nor along the rows
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const Mesh2 mesh(ctx, {ctx.num_devices(), 1});
        auto u = Grid2::zeros(mesh, {8, 12}), v = Grid2::zeros(mesh, {8, 12});
        auto g = sl::ghosted(u, {1, 1});
        try {
          run_stencil<true, sl::Check::on>(v, g, [](const sl::Index<2>&, const auto& nb) { return nb(0, -2); });
          FAIL_CHECK("no exception for nb(0, -2) with widths (1, 1)");
        } catch (const std::out_of_range& e) {
          CHECK(std::string(e.what()).find("nb(0, -2) at global index (") != std::string::npos);
        }
      },
      {1, 4});
}
}

