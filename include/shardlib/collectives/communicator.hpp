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
/// recv. reduce_scatter, all_to_all and exchange need send and recv that do not overlap.
///
/// Strided regions: `exchange` is an all-to-all whose pieces are N-D boxes (`Region`) inside
/// the buffers, as MPI_Alltoallw, so that resharding a tensor needs no packing pass of its own.
#pragma once

#include <shardlib/collectives/counters.hpp>
#include <shardlib/collectives/types.hpp>
#include <shardlib/detail/shape_only.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

/// The most dimensions a `Region` has.
inline constexpr int max_region_rank = 8;

/// An N-D box of elements inside a buffer: element (i_0, ..., i_{rank-1}) with 0 <= i_k < extent[k]
/// sits at element offset `offset + sum_k i_k * stride[k]`. rank 0 (the default) or any zero extent
/// is an empty region. Elements are visited in row-major order of the box (last index fastest).
struct Region {
  std::size_t offset = 0;
  int rank = 0;  // 0..max_region_rank
  std::array<std::size_t, max_region_rank> extent{};
  std::array<std::size_t, max_region_rank> stride{};

  /// Product of the extents; 0 when rank <= 0 (a rank above max_region_rank counts its first 8).
  constexpr std::size_t count() const noexcept {
    if (rank <= 0) return 0;
    std::size_t n = 1;
    for (int k = 0; k < rank && k < max_region_rank; ++k) n *= extent[static_cast<std::size_t>(k)];
    return n;
  }
  /// `count` consecutive elements from `offset` (rank 1, stride 1).
  static constexpr Region contiguous(std::size_t offset, std::size_t count) noexcept {
    Region r;
    r.offset = offset;
    r.rank = 1;
    r.extent[0] = count;
    r.stride[0] = 1;
    return r;
  }
  /// A box of `extent` (one entry per dimension, at most max_region_rank) whose element
  /// (i_0, ...) sits at `offset + sum i_k * stride[k]`. Throws std::invalid_argument when the two
  /// lists differ in length or are too long.
  static constexpr Region strided(std::size_t offset, std::initializer_list<std::size_t> extent,
                                  std::initializer_list<std::size_t> stride) {
    if (extent.size() != stride.size() || extent.size() > static_cast<std::size_t>(max_region_rank))
      throw std::invalid_argument("shardlib: Region::strided: " + std::to_string(extent.size()) + " extents and " +
                                  std::to_string(stride.size()) + " strides; give as many of each, at most " +
                                  std::to_string(max_region_rank));
    Region r;
    r.offset = offset;
    r.rank = static_cast<int>(extent.size());
    std::size_t k = 0;
    for (auto e : extent) r.extent[k++] = e;
    k = 0;
    for (auto st : stride) r.stride[k++] = st;
    return r;
  }
};

/// An exchange started by Communicator::start_exchange; `wait()` completes it.
class PendingExchange {
 public:
  PendingExchange() = default;
  PendingExchange(const PendingExchange&) = delete;
  PendingExchange& operator=(const PendingExchange&) = delete;
  virtual ~PendingExchange() = default;
  /// Returns once the receive regions hold what was sent and the send buffer may change.
  /// Throws CollectiveError as exchange does. Call it once.
  virtual void wait() = 0;
};

namespace detail {
/// What backends that complete an exchange when it starts hand back.
class CompletedExchange final : public PendingExchange {
 public:
  void wait() override {}
};
}  // namespace detail

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

  /// The devices of the run (world ranks) that rank `r` of this group is: `r` itself for a world,
  /// the mesh's members for a group that Context::group made (set_world_devices); -1 when unknown
  /// (a group split otherwise). A planner tells links within a node from links between nodes by
  /// them (plan/cost.hpp).
  int world_device(int r) const noexcept {
    if (devices_.empty()) return world_ ? r : -1;
    return devices_[static_cast<std::size_t>(r)];
  }
  /// The lowest and the highest world device of the group ({-1, -1}: unknown).
  std::pair<int, int> world_span() const noexcept { return {lowest_, highest_}; }
  /// Internal (Context::group): the world device of each rank, size() of them.
  void set_world_devices(std::vector<int> devices) {
    if (static_cast<int>(devices.size()) != size_)
      throw std::invalid_argument("shardlib: set_world_devices of " + name_ + ": " + std::to_string(devices.size()) +
                                  " devices for a group of " + std::to_string(size_));
    devices_ = std::move(devices);
    lowest_ = *std::min_element(devices_.begin(), devices_.end());
    highest_ = *std::max_element(devices_.begin(), devices_.end());
  }
  /// Whether buffers may live in GPU memory (otherwise they must be host-accessible).
  virtual bool accepts_device_memory() const noexcept { return false; }
  /// Whether `send` is buffered: it returns once the message is copied, whether or not the peer
  /// has posted its `recv` (threads, mpi). Then two ranks may send to each other before either
  /// receives, as a pipeline's neighbouring stages do. NCCL's sends are not.
  virtual bool buffered_sends() const noexcept { return false; }

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
    CommRecorder::record(Kind::all_reduce, moved, moved, name_, size_, lowest_, highest_);
    if (DryRun::active()) return dry_copy(recv, send, count, t);
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

  /// Rank p receives the elements of this rank's send_regions[p] (read from `send`) into its
  /// recv_regions[rank()] (in `recv`); the two regions of each pair must have the same count
  /// (their shapes may differ: elements pair up in row-major order, so a strided box can land in a
  /// contiguous run and back). The pair with p == rank() is a local copy. send and recv must not overlap.
  /// Counted as all_to_all, or as `counted_as` (an exchange that gathers: Kind::all_gather).
  void exchange(const void* send, std::span<const Region> send_regions, void* recv,
                std::span<const Region> recv_regions, DType t, Kind counted_as = Kind::all_to_all) {
    check_exchange("exchange", send, send_regions, recv, recv_regions, t, counted_as);
    if (DryRun::active()) return dry_exchange(send, send_regions, recv, recv_regions, t);
    do_exchange(send, send_regions, recv, recv_regions, t);
  }

  /// `exchange` in two halves, so that work can run while the data travels: starts it and
  /// returns the pending exchange, whose `wait()` completes it. Until then `send` must not be
  /// changed nor `recv` read, and both region spans must stay alive; calls to other collectives
  /// of the group may come in between (every member calls them in the same order). A backend
  /// that cannot leave data in flight (threads: devices copy from each other's memory with
  /// their own threads) completes the exchange here and `wait()` returns at once; mpi posts
  /// MPI_Irecv/MPI_Isend and waits in `wait()`. A pending exchange must not outlive its
  /// communicator; destroying it unfinished waits for it (errors then go unreported). Counted as
  /// all_to_all, or as `counted_as` (a permute started: Kind::permute).
  [[nodiscard]] std::unique_ptr<PendingExchange> start_exchange(const void* send, std::span<const Region> send_regions,
                                                                void* recv, std::span<const Region> recv_regions, DType t,
                                                                Kind counted_as = Kind::all_to_all) {
    check_exchange("start_exchange", send, send_regions, recv, recv_regions, t, counted_as);
    if (DryRun::active()) {
      dry_exchange(send, send_regions, recv, recv_regions, t);
      return std::make_unique<detail::CompletedExchange>();
    }
    return do_start_exchange(send, send_regions, recv, recv_regions, t);
  }

  /// Every rank's `buf` (count elements) = root's.
  void broadcast(void* buf, std::size_t count, DType t, int root) {
    check_rank("broadcast", "root", root);
    check_buffers("broadcast", buf, buf, count, count);
    std::uint64_t b = bytes(count, t);
    CommRecorder::record(Kind::broadcast, rank_ == root ? b * static_cast<std::uint64_t>(size_ - 1) : 0,
                         rank_ == root ? 0 : b, name_, size_, lowest_, highest_);
    if (DryRun::active()) return rank_ == root ? void() : dry_zero(buf, count, t);
    do_broadcast(buf, count, t, root);
  }

  /// Point to point: `count` elements to rank `peer`, matched by a recv with the same tag.
  /// Returns once `buf` may change; buffered_sends() says whether it may also return before the
  /// peer receives.
  void send(const void* buf, std::size_t count, DType t, int peer, int tag = 0) {
    check_rank("send", "peer", peer);
    check_buffers("send", buf, buf, count, 0);
    record_pair(Kind::send, peer == rank_ ? 0 : bytes(count, t), 0, peer);
    if (DryRun::active()) return;
    do_send(buf, count, t, peer, tag);
  }
  void recv(void* buf, std::size_t count, DType t, int peer, int tag = 0) {
    check_rank("recv", "peer", peer);
    check_buffers("recv", buf, buf, 0, count);
    record_pair(Kind::recv, 0, peer == rank_ ? 0 : bytes(count, t), peer);
    if (DryRun::active()) return dry_zero(buf, count, t);
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
    record_pair(Kind::permute, dest != -1 && dest != rank_ ? bytes(send_count, t) : 0,
                source != -1 && source != rank_ ? bytes(recv_count, t) : 0, dest, source);
    if (DryRun::active()) {
      if (source == -1) return;
      if (source == rank_ && dest == rank_) return dry_copy(recv, send, std::min(send_count, recv_count), t);
      return dry_zero(recv, recv_count, t);
    }
    do_permute(send, dest == -1 ? 0 : send_count, dest, recv, source == -1 ? 0 : recv_count, source, t);
  }

  /// Collective check that every rank passes the same `words` (host memory). A check, not data
  /// movement: not counted, and nothing is compared in a dry run. Returns an empty vector when
  /// they agree; otherwise every rank's words (size() × words.size(), in rank order), the same
  /// on every rank, for the caller's message. One all_reduce when they agree.
  std::vector<std::int64_t> mismatch(std::span<const std::int64_t> words) {
    const std::size_t n = words.size();
    if (size_ == 1 || n == 0 || DryRun::active()) return {};
    std::vector<std::int64_t> both(2 * n);  // max of w and of ~w: the largest and the smallest w
    for (std::size_t i = 0; i < n; ++i) {
      both[i] = words[i];
      both[n + i] = ~words[i];
    }
    do_all_reduce(both.data(), both.data(), 2 * n, DType::i64, Op::max);
    bool same = true;
    for (std::size_t i = 0; i < n; ++i) same = same && both[i] == ~both[n + i];
    if (same) return {};
    std::vector<std::int64_t> all(n * static_cast<std::size_t>(size_));
    do_all_gather(words.data(), all.data(), Blocks(n, size_), DType::i64);
    return all;
  }

  /// Returns once every rank of the group has called it.
  void barrier() {
    CommRecorder::record(Kind::barrier, 0, 0, name_, size_, lowest_, highest_);
    if (DryRun::active()) return;
    do_barrier();
  }

  /// Collective: splits the group into sub-groups of equal `color`, ranked by `key` (then by
  /// rank). A negative color leaves this device out (returns nullptr), as MPI_UNDEFINED.
  std::unique_ptr<Communicator> split(int color, int key, std::string name) { return do_split(color, key, std::move(name)); }
  /// split() where every device knows the size of its sub-group (a mesh group: the product of
  /// its axes' sizes), which a simulated group (collectives/simulated.hpp) cannot ask the others.
  std::unique_ptr<Communicator> split(int color, int key, int group_size, std::string name) {
    return do_split_sized(color, key, group_size, std::move(name));
  }

 protected:
  Communicator(int rank, int size, std::string name)
      : rank_(rank), size_(size), name_(std::move(name)), world_(name_ == "world"), lowest_(world_ ? 0 : -1),
        highest_(world_ ? size - 1 : -1) {}

  /// Records a point-to-point call with this device and its peers (-1: none) as the span.
  void record_pair(Kind k, std::uint64_t sent, std::uint64_t received, int peer, int other = -1) const noexcept {
    int lo = world_device(rank_), hi = lo;
    for (int p : {peer, other}) {
      if (p < 0) continue;
      const int d = world_device(p);
      if (d < 0 || lo < 0) {
        lo = hi = -1;
        break;
      }
      lo = std::min(lo, d);
      hi = std::max(hi, d);
    }
    CommRecorder::record(k, sent, received, name_, size_, lo, hi);
  }

  virtual void do_all_gather(const void* send, void* recv, const Blocks& blocks, DType t) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, const Blocks& blocks, DType t, Op op) = 0;
  virtual void do_all_reduce(const void* send, void* recv, std::size_t count, DType t, Op op) = 0;
  virtual void do_all_to_all(const void* send, const Blocks& send_blocks, void* recv, const Blocks& recv_blocks,
                             DType t) = 0;
  /// Both spans hold size() regions of valid rank; the backend checks that the counts of every
  /// pair agree (the self pair included).
  virtual void do_exchange(const void* send, std::span<const Region> send_regions, void* recv,
                           std::span<const Region> recv_regions, DType t) = 0;
  /// Starts an exchange (arguments as do_exchange). The default runs the whole exchange now.
  virtual std::unique_ptr<PendingExchange> do_start_exchange(const void* send, std::span<const Region> send_regions,
                                                             void* recv, std::span<const Region> recv_regions, DType t) {
    do_exchange(send, send_regions, recv, recv_regions, t);
    return std::make_unique<detail::CompletedExchange>();
  }
  virtual void do_broadcast(void* buf, std::size_t count, DType t, int root) = 0;
  virtual void do_send(const void* buf, std::size_t count, DType t, int peer, int tag) = 0;
  virtual void do_recv(void* buf, std::size_t count, DType t, int peer, int tag) = 0;
  virtual void do_permute(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count,
                          int source, DType t) = 0;
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key, std::string name) = 0;
  /// The default ignores the size (the backend learns it from the others).
  virtual std::unique_ptr<Communicator> do_split_sized(int color, int key, int /*group_size*/, std::string name) {
    return do_split(color, key, std::move(name));
  }

  // What a collective leaves in a dry run (see DryRun in counters.hpp): this device's own part.
  // Host memory here; a backend whose buffers live in GPU memory overrides the three.

  /// Sets `count` elements at `p` to zero bits.
  /// (Shape-only blocks, detail/shape_only.hpp, have no memory: a dry fill leaves them alone.)
  virtual void dry_zero(void* p, std::size_t count, DType t) {
    if (count && !is_shape_only(p)) std::memset(p, 0, static_cast<std::size_t>(bytes(count, t)));
  }
  /// Copies `count` elements (the two may overlap).
  virtual void dry_copy(void* dst, const void* src, std::size_t count, DType t) {
    if (count && dst != src && !is_shape_only(dst) && !is_shape_only(src))
      std::memmove(dst, src, static_cast<std::size_t>(bytes(count, t)));
  }
  /// Calls f(element offset) for each element of `r` in row-major order.
  template <class F>
  static void for_each_offset(const Region& r, F&& f) {
    if (r.count() == 0) return;
    std::array<std::size_t, max_region_rank> i{};
    const int rank = std::min(r.rank, max_region_rank);
    for (;;) {
      std::size_t off = r.offset;
      for (int k = 0; k < rank; ++k) off += i[static_cast<std::size_t>(k)] * r.stride[static_cast<std::size_t>(k)];
      f(off);
      int k = rank - 1;
      for (; k >= 0; --k) {
        const auto ku = static_cast<std::size_t>(k);
        if (++i[ku] < r.extent[ku]) break;
        i[ku] = 0;
      }
      if (k < 0) return;
    }
  }
  /// Zeros the receive regions of the other ranks and copies the pair to itself.
  virtual void dry_exchange(const void* send, std::span<const Region> send_regions, void* recv,
                            std::span<const Region> recv_regions, DType t) {
    if (is_shape_only(send) || is_shape_only(recv)) return;
    const std::size_t e = size_of(t);
    auto* out = static_cast<unsigned char*>(recv);
    for (int p = 0; p < size_; ++p)
      if (p != rank_)
        for_each_offset(recv_regions[static_cast<std::size_t>(p)], [&](std::size_t o) { std::memset(out + o * e, 0, e); });
    std::vector<std::size_t> from;  // the pair to itself, element by element in row-major order
    from.reserve(send_regions[static_cast<std::size_t>(rank_)].count());
    for_each_offset(send_regions[static_cast<std::size_t>(rank_)], [&](std::size_t o) { from.push_back(o); });
    std::size_t n = 0;
    const auto* in = static_cast<const unsigned char*>(send);
    for_each_offset(recv_regions[static_cast<std::size_t>(rank_)], [&](std::size_t o) {
      if (n < from.size()) std::memcpy(out + o * e, in + from[n++] * e, e);
    });
  }

  static std::uint64_t bytes(std::size_t count, DType t) noexcept { return static_cast<std::uint64_t>(count) * size_of(t); }

  /// "all_reduce on world (threads, rank 2 of 4)": the start of every error message.
  std::string where(std::string_view call) const {
    return std::string(call) + " on " + name_ + " (" + std::string(backend()) + ", rank " + std::to_string(rank_) +
           " of " + std::to_string(size_) + ")";
  }

 private:
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

  /// The checks and the counting shared by exchange and start_exchange.
  void check_exchange(std::string_view call, const void* send, std::span<const Region> send_regions, const void* recv,
                      std::span<const Region> recv_regions, DType t, Kind counted_as = Kind::all_to_all) {
    check_regions(call, "send", send_regions);
    check_regions(call, "receive", recv_regions);
    std::size_t send_total = 0, recv_total = 0, send_own = 0, recv_own = 0;
    for (int p = 0; p < size_; ++p) {
      const std::size_t s = send_regions[static_cast<std::size_t>(p)].count();
      const std::size_t r = recv_regions[static_cast<std::size_t>(p)].count();
      send_total += s;
      recv_total += r;
      if (p == rank_) {
        send_own = s;
        recv_own = r;
      }
    }
    check_buffers(call, send, recv, send_total, recv_total);
    const auto sb = byte_span(call, "send", send_regions, t), rb = byte_span(call, "receive", recv_regions, t);
    const auto s0 = reinterpret_cast<std::uintptr_t>(send), r0 = reinterpret_cast<std::uintptr_t>(recv);
    if (sb.first < sb.second && rb.first < rb.second && s0 + sb.first < r0 + rb.second && r0 + rb.first < s0 + sb.second)
      throw CollectiveError("shardlib: " + where(call) + ": the send and receive buffers overlap; " + std::string(call) +
                            " cannot run in place");
    CommRecorder::record(counted_as, bytes(send_total - send_own, t), bytes(recv_total - recv_own, t), name_, size_, lowest_, highest_);
  }

  void check_regions(std::string_view call, std::string_view side, std::span<const Region> regions) const {
    if (regions.size() != static_cast<std::size_t>(size_))
      throw CollectiveError("shardlib: " + where(call) + ": " + std::to_string(regions.size()) + " " + std::string(side) +
                            " regions given for a group of " + std::to_string(size_));
    for (std::size_t p = 0; p < regions.size(); ++p)
      if (regions[p].rank < 0 || regions[p].rank > max_region_rank)
        throw CollectiveError("shardlib: " + where(call) + ": " + std::string(side) + " region " + std::to_string(p) +
                              " has rank " + std::to_string(regions[p].rank) + "; a region's rank lies in [0, " +
                              std::to_string(max_region_rank) + "]");
  }
  /// Bytes [first, second) from the buffer's start that the non-empty regions touch ({0, 0}
  /// when none); throws when a region reaches past the address space.
  std::pair<std::uintptr_t, std::uintptr_t> byte_span(std::string_view call, std::string_view side,
                                                      std::span<const Region> regions, DType t) const {
    constexpr std::uintptr_t top = std::numeric_limits<std::uintptr_t>::max();
    const std::uintptr_t e = size_of(t);
    std::uintptr_t lo = top, hi = 0;
    for (std::size_t p = 0; p < regions.size(); ++p) {
      const Region& r = regions[p];
      if (r.count() == 0) continue;
      std::uintptr_t last = r.offset;  // element offset of the box's last element (strides are >= 0)
      bool fits = true;
      for (int k = 0; k < r.rank && fits; ++k) {
        const std::uintptr_t n = r.extent[static_cast<std::size_t>(k)] - 1, st = r.stride[static_cast<std::size_t>(k)];
        fits = st == 0 || n <= (top - last) / st;
        if (fits) last += n * st;
      }
      if (!fits || last >= top / e)
        throw CollectiveError("shardlib: " + where(call) + ": " + std::string(side) + " region " + std::to_string(p) +
                              " reaches past the end of the address space");
      lo = std::min<std::uintptr_t>(lo, r.offset * e);
      hi = std::max<std::uintptr_t>(hi, (last + 1) * e);
    }
    return lo < hi ? std::pair{lo, hi} : std::pair<std::uintptr_t, std::uintptr_t>{0, 0};
  }

  void all_gather_blocks(const void* send, void* recv, const Blocks& blocks, DType t) {
    check_blocks("all_gather", blocks);
    check_buffers("all_gather", send, recv, blocks.count(rank_), blocks.total());
    std::uint64_t own = bytes(blocks.count(rank_), t);
    CommRecorder::record(Kind::all_gather, own * static_cast<std::uint64_t>(size_ - 1), bytes(blocks.total(), t) - own, name_, size_, lowest_, highest_);
    if (DryRun::active()) {  // zeros around its own block (which `send` may already be: in place)
      auto* out = static_cast<unsigned char*>(recv);
      const std::size_t at = blocks.offset(rank_), n = blocks.count(rank_);
      dry_zero(out, at, t);
      dry_zero(out + bytes(at + n, t), blocks.total() - at - n, t);
      return dry_copy(out + bytes(at, t), send, n, t);
    }
    do_all_gather(send, recv, blocks, t);
  }
  void reduce_scatter_blocks(const void* send, void* recv, const Blocks& blocks, DType t, Op op) {
    check_blocks("reduce_scatter", blocks);
    check_buffers("reduce_scatter", send, recv, blocks.total(), blocks.count(rank_));
    check_disjoint("reduce_scatter", send, blocks.total(), recv, blocks.count(rank_), t);
    std::uint64_t own = bytes(blocks.count(rank_), t);
    CommRecorder::record(Kind::reduce_scatter, bytes(blocks.total(), t) - own, own * static_cast<std::uint64_t>(size_ - 1), name_, size_, lowest_, highest_);
    if (DryRun::active())
      return dry_copy(recv, static_cast<const unsigned char*>(send) + bytes(blocks.offset(rank_), t), blocks.count(rank_), t);
    do_reduce_scatter(send, recv, blocks, t, op);
  }
  void all_to_all_blocks(const void* send, const Blocks& sb, void* recv, const Blocks& rb, DType t) {
    check_blocks("all_to_all", sb);
    check_blocks("all_to_all", rb);
    check_buffers("all_to_all", send, recv, sb.total(), rb.total());
    check_disjoint("all_to_all", send, sb.total(), recv, rb.total(), t);
    CommRecorder::record(Kind::all_to_all, bytes(sb.total() - sb.count(rank_), t), bytes(rb.total() - rb.count(rank_), t), name_, size_, lowest_, highest_);
    if (DryRun::active()) {
      dry_zero(recv, rb.total(), t);
      return dry_copy(static_cast<unsigned char*>(recv) + bytes(rb.offset(rank_), t),
                      static_cast<const unsigned char*>(send) + bytes(sb.offset(rank_), t),
                      std::min(sb.count(rank_), rb.count(rank_)), t);
    }
    do_all_to_all(send, sb, recv, rb, t);
  }

  int rank_;
  int size_;
  std::string name_;
  bool world_;                // named "world": every backend's world, whose ranks are the run's devices
  int lowest_, highest_;      // world_span()
  std::vector<int> devices_;  // world_device() of each rank (empty: the world's own, or unknown)
};

}  // namespace shardlib::coll
