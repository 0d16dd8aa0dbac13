// SPDX-License-Identifier: Apache-2.0
/// @file
/// Adam with decoupled weight decay and bias correction (torch.optim.AdamW): `sl::optim::AdamW`.
#pragma once

#include <shardlib/kernels/optim.hpp>
#include <shardlib/optim/optimizer.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace shardlib::optim {

/// AdamW's hyperparameters (PyTorch's defaults).
struct AdamWOptions {
  double lr = 1e-3;            ///< the learning rate (unless `schedule` is set)
  double beta1 = 0.9;          ///< decay of the first moment
  double beta2 = 0.999;        ///< decay of the second moment
  double eps = 1e-8;           ///< added to the second moment's root
  double weight_decay = 0.01;  ///< decoupled: p *= 1 - lr * weight_decay
  double clip_norm = 0;        ///< > 0: clip the gradients by their global norm first
  Schedule schedule{};         ///< when set, the rate of step t
  std::size_t bucket_bytes = std::size_t{25} << 20;  ///< all_reduce buckets for pending gradients
};

/// AdamW's update: two state tensors (the moments), 8 bytes per float32 parameter.
struct AdamWRule {
  using Options = AdamWOptions;
  using Step = kernels::AdamWStep;
  static constexpr const char* name = "AdamW";
  static constexpr std::size_t max_states = 2;
  static int num_states(const Options&) noexcept { return 2; }
  static void check(const Options& o) {
    detail::check_common_options(name, o);
    if (!(o.beta1 >= 0 && o.beta1 < 1)) detail::bad_option(name, "beta1", o.beta1, "it must be in [0, 1)");
    if (!(o.beta2 >= 0 && o.beta2 < 1)) detail::bad_option(name, "beta2", o.beta2, "it must be in [0, 1)");
    if (!(std::isfinite(o.eps) && o.eps > 0)) detail::bad_option(name, "eps", o.eps, "it must be > 0");
  }
  static Step make_step(const Options& o, double lr, double grad_scale, std::int64_t t) noexcept {
    return Step{lr, o.beta1, o.beta2, o.eps, o.weight_decay, grad_scale, t};
  }
  template <class Exec, class T, class G>
  static void update(const Exec& exec, std::int64_t n, T* p, const G* g, T* const* state, const Step& s) {
    kernels::adamw_update(exec, n, p, g, state[0], state[1], s);
  }
};

/// AdamW over sharded parameters (see Optimizer).
using AdamW = Optimizer<AdamWRule>;

}  // namespace shardlib::optim
