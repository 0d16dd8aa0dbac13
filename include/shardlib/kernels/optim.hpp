// SPDX-License-Identifier: Apache-2.0
/// @file
/// Optimizer updates on one shard: SGD with momentum and AdamW, elementwise over a parameter
/// block, its gradient block and its state blocks (all laid out alike), and the sum of squares
/// of a gradient block (for clipping by the global norm). The gradient may have another element
/// type than the parameter and state (mixed precision: bf16 or f16 gradients, float32 master
/// weights and state); it is read in the parameter's type.
///
/// Knows nothing of tensors or collectives: raw pointers, a length, an execution-space instance.
/// The formulas are PyTorch's (torch.optim.SGD with dampening 0, torch.optim.AdamW), so a
/// model trained here and there takes the same steps.
#pragma once

#include <shardlib/detail/attributes.hpp>
SHARDLIB_SIMD_WARNINGS_OFF  // (g++ 12 under -march=native: detail/attributes.hpp)

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/half.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/kernels/vmath.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace shardlib::kernels {

/// SGD hyperparameters of one step; `grad_scale` multiplies the gradient first (clipping).
struct SgdStep {
  double lr = 0, momentum = 0, weight_decay = 0, grad_scale = 1;
  bool nesterov = false;
};

/// The SGD step on element i (see sgd_update).
template <class T, class G>
struct SgdKernel {
  T* p;
  const G* g;
  T* buf;
  T lr, mu, wd, gs;
  bool nesterov;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const T d = gs * static_cast<T>(g[i]) + wd * p[i];
    if (buf == nullptr) {
      p[i] -= lr * d;
      return;
    }
    const T b = mu * buf[i] + d;
    buf[i] = b;
    p[i] -= lr * (nesterov ? d + mu * b : b);
  }
};

/// p -= lr * d, where g' = grad_scale g + weight_decay p, buf = momentum buf + g' (buf starts at
/// zero, so the first step's buf is g'), d = nesterov ? g' + momentum buf : buf (momentum 0: d =
/// g', and `buf` may be null). On a host instance it returns when done; on a device one it is
/// queued on the instance's stream.
template <class Exec, class T, class G>
void sgd_update(const Exec& exec, std::int64_t n, T* p, const G* g, T* buf, const SgdStep& s) {
  if (n > 0)  // p and buf (when given) read and written, g read
    count_kernel(static_cast<std::uint64_t>(n) * ((buf != nullptr ? 4u : 2u) * sizeof(T) + sizeof(G)));
  if (shardlib::shape_only()) return;
  detail::portable::run(exec, buf == nullptr ? "shardlib::sgd" : "shardlib::sgd_momentum", n,
                        SgdKernel<T, G>{p, g, buf, static_cast<T>(s.lr), static_cast<T>(s.momentum),
                                        static_cast<T>(s.weight_decay), static_cast<T>(s.grad_scale), s.nesterov});
}

/// AdamW hyperparameters of one step (`step` counts from 1, for the bias corrections).
struct AdamWStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, grad_scale = 1;
  std::int64_t step = 1;
};

/// The AdamW step on element i (see adamw_update).
template <class T, class G>
struct AdamWKernel {
  T* p;
  const G* g;
  T* m;
  T* v;
  T decay, b1, b2, eps, gs, step_size, bc2_sqrt;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    using std::sqrt;
    const T gi = gs * static_cast<T>(g[i]);
    const T mi = b1 * m[i] + (T(1) - b1) * gi;
    const T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (sqrt(vi) / bc2_sqrt + eps);
  }
};

/// AdamWKernel's formula on a host, a chunk of vmath::chunk elements per work item on Eigen's SIMD
/// packets (float or double, the gradient of the parameter's type). The element-at-a-time form
/// ran at 11 GB/s on a Xeon core, its scalar square root and division the bound: 4.5 ms for the
/// 1.87 M floats of benchmarks/run train's GPT, these chunks 1.1 ms.
/// Every element takes the same packet instructions, the last n % lanes through a padded packet:
/// its result does not depend on where it sits, so DP and ZeRO, whose blocks start at other
/// elements, take bit-identical steps (an Eigen array expression takes a run's unaligned ends one
/// scalar at a time, and they differed). The square root is Eigen's packet sqrt, under its default
/// EIGEN_FAST_MATH an estimate with a Newton step (within a few float ulps; 0 at 0, NaN stays
/// NaN), so a step may differ from the element form's (a GPU's) in its last bits.
template <class T>
struct AdamWChunks {
  AdamWKernel<T, T> k;
  std::int64_t n;
  void operator()(std::int64_t c) const {
    namespace ei = Eigen::internal;
    using P = vmath::Packet<T>;
    constexpr std::int64_t W = vmath::lanes<T>;
    const P decay = ei::pset1<P>(k.decay), b1 = ei::pset1<P>(k.b1), c1 = ei::pset1<P>(T(1) - k.b1),
            b2 = ei::pset1<P>(k.b2), c2 = ei::pset1<P>(T(1) - k.b2), eps = ei::pset1<P>(k.eps),
            gs = ei::pset1<P>(k.gs), step = ei::pset1<P>(k.step_size), bc2 = ei::pset1<P>(k.bc2_sqrt);
    auto update = [&](const T* g, T* p, T* m, T* v) {
      const P gi = ei::pmul(gs, ei::ploadu<P>(g));
      const P mi = ei::padd(ei::pmul(b1, ei::ploadu<P>(m)), ei::pmul(c1, gi));
      const P vi = ei::padd(ei::pmul(b2, ei::ploadu<P>(v)), ei::pmul(ei::pmul(c2, gi), gi));
      ei::pstoreu(m, mi);
      ei::pstoreu(v, vi);
      ei::pstoreu(p, ei::psub(ei::pmul(ei::ploadu<P>(p), decay),
                              ei::pdiv(ei::pmul(step, mi), ei::padd(ei::pdiv(ei::psqrt(vi), bc2), eps))));
    };
    const std::int64_t b = c * vmath::chunk, e = n - b < vmath::chunk ? n : b + vmath::chunk;
    std::int64_t j = b;
    for (; j + W <= e; j += W) update(k.g + j, k.p + j, k.m + j, k.v + j);
    if (j < e) {  // the rest, padded to a packet with zeros (their update is 0 / eps: finite)
      T g[W] = {}, p[W] = {}, m[W] = {}, v[W] = {};
      const std::int64_t r = e - j;
      for (std::int64_t l = 0; l < r; ++l) g[l] = k.g[j + l], p[l] = k.p[j + l], m[l] = k.m[j + l], v[l] = k.v[j + l];
      update(g, p, m, v);
      for (std::int64_t l = 0; l < r; ++l) k.p[j + l] = p[l], k.m[j + l] = m[l], k.v[j + l] = v[l];
    }
  }
};

/// Decoupled weight decay, then Adam: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g²;
/// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps), with g = grad_scale * grad. On a
/// host instance it returns when done (float and double state with a gradient of its type run in
/// SIMD chunks: AdamWChunks); on a device one it is queued on the instance's stream.
template <class Exec, class T, class G>
void adamw_update(const Exec& exec, std::int64_t n, T* p, const G* g, T* m, T* v, const AdamWStep& s) {
  if (n > 0) count_kernel(static_cast<std::uint64_t>(n) * (6 * sizeof(T) + sizeof(G)));  // p, m, v read, written; g read
  if (shardlib::shape_only()) return;
  const double t = static_cast<double>(s.step);
  const AdamWKernel<T, G> k{p, g, m, v, static_cast<T>(1 - s.lr * s.weight_decay), static_cast<T>(s.beta1),
                            static_cast<T>(s.beta2), static_cast<T>(s.eps), static_cast<T>(s.grad_scale),
                            static_cast<T>(s.lr / (1 - std::pow(s.beta1, t))),
                            static_cast<T>(std::sqrt(1 - std::pow(s.beta2, t)))};
  if constexpr (is_host_exec_v<Exec> && vmath::is_vector_type_v<T> && std::is_same_v<T, G>) {
    if (n > 0)
      Kokkos::parallel_for("shardlib::adamw", Kokkos::RangePolicy<Exec>(exec, 0, (n + vmath::chunk - 1) / vmath::chunk),
                           AdamWChunks<T>{k, n});
    kernels::fence(exec);
  } else {
    detail::portable::run(exec, "shardlib::adamw", n, k);
  }
}

/// x² of element i in double, summed.
template <class T>
struct SumOfSquaresKernel {
  const T* g;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, double& acc) const {
    const double x = static_cast<double>(static_cast<compute_t<T>>(g[i]));
    acc += x * x;
  }
};

/// The host form of SumOfSquaresKernel: chunk c of `chunk` elements, summed in `lanes`
/// interleaved accumulators (one chain of dependent adds ran at about 4 cycles an element: 1.9 ms
/// for 1.7 M floats on a Xeon core, these lanes 0.33 ms).
template <class T>
struct SumOfSquaresChunks {
  static constexpr std::int64_t chunk = 4096, lanes = 16;
  const T* g;
  std::int64_t n;
  void operator()(std::int64_t c, double& acc) const {
    const std::int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    double s[lanes] = {};
    std::int64_t j = b;
    for (; j + lanes <= e; j += lanes)
      for (std::int64_t l = 0; l < lanes; ++l) {
        const double x = static_cast<double>(static_cast<compute_t<T>>(g[j + l]));
        s[l] += x * x;
      }
    for (; j < e; ++j) {
      const double x = static_cast<double>(static_cast<compute_t<T>>(g[j]));
      s[j % lanes] += x * x;
    }
    double t = 0;
    for (std::int64_t l = 0; l < lanes; ++l) t += s[l];
    acc += t;
  }
};

/// The sum of squares of `g[0..n)` in double (waits for it: the host needs the value; zero in
/// shape-only mode).
template <class Exec, class T>
double sum_of_squares(const Exec& exec, std::int64_t n, const T* g) {
  double s = 0;
  if (n == 0) return s;
  count_kernel(static_cast<std::uint64_t>(n) * sizeof(T));  // g read
  if (shardlib::shape_only()) return s;
  if constexpr (is_host_exec_v<Exec>) {
    using C = SumOfSquaresChunks<T>;
    Kokkos::parallel_reduce("shardlib::sum_of_squares", Kokkos::RangePolicy<Exec>(exec, 0, (n + C::chunk - 1) / C::chunk),
                            C{g, n}, s);
  } else {
    Kokkos::parallel_reduce("shardlib::sum_of_squares", Kokkos::RangePolicy<Exec>(exec, 0, n), SumOfSquaresKernel<T>{g}, s);
  }
  kernels::fence(exec);
  return s;
}

}  // namespace shardlib::kernels

SHARDLIB_SIMD_WARNINGS_ON
