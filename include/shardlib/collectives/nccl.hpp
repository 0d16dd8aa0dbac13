// SPDX-License-Identifier: Apache-2.0
/// @file
/// The `nccl` backend of the collectives: one process per GPU, started by mpirun, buffers in GPU
/// memory, every collective enqueued on the device's CUDA stream with no host synchronisation.
///
/// A thin layer over NCCL: all_gather is ncclAllGather, reduce_scatter ncclReduceScatter,
/// all_reduce ncclAllReduce, broadcast ncclBroadcast, split ncclCommSplit; all_to_all, send,
/// recv, permute and exchange are grouped ncclSend/ncclRecv (ncclGroupStart/End). Uneven
/// all_gather is one ncclBroadcast per rank and uneven reduce_scatter one ncclReduce per rank,
/// each set in one group.
///
/// - **Start-up.** `world()` runs under mpirun with MPI initialised: each process takes the GPU
///   `local rank % GPU count` (local: the processes of its node), rank 0 makes the
///   ncclUniqueId and MPI_Bcast hands it on. Two processes on one GPU (more processes on a node
///   than GPUs it shows them) is refused on every rank, naming both ranks and the GPU's PCI
///   address; so is a process that finds no GPU (with CUDA's error and the rank).
/// - **Stream order.** A call returns once its work is enqueued on `stream()`: work enqueued on
///   that stream afterwards sees the result and may reuse the buffers. The host reads results,
///   or writes buffers through other streams, after `synchronize()`. `start_exchange` therefore
///   has nothing left to wait for. barrier() is the one call that waits on the host.
/// - **Strided exchange.** Contiguous regions are sent from and received into the caller's
///   buffers; strided ones are packed into (and unpacked from) a scratch buffer on the GPU with
///   cudaMemcpy2DAsync rectangles (detail::plan_region_copy: a box of rows is one rectangle).
///   The scratch buffer is kept and grown stream-ordered (cudaMallocAsync), so steady state
///   allocates nothing. The pair to itself is copied directly.
/// - **Types.** Every DType. i16 and u16 travel as 16-bit words, but NCCL cannot reduce them:
///   all_reduce and reduce_scatter on them throw. f16 and bf16 reduce in NCCL's own kernels.
/// - **send / recv.** NCCL has no tags: a rank's sends to one peer pair with that peer's recvs
///   in the order they are called, whatever their tags.
/// - **Errors.** Buffers in host memory are refused (CollectiveError). Each failing NCCL or CUDA
///   call becomes a `CollectiveError` naming the call, the group, the rank, and NCCL's or CUDA's
///   text (with ncclGetLastError's detail).
/// - **Watchdog.** A thread per communicator watches its collectives through CUDA events. When
///   NCCL reports an asynchronous error (ncclCommGetAsyncError: a peer died, a network failed),
///   or a collective has not finished within the timeout (`SHARDLIB_NCCL_TIMEOUT` seconds,
///   default 600; 0 leaves only the error check), it aborts the communicator (ncclCommAbort, which
///   also ends the kernels a stuck rank waits in), prints why on stderr, and every later call on
///   the communicator throws that message: a failed rank never hangs the job silently.
///
/// Compiled only with SHARDLIB_HAVE_NCCL (Meson's `shardlib-nccl` dependency defines it when the
/// CUDA toolkit, NCCL and MPI are found); otherwise this header declares nothing of its own.
/// It is host code: any C++20 compiler builds it, no nvcc needed.
#pragma once

#include <shardlib/collectives/communicator.hpp>

#if defined(SHARDLIB_HAVE_NCCL)

#if !defined(SHARDLIB_HAVE_MPI)
#error "shardlib: the nccl backend needs MPI (the ncclUniqueId travels over MPI): define SHARDLIB_HAVE_MPI and link MPI (Meson's shardlib-nccl dependency does both)"
#endif

#include <shardlib/collectives/detail/mpi_c.hpp>
#include <shardlib/collectives/detail/nccl_watchdog.hpp>
#include <shardlib/collectives/detail/region_copy.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace shardlib::coll {

namespace detail::nccl {

/// NCCL's type for a DType. i16 and u16 map to a 16-bit type that moves their bits (never reduce
/// with it: see reducible).
inline ncclDataType_t datatype(DType t) noexcept {
  switch (t) {
    case DType::i8: return ncclInt8;
    case DType::u8: return ncclUint8;
    case DType::i16: return ncclFloat16;
    case DType::u16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::u32: return ncclUint32;
    case DType::i64: return ncclInt64;
    case DType::u64: return ncclUint64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
  }
  return ncclInt8;
}

/// Whether NCCL can reduce elements of this type.
constexpr bool reducible(DType t) noexcept { return t != DType::i16 && t != DType::u16; }

inline ncclRedOp_t redop(Op op) noexcept {
  switch (op) {
    case Op::sum: return ncclSum;
    case Op::prod: return ncclProd;
    case Op::max: return ncclMax;
    case Op::min: return ncclMin;
  }
  return ncclSum;
}

/// The GPU a process takes: its local rank modulo the GPUs it sees (gpus >= 1).
constexpr int device_for(int local_rank, int gpus) noexcept { return gpus > 0 ? local_rank % gpus : -1; }

/// The first pair of processes of one node on the same GPU, as indices into `bus_ids` (their
/// GPUs' PCI addresses, by local rank); {-1, -1} when every process has a GPU of its own.
inline std::pair<int, int> shared_gpu(const std::vector<std::string>& bus_ids) noexcept {
  for (std::size_t i = 0; i < bus_ids.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (bus_ids[i] == bus_ids[j]) return {static_cast<int>(j), static_cast<int>(i)};
  return {-1, -1};
}

}  // namespace detail::nccl

/// A group of processes, one GPU each, over an NCCL communicator (see the file comment).
///
/// One instance per group and process; an instance must not run two collectives at once from
/// different threads. Buffers must be GPU memory (cudaMalloc, cudaMallocAsync, managed memory,
/// or a Kokkos::CudaSpace view's data()).
class NcclCommunicator final : public Communicator {
 public:
  /// All processes of `comm` (MPI_COMM_WORLD by default; MPI must be initialised), named "world",
  /// each on its GPU (see the file comment). Collectives go on `stream`; with none given, the
  /// communicator creates a non-blocking stream of its own. Every process throws CollectiveError
  /// when any of them cannot start.
  static std::unique_ptr<NcclCommunicator> world(MPI_Comm comm = MPI_COMM_WORLD, cudaStream_t stream = nullptr) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised)
      throw CollectiveError(
          "shardlib: nccl backend: MPI is not initialised; start the processes with mpirun and call MPI_Init first "
          "(the ncclUniqueId travels over MPI)");
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const std::string who = "nccl backend, rank " + std::to_string(rank) + " of " + std::to_string(size);
    std::string error;  // this process's reason for not starting
    // Local rank: rank among the processes of this node.
    MPI_Comm node = MPI_COMM_NULL;
    int local_rank = 0, local_size = 1;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
      MPI_Comm_rank(node, &local_rank);
      MPI_Comm_size(node, &local_size);
    }
    int gpus = 0, device = -1;
    char bus[32] = {};
    if (cudaError_t rc = cudaGetDeviceCount(&gpus); rc != cudaSuccess) {
      error = "cudaGetDeviceCount: " + std::string(cudaGetErrorString(rc)) + " (" + cudaGetErrorName(rc) +
              "): this process sees no usable GPU";
    } else if (gpus < 1) {
      error = "cudaGetDeviceCount found no GPU";
    } else {
      device = detail::nccl::device_for(local_rank, gpus);
      if (cudaError_t rc2 = cudaDeviceGetPCIBusId(bus, sizeof bus, device); rc2 != cudaSuccess)
        error = "cudaDeviceGetPCIBusId(" + std::to_string(device) + "): " + cudaGetErrorString(rc2);
      else if (cudaError_t rc3 = cudaSetDevice(device); rc3 != cudaSuccess)
        error = "cudaSetDevice(" + std::to_string(device) + "): " + cudaGetErrorString(rc3);
    }
    // Two processes of a node on one GPU: NCCL cannot have both.
    if (node != MPI_COMM_NULL) {
      std::vector<char> all(32 * static_cast<std::size_t>(local_size));
      MPI_Allgather(bus, 32, MPI_CHAR, all.data(), 32, MPI_CHAR, node);
      std::vector<std::string> ids;
      for (int r = 0; r < local_size; ++r) ids.emplace_back(all.data() + 32 * r);
      for (auto& id : ids)
        if (id.empty()) id = "(none)";
      const auto [a, b] = detail::nccl::shared_gpu(ids);
      if (a >= 0 && error.empty() && ids[static_cast<std::size_t>(a)] != "(none)")
        error = "local ranks " + std::to_string(a) + " and " + std::to_string(b) + " of this node would share the GPU at " +
                ids[static_cast<std::size_t>(a)] + " (" + std::to_string(local_size) + " processes, " +
                std::to_string(gpus) + " GPU(s) visible): one GPU cannot hold two NCCL ranks; start at most one process per GPU";
      MPI_Comm_free(&node);
    }
    ncclUniqueId id{};
    if (rank == 0 && error.empty())
      if (ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess)
        error = std::string("ncclGetUniqueId: ") + ncclGetErrorString(rc);
    // Every process learns whether all can go on (else NCCL's init would wait for ever).
    int failed_rank = error.empty() ? -1 : rank;
    int worst = -1;
    MPI_Allreduce(&failed_rank, &worst, 1, MPI_INT, MPI_MAX, comm);
    if (!error.empty()) throw CollectiveError("shardlib: " + who + ": " + error);
    if (worst >= 0)
      throw CollectiveError("shardlib: " + who + ": rank " + std::to_string(worst) +
                            " could not start the nccl backend (its own error says why); no communicator was made");
    if (int rc = MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm); rc != MPI_SUCCESS)
      throw CollectiveError("shardlib: " + who + ": MPI_Bcast of the ncclUniqueId failed");
    ncclComm_t c = nullptr;
    if (ncclResult_t rc = ncclCommInitRank(&c, size, id, rank); rc != ncclSuccess)
      throw CollectiveError("shardlib: " + who + ": ncclCommInitRank: " + ncclGetErrorString(rc) + " (" +
                            ncclGetLastError(nullptr) + ")");
    return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(c, device, stream, "world", rank, size));
  }

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (!watchdog_->failed()) cudaStreamSynchronize(stream_);
    watchdog_.reset();
    if (scratch_) cudaFree(scratch_);
    if (flag_) cudaFree(flag_);
    if (!aborted()) ncclCommDestroy(comm_);
    if (owns_stream_) cudaStreamDestroy(stream_);
  }

  std::string_view backend() const noexcept override { return "nccl"; }
  bool accepts_device_memory() const noexcept override { return true; }

  /// The stream every collective is enqueued on.
  cudaStream_t stream() const noexcept { return stream_; }
  /// The CUDA device (ordinal) of this process's GPU.
  int device() const noexcept { return device_; }
  /// The NCCL communicator (for calls of the application's own; do not destroy it).
  ncclComm_t comm() const noexcept { return comm_; }

  /// Waits on the host until every collective enqueued so far has finished; throws
  /// CollectiveError when the watchdog aborted the communicator meanwhile, or on a CUDA error.
  void synchronize() {
    constexpr std::string_view call = "synchronize";
    cudaSetDevice(device_);
    for (;;) {
      if (aborted()) throw CollectiveError(watchdog_->failure());
      const cudaError_t rc = cudaStreamQuery(stream_);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) cuda_failed(rc, "cudaStreamQuery", call);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

 protected:
  void do_all_gather(const void* send, void* recv, const Blocks& blocks, DType t) override {
    constexpr std::string_view call = "all_gather";
    Enqueue q(*this, call, {{send, blocks.count(rank())}, {recv, blocks.total()}});
    const auto type = detail::nccl::datatype(t);
    if (blocks.is_uniform()) {
      q.nccl(ncclAllGather(send, recv, blocks.count(0), type, comm_, stream_), "ncclAllGather");
      return;
    }
    auto* out = static_cast<char*>(recv);
    q.nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size(); ++r) {
      if (blocks.count(r) == 0) continue;
      void* at = out + blocks.offset(r) * size_of(t);
      q.nccl(ncclBroadcast(r == rank() ? send : at, at, blocks.count(r), type, r, comm_, stream_), "ncclBroadcast");
    }
    q.nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

  void do_reduce_scatter(const void* send, void* recv, const Blocks& blocks, DType t, Op op) override {
    constexpr std::string_view call = "reduce_scatter";
    Enqueue q(*this, call, {{send, blocks.total()}, {recv, blocks.count(rank())}});
    q.reducible(t);
    const auto type = detail::nccl::datatype(t);
    if (blocks.is_uniform()) {
      q.nccl(ncclReduceScatter(send, recv, blocks.count(0), type, detail::nccl::redop(op), comm_, stream_),
             "ncclReduceScatter");
      return;
    }
    const auto* in = static_cast<const char*>(send);
    q.nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size(); ++r)
      if (blocks.count(r) != 0)
        q.nccl(ncclReduce(in + blocks.offset(r) * size_of(t), recv, blocks.count(r), type, detail::nccl::redop(op), r,
                          comm_, stream_),
               "ncclReduce");
    q.nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

  void do_all_reduce(const void* send, void* recv, std::size_t count, DType t, Op op) override {
    Enqueue q(*this, "all_reduce", {{send, count}, {recv, count}});
    q.reducible(t);
    q.nccl(ncclAllReduce(send, recv, count, detail::nccl::datatype(t), detail::nccl::redop(op), comm_, stream_),
           "ncclAllReduce");
  }

  void do_all_to_all(const void* send, const Blocks& sb, void* recv, const Blocks& rb, DType t) override {
    Enqueue q(*this, "all_to_all", {{send, sb.total()}, {recv, rb.total()}});
    const std::size_t e = size_of(t);
    const auto type = detail::nccl::datatype(t);
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    const int me = rank();
    if (const std::size_t n = std::min(sb.count(me), rb.count(me)); n != 0)
      q.cuda(cudaMemcpyAsync(out + rb.offset(me) * e, in + sb.offset(me) * e, n * e, cudaMemcpyDeviceToDevice, stream_),
             "cudaMemcpyAsync");
    q.nccl(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size(); ++p) {
      if (p == me) continue;
      if (sb.count(p) != 0) q.nccl(ncclSend(in + sb.offset(p) * e, sb.count(p), type, p, comm_, stream_), "ncclSend");
      if (rb.count(p) != 0) q.nccl(ncclRecv(out + rb.offset(p) * e, rb.count(p), type, p, comm_, stream_), "ncclRecv");
    }
    q.nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

  void do_exchange(const void* send, std::span<const Region> send_regions, void* recv,
                   std::span<const Region> recv_regions, DType t) override {
    constexpr std::string_view call = "exchange";
    Enqueue q(*this, call, {{send, 1}, {recv, 1}});
    const std::size_t e = size_of(t);
    const int me = rank(), n = size();
    for (int p = 0; p < n; ++p) {
      const auto pu = static_cast<std::size_t>(p);
      if (send_regions[pu].count() != recv_regions[pu].count() && p == me)
        throw CollectiveError("shardlib: " + where(call) + ": the pair to itself sends " +
                              std::to_string(send_regions[pu].count()) + " elements into a region of " +
                              std::to_string(recv_regions[pu].count()));
    }
    // Where each peer's piece travels from and to: the caller's buffer when contiguous, else scratch.
    auto contiguous = [](const Region& r) {
      const Region nr = detail::normalise(r);
      return nr.rank == 1 && nr.stride[0] == 1;
    };
    send_at_.assign(static_cast<std::size_t>(n), nullptr);
    recv_at_.assign(static_cast<std::size_t>(n), nullptr);
    std::size_t scratch = 0;
    send_scratch_.assign(static_cast<std::size_t>(n), 0);
    recv_scratch_.assign(static_cast<std::size_t>(n), 0);
    for (int p = 0; p < n; ++p) {
      const auto pu = static_cast<std::size_t>(p);
      if (p == me) continue;
      if (send_regions[pu].count() != 0 && !contiguous(send_regions[pu])) {
        send_scratch_[pu] = scratch + 1;  // 1 + offset, 0: none
        scratch += send_regions[pu].count() * e;
      }
      if (recv_regions[pu].count() != 0 && !contiguous(recv_regions[pu])) {
        recv_scratch_[pu] = scratch + 1;
        scratch += recv_regions[pu].count() * e;
      }
    }
    char* base = q.scratch(scratch);
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    for (int p = 0; p < n; ++p) {
      const auto pu = static_cast<std::size_t>(p);
      if (p == me) continue;
      if (send_scratch_[pu] != 0) {
        send_at_[pu] = base + send_scratch_[pu] - 1;
        copy(q, base + send_scratch_[pu] - 1, Region::contiguous(0, send_regions[pu].count()), in, send_regions[pu], e);
      } else {
        send_at_[pu] = in + detail::normalise(send_regions[pu]).offset * e;
      }
      recv_at_[pu] = recv_scratch_[pu] != 0 ? base + recv_scratch_[pu] - 1 : out + detail::normalise(recv_regions[pu]).offset * e;
    }
    copy(q, out, recv_regions[static_cast<std::size_t>(me)], in, send_regions[static_cast<std::size_t>(me)], e);
    // Bytes, so that a piece's element count never overflows NCCL's size_t for any type.
    q.nccl(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < n; ++p) {
      const auto pu = static_cast<std::size_t>(p);
      if (p == me) continue;
      if (send_regions[pu].count() != 0)
        q.nccl(ncclSend(send_at_[pu], send_regions[pu].count() * e, ncclUint8, p, comm_, stream_), "ncclSend");
      if (recv_regions[pu].count() != 0)
        q.nccl(ncclRecv(const_cast<void*>(recv_at_[pu]), recv_regions[pu].count() * e, ncclUint8, p, comm_, stream_),
               "ncclRecv");
    }
    q.nccl(ncclGroupEnd(), "ncclGroupEnd");
    for (int p = 0; p < n; ++p) {
      const auto pu = static_cast<std::size_t>(p);
      if (p != me && recv_scratch_[pu] != 0)
        copy(q, out, recv_regions[pu], base + recv_scratch_[pu] - 1, Region::contiguous(0, recv_regions[pu].count()), e);
    }
  }

  void do_broadcast(void* buf, std::size_t count, DType t, int root) override {
    Enqueue q(*this, "broadcast", {{buf, count}});
    q.nccl(ncclBroadcast(buf, buf, count, detail::nccl::datatype(t), root, comm_, stream_), "ncclBroadcast");
  }

  void do_send(const void* buf, std::size_t count, DType t, int peer, int) override {
    Enqueue q(*this, "send", {{buf, count}});
    if (peer == rank()) throw CollectiveError("shardlib: " + where("send") + ": a send to itself (NCCL would wait for ever)");
    q.nccl(ncclSend(buf, count, detail::nccl::datatype(t), peer, comm_, stream_), "ncclSend");
  }

  void do_recv(void* buf, std::size_t count, DType t, int peer, int) override {
    Enqueue q(*this, "recv", {{buf, count}});
    if (peer == rank()) throw CollectiveError("shardlib: " + where("recv") + ": a recv from itself (NCCL would wait for ever)");
    q.nccl(ncclRecv(buf, count, detail::nccl::datatype(t), peer, comm_, stream_), "ncclRecv");
  }

  void do_permute(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count, int source,
                  DType t) override {
    Enqueue q(*this, "permute", {{send, send_count}, {recv, recv_count}});
    const auto type = detail::nccl::datatype(t);
    const int me = rank();
    if (dest == me && source == me) {
      if (const std::size_t n = std::min(send_count, recv_count); n != 0 && send != recv)
        q.cuda(cudaMemcpyAsync(recv, send, n * size_of(t), cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
      return;
    }
    q.nccl(ncclGroupStart(), "ncclGroupStart");
    if (dest >= 0 && send_count != 0) q.nccl(ncclSend(send, send_count, type, dest, comm_, stream_), "ncclSend");
    if (source >= 0 && recv_count != 0) q.nccl(ncclRecv(recv, recv_count, type, source, comm_, stream_), "ncclRecv");
    q.nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

  void do_barrier() override {
    {
      Enqueue q(*this, "barrier", {});
      q.nccl(ncclAllReduce(flag_, flag_, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce");
    }
    synchronize();
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name) override {
    constexpr std::string_view call = "split";
    check_alive(call);
    cudaSetDevice(device_);
    ncclComm_t child = nullptr;
    ok(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr), "ncclCommSplit", call);
    if (color < 0 || child == nullptr) return nullptr;
    int r = 0, s = 0;
    ncclCommUserRank(child, &r);
    ncclCommCount(child, &s);
    // The same stream: collectives of every group of this device stay in one order.
    return std::unique_ptr<Communicator>(new NcclCommunicator(child, device_, stream_, std::move(name), r, s));
  }

  // Dry runs (see Communicator): the same fills, in GPU memory.
  void dry_zero(void* p, std::size_t count, DType t) override {
    if (count) cuda_ok(cudaMemsetAsync(p, 0, count * size_of(t), stream_), "cudaMemsetAsync", "dry run");
  }
  void dry_copy(void* dst, const void* src, std::size_t count, DType t) override {
    if (count && dst != src)
      cuda_ok(cudaMemcpyAsync(dst, src, count * size_of(t), cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync",
              "dry run");
  }
  void dry_exchange(const void* send, std::span<const Region> send_regions, void* recv,
                    std::span<const Region> recv_regions, DType t) override {
    const std::size_t e = size_of(t);
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      plan_.clear();
      const Region& r = recv_regions[static_cast<std::size_t>(p)];
      detail::plan_region_copy(plan_, r, r, e);
      for (const auto& c : plan_)
        cuda_ok(cudaMemset2DAsync(static_cast<char*>(recv) + c.dst_offset, c.dst_pitch, 0, c.width, c.height, stream_),
                "cudaMemset2DAsync", "dry run");
    }
    plan_.clear();
    detail::plan_region_copy(plan_, recv_regions[static_cast<std::size_t>(rank())], send_regions[static_cast<std::size_t>(rank())], e);
    for (const auto& c : plan_)
      cuda_ok(cudaMemcpy2DAsync(static_cast<char*>(recv) + c.dst_offset, c.dst_pitch,
                                static_cast<const char*>(send) + c.src_offset, c.src_pitch, c.width, c.height,
                                cudaMemcpyDeviceToDevice, stream_),
              "cudaMemcpy2DAsync", "dry run");
  }

 private:
  NcclCommunicator(ncclComm_t comm, int device, cudaStream_t stream, std::string name, int rank, int size)
      : Communicator(rank, size, std::move(name)), comm_(comm), device_(device), stream_(stream) {
    try {
      cudaSetDevice(device_);
      if (stream_ == nullptr) {
        cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", "construction");
        owns_stream_ = true;
      }
      cuda_ok(cudaMalloc(&flag_, sizeof(int)), "cudaMalloc", "construction");
      cuda_ok(cudaMemsetAsync(flag_, 0, sizeof(int), stream_), "cudaMemsetAsync", "construction");
      watchdog_ = std::make_unique<detail::nccl::Watchdog>(comm_, device_, where("the watchdog"),
                                                           detail::nccl::timeout_from_environment());
    } catch (...) {
      if (flag_) cudaFree(flag_);
      if (owns_stream_) cudaStreamDestroy(stream_);
      ncclCommDestroy(comm_);
      throw;
    }
  }

  /// One collective: checks that the communicator is alive and that the buffers are GPU memory,
  /// sets the device, and once the work is enqueued hands an event to the watchdog.
  class Enqueue {
   public:
    struct Buffer {
      const void* p;
      std::size_t count;
    };
    Enqueue(NcclCommunicator& c, std::string_view call, std::initializer_list<Buffer> buffers)
        : c_(c), call_(call) {
      c_.check_alive(call_);
      c_.cuda_ok(cudaSetDevice(c_.device_), "cudaSetDevice", call_);
      for (const Buffer& b : buffers)
        if (b.count != 0 && b.p != nullptr) c_.check_device_memory(b.p, call_);
    }
    Enqueue(const Enqueue&) = delete;
    Enqueue& operator=(const Enqueue&) = delete;
    ~Enqueue() noexcept(false) {
      if (std::uncaught_exceptions() > exceptions_) return;
      c_.cuda_ok(c_.watchdog_->enqueued(call_.data(), c_.stream_), "cudaEventRecord", call_);
    }
    void nccl(ncclResult_t rc, std::string_view fn) const { c_.ok(rc, fn, call_); }
    void cuda(cudaError_t rc, std::string_view fn) const { c_.cuda_ok(rc, fn, call_); }
    void reducible(DType t) const {
      if (!detail::nccl::reducible(t))
        throw CollectiveError("shardlib: " + c_.where(call_) + ": NCCL cannot reduce " + std::string(coll::name(t)) +
                              " elements (no 16-bit integer reductions); reduce them as i32");
    }
    /// The scratch buffer, grown stream-ordered to at least `bytes`.
    char* scratch(std::size_t bytes) const {
      if (bytes > c_.scratch_bytes_) {
        if (c_.scratch_) c_.cuda_ok(cudaFreeAsync(c_.scratch_, c_.stream_), "cudaFreeAsync", call_);
        c_.scratch_ = nullptr;
        c_.scratch_bytes_ = 0;
        c_.cuda_ok(cudaMallocAsync(&c_.scratch_, bytes, c_.stream_), "cudaMallocAsync", call_);
        c_.scratch_bytes_ = bytes;
      }
      return static_cast<char*>(c_.scratch_);
    }
    std::string_view call() const noexcept { return call_; }

   private:
    NcclCommunicator& c_;
    std::string_view call_;
    int exceptions_ = std::uncaught_exceptions();
  };

  /// Copies region `sr` of `src` into region `dr` of `dst` (both GPU memory) on the stream.
  void copy(const Enqueue& q, void* dst, const Region& dr, const void* src, const Region& sr, std::size_t e) {
    plan_.clear();
    detail::plan_region_copy(plan_, dr, sr, e);
    for (const auto& c : plan_)
      q.cuda(cudaMemcpy2DAsync(static_cast<char*>(dst) + c.dst_offset, c.dst_pitch,
                               static_cast<const char*>(src) + c.src_offset, c.src_pitch, c.width, c.height,
                               cudaMemcpyDeviceToDevice, stream_),
             "cudaMemcpy2DAsync");
  }

  bool aborted() const noexcept { return watchdog_ && watchdog_->failed(); }
  void check_alive(std::string_view call) const {
    if (aborted())
      throw CollectiveError("shardlib: " + where(call) + ": the communicator was aborted earlier: " + watchdog_->failure());
  }
  void check_device_memory(const void* p, std::string_view call) const {
    cudaPointerAttributes a{};
    const cudaError_t rc = cudaPointerGetAttributes(&a, p);
    if (rc != cudaSuccess) {
      cudaGetLastError();  // clear it
      throw CollectiveError("shardlib: " + where(call) + ": cudaPointerGetAttributes: " + cudaGetErrorString(rc));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
      throw CollectiveError("shardlib: " + where(call) +
                            ": a buffer is in host memory; the nccl backend moves GPU memory (cudaMalloc, a "
                            "Kokkos::CudaSpace view) only");
    if (a.type == cudaMemoryTypeDevice && a.device != device_)
      throw CollectiveError("shardlib: " + where(call) + ": a buffer is on GPU " + std::to_string(a.device) +
                            ", not on this rank's GPU " + std::to_string(device_));
  }
  void ok(ncclResult_t rc, std::string_view fn, std::string_view call) const {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    const char* last = ncclGetLastError(comm_);
    throw CollectiveError("shardlib: " + where(call) + ": " + std::string(fn) + " failed: " + ncclGetErrorString(rc) +
                          (last && *last ? std::string(" (") + last + ")" : std::string()));
  }
  void cuda_ok(cudaError_t rc, std::string_view fn, std::string_view call) const {
    if (rc != cudaSuccess) cuda_failed(rc, fn, call);
  }
  [[noreturn]] void cuda_failed(cudaError_t rc, std::string_view fn, std::string_view call) const {
    throw CollectiveError("shardlib: " + where(call) + ": " + std::string(fn) + " failed: " + cudaGetErrorString(rc) +
                          " (" + cudaGetErrorName(rc) + ")");
  }

  ncclComm_t comm_;
  int device_;
  cudaStream_t stream_;
  bool owns_stream_ = false;
  int* flag_ = nullptr;  // one int on the GPU for barrier
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  std::vector<detail::Copy2D> plan_;
  std::vector<const void*> send_at_, recv_at_;  // exchange: where each peer's piece travels from / to
  std::vector<std::size_t> send_scratch_, recv_scratch_;  // exchange: 1 + its offset in scratch, 0: none
  std::unique_ptr<detail::nccl::Watchdog> watchdog_;
};

}  // namespace shardlib::coll

#endif  // SHARDLIB_HAVE_NCCL
