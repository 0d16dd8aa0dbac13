// SPDX-License-Identifier: Apache-2.0
// Stencil benchmarks (<shardlib/stencil.hpp>), one JSON record per case on stdout:
//   --part sweep     stencil_for of a 2-D 5-point Jacobi sweep (N x N per device block, doubles)
//                    and a 3-D 7-point sweep (M^3 per device), ghosts current (no exchange), next to
//                    the same sweep hand-written as a plain loop over local() (its interior), and to a
//                    memcpy of the block (the copy-bandwidth limit: a sweep reads and writes each
//                    cell once at best, as a copy does); all devices at once
//   --part exchange  the ghost exchange of a 2-D grid: rows (mesh {n, 1}, widths {1, 0}) and faces
//                    (mesh {a, b}, widths {1, 1}; corners too), next to the hand-written exchange of
//                    the same faces: MPI_Sendrecv per neighbour under mpi, permute per neighbour on
//                    threads (packed columns either way)
//   --part step      one Jacobi step (exchange + sweep) with the exchange overlapped, and blocking,
//                    next to max(sweep alone, exchange alone)
//   --part roll      a periodic 5-point sweep written whole-array with four rolls
//                    (0.25 * (roll(u, 1, 0) + roll(u, -1, 0) + roll(u, 1, 1) + roll(u, -1, 1))), next to
//                    stencil_for over a periodic ghosted view (exchange included); --side S global
//                    side (2048), mesh as square as the devices allow
// --n N (2-D block side per device, 1024), --m M (3-D, 96), --weak 0: N is the global side instead.
#include <shardlib/stencil.hpp>

#include "common.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if SHARDLIB_HAVE_MPI
#include <shardlib/collectives/mpi.hpp>
#endif

namespace sl = shardlib;
using B = sl::Boundary;

namespace {

using Mesh2 = sl::Mesh<"x", "y">;
using Grid2 = sl::DistributedTensor<double, Mesh2, sl::Spec<"x", "y">>;
using Mesh3 = sl::Mesh<"x">;
using Grid3 = sl::DistributedTensor<double, Mesh3, sl::Spec<"x", sl::none, sl::none>>;

using bench::num;

void record(sl::Context& ctx, const std::string& part, const std::string& fields) {
  if (ctx.device() == 0)
    std::printf("{\"bench\": \"stencil\", \"part\": \"%s\", \"backend\": \"%s\", \"devices\": %d, %s}\n", part.c_str(),
                std::string(ctx.backend()).c_str(), ctx.num_devices(), fields.c_str());
  std::fflush(stdout);
}

std::array<int, 2> split2(int n) {
  int a = 1;
  for (int d = 1; d * d <= n; ++d)
    if (n % d == 0) a = d;
  return {n / a, a};
}

// -- sweeps -------------------------------------------------------------------------------------

/// STREAM's scale kernel, b = q a: the copy-bandwidth figure HPC codes are held to (a plain copy
/// loop would be turned into a memcpy call by the compiler).
struct StreamScale {
  std::vector<double> a, b;
  double q = 1.0;
  explicit StreamScale(std::int64_t n) : a(static_cast<std::size_t>(n), 1.0), b(static_cast<std::size_t>(n), 0.0) {}
  void operator()() {
    double* __restrict out = b.data();
    const double* __restrict in = a.data();
    const double s = q;
    for (std::size_t i = 0; i < a.size(); ++i) out[i] = s * in[i];
  }
};

std::string limits(double t, double bytes, double t_stream, double t_memcpy) {
  return ", \"bytes\": " + num(bytes) + ", \"GBps\": " + num(bytes / t / 1e9) + ", \"copy_seconds\": " + num(t_stream) +
         ", \"copy_GBps\": " + num(bytes / t_stream / 1e9) + ", \"fraction_of_copy_bandwidth\": " + num(t_stream / t) +
         ", \"memcpy_GBps\": " + num(bytes / t_memcpy / 1e9) + ", \"fraction_of_memcpy\": " + num(t_memcpy / t);
}

void sweep(sl::Context& ctx, std::int64_t n, std::int64_t m, bool weak) {
  const int d = ctx.num_devices();
  {  // 2-D 5-point, mesh {d, 1}
    const Mesh2 mesh(ctx, {d, 1});
    const std::int64_t rows = weak ? n * d : n, cols = n;
    auto u = Grid2::random(mesh, {rows, cols}, 1, 0.0, 1.0), v = Grid2::zeros(mesh, {rows, cols});
    auto g = sl::ghosted(u, {1, 1});
    g.exchange();
    auto f = [](const sl::Index<2>&, const auto& nb) { return 0.25 * (nb(-1, 0) + nb(1, 0) + nb(0, -1) + nb(0, 1)); };
    auto ours = [&] { sl::stencil_for(v, g, f, sl::GhostRefresh::none); };
    // The hand-written loop over the same blocks (local()), its interior: no ghosts to read.
    const std::int64_t br = u.block().extent[0], bc = u.block().extent[1], w = bc;
    auto plain = [&] {
      double* __restrict out = v.local().data();
      const double* __restrict in = u.local().data();
      for (std::int64_t i = 1; i + 1 < br; ++i)
        for (std::int64_t j = 1; j + 1 < bc; ++j)
          out[i * w + j] = 0.25 * (in[(i - 1) * w + j] + in[(i + 1) * w + j] + in[i * w + j - 1] + in[i * w + j + 1]);
    };
    std::vector<double> c0(static_cast<std::size_t>(br * bc), 1.0), c1(c0.size());
    auto copy = [&] { std::memcpy(c1.data(), c0.data(), c0.size() * sizeof(double)); };
    StreamScale stream(br * bc);
    const auto [t, tp] = bench::time_ops(ctx.world(), ours, &plain);
    const auto [ts, tc] = bench::time_ops(ctx.world(), stream, &copy);
    const double bytes = 2.0 * static_cast<double>(br * bc) * sizeof(double) * d;  // read + write per cell, all devices
    record(ctx, "sweep",
           "\"name\": \"jacobi5_2d\", \"shape\": [" + std::to_string(rows) + ", " + std::to_string(cols) + "], \"block\": [" +
               std::to_string(br) + ", " + std::to_string(bc) + "], \"seconds\": " + num(t) +
               ", \"baseline\": \"plain loop over local()\", \"baseline_seconds\": " + num(tp) +
               ", \"ratio_to_baseline\": " + num(tp / t) + limits(t, bytes, ts, tc));
  }
  {  // 3-D 7-point, mesh {d}
    const Mesh3 mesh(ctx, {d});
    const std::int64_t x = weak ? m * d : m;
    auto u = Grid3::random(mesh, {x, m, m}, 1, 0.0, 1.0), v = Grid3::zeros(mesh, {x, m, m});
    auto g = sl::ghosted(u, {1, 1, 1});
    g.exchange();
    auto f = [](const sl::Index<3>&, const auto& nb) {
      return (nb(-1, 0, 0) + nb(1, 0, 0) + nb(0, -1, 0) + nb(0, 1, 0) + nb(0, 0, -1) + nb(0, 0, 1)) * (1.0 / 6);
    };
    auto ours = [&] { sl::stencil_for(v, g, f, sl::GhostRefresh::none); };
    const std::int64_t b0 = u.block().extent[0], b1 = u.block().extent[1], b2 = u.block().extent[2], s1 = b2, s0 = b1 * s1;
    auto plain = [&] {
      double* __restrict out = v.local().data();
      const double* __restrict in = u.local().data();
      for (std::int64_t i = 1; i + 1 < b0; ++i)
        for (std::int64_t j = 1; j + 1 < b1; ++j)
          for (std::int64_t k = 1; k + 1 < b2; ++k) {
            const std::int64_t c = i * s0 + j * s1 + k;
            out[c] = (in[c - s0] + in[c + s0] + in[c - s1] + in[c + s1] + in[c - 1] + in[c + 1]) * (1.0 / 6);
          }
    };
    std::vector<double> c0(static_cast<std::size_t>(b0 * b1 * b2), 1.0), c1(c0.size());
    auto copy = [&] { std::memcpy(c1.data(), c0.data(), c0.size() * sizeof(double)); };
    StreamScale stream(b0 * b1 * b2);
    const auto [t, tp] = bench::time_ops(ctx.world(), ours, &plain);
    const auto [ts, tc] = bench::time_ops(ctx.world(), stream, &copy);
    const double bytes = 2.0 * static_cast<double>(b0 * b1 * b2) * sizeof(double) * d;
    record(ctx, "sweep",
           "\"name\": \"jacobi7_3d\", \"shape\": [" + std::to_string(x) + ", " + std::to_string(m) + ", " + std::to_string(m) +
               "], \"seconds\": " + num(t) + ", \"baseline\": \"plain loop over local()\", \"baseline_seconds\": " +
               num(tp) + ", \"ratio_to_baseline\": " + num(tp / t) + limits(t, bytes, ts, tc));
  }
}

// -- exchange -----------------------------------------------------------------------------------

/// The hand-written exchange of the four faces of a rows x cols block on a px x py grid of
/// devices (non-periodic): columns packed, one call per neighbour direction.
struct HandExchange {
  sl::Context& ctx;
  int px, py;
  std::int64_t rows, cols;
  const double* block;
  std::vector<double> send_col, recv_col, ghost_n, ghost_s, ghost_w, ghost_e;
  HandExchange(sl::Context& c, int a, int b, std::int64_t r, std::int64_t k, const double* blk)
      : ctx(c), px(a), py(b), rows(r), cols(k), block(blk), send_col(static_cast<std::size_t>(r)), recv_col(static_cast<std::size_t>(r)),
        ghost_n(static_cast<std::size_t>(k)), ghost_s(static_cast<std::size_t>(k)), ghost_w(static_cast<std::size_t>(r)),
        ghost_e(static_cast<std::size_t>(r)) {}
  void run() {
    const int me = ctx.device(), i = me / py, j = me % py;
    const int north = i > 0 ? me - py : -1, south = i + 1 < px ? me + py : -1;
    const int west = j > 0 ? me - 1 : -1, east = j + 1 < py ? me + 1 : -1;
    const double* first_row = block;
    const double* last_row = block + (rows - 1) * cols;
#if SHARDLIB_HAVE_MPI
    if (auto* mpi = dynamic_cast<sl::coll::MpiCommunicator*>(&ctx.world())) {
      MPI_Comm c = mpi->comm();
      auto p = [](int r) { return r < 0 ? MPI_PROC_NULL : r; };
      const int nr = static_cast<int>(rows), nc = static_cast<int>(cols);
      MPI_Sendrecv(last_row, nc, MPI_DOUBLE, p(south), 1, ghost_n.data(), nc, MPI_DOUBLE, p(north), 1, c, MPI_STATUS_IGNORE);
      MPI_Sendrecv(first_row, nc, MPI_DOUBLE, p(north), 2, ghost_s.data(), nc, MPI_DOUBLE, p(south), 2, c, MPI_STATUS_IGNORE);
      if (py > 1) {
        for (std::int64_t r = 0; r < rows; ++r) send_col[static_cast<std::size_t>(r)] = block[r * cols + cols - 1];
        MPI_Sendrecv(send_col.data(), nr, MPI_DOUBLE, p(east), 3, ghost_w.data(), nr, MPI_DOUBLE, p(west), 3, c, MPI_STATUS_IGNORE);
        for (std::int64_t r = 0; r < rows; ++r) send_col[static_cast<std::size_t>(r)] = block[r * cols];
        MPI_Sendrecv(send_col.data(), nr, MPI_DOUBLE, p(west), 4, ghost_e.data(), nr, MPI_DOUBLE, p(east), 4, c, MPI_STATUS_IGNORE);
      }
      return;
    }
#endif
    auto& w = ctx.world();
    const auto dt = sl::coll::DType::f64;
    w.permute(last_row, static_cast<std::size_t>(cols), south, ghost_n.data(), static_cast<std::size_t>(cols), north, dt);
    w.permute(first_row, static_cast<std::size_t>(cols), north, ghost_s.data(), static_cast<std::size_t>(cols), south, dt);
    if (py > 1) {
      for (std::int64_t r = 0; r < rows; ++r) send_col[static_cast<std::size_t>(r)] = block[r * cols + cols - 1];
      w.permute(send_col.data(), static_cast<std::size_t>(rows), east, ghost_w.data(), static_cast<std::size_t>(rows), west, dt);
      for (std::int64_t r = 0; r < rows; ++r) send_col[static_cast<std::size_t>(r)] = block[r * cols];
      w.permute(send_col.data(), static_cast<std::size_t>(rows), west, ghost_e.data(), static_cast<std::size_t>(rows), east, dt);
    }
  }
};

void exchange(sl::Context& ctx, std::int64_t n, bool weak) {
  const int d = ctx.num_devices();
  for (int layout = 0; layout < 2; ++layout) {
    const auto [px, py] = layout == 0 ? std::array<int, 2>{d, 1} : split2(d);
    if (layout == 1 && py == 1) continue;  // the same as rows
    const Mesh2 mesh(ctx, {px, py});
    const std::int64_t rows = weak ? n * px : n, cols = weak ? n * py : n;
    auto u = Grid2::random(mesh, {rows, cols}, 1, 0.0, 1.0);
    auto g = layout == 0 ? sl::ghosted(u, {1, 0}) : sl::ghosted(u, {1, 1});
    HandExchange hand(ctx, px, py, u.block().extent[0], u.block().extent[1], u.local().data());
    auto ours = [&] { g.exchange(); };
    auto base = [&] { hand.run(); };
    const auto [t, tb] = bench::time_ops(ctx.world(), ours, &base);
    const double bytes = static_cast<double>(g.cells_received()) * sizeof(double);
    record(ctx, "exchange",
           std::string("\"name\": \"") + (layout == 0 ? "rows" : "faces") + "\", \"mesh\": [" + std::to_string(px) + ", " +
               std::to_string(py) + "], \"shape\": [" + std::to_string(rows) + ", " + std::to_string(cols) + "], \"seconds\": " +
               num(t) + ", \"baseline\": \"hand-written " + (ctx.backend() == "mpi" ? "MPI_Sendrecv" : "permute") +
               " per face\", \"baseline_seconds\": " + num(tb) + ", \"ratio_to_baseline\": " + num(tb / t) +
               ", \"bytes\": " + num(bytes) + ", \"cells_received_device0\": " + std::to_string(g.cells_received()));
  }
}

// -- step with and without overlap --------------------------------------------------------------

void step(sl::Context& ctx, std::int64_t n, bool weak) {
  const int d = ctx.num_devices();
  const auto [px, py] = split2(d);
  const Mesh2 mesh(ctx, {px, py});
  const std::int64_t rows = weak ? n * px : n, cols = weak ? n * py : n;
  auto u = Grid2::random(mesh, {rows, cols}, 1, 0.0, 1.0), v = Grid2::zeros(mesh, {rows, cols});
  auto g = sl::ghosted(u, {1, 1});
  auto f = [](const sl::Index<2>&, const auto& nb) { return 0.25 * (nb(-1, 0) + nb(1, 0) + nb(0, -1) + nb(0, 1)); };
  auto overlap = [&] { sl::stencil_for(v, g, f); };
  auto blocking = [&] { sl::stencil_for(v, g, f, sl::GhostRefresh::blocking); };
  auto compute = [&] { sl::stencil_for(v, g, f, sl::GhostRefresh::none); };
  auto exch = [&] { g.exchange(); };
  const auto [to, tb] = bench::time_ops(ctx.world(), overlap, &blocking);
  const auto [tc, te] = bench::time_ops(ctx.world(), compute, &exch);
  const double bound = std::max(tc, te);
  record(ctx, "step",
         "\"name\": \"jacobi5_step\", \"mesh\": [" + std::to_string(px) + ", " + std::to_string(py) + "], \"shape\": [" +
             std::to_string(rows) + ", " + std::to_string(cols) + "], \"seconds\": " + num(to) +
             ", \"baseline\": \"max(sweep alone, exchange alone)\", \"baseline_seconds\": " + num(bound) +
             ", \"ratio_to_baseline\": " + num(to / bound) + ", \"blocking_seconds\": " + num(tb) +
             ", \"sweep_seconds\": " + num(tc) + ", \"exchange_seconds\": " + num(te));
}

// -- whole-array form (roll) against stencil_for -------------------------------------------------

void roll_sweep(sl::Context& ctx, std::int64_t side) {
  const auto [px, py] = split2(ctx.num_devices());
  const Mesh2 mesh(ctx, {px, py});
  auto u = Grid2::random(mesh, {side, side}, 1, 0.0, 1.0), v = Grid2::zeros(mesh, {side, side});
  auto g = sl::ghosted(u, {1, 1}, B::periodic());
  auto f = [](const sl::Index<2>&, const auto& nb) { return 0.25 * (nb(-1, 0) + nb(1, 0) + nb(0, -1) + nb(0, 1)); };
  auto rolls = [&] { v = 0.25 * (sl::roll(u, 1, 0) + sl::roll(u, -1, 0) + sl::roll(u, 1, 1) + sl::roll(u, -1, 1)); };
  auto ghosts = [&] { sl::stencil_for(v, g, f); };
  const auto [t, tb] = bench::time_ops(ctx.world(), rolls, &ghosts);
  record(ctx, "roll",
         "\"name\": \"jacobi5_periodic\", \"mesh\": [" + std::to_string(px) + ", " + std::to_string(py) + "], \"shape\": [" +
             std::to_string(side) + ", " + std::to_string(side) + "], \"seconds\": " + num(t) +
             ", \"baseline\": \"stencil_for over a periodic ghosted view\", \"baseline_seconds\": " + num(tb) +
             ", \"ratio_to_baseline\": " + num(tb / t));
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
  bench::check_args(argc, argv,
                    {{"--part", bench::Takes::word, "sweep|exchange|step|roll"},
                     {"--n", bench::Takes::integer},
                     {"--m", bench::Takes::integer},
                     {"--weak", bench::Takes::integer},
                     {"--side", bench::Takes::integer}});
  auto rt = sl::Runtime::from_args(argc, argv, 1);
  const std::string part = bench::text_arg(argc, argv, "--part", "sweep");
  const auto n = static_cast<std::int64_t>(bench::arg(argc, argv, "--n", 4096));
  const auto m = static_cast<std::int64_t>(bench::arg(argc, argv, "--m", 256));
  const bool weak = bench::arg(argc, argv, "--weak", 1) != 0;
  const auto side = static_cast<std::int64_t>(bench::arg(argc, argv, "--side", 2048));
  rt.spmd([&](sl::Context& ctx) {
    bench::warm_up(ctx.world());
    if (part == "sweep") sweep(ctx, n, m, weak);
    else if (part == "exchange") exchange(ctx, n, weak);
    else if (part == "step") step(ctx, n, weak);
    else if (part == "roll") roll_sweep(ctx, side);
    else throw std::invalid_argument("bench_stencil: --part is sweep, exchange, step or roll, not " + part);
  });
  return 0;
}
