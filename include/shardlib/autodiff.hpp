// SPDX-License-Identifier: Apache-2.0
/// @file
/// Reverse-mode automatic differentiation over sharded tensors (docs/05_gradients.md): `Var`,
/// `Param`, the differentiable ops, `backward`, `sync_grads`, `value_and_grad`, the losses,
/// `checkpoint` (activation recomputation).
/// Not included by <shardlib/shardlib.hpp>: code that only runs forward does not compile it.
#pragma once

#include <shardlib/shardlib.hpp>

#include <shardlib/autodiff/checkpoint.hpp>
#include <shardlib/autodiff/elementwise.hpp>
#include <shardlib/autodiff/graph.hpp>
#include <shardlib/autodiff/layout.hpp>
#include <shardlib/autodiff/linalg.hpp>
#include <shardlib/autodiff/losses.hpp>
#include <shardlib/autodiff/record.hpp>
#include <shardlib/autodiff/reduce.hpp>
#include <shardlib/autodiff/shift.hpp>
#include <shardlib/autodiff/var.hpp>
