// SPDX-License-Identifier: Apache-2.0
/// @file
/// Function attributes that keep the library's compile time in check.
///
/// A spec-typed op is a thin wrapper around runtime-generic code (compiled once per element
/// type); `SHARDLIB_NOINLINE` keeps that code out of line, so that the optimiser does not copy it
/// into every wrapper (each spec type's op would otherwise carry its own optimised copy, which
/// is where a translation unit's compile time goes). Error paths are `SHARDLIB_COLD`: out of line
/// and laid out away from the hot code. `SHARDLIB_HOST_DEVICE` marks the few functions outside
/// Kokkos code that GPU kernels call too (the 16-bit types' conversions), for nvcc.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SHARDLIB_HOST_DEVICE __host__ __device__
#else
#define SHARDLIB_HOST_DEVICE
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SHARDLIB_NOINLINE __attribute__((noinline))
#define SHARDLIB_COLD __attribute__((noinline, cold))
#elif defined(_MSC_VER)
#define SHARDLIB_NOINLINE __declspec(noinline)
#define SHARDLIB_COLD __declspec(noinline)
#else
#define SHARDLIB_NOINLINE
#define SHARDLIB_COLD
#endif
