// SPDX-License-Identifier: Apache-2.0
/// @file
/// Planning a run on a mesh you do not have (docs/16_planning.md): the simulate backend
/// (runtime.hpp: `--backend simulate --devices N`, shape-only tensors, simulated groups) runs a
/// program's step as one device of N, and plan/table.hpp compares the candidates' plans for
/// devices of a given memory.
#pragma once

#include <shardlib/plan/table.hpp>
#include <shardlib/runtime/runtime.hpp>
