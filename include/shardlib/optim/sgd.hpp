// SPDX-License-Identifier: Apache-2.0
/// @file
/// Stochastic gradient descent with momentum (torch.optim.SGD, dampening 0): `sl::optim::SGD`.
#pragma once

#include <shardlib/kernels/optim.hpp>
#include <shardlib/optim/optimizer.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace shardlib::optim {

/// SGD's hyperparameters.
struct SGDOptions {
  double lr = 0.01;            ///< the learning rate (unless `schedule` is set)
  double momentum = 0;         ///< 0: no momentum buffer is kept
  bool nesterov = false;       ///< Nesterov momentum (needs momentum > 0)
  double weight_decay = 0;     ///< L2 penalty added to the gradient
  double clip_norm = 0;        ///< > 0: clip the gradients by their global norm first
  Schedule schedule{};         ///< when set, the rate of step t
  std::size_t bucket_bytes = std::size_t{25} << 20;  ///< all_reduce buckets for pending gradients
};

/// SGD's update: one state tensor (the momentum buffer) when momentum > 0.
struct SgdRule {
  using Options = SGDOptions;
  using Step = kernels::SgdStep;
  static constexpr const char* name = "SGD";
  static constexpr std::size_t max_states = 1;
  static int num_states(const Options& o) noexcept { return o.momentum != 0 ? 1 : 0; }
  static void check(const Options& o) {
    detail::check_common_options(name, o);
    if (!(o.momentum >= 0 && o.momentum < 1)) detail::bad_option(name, "momentum", o.momentum, "it must be in [0, 1)");
    if (o.nesterov && o.momentum == 0)
      detail::bad_option(name, "momentum", o.momentum, "Nesterov momentum needs momentum > 0");
  }
  static Step make_step(const Options& o, double lr, double grad_scale, std::int64_t) noexcept {
    return Step{lr, o.momentum, o.weight_decay, grad_scale, o.nesterov};
  }
  template <class Exec, class T, class G>
  static void update(const Exec& exec, std::int64_t n, T* p, const G* g, T* const* state, const Step& s) {
    kernels::sgd_update(exec, n, p, g, s.momentum != 0 ? state[0] : nullptr, s);
  }
};

/// SGD with momentum over sharded parameters (see Optimizer).
using SGD = Optimizer<SgdRule>;

}  // namespace shardlib::optim
