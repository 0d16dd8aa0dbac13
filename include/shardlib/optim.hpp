// SPDX-License-Identifier: Apache-2.0
/// @file
/// Optimizers over sharded parameters (docs/08_training.md): `sl::optim::SGD`, `sl::optim::AdamW`,
/// with state tensors in a spec of their own (ZeRO), clipping by the global norm and schedules;
/// and the per-device memory ledger by role (memory.hpp). Includes <shardlib/autodiff.hpp>.
#pragma once

#include <shardlib/autodiff.hpp>
#include <shardlib/memory.hpp>
#include <shardlib/optim/adamw.hpp>
#include <shardlib/optim/optimizer.hpp>
#include <shardlib/optim/sgd.hpp>
