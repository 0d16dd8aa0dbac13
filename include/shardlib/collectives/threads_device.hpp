// SPDX-License-Identifier: Apache-2.0
/// @file
/// The threads backend over GPU memory: in-process devices, each with its own instance of a
/// Kokkos execution space (on a CUDA-enabled Kokkos its own stream), whose collectives move
/// blocks in GPU memory directly, device to device, with no copy through host memory and no
/// host wait. `ThreadDeviceCommunicator<Exec>` is the threads communicator
/// (collectives/threads.hpp: the same meetings, checks and errors) with `DeviceMoves<Exec>`:
///
/// - a member reads its peers' buffers with copies queued on its own stream
///   (`cudaMemcpyAsync` / `cudaMemcpy2DAsync`, cudaMemcpyDefault) and reduces them with a Kokkos
///   kernel on its instance that reads every member's block;
/// - CUDA events order the streams: each member records `ready` when its call is posted (its
///   buffers hold what the call must read once its earlier work is done), and a reader's stream
///   waits for it before reading; all_reduce's second phase waits for the owner's `mid`; at the
///   end each member records `done` and its stream waits for every peer's `done`, so that its
///   later work (a kernel that overwrites the send block, a block handed on by the block cache)
///   comes after its peers' reads. The events belong to the group, so none is destroyed while a
///   peer may still wait on it.
/// - send and recv go through host memory (a message is a host copy), waiting for the stream.
///
/// The runtime gives each in-process device such a communicator as its `device_world()` on a
/// CUDA-enabled Kokkos (Runtime::threads), so reshards of tensors in GPU memory and the statistics
/// of softmax and the norms along a split dim stay on the GPU. The devices share one GPU (or
/// GPUs with peer access: copies use unified addressing, the reduction kernel reads peers'
/// memory directly). On a host instance (Exec a host space, as the tests in CI run it) the
/// copies are memcpy, the reduction the same kernel, and there is nothing to order.
#pragma once

#include <shardlib/collectives/detail/region_copy.hpp>
#include <shardlib/collectives/threads.hpp>
#include <shardlib/half.hpp>

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib::coll {
namespace detail {

/// Whether Exec is Kokkos' CUDA execution space.
template <class Exec>
inline constexpr bool is_cuda_exec_v =
#if defined(KOKKOS_ENABLE_CUDA)
    std::is_same_v<Exec, Kokkos::Cuda>;
#else
    false;
#endif

#if defined(KOKKOS_ENABLE_CUDA)
/// Throws CollectiveError naming the CUDA call and its error.
inline void cuda_check(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    throw CollectiveError(std::string("shardlib: threads backend in GPU memory: ") + call + " failed: " +
                          cudaGetErrorString(e) + " (cudaError_t " + std::to_string(static_cast<int>(e)) + ")");
}
#endif

/// The members' stream events of one group: member r records ready, mid and done (see the file
/// comment); its peers wait on them.
struct StreamMarks {
#if defined(KOKKOS_ENABLE_CUDA)
  using Event = cudaEvent_t;
#else
  using Event = void*;  // nothing to order on host instances
#endif
  struct Member {
    Event ready = nullptr, mid = nullptr, done = nullptr;
  };
  std::vector<Member> members;
  explicit StreamMarks(int n) : members(static_cast<std::size_t>(n)) {}
  StreamMarks(const StreamMarks&) = delete;
  StreamMarks& operator=(const StreamMarks&) = delete;
  ~StreamMarks() {
#if defined(KOKKOS_ENABLE_CUDA)
    for (auto& m : members)
      for (cudaEvent_t e : {m.ready, m.mid, m.done})
        if (e) cudaEventDestroy(e);
#endif
  }
  void create() {
#if defined(KOKKOS_ENABLE_CUDA)
    for (auto& m : members)
      for (cudaEvent_t* e : {&m.ready, &m.mid, &m.done})
        cuda_check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
#endif
  }
};

/// The most members a device reduction reads at once (one kernel argument each).
inline constexpr int max_reduce_inputs = 64;

/// out[i] = op over k of in[k][i], computed in C (float for the 16-bit types, rounded once).
template <class T, class C>
struct ReduceInputsKernel {
  T* out;
  const T* in[max_reduce_inputs];
  int inputs;
  Op op;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    C acc = static_cast<C>(in[0][i]);
    for (int k = 1; k < inputs; ++k) {
      const C x = static_cast<C>(in[k][i]);
      switch (op) {
        case Op::sum: acc = static_cast<C>(acc + x); break;
        case Op::prod: acc = static_cast<C>(acc * x); break;
        case Op::max: acc = x > acc ? x : acc; break;
        case Op::min: acc = x < acc ? x : acc; break;
      }
    }
    out[i] = static_cast<T>(acc);
  }
};

/// How a threads communicator moves data in the memory of `Exec`'s instance (see the file
/// comment; the hooks are HostMoves').
template <class Exec>
struct DeviceMoves {
  static constexpr bool host = false;
  Exec exec;

  DeviceMoves() = default;
  DeviceMoves(Exec e) : exec(std::move(e)) {}  // NOLINT: implicit, {instance}

  static std::shared_ptr<void> make_state(int members) {
    auto marks = std::make_shared<StreamMarks>(members);
    if constexpr (is_cuda_exec_v<Exec>) marks->create();
    return marks;
  }

  void posted(ThreadGroup& g, int me) { record(mark(g, me), &StreamMarks::Member::ready); }
  void reading(ThreadGroup& g, int me, int peer) {
    if (peer != me) wait(mark(g, peer), &StreamMarks::Member::ready);
  }
  void phase(ThreadGroup& g, int me) { record(mark(g, me), &StreamMarks::Member::mid); }
  void reading_phase(ThreadGroup& g, int me, int peer) {
    if (peer != me) wait(mark(g, peer), &StreamMarks::Member::mid);
  }
  void finishing(ThreadGroup& g, int me) { record(mark(g, me), &StreamMarks::Member::done); }
  void finished(ThreadGroup& g, int me) {
    for (int r = 0; r < g.size(); ++r)
      if (r != me) wait(mark(g, r), &StreamMarks::Member::done);
  }

  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0 || dst == src) return;
    if constexpr (is_cuda_exec_v<Exec>) {
#if defined(KOKKOS_ENABLE_CUDA)
      cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, exec.cuda_stream()), "cudaMemcpyAsync");
#endif
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  /// The region copy as rectangles (plan_region_copy), one 2-D copy each.
  void copy_region(void* dst, const Region& dr, const void* src, const Region& sr, std::size_t e) {
    plan_.clear();
    plan_region_copy(plan_, dr, sr, e);
    for (const Copy2D& c : plan_) {
      auto* d = static_cast<unsigned char*>(dst) + c.dst_offset;
      const auto* s = static_cast<const unsigned char*>(src) + c.src_offset;
      const std::size_t dp = c.height > 1 ? c.dst_pitch : c.width, sp = c.height > 1 ? c.src_pitch : c.width;
      if constexpr (is_cuda_exec_v<Exec>) {
#if defined(KOKKOS_ENABLE_CUDA)
        cuda_check(cudaMemcpy2DAsync(d, dp, s, sp, c.width, c.height, cudaMemcpyDefault, exec.cuda_stream()),
                   "cudaMemcpy2DAsync");
#endif
      } else {
        for (std::size_t i = 0; i < c.height; ++i) std::memcpy(d + i * dp, s + i * sp, c.width);
      }
    }
  }
  void zero(void* p, std::size_t bytes) {
    if (bytes == 0) return;
    if constexpr (is_cuda_exec_v<Exec>) {
#if defined(KOKKOS_ENABLE_CUDA)
      cuda_check(cudaMemsetAsync(p, 0, bytes, exec.cuda_stream()), "cudaMemsetAsync");
#endif
    } else {
      std::memset(p, 0, bytes);
    }
  }
  void zero_region(void* dst, const Region& r, std::size_t e) {
    plan_.clear();
    plan_region_copy(plan_, r, r, e);
    for (const Copy2D& c : plan_) {
      auto* d = static_cast<unsigned char*>(dst) + c.dst_offset;
      const std::size_t dp = c.height > 1 ? c.dst_pitch : c.width;
      if constexpr (is_cuda_exec_v<Exec>) {
#if defined(KOKKOS_ENABLE_CUDA)
        cuda_check(cudaMemset2DAsync(d, dp, 0, c.width, c.height, exec.cuda_stream()), "cudaMemset2DAsync");
#endif
      } else {
        for (std::size_t i = 0; i < c.height; ++i) std::memset(d + i * dp, 0, c.width);
      }
    }
  }
  void reduce(void* out, const void* const* in, int inputs, std::size_t n, DType t, Op op) {
    if (inputs > max_reduce_inputs)
      throw CollectiveError("shardlib: threads backend in GPU memory: a reduction over " + std::to_string(inputs) +
                            " devices; at most " + std::to_string(max_reduce_inputs) + " are supported");
    switch (t) {
      case DType::i8: return run<std::int8_t, std::int8_t>(out, in, inputs, n, op);
      case DType::u8: return run<std::uint8_t, std::uint8_t>(out, in, inputs, n, op);
      case DType::i16: return run<std::int16_t, std::int16_t>(out, in, inputs, n, op);
      case DType::u16: return run<std::uint16_t, std::uint16_t>(out, in, inputs, n, op);
      case DType::i32: return run<std::int32_t, std::int32_t>(out, in, inputs, n, op);
      case DType::u32: return run<std::uint32_t, std::uint32_t>(out, in, inputs, n, op);
      case DType::i64: return run<std::int64_t, std::int64_t>(out, in, inputs, n, op);
      case DType::u64: return run<std::uint64_t, std::uint64_t>(out, in, inputs, n, op);
      case DType::f16: return run<f16, float>(out, in, inputs, n, op);
      case DType::bf16: return run<bf16, float>(out, in, inputs, n, op);
      case DType::f32: return run<float, float>(out, in, inputs, n, op);
      case DType::f64: return run<double, double>(out, in, inputs, n, op);
    }
  }
  /// send's copy into a host message and recv's out of one: it waits for the stream.
  void message_copy(void* dst, const void* src, std::size_t bytes) { transfer(dst, src, bytes); }

 private:
  static StreamMarks::Member& mark(ThreadGroup& g, int r) {
    return static_cast<StreamMarks*>(g.moves_state().get())->members[static_cast<std::size_t>(r)];
  }
#if defined(KOKKOS_ENABLE_CUDA)
  void record(StreamMarks::Member& m, cudaEvent_t StreamMarks::Member::*which) {
    if constexpr (is_cuda_exec_v<Exec>) cuda_check(cudaEventRecord(m.*which, exec.cuda_stream()), "cudaEventRecord");
  }
  void wait(StreamMarks::Member& m, cudaEvent_t StreamMarks::Member::*which) {
    if constexpr (is_cuda_exec_v<Exec>) cuda_check(cudaStreamWaitEvent(exec.cuda_stream(), m.*which, 0), "cudaStreamWaitEvent");
  }
#else
  void record(StreamMarks::Member&, StreamMarks::Event StreamMarks::Member::*) {}
  void wait(StreamMarks::Member&, StreamMarks::Event StreamMarks::Member::*) {}
#endif
  template <class T, class C>
  void run(void* out, const void* const* in, int inputs, std::size_t n, Op op) {
    if (n == 0) return;
    ReduceInputsKernel<T, C> k{static_cast<T*>(out), {}, inputs, op};
    for (int i = 0; i < inputs; ++i) k.in[i] = static_cast<const T*>(in[i]);
    Kokkos::parallel_for("shardlib::coll::threads_reduce", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(n)), k);
    if constexpr (!is_cuda_exec_v<Exec>) exec.fence();  // host instances: done when it returns
  }
  void transfer(void* dst, const void* src, std::size_t bytes) {
    if constexpr (is_cuda_exec_v<Exec>) {
#if defined(KOKKOS_ENABLE_CUDA)
      if (bytes) cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, exec.cuda_stream()), "cudaMemcpyAsync");
      cuda_check(cudaStreamSynchronize(exec.cuda_stream()), "cudaStreamSynchronize");
#endif
    } else if (bytes) {
      std::memcpy(dst, src, bytes);
    }
  }
  std::vector<Copy2D> plan_;
};

}  // namespace detail

/// The threads communicator over the memory of `Exec`'s instances (see the file comment).
template <class Exec>
using ThreadDeviceCommunicator = BasicThreadCommunicator<detail::DeviceMoves<Exec>>;

}  // namespace shardlib::coll
