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

/// Around the GPU kernels that call a user's functor (loops, map, zip, parallel_reduce): under
/// nvcc, calling a host-only function from them is an error, not nvcc's warning #20011/#20014
/// (which would leave a kernel that fails when it runs). Those kernels are used in device memory
/// only; host memory has forms of them outside these marks, so a host functor on a host tensor
/// still builds. Each such kernel is written twice, the same body: nvcc applies the diagnostic
/// state where a function is defined, so a shared body would make the host form an error too.
#if defined(__NVCC__) && defined(__NVCC_DIAG_PRAGMA_SUPPORT__)
#define SHARDLIB_DEVICE_FUNCTORS_BEGIN \
  _Pragma("nv_diagnostic push") _Pragma("nv_diag_error 20011") _Pragma("nv_diag_error 20014")
#define SHARDLIB_DEVICE_FUNCTORS_END _Pragma("nv_diagnostic pop")
#else
#define SHARDLIB_DEVICE_FUNCTORS_BEGIN
#define SHARDLIB_DEVICE_FUNCTORS_END
#endif

/// Around the library's SIMD code (Eigen's packet math and the kernels that inline it): g++ 12's
/// AVX-512 intrinsics initialise a dummy with itself (`__m512 __Y = __Y;`, GCC bug 105593, fixed
/// in GCC 13), which -Wmaybe-uninitialized and -Wuninitialized report at every inlined use under
/// `-march=native` — hundreds of warnings in a user's translation unit that are not about their
/// code; and -Warray-bounds reports the packet loads of a vector loop that a short array (3
/// floats, say, whose size the compiler sees) never reaches. The kernel headers turn those
/// warnings off for their own definitions and on again at their end (push and pop: the user's
/// settings are untouched outside).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define SHARDLIB_SIMD_WARNINGS_OFF                                   \
  _Pragma("GCC diagnostic push")                                     \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")        \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")              \
  _Pragma("GCC diagnostic ignored \"-Warray-bounds\"")
#define SHARDLIB_SIMD_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define SHARDLIB_SIMD_WARNINGS_OFF
#define SHARDLIB_SIMD_WARNINGS_ON
#endif
