// SPDX-License-Identifier: Apache-2.0
/// @file
/// Where a kernel runs: every kernel in kernels/ takes a Kokkos execution-space instance; on a
/// host one it takes the host paths (memcpy, Eigen's packets, BLAS) and returns when its output is
/// written (it fences); on a device one (Kokkos::Cuda) it queues one-element-per-thread kernels on
/// the instance's stream and returns at once.
#pragma once

#include <Kokkos_Core.hpp>

namespace shardlib::kernels {

/// Whether kernels on execution space `Exec` run on the host (its memory is host memory).
template <class Exec>
inline constexpr bool is_host_exec_v =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;

}  // namespace shardlib::kernels
