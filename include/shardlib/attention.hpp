// SPDX-License-Identifier: Apache-2.0
/// @file
/// Scaled dot-product attention over sharded tensors and Vars (attention/attention.hpp;
/// docs/14_attention.md): cuDNN's fused flash attention on a GPU, the ops elsewhere.
/// Not included by <shardlib/shardlib.hpp> (it brings the gradients, <shardlib/autodiff.hpp>).
#pragma once

#include <shardlib/attention/attention.hpp>
