// SPDX-License-Identifier: Apache-2.0
/// @file
/// Shape-only execution: the mode in which a device runs the same program on tensors that have
/// shapes, specs and byte counts but no storage (issue "planning at scale"; plan/simulate.hpp).
///
/// While a `ShapeOnlyScope` is alive on a device's thread:
/// - every block the device's block cache hands out (memory.hpp) is an address range of its own
///   that no memory backs (`is_shape_only(p)` says so), counted in the memory account under its
///   role exactly as a real block would be: the account of a shape-only step is the real step's;
/// - kernels (kernels/, and the data paths of execute/, tensor.hpp, io/) do nothing and return at
///   once; a kernel that returns a value returns zero (a reduction's sum, a norm, a maximum);
/// - collectives are counted and not performed (the communicator's dry run, collectives/counters.hpp),
///   and never read or write a shape-only block.
/// Control flow that branches on values (a loss scaler's overflow check, a token's expert) sees
/// those zeros: what a shape-only step decides by values is the step's plan, not its result.
///
/// The flag is per thread because every device runs on a thread of its own (threads backend) or
/// is the process (mpi), as `coll::DryRun`'s.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardlib {

namespace detail {
inline bool& shape_only_flag() noexcept {
  static thread_local bool f = false;
  return f;
}
/// Shape-only blocks live at [shape_only_base, 2 * shape_only_base): addresses no x86-64 or
/// AArch64 process can map (above 2^57), so a kernel that touches one faults at once instead of
/// reading someone else's memory.
inline constexpr std::uintptr_t shape_only_base = std::uintptr_t{1} << 61;
/// The next free address of this thread's shape-only blocks (each block gets a range of its own,
/// as a real allocator gives, so that code comparing addresses for aliasing takes the same path).
inline std::uintptr_t& shape_only_next() noexcept {
  static thread_local std::uintptr_t next = shape_only_base;
  return next;
}
}  // namespace detail

/// Whether this device (thread) runs shape-only now (see the file comment).
inline bool shape_only() noexcept { return detail::shape_only_flag(); }

/// Whether `p` points into a shape-only block (no memory behind it).
inline bool is_shape_only(const void* p) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return a >= detail::shape_only_base && a < 2 * detail::shape_only_base;
}

/// An address range of `bytes` for a shape-only block (64-byte aligned, never backed by memory).
inline void* shape_only_block(std::size_t bytes) noexcept {
  std::uintptr_t& next = detail::shape_only_next();
  if (next + bytes + 64 >= 2 * detail::shape_only_base) next = detail::shape_only_base;  // wraps after 2^61 bytes
  void* p = reinterpret_cast<void*>(next);
  next += (bytes + 63) / 64 * 64 + 64;  // a gap: no two blocks are adjacent
  return p;
}

/// While alive on this thread (device), it runs shape-only (see the file comment). Scopes nest.
class ShapeOnlyScope {
 public:
  ShapeOnlyScope() noexcept : prev_(detail::shape_only_flag()) { detail::shape_only_flag() = true; }
  ShapeOnlyScope(const ShapeOnlyScope&) = delete;
  ShapeOnlyScope& operator=(const ShapeOnlyScope&) = delete;
  ~ShapeOnlyScope() { detail::shape_only_flag() = prev_; }

 private:
  bool prev_;
};

}  // namespace shardlib
