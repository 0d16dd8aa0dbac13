// SPDX-License-Identifier: Apache-2.0
// The 2-D heat equation relaxed to its steady state with Jacobi sweeps (5-point stencil) on a grid
// split over a 2-D mesh of devices: the top edge held at 1, the others at 0.
//
//   ./heat2d [--devices N] [--n SIDE] [--sweeps K] [--png FILE]     (threads: 4 devices; --help)
//   mpirun -np 4 ./heat2d
//
// Prints the residual (the largest change of a sweep) every tenth of the run, checks the field
// against the same sweeps as a serial loop over the whole grid on one device (bit for bit), and
// writes the field as a PNG picture (heat2d.png).
#include <shardlib/stencil.hpp>

#include "common.hpp"

#include "png.hpp"

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace sl = shardlib;
using B = sl::Boundary;

using Mesh = sl::Mesh<"x", "y">;
using Grid = sl::DistributedTensor<double, Mesh, sl::Spec<"x", "y">>;

constexpr const char* usage = R"(usage: heat2d [--devices N] [--n SIDE] [--sweeps K] [--png FILE]
  --devices N  in-process devices (4), as a 2-D mesh; under mpirun each rank is a device
  --n SIDE     grid points per side (128), 1 to 1048576; any side on any mesh (blocks may be uneven)
  --sweeps K   Jacobi sweeps (2000), 1 or more
  --png FILE   the picture of the field (heat2d.png)
Also the runtime's --backend threads|mpi|nccl and --threads-per-device N, and Kokkos's
--kokkos-NAME=VALUE. Bad input: a one-line message and exit status 2; a field that differs from
the serial loop: exit status 1.
)";

int main(int argc, char** argv) {
  return example::main(argc, argv, "heat2d", usage, [](example::Args& args) {
    const std::int64_t n = args.integer("--n", 128, 1, 1 << 20);
    const int sweeps = static_cast<int>(args.integer("--sweeps", 2000, 1, 1000000000));
    const std::string png = args.text("--png", "heat2d.png");
    auto rt = args.runtime(/*default_devices=*/4);
    rt.spmd([&](sl::Context& ctx) {
      const auto [rows, cols] = example::square_mesh(ctx.num_devices());
      const Mesh mesh(ctx, {rows, cols});
      const bool root = ctx.device() == 0;

      // The field and the next one, and a ghosted view of the field: one layer of ghost cells, the
      // top edge (low side of dim 0) held at 1, the other edges at 0.
      auto u = Grid::zeros(mesh, {n, n}), v = Grid::zeros(mesh, {n, n});
      auto gu = sl::ghosted(u, {1, 1}, {{{B::dirichlet(1), B::zero()}, {B::zero(), B::zero()}}});
      auto jacobi = [](const sl::Index<2>&, const auto& nb) { return 0.25 * (nb(-1, 0) + nb(1, 0) + nb(0, -1) + nb(0, 1)); };
      if (root)
        std::printf("heat2d: %lld x %lld grid on mesh %s (%s backend), %d Jacobi sweeps\n", static_cast<long long>(n),
                    static_cast<long long>(n), mesh.to_string().c_str(), std::string(ctx.backend()).c_str(), sweeps);
      for (int s = 1; s <= sweeps; ++s) {
        sl::stencil_for(v, gu, jacobi);  // ghosts of u exchanged while the interior is computed
        std::swap(u, v);                 // gu views the object u, which now holds the new field
        if (s % (sweeps / 10 > 0 ? sweeps / 10 : 1) == 0 || s == sweeps) {
          const double change = sl::parallel_reduce<sl::ReduceOp::max>(
              u, v, [](const sl::Index<2>&, double a, double b) { return std::abs(a - b); });
          if (root) std::printf("  sweep %5d: residual (largest change) %.3e\n", s, change);
        }
      }

      // The same sweeps as a serial loop over the whole grid (what one device computes).
      const auto field = u.to_host();
      if (root) {
        std::vector<double> a(static_cast<std::size_t>(n * n), 0.0), b(a.size());
        auto at = [&](std::int64_t i, std::int64_t j) {
          if (i < 0) return 1.0;
          if (i >= n || j < 0 || j >= n) return 0.0;
          return a[static_cast<std::size_t>(i * n + j)];
        };
        for (int s = 0; s < sweeps; ++s) {
          for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j < n; ++j)
              b[static_cast<std::size_t>(i * n + j)] = 0.25 * (at(i - 1, j) + at(i + 1, j) + at(i, j - 1) + at(i, j + 1));
          a.swap(b);
        }
        std::size_t differ = 0;
        for (std::size_t k = 0; k < a.size(); ++k) differ += a[k] != field[k];
        std::printf("serial loop on one device: %s (%zu of %zu cells differ)\n", differ ? "DIFFERENT" : "bit for bit the same",
                    differ, a.size());
        example::write_png(png, field, n, n, 0.0, 1.0);
        std::printf("picture: %s (%lld x %lld pixels, top edge hot)\n", png.c_str(), static_cast<long long>(n),
                    static_cast<long long>(n));
        if (differ) throw std::runtime_error("the sharded field differs from the serial loop");
      }
    });
    return 0;
  });
}
