// SPDX-License-Identifier: Apache-2.0
/// @file
/// Distributed checkpoints (HDF5): `sl::io::save`, `sl::io::load` onto any mesh and spec,
/// `sl::io::read` into host memory, `sl::io::list`. Needs HDF5 (Debian's libhdf5-dev), which
/// the build finds by itself (SHARDLIB_HAVE_HDF5); not included by <shardlib/shardlib.hpp>.
#pragma once
#include <shardlib/io/checkpoint.hpp>
