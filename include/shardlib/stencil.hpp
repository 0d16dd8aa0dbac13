// SPDX-License-Identifier: Apache-2.0
/// @file
/// Ghost cells and stencils: `sl::ghosted` views with ghost layers and boundaries, exchanged
/// with one collective (start/finish to overlap), and `sl::stencil_for` loops over them.
/// Not included by <shardlib/shardlib.hpp>: include it where stencils are written.
#pragma once

#include <shardlib/shardlib.hpp>
#include <shardlib/stencil/ghosted.hpp>
#include <shardlib/sharding/halo.hpp>
#include <shardlib/stencil/stencil_for.hpp>
