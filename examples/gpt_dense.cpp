// SPDX-License-Identifier: Apache-2.0
// The gpt example's recipes of docs/08_training.md in float32 (gpt/driver.hpp).
#include "gpt/driver.hpp"

namespace gpt::driver {

template <class E>
int dense(shardlib::Runtime& rt, const Run& run) {
  const std::string& r = run.recipe;
  if (r == "dp") return main_for<DP, E>(rt, run);
  if (r == "zero1") return main_for<Zero1, E>(rt, run);
  if (r == "zero2") return main_for<Zero2, E>(rt, run);
  if (r == "zero3") return main_for<Zero3, E>(rt, run);
  if (r == "tp") return main_for<TP, E>(rt, run);
  if (r == "dp_tp") return main_for<DPxTP, E>(rt, run);
  if (r == "cp") return main_for<DPxCP, E>(rt, run);
  return main_for<Replicated, E>(rt, run);
}

#ifndef GPT_DRIVER_16_BIT
template int dense<float>(shardlib::Runtime&, const Run&);
#else
template int dense<shardlib::bf16>(shardlib::Runtime&, const Run&);
template int dense<shardlib::f16>(shardlib::Runtime&, const Run&);
#endif

}  // namespace gpt::driver
