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

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

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

/// Decoupled weight decay, then Adam: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g²;
/// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps), with g = grad_scale * grad. On a
/// host instance it returns when done; on a device one it is queued on the instance's stream.
template <class Exec, class T, class G>
void adamw_update(const Exec& exec, std::int64_t n, T* p, const G* g, T* m, T* v, const AdamWStep& s) {
  if (n > 0) count_kernel(static_cast<std::uint64_t>(n) * (6 * sizeof(T) + sizeof(G)));  // p, m, v read, written; g read
  if (shardlib::shape_only()) return;
  const double t = static_cast<double>(s.step);
  detail::portable::run(exec, "shardlib::adamw", n,
                        AdamWKernel<T, G>{p, g, m, v, static_cast<T>(1 - s.lr * s.weight_decay), static_cast<T>(s.beta1),
                                          static_cast<T>(s.beta2), static_cast<T>(s.eps), static_cast<T>(s.grad_scale),
                                          static_cast<T>(s.lr / (1 - std::pow(s.beta1, t))),
                                          static_cast<T>(std::sqrt(1 - std::pow(s.beta2, t)))});
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
