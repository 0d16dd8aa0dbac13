// SPDX-License-Identifier: Apache-2.0
// The gpt example's pipeline recipes (docs/11_pipeline_parallel.md) in float32 (gpt/driver.hpp).
#include "gpt/driver.hpp"

namespace gpt::driver {

template <class E>
int pipelined(shardlib::Runtime& rt, const Run& run) {
  const std::string& r = run.recipe;
  if (r == "pp") return main_for<PP, E>(rt, run);
  if (r == "pp_dp") return main_for<PPxDP, E>(rt, run);
  if (r == "pp_tp") return main_for<PPxTP, E>(rt, run);
  if (r == "pp_dp_tp") return main_for<PPxDPxTP, E>(rt, run);
  if (r == "pp_zero1") return main_for<PPxZero1, E>(rt, run);
  return main_for<PPxZero2, E>(rt, run);
}

#ifndef GPT_DRIVER_16_BIT
template int pipelined<float>(shardlib::Runtime&, const Run&);
#else
template int pipelined<shardlib::bf16>(shardlib::Runtime&, const Run&);
template int pipelined<shardlib::f16>(shardlib::Runtime&, const Run&);
#endif

}  // namespace gpt::driver
