// SPDX-License-Identifier: Apache-2.0
// A blob carried across a periodic 2-D domain by a constant wind (the advection equation
// u_t + a u_x + b u_y = 0, first-order upwind), on a grid split over both dims of a 2-D mesh.
// The ghost cells wrap around: what leaves one edge enters the opposite one, across devices.
//
//   ./advection2d [--devices N] [--n SIDE] [--steps K] [--png FILE]   (threads: 6 devices; --help)
//   mpirun -np 4 ./advection2d
//
// Prints the mass (conserved exactly by the scheme, up to round-off) and the peak as the blob
// travels, checks the field against the same steps as a serial loop over the whole grid (bit for
// bit), and writes the final field as a PNG picture (advection2d.png).
#include <shardlib/stencil.hpp>

#include "common.hpp"

#include "png.hpp"

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace sl = shardlib;
using I2 = sl::Index<2>;
using Mesh = sl::Mesh<"x", "y">;
using Grid = sl::DistributedTensor<double, Mesh, sl::Spec<"x", "y">>;

constexpr const char* usage = R"(usage: advection2d [--devices N] [--n SIDE] [--steps K] [--png FILE]
  --devices N  in-process devices (6), as a 2-D mesh; under mpirun each rank is a device
  --n SIDE     grid points per side (96), 1 to 1048576; any side on any mesh (blocks may be uneven)
  --steps K    upwind steps (240), 1 or more
  --png FILE   the picture of the final field (advection2d.png)
Also the runtime's --backend threads|mpi|nccl and --threads-per-device N, and Kokkos's
--kokkos-NAME=VALUE. Bad input: a one-line message and exit status 2; a field that differs from
the serial loop: exit status 1.
)";

int main(int argc, char** argv) {
  return example::main(argc, argv, "advection2d", usage, [](example::Args& args) {
    const std::int64_t n = args.integer("--n", 96, 1, 1 << 20);
    const int steps = static_cast<int>(args.integer("--steps", 240, 1, 1000000000));
    const std::string png = args.text("--png", "advection2d.png");
    auto rt = args.runtime(/*default_devices=*/6);
    rt.spmd([&](sl::Context& ctx) {
      const auto [rows, cols] = example::square_mesh(ctx.num_devices());
      const Mesh mesh(ctx, {rows, cols});
      const bool root = ctx.device() == 0;
      const double cx = 0.5, cy = 0.25;  // Courant numbers a dt / h, b dt / h (both > 0: upwind reads i-1, j-1)
      auto blob = [n](std::int64_t i, std::int64_t j) {
        const double x = double(i) / double(n) - 0.3, y = double(j) / double(n) - 0.3;
        return std::exp(-(x * x + y * y) / 0.005);
      };
      auto u = Grid::zeros(mesh, {n, n}), v = Grid::zeros(mesh, {n, n});
      sl::parallel_for(u, [=](const I2& i, double& e) { e = blob(i[0], i[1]); });
      auto gu = sl::ghosted(u, {1, 1}, sl::Boundary::periodic());
      auto upwind = [=](const I2&, const auto& nb) {
        return nb(0, 0) - cx * (nb(0, 0) - nb(-1, 0)) - cy * (nb(0, 0) - nb(0, -1));
      };
      auto mass = [&] { return sl::parallel_reduce(u, [](const I2&, double e) { return e; }); };
      const double mass0 = mass();
      if (root)
        std::printf("advection2d: %lld x %lld periodic grid on mesh %s (%s backend), %d upwind steps, Courant (%.2f, %.2f)\n",
                    static_cast<long long>(n), static_cast<long long>(n), mesh.to_string().c_str(),
                    std::string(ctx.backend()).c_str(), steps, cx, cy);
      for (int s = 1; s <= steps; ++s) {
        sl::stencil_for(v, gu, upwind);
        std::swap(u, v);
        if (s % (steps / 4 > 0 ? steps / 4 : 1) == 0) {
          const double m = mass(), peak = sl::parallel_reduce<sl::ReduceOp::max>(u, [](const I2&, double e) { return e; });
          if (root) std::printf("  step %4d: mass %.12f (relative change %.1e), peak %.4f\n", s, m, (m - mass0) / mass0, peak);
        }
      }
      const auto field = u.to_host();
      if (root) {
        std::vector<double> a(static_cast<std::size_t>(n * n)), b(a.size());
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t j = 0; j < n; ++j) a[static_cast<std::size_t>(i * n + j)] = blob(i, j);
        auto at = [&](std::int64_t i, std::int64_t j) { return a[static_cast<std::size_t>(((i + n) % n) * n + (j + n) % n)]; };
        for (int s = 0; s < steps; ++s) {
          for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j < n; ++j)
              b[static_cast<std::size_t>(i * n + j)] = at(i, j) - cx * (at(i, j) - at(i - 1, j)) - cy * (at(i, j) - at(i, j - 1));
          a.swap(b);
        }
        std::size_t differ = 0;
        for (std::size_t k = 0; k < a.size(); ++k) differ += a[k] != field[k];
        std::printf("serial loop on one device: %s (%zu of %zu cells differ)\n", differ ? "DIFFERENT" : "bit for bit the same",
                    differ, a.size());
        example::write_png(png, field, n, n, 0.0, 1.0);
        std::printf("picture: %s\n", png.c_str());
        if (differ) throw std::runtime_error("the sharded field differs from the serial loop");
      }
    });
    return 0;
  });
}
