// SPDX-License-Identifier: Apache-2.0
/// @file
/// Every op on DistributedTensor: elementwise math and broadcasting, einsum/matmul, reductions
/// and normalisations along a dim, and layout ops (permute, reshape, slice, concat, take),
/// and whole-array neighbour ops (roll, shift, pad, where). Each
/// op's output spec is chosen at compile time by its rule in sharding/ (docs/04_operators.md has
/// the table).
#pragma once

#include <shardlib/ops/elementwise.hpp>
#include <shardlib/ops/layout.hpp>
#include <shardlib/ops/linalg.hpp>
#include <shardlib/ops/reduce.hpp>
#include <shardlib/ops/shift.hpp>
