// SPDX-License-Identifier: Apache-2.0
/// @file
/// The one communicator interface every collective goes through.
///
/// A `Communicator` is a group of devices (all of them, or those along a mesh-axis subset),
/// each with a rank in the group. Its public calls check their arguments, count what they
/// move (collectives/counters.hpp), and hand over to a backend (`threads`, `mpi`, `nccl`)
/// through the protected `do_*` functions. Buffers are raw pointers with element counts and a
/// DType; collectives/views.hpp has the same calls on Kokkos views.
///
/// Uneven blocks: calls that take `counts` (one per rank) move blocks of different sizes,
/// laid out back to back in rank order; the plain `count` forms move equal blocks.
///
/// All calls are collective over the group (send/recv excepted): every member calls the same
/// collective, in the same order, with matching arguments. Backends report a mismatch they
/// can detect as `CollectiveError` rather than hang. (An argument error found by this class on
/// only some members, e.g. a bad root on one device, leaves the others waiting: the threads
/// backend then reports them as missing; the mpi backend needs SHARDLIB_CHECK_COLLECTIVES=1.)
///
/// In place: all_reduce with send == recv, and all_gather with send at this rank's block of
/// recv. reduce_scatter and all_to_all need send and recv that do not overlap.
#pragma once

#include <shardlib/collectives/counters.hpp>
#include <shardlib/collectives/types.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace shardlib::coll {

/// A collective was misused or failed: the message names the collective, the group and the
/// device, and what was wrong.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Per-rank block sizes of one call: all equal (`uniform`) or one per rank (`counts`).
class Blocks {
 public:
  Blocks(std::size_t uniform, int n) noexcept : uniform_(uniform), n_(n) {}
  Blocks(std::span<const std::size_t> counts) noexcept  // NOLINT(google-explicit-constructor)
      : counts_(counts.data()), n_(static_cast<int>(counts.size())) {}

  bool is_uniform() const noexcept { return counts_ == nullptr; }
  int ranks() const noexcept { return n_; }
  std::size_t count(int r) const noexcept { return counts_ ? counts_[r] : uniform_; }
  /// Elements before block `r`.
  std::size_t offset(int r) const noexcept {
    if (!counts_) return uniform_ * static_cast<std::size_t>(r);
    std::size_t o = 0;
    for (int i = 0; i < r; ++i) o += counts_[i];
    return o;
  }
  std::size_t total() const noexcept { return offset(n_); }
  const std::size_t* data() const noexcept { return counts_; }

 private:
  const std::size_t* counts_ = nullptr;
  std::size_t uniform_ = 0;
  int n_ = 0;
};

/// A group of devices and the collectives over it (see the file comment).
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// This device's rank in the group, 0 <= rank() < size().
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// Which group this is, for messages: "world", "group {model} of mesh {data: 4, model: 2}".
  const std::string& name() const noexcept { return name_; }
  /// "threads", "mpi" or "nccl".
  virtual std::string_view backend() const noexcept = 0;
  /// Whether buffers may live in GPU memory (otherwise they must be host-accessible).
  virtual bool accepts_device_memory() const noexcept { return false; }

  /// `recv` (size() × count elements) = every rank's `send` (count elements), in rank order.
  void all_gather(const void* send, void* recv, std::size_t count, DType t) {
    all_gather_blocks(send, recv, Blocks(count, size_), t);
  }
  /// Uneven: rank r contributes counts[r] elements; `recv` holds their sum.
  void all_gather(const void* send, void* recv, std::span<const std::size_t> counts, DType t) {
    all_gather_blocks(send, recv, Blocks(counts), t);
  }

  /// `recv` (count elements) = block rank() of the reduction of every rank's `send` (size() × count).
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t, Op op) {
    reduce_scatter_blocks(send, recv, Blocks(count, size_), t, op);
  }
  /// Uneven: block r has counts[r] elements; `send` holds their sum, `recv` counts[rank()].
  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType t, Op op) {
    reduce_scatter_blocks(send, recv, Blocks(counts), t, op);
  }

  /// `recv` = the reduction of every rank's `send` (count elements each). send == recv: in place.
  void all_reduce(const void* send, void* recv, std::size_t count, DType t, Op op) {
    check_buffers("all_reduce", send, recv, count, count);
    std::uint64_t b = bytes(count, t), moved = size_ > 1 ? 2 * b * static_cast<std::uint64_t>(size_ - 1) / static_cast<std::uint64_t>(size_) : 0;
    CommRecorder::record(Kind::all_reduce, moved, moved);
    do_all_reduce(send, recv, count, t, op);
  }

  /// Block p of `send` goes to rank p, arriving as block rank() of its `recv` (count each).
  void all_to_all(const void* send, void* recv, std::size_t count, DType t) {
    all_to_all_blocks(send, Blocks(count, size_), recv, Blocks(count, size_), t);
  }
  /// Uneven: send_counts[p] elements go to rank p; recv_counts[p] come from rank p.
  void all_to_all(const void* send, std::span<const std::size_t> send_counts, void* recv,
                  std::span<const std::size_t> recv_counts, DType t) {
    all_to_all_blocks(send, Blocks(send_counts), recv, Blocks(recv_counts), t);
  }

  /// Every rank's `buf` (count elements) = root's.
  void broadcast(void* buf, std::size_t count, DType t, int root) {
    check_rank("broadcast", "root", root);
    check_buffers("broadcast", buf, buf, count, count);
    std::uint64_t b = bytes(count, t);
    CommRecorder::record(Kind::broadcast, rank_ == root ? b * static_cast<std::uint64_t>(size_ - 1) : 0,
                         rank_ == root ? 0 : b);
    do_broadcast(buf, count, t, root);
  }

  /// Point to point: `count` elements to rank `peer`, matched by a recv with the same tag.
  void send(const void* buf, std::size_t count, DType t, int peer, int tag = 0) {
    check_rank("send", "peer", peer);
    check_buffers("send", buf, buf, count, 0);
    CommRecorder::record(Kind::send, peer == rank_ ? 0 : bytes(count, t), 0);
    do_send(buf, count, t, peer, tag);
  }
  void recv(void* buf, std::size_t count, DType t, int peer, int tag = 0) {
    check_rank("recv", "peer", peer);
    check_buffers("recv", buf, buf, 0, count);
    CommRecorder::record(Kind::recv, 0, peer == rank_ ? 0 : bytes(count, t));
    do_recv(buf, count, t, peer, tag);
  }

  /// Collective permute: `send` (send_count) goes to rank `dest` while `recv` (recv_count)
  /// arrives from rank `source`; -1 for no destination / no source. Pipelines and halo
  /// exchanges are permutes.
  void permute(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count, int source,
               DType t) {
    if (dest != -1) check_rank("permute", "dest", dest);
    if (source != -1) check_rank("permute", "source", source);
    check_buffers("permute", send, recv, dest == -1 ? 0 : send_count, source == -1 ? 0 : recv_count);
    CommRecorder::record(Kind::permute, dest != -1 && dest != rank_ ? bytes(send_count, t) : 0,
                         source != -1 && source != rank_ ? bytes(recv_count, t) : 0);
    do_permute(send, dest == -1 ? 0 : send_count, dest, recv, source == -1 ? 0 : recv_count, source, t);
  }

  /// Returns once every rank of the group has called it.
  void barrier() {
    CommRecorder::record(Kind::barrier, 0, 0);
    do_barrier();
  }

  /// Collective: splits the group into sub-groups of equal `color`, ranked by `key` (then by
  /// rank). A negative color leaves this device out (returns nullptr), as MPI_UNDEFINED.
  std::unique_ptr<Communicator> split(int color, int key, std::string name) { return do_split(color, key, std::move(name)); }

 protected:
  Communicator(int rank, int size, std::string name) : rank_(rank), size_(size), name_(std::move(name)) {}

  virtual void do_all_gather(const void* send, void* recv, const Blocks& blocks, DType t) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, const Blocks& blocks, DType t, Op op) = 0;
  virtual void do_all_reduce(const void* send, void* recv, std::size_t count, DType t, Op op) = 0;
  virtual void do_all_to_all(const void* send, const Blocks& send_blocks, void* recv, const Blocks& recv_blocks,
                             DType t) = 0;
  virtual void do_broadcast(void* buf, std::size_t count, DType t, int root) = 0;
  virtual void do_send(const void* buf, std::size_t count, DType t, int peer, int tag) = 0;
  virtual void do_recv(void* buf, std::size_t count, DType t, int peer, int tag) = 0;
  virtual void do_permute(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count,
                          int source, DType t) = 0;
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key, std::string name) = 0;

  /// "all_reduce on world (threads, rank 2 of 4)": the start of every error message.
  std::string where(std::string_view call) const {
    return std::string(call) + " on " + name_ + " (" + std::string(backend()) + ", rank " + std::to_string(rank_) +
           " of " + std::to_string(size_) + ")";
  }

 private:
  static std::uint64_t bytes(std::size_t count, DType t) noexcept { return static_cast<std::uint64_t>(count) * size_of(t); }

  void check_rank(std::string_view call, std::string_view what, int r) const {
    if (r < 0 || r >= size_)
      throw CollectiveError("shardlib: " + where(call) + ": " + std::string(what) + " " + std::to_string(r) +
                            " is out of range [0, " + std::to_string(size_) + ")");
  }
  void check_buffers(std::string_view call, const void* send, const void* recv, std::size_t send_count,
                     std::size_t recv_count) const {
    if ((send_count && !send) || (recv_count && !recv))
      throw CollectiveError("shardlib: " + where(call) + ": null buffer for " +
                            std::to_string(send_count && !send ? send_count : recv_count) + " elements");
  }
  void check_disjoint(std::string_view call, const void* send, std::size_t send_count, const void* recv,
                      std::size_t recv_count, DType t) const {
    auto s = reinterpret_cast<std::uintptr_t>(send), r = reinterpret_cast<std::uintptr_t>(recv);
    std::uintptr_t se = s + send_count * size_of(t), re = r + recv_count * size_of(t);
    if (send_count && recv_count && s < re && r < se)
      throw CollectiveError("shardlib: " + where(call) + ": the send and receive buffers overlap; " + std::string(call) +
                            " cannot run in place");
  }
  void check_blocks(std::string_view call, const Blocks& b) const {
    if (b.ranks() != size_)
      throw CollectiveError("shardlib: " + where(call) + ": " + std::to_string(b.ranks()) +
                            " block counts given for a group of " + std::to_string(size_));
  }

  void all_gather_blocks(const void* send, void* recv, const Blocks& blocks, DType t) {
    check_blocks("all_gather", blocks);
    check_buffers("all_gather", send, recv, blocks.count(rank_), blocks.total());
    std::uint64_t own = bytes(blocks.count(rank_), t);
    CommRecorder::record(Kind::all_gather, own * static_cast<std::uint64_t>(size_ - 1), bytes(blocks.total(), t) - own);
    do_all_gather(send, recv, blocks, t);
  }
  void reduce_scatter_blocks(const void* send, void* recv, const Blocks& blocks, DType t, Op op) {
    check_blocks("reduce_scatter", blocks);
    check_buffers("reduce_scatter", send, recv, blocks.total(), blocks.count(rank_));
    check_disjoint("reduce_scatter", send, blocks.total(), recv, blocks.count(rank_), t);
    std::uint64_t own = bytes(blocks.count(rank_), t);
    CommRecorder::record(Kind::reduce_scatter, bytes(blocks.total(), t) - own, own * static_cast<std::uint64_t>(size_ - 1));
    do_reduce_scatter(send, recv, blocks, t, op);
  }
  void all_to_all_blocks(const void* send, const Blocks& sb, void* recv, const Blocks& rb, DType t) {
    check_blocks("all_to_all", sb);
    check_blocks("all_to_all", rb);
    check_buffers("all_to_all", send, recv, sb.total(), rb.total());
    check_disjoint("all_to_all", send, sb.total(), recv, rb.total(), t);
    CommRecorder::record(Kind::all_to_all, bytes(sb.total() - sb.count(rank_), t), bytes(rb.total() - rb.count(rank_), t));
    do_all_to_all(send, sb, recv, rb, t);
  }

  int rank_;
  int size_;
  std::string name_;
};

}  // namespace shardlib::coll
