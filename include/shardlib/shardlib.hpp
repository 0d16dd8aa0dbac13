// SPDX-License-Identifier: Apache-2.0
/// @file
/// Umbrella header: everything a shardlib program uses. `#include <shardlib/shardlib.hpp>`.
#pragma once

#include <shardlib/axis_name.hpp>
#include <shardlib/collectives/views.hpp>
#include <shardlib/mesh.hpp>
#include <shardlib/runtime/runtime.hpp>
#include <shardlib/sharding/block.hpp>
#include <shardlib/sharding/reshard.hpp>
#include <shardlib/spec.hpp>
#include <shardlib/ops.hpp>
#include <shardlib/tensor.hpp>
#include <shardlib/version.hpp>
#include <shardlib/visualize.hpp>
