// SPDX-License-Identifier: Apache-2.0
/// @file
/// The cost model: the time of one training step on one device, from what the step does there
/// (its GEMM FLOPs and memory-bound kernels, kernels::flop_count; its collectives, each with its
/// group and bytes, coll::trace; the pipeline schedule's bubble) and what the device and its links
/// can do (a Profile, plan/profile.hpp). docs/16_planning.md says what it assumes.
///
/// | part | time |
/// |---|---|
/// | GEMMs | unbatched FLOPs / gemm_rate + batched FLOPs / batched_gemm_rate + calls × gemm_call + products × gemm_product |
/// | other kernels | bytes / memory_bandwidth + calls × kernel_call |
/// | a collective | steps × α + bytes sent / bus bandwidth, of the link it crosses |
/// | the bubble | C / (s (1 − b)) − C, 0 at least: C = GEMMs + kernels, b the schedule's idle fraction, s = shared |
///
/// The bubble: alone, a device idle a fraction b of the step computes for C / (1 − b). Where s
/// devices share one device's compute (Profile::shared: a host's devices over its cores), C is
/// the device's compute while all of them compute, and one running alone does it in C / s; the
/// step is the longer of the two, C when the stages' idle times are the others' running time
/// (s = 1: C × b / (1 − b)).
///
/// The step is their sum: nothing overlaps (shardlib's collectives run between the kernels). A
/// collective's link is `intra_node` when every device it joins is on one node (the run's devices
/// in order, node_size to a node: device d on node d / node_size), else `inter_node`. Steps by
/// kind, as NCCL's algorithms take them: all_gather, reduce_scatter, all_to_all n − 1 (ring,
/// pairwise); all_reduce the fewer of a ring's 2(n − 1) and a tree's 2⌈log2 n⌉; broadcast and
/// barrier ⌈log2 n⌉; send, recv, permute 1.
#pragma once

#include <shardlib/collectives/counters.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/plan/profile.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace shardlib::plan {

/// What one device does in one step: the inputs of the cost model.
struct Work {
  std::uint64_t gemm_flops = 0, gemm_calls = 0;      ///< kernels::flop_count()'s gemm, gemm_calls
  std::uint64_t gemm_products = 0;                   ///< its gemm_products (a batch counts each matrix)
  std::uint64_t batched_gemm_flops = 0;              ///< its batched_gemm: the part of gemm_flops in batches
  std::uint64_t kernel_bytes = 0, kernel_calls = 0;  ///< its kernel_bytes, kernel_calls
  std::vector<coll::CallRecord> calls;               ///< the step's collectives (coll::trace)
  double bubble = 0;  ///< the fraction of the step the pipeline's schedule leaves this device idle (Table::bubble)
};

/// What this device computed and sent since `before` (its kernels::flop_count() then) and what
/// `calls` recorded (a coll::CommRecorder made with coll::keep_calls): the cost model's input for
/// that stretch of the program, a step of it on shapes alone as well (`bubble` left 0).
inline Work work_since(const kernels::FlopCount& before, const coll::CommRecorder& calls) {
  const kernels::FlopCount d = kernels::flop_count() - before;
  Work w;
  w.gemm_flops = d.gemm;
  w.gemm_calls = d.gemm_calls;
  w.gemm_products = d.gemm_products;
  w.batched_gemm_flops = d.batched_gemm;
  w.kernel_bytes = d.kernel_bytes;
  w.kernel_calls = d.kernel_calls;
  w.calls = calls.calls();
  return w;
}

/// A step's predicted time on one device, by part (seconds), and the bytes it sends by link.
struct StepTime {
  double gemm = 0, kernels = 0, bubble = 0, intra_node = 0, inter_node = 0;
  std::uint64_t intra_bytes = 0, inter_bytes = 0;
  double compute() const noexcept { return gemm + kernels; }
  double communication() const noexcept { return intra_node + inter_node; }
  double total() const noexcept { return compute() + bubble + communication(); }
};

/// Which link `call` crosses on devices of `node_size` to a node (see the file comment); a call
/// whose devices are unknown is taken to stay in a node when its group fits in one.
inline LinkKind link_of(const coll::CallRecord& call, int node_size) noexcept {
  if (node_size < 1) node_size = 1;
  if (call.first_device < 0 || call.last_device < 0)
    return call.group_size <= node_size ? LinkKind::intra_node : LinkKind::inter_node;
  return call.first_device / node_size == call.last_device / node_size ? LinkKind::intra_node : LinkKind::inter_node;
}

/// ⌈log2 n⌉ for n >= 1.
constexpr int ceil_log2(int n) noexcept {
  int k = 0;
  while ((1LL << k) < n) ++k;
  return k;
}

/// The algorithm steps of `call` (see the file comment).
inline int steps_of(const coll::CallRecord& call) noexcept {
  const int n = std::max(1, call.group_size);
  if (n == 1) return 0;
  switch (call.kind) {
    case coll::Kind::all_gather:
    case coll::Kind::reduce_scatter:
    case coll::Kind::all_to_all: return n - 1;
    case coll::Kind::all_reduce: return std::min(2 * (n - 1), 2 * ceil_log2(n));
    case coll::Kind::broadcast:
    case coll::Kind::barrier: return ceil_log2(n);
    default: return 1;
  }
}

/// The seconds `call` takes on `link`.
inline double call_seconds(const coll::CallRecord& call, const Link& link) noexcept {
  if (call.group_size <= 1) return 0;
  double bytes = static_cast<double>(std::max(call.bytes_sent, call.bytes_received));
  if (call.kind == coll::Kind::broadcast)  // the root sends the buffer to n - 1: a pipelined tree moves it once
    bytes = call.bytes_received > 0 ? static_cast<double>(call.bytes_received)
                                    : static_cast<double>(call.bytes_sent) / (call.group_size - 1);
  if (call.kind == coll::Kind::send || call.kind == coll::Kind::recv || call.kind == coll::Kind::permute)
    if (bytes == 0) return 0;  // to or from itself
  return steps_of(call) * link.latency + (link.bandwidth > 0 ? bytes / link.bandwidth : 0);
}

/// The step time of `work` on devices of `profile` (see the file comment).
inline StepTime predict(const Work& work, const Profile& profile) {
  StepTime t;
  if (profile.gemm_rate > 0) {
    // a batch's FLOPs at the batched rate where the profile has one (batched_gemm_rate 0: gemm_rate)
    const double batched = static_cast<double>(std::min(work.batched_gemm_flops, work.gemm_flops));
    const double batched_rate = profile.batched_gemm_rate > 0 ? profile.batched_gemm_rate : profile.gemm_rate;
    t.gemm = (static_cast<double>(work.gemm_flops) - batched) / profile.gemm_rate + batched / batched_rate +
             work.gemm_calls * profile.gemm_call + work.gemm_products * profile.gemm_product;
  }
  if (profile.memory_bandwidth > 0)
    t.kernels = static_cast<double>(work.kernel_bytes) / profile.memory_bandwidth + work.kernel_calls * profile.kernel_call;
  const double b = std::clamp(work.bubble, 0.0, 0.99), shared = std::max(1.0, profile.shared);
  t.bubble = std::max(0.0, t.compute() / (shared * (1 - b)) - t.compute());
  for (const coll::CallRecord& c : work.calls) {
    const LinkKind k = link_of(c, profile.node_size);
    const double s = call_seconds(c, profile.link(k));
    if (k == LinkKind::intra_node) {
      t.intra_node += s;
      t.intra_bytes += c.bytes_sent;
    } else {
      t.inter_node += s;
      t.inter_bytes += c.bytes_sent;
    }
  }
  return t;
}

}  // namespace shardlib::plan
