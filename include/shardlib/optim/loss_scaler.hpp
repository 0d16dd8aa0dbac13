// SPDX-License-Identifier: Apache-2.0
/// @file
/// Dynamic loss scaling for f16 training (torch.cuda.amp.GradScaler's rule): the loss is
/// multiplied by a scale S before the backward, so that small gradients do not underflow in
/// f16; the optimizer divides the gradients by S, and skips a step whose gradients overflowed
/// (an infinity or NaN anywhere, on any device), halving S. After `growth_interval` good steps
/// in a row, S doubles. bf16 has float32's range and needs none of this.
///
///     sl::optim::LossScaler scaler;                 // S = 65536
///     sl::backward(loss * scaler.scale());
///     bool stepped = opt.step(scaler);              // false: skipped, S halved, nothing changed
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace shardlib::optim {

/// LossScaler's settings (torch.cuda.amp.GradScaler's defaults).
struct LossScalerOptions {
  double init_scale = 65536;        ///< S at the start (2^16)
  double growth_factor = 2;         ///< S *= this after growth_interval good steps in a row
  double backoff_factor = 0.5;      ///< S *= this after a step skipped for overflow
  std::int64_t growth_interval = 2000;
};

/// The loss scale of f16 training (see the file comment). One per model, the same on every
/// device: every device takes the same decisions from the same all_reduced norm.
class LossScaler {
 public:
  /// Throws std::invalid_argument naming the option when one is out of range.
  explicit LossScaler(LossScalerOptions o = {}) : o_(o), scale_(o.init_scale) {
    auto bad = [](const char* what, double v, const char* want) {
      throw std::invalid_argument(std::string("shardlib: LossScaler: ") + what + " is " + std::to_string(v) + ": " + want);
    };
    if (!(std::isfinite(o.init_scale) && o.init_scale > 0)) bad("init_scale", o.init_scale, "it must be finite and > 0");
    if (!(std::isfinite(o.growth_factor) && o.growth_factor >= 1)) bad("growth_factor", o.growth_factor, "it must be >= 1");
    if (!(o.backoff_factor > 0 && o.backoff_factor < 1)) bad("backoff_factor", o.backoff_factor, "it must be in (0, 1)");
    if (o.growth_interval < 1) bad("growth_interval", static_cast<double>(o.growth_interval), "it must be >= 1");
  }
  /// S: multiply the loss by it before the backward.
  double scale() const noexcept { return scale_; }
  /// Steps skipped so far because the gradients overflowed.
  std::int64_t skipped() const noexcept { return skipped_; }
  const LossScalerOptions& options() const noexcept { return o_; }

  /// What a checkpoint keeps of the scaler (torch's GradScaler.state_dict): S, the good steps in
  /// a row since S last changed, the steps skipped so far.
  struct State {
    double scale = 65536;
    std::int64_t good = 0, skipped = 0;
  };
  State state() const noexcept { return {scale_, good_, skipped_}; }
  /// Restores a state() (a resumed run continues as the saved one would have). Throws
  /// std::invalid_argument, changing nothing, for a scale that is not finite and > 0 or a
  /// negative count.
  void set_state(const State& s) {
    if (!(std::isfinite(s.scale) && s.scale > 0) || s.good < 0 || s.skipped < 0)
      throw std::invalid_argument("shardlib: LossScaler::set_state: scale " + std::to_string(s.scale) + ", good steps " +
                                  std::to_string(s.good) + ", skipped " + std::to_string(s.skipped) +
                                  ": the scale must be finite and > 0 and the counts >= 0");
    scale_ = s.scale;
    good_ = s.good;
    skipped_ = s.skipped;
  }

  /// The optimizer's report of a step: whether the gradients were finite. Backs off or grows S.
  void update(bool finite) noexcept {
    if (!finite) {
      scale_ *= o_.backoff_factor;
      good_ = 0;
      ++skipped_;
    } else if (++good_ == o_.growth_interval) {
      const double grown = scale_ * o_.growth_factor;
      if (std::isfinite(grown)) scale_ = grown;
      good_ = 0;
    }
  }

 private:
  LossScalerOptions o_;
  double scale_;
  std::int64_t good_ = 0, skipped_ = 0;
};

}  // namespace shardlib::optim
