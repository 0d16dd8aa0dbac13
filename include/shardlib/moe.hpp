// SPDX-License-Identifier: Apache-2.0
/// @file
/// Mixture-of-experts layers (expert parallelism): `sl::moe(x, router, w1, w2, {.top_k = 2})`
/// (moe/moe.hpp; docs/15_experts.md), its routing (moe/routing.hpp) and sharding rule
/// (sharding/moe.hpp).
#pragma once

#include <shardlib/moe/moe.hpp>
#include <shardlib/moe/routing.hpp>
#include <shardlib/sharding/moe.hpp>
