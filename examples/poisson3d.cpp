// SPDX-License-Identifier: Apache-2.0
// The 3-D Poisson equation -Δu = f on the unit cube (u = 0 on the boundary), solved with
// conjugate gradient: the 7-point Laplacian applied matrix-free with stencil_for, dot products
// with parallel_reduce over two tensors, the vector updates with parallel_for over two tensors.
// The grid is split over a 3-D mesh of devices (each dim over its own axis).
//
//   ./poisson3d [--devices N] [--n SIDE] [--tol-digits D]   (threads: 8 devices; stop at |r|/|b| < 1e-D; --help)
//   mpirun -np 4 ./poisson3d
//
// f comes from u* = x(1-x) y(1-y) z(1-z), which the 7-point stencil differentiates exactly (a
// quadratic in each dim), so the discrete solution is u* at the grid points: the error against it
// is the solver's. Prints the residual history, then checks the solution against the same CG run
// serially on one device (equal to round-off: the dot products add in another order).
#include <shardlib/stencil.hpp>

#include "common.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace sl = shardlib;

using Mesh = sl::Mesh<"x", "y", "z">;
using Field = sl::DistributedTensor<double, Mesh, sl::Spec<"x", "y", "z">>;
using I3 = sl::Index<3>;

namespace {

constexpr const char* usage = R"(usage: poisson3d [--devices N] [--n SIDE] [--tol-digits D]
  --devices N     in-process devices (8), as a 3-D mesh; under mpirun each rank is a device
  --n SIDE        unknowns per side (32), 1 to 65536; any side on any mesh (blocks may be uneven)
  --tol-digits D  stop CG at a relative residual |r| / |b| below 1e-D (10), D from 1 to 16 (a
                  double's round-off stops CG short of more)
Also the runtime's --backend threads|mpi|nccl and --threads-per-device N, and Kokkos's
--kokkos-NAME=VALUE. Bad input: a one-line message and exit status 2; a solution that differs from
the serial CG's or from u* by more than 1e-7: exit status 1.
)";

/// Mesh sizes for n devices over three axes, as even as they come (8 -> 2 x 2 x 2, 6 -> 3 x 2 x 1).
std::array<int, 3> mesh_sizes(int n) {
  std::array<int, 3> s{1, 1, 1};
  for (int p = 2; n > 1;) {
    if (n % p != 0) {
      ++p;
      continue;
    }
    *std::min_element(s.begin(), s.end()) *= p;
    n /= p;
  }
  std::sort(s.rbegin(), s.rend());
  return s;
}

/// Serial CG on the whole grid (one device): the reference.
std::vector<double> serial_cg(std::int64_t n, const std::vector<double>& b, double tol, int& iterations) {
  const auto N = static_cast<std::size_t>(n * n * n);
  const double h2 = 1.0 / double((n + 1) * (n + 1));
  auto A = [&](const std::vector<double>& p, std::vector<double>& q) {
    auto at = [&](std::int64_t i, std::int64_t j, std::int64_t k) {
      return i < 0 || j < 0 || k < 0 || i >= n || j >= n || k >= n ? 0.0 : p[static_cast<std::size_t>((i * n + j) * n + k)];
    };
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t k = 0; k < n; ++k)
          q[static_cast<std::size_t>((i * n + j) * n + k)] =
              (6 * at(i, j, k) - at(i - 1, j, k) - at(i + 1, j, k) - at(i, j - 1, k) - at(i, j + 1, k) - at(i, j, k - 1) -
               at(i, j, k + 1)) / h2;
  };
  auto dot = [&](const std::vector<double>& a, const std::vector<double>& c) {
    double s = 0;
    for (std::size_t i = 0; i < N; ++i) s += a[i] * c[i];
    return s;
  };
  std::vector<double> x(N, 0.0), r = b, p = b, q(N);
  double rr = dot(r, r);
  const double stop = tol * tol * dot(b, b);
  for (iterations = 0; rr > stop && iterations < 10 * n; ++iterations) {
    A(p, q);
    const double alpha = rr / dot(p, q);
    for (std::size_t i = 0; i < N; ++i) {
      x[i] += alpha * p[i];
      r[i] -= alpha * q[i];
    }
    const double next = dot(r, r);
    for (std::size_t i = 0; i < N; ++i) p[i] = r[i] + next / rr * p[i];
    rr = next;
  }
  return x;
}
}  // namespace

int main(int argc, char** argv) {
  return example::main(argc, argv, "poisson3d", usage, [](example::Args& args) {
    const std::int64_t n = args.integer("--n", 32, 1, 1 << 16);
    const double tol = std::pow(10.0, -static_cast<double>(args.integer("--tol-digits", 10, 1, 16)));
    auto rt = args.runtime(/*default_devices=*/8);
    rt.spmd([&](sl::Context& ctx) {
      const auto sizes = mesh_sizes(ctx.num_devices());
      const Mesh mesh(ctx, {sizes[0], sizes[1], sizes[2]});
      const bool root = ctx.device() == 0;
      const double h = 1.0 / double(n + 1), h2 = h * h;
      auto q = [h](std::int64_t i) {  // x(1-x) at grid point i
        const double x = h * double(i + 1);
        return x * (1 - x);
      };
      if (root)
        std::printf("poisson3d: %lld^3 unknowns on mesh %s (%s backend), CG to a relative residual of %.0e\n",
                    static_cast<long long>(n), mesh.to_string().c_str(), std::string(ctx.backend()).c_str(), tol);

      // b = f at the grid points; x = 0, so r = b and p = r.
      auto b = Field::zeros(mesh, {n, n, n});
      sl::parallel_for(b, [=](const I3& i, double& v) {  // f = -Δu* = 2 (y(1-y) z(1-z) + ...)
        v = 2 * (q(i[1]) * q(i[2]) + q(i[0]) * q(i[2]) + q(i[0]) * q(i[1]));
      });
      auto x = Field::zeros(mesh, {n, n, n}), r = b.clone(), p = b.clone(), ap = Field::zeros(mesh, {n, n, n});
      auto gp = sl::ghosted(p, {1, 1, 1});  // ghost cells beyond the boundary hold 0: u = 0 there
      auto laplacian = [h2](const I3&, const auto& nb) {
        return (6 * nb(0, 0, 0) - nb(-1, 0, 0) - nb(1, 0, 0) - nb(0, -1, 0) - nb(0, 1, 0) - nb(0, 0, -1) - nb(0, 0, 1)) / h2;
      };
      auto dot = [](const Field& a, const Field& c) {
        return sl::parallel_reduce(a, c, [](const I3&, double u, double v) { return u * v; });
      };
      double rr = dot(r, r);
      const double bb = rr, stop = tol * tol * bb;
      int it = 0;
      for (; rr > stop && it < 10 * n; ++it) {
        sl::stencil_for(ap, gp, laplacian);  // A p, the exchange of p's ghosts overlapped
        const double alpha = rr / dot(p, ap);
        sl::parallel_for(x, p, [=](const I3&, double& xv, double pv) { xv += alpha * pv; });
        sl::parallel_for(r, ap, [=](const I3&, double& rv, double av) { rv -= alpha * av; });
        const double next = dot(r, r), beta = next / rr;
        sl::parallel_for(p, r, [=](const I3&, double& pv, double rv) { pv = rv + beta * pv; });
        rr = next;
        if (root && (it % 10 == 0)) std::printf("  iteration %3d: |r| / |b| = %.3e\n", it + 1, std::sqrt(rr / bb));
      }
      if (root) std::printf("  converged after %d iterations: |r| / |b| = %.3e\n", it, std::sqrt(rr / bb));
      const double err = sl::parallel_reduce<sl::ReduceOp::max>(
          x, [=](const I3& i, double v) { return std::abs(v - q(i[0]) * q(i[1]) * q(i[2])); });
      if (root) std::printf("  max |u - u*| = %.3e (u* peaks at 1/64)\n", err);

      const auto xs = x.to_host(), bs = b.to_host();
      if (root) {
        int serial_it = 0;
        const auto ref = serial_cg(n, bs, tol, serial_it);
        double diff = 0, scale = 0;
        for (std::size_t k = 0; k < ref.size(); ++k) {
          diff = std::max(diff, std::abs(xs[k] - ref[k]));
          scale = std::max(scale, std::abs(ref[k]));
        }
        std::printf("serial CG on one device: %d iterations, max |x - x_serial| / max |x_serial| = %.2e\n", serial_it, diff / scale);
        if (diff > 1e-8 * scale || std::abs(serial_it - it) > 1)
          throw std::runtime_error("the sharded solution does not match the serial one");
        if (err > 1e-7) {  // a loose --tol-digits stops short of it
          char what[128];
          std::snprintf(what, sizeof what, "max |u - u*| = %.3e, more than 1e-7: more --tol-digits bring u closer", err);
          throw std::runtime_error(what);
        }
      }
    });
    return 0;
  });
}
