// SPDX-License-Identifier: Apache-2.0
/// @file
/// The `threads` backend: N virtual devices in one process, one thread each.
///
/// Single copy: a collective posts each member's buffer addresses in a shared slot, meets at a
/// barrier, and then every member reads what it needs straight from its peers' buffers (no
/// staging copy); a second barrier keeps those buffers alive until every reader is done.
/// all_reduce reduces one block per member (reduce-scatter) and gathers the blocks, so the
/// reduction work is split evenly and each result element is computed once.
///
/// Waiting: a short spin (none when devices outnumber cores), then yields, then a sleep on a
/// condition variable, so 8 devices on 2 cores all make progress. Nothing waits forever:
/// - a device whose SPMD body threw aborts the run: every waiting device throws `RunAborted`
///   carrying that device's message;
/// - a member that finished its body, or that has not arrived after the timeout, makes the
///   waiting members throw a CollectiveError naming it (a collective called by only some
///   devices);
/// - members that disagree on the call (kind, element type, counts, root, peers) all throw a
///   CollectiveError saying what differs, after one more meeting: none unwinds, or posts its
///   next call, while a peer still reads the one it posted.
///
/// exchange copies each strided region straight from the peer's send buffer into this
/// device's receive buffer (detail/region_copy.hpp), with no packing.
///
/// send/recv are eager: `send` copies into a mailbox and returns; `recv` takes from it.
///
/// The same communicator over GPU memory (collectives/threads_device.hpp: in-process devices each
/// with its own CUDA stream) keeps this protocol and its checks; what it queues instead of
/// copying is ordered by CUDA events, so that no collective waits for a stream on the host.
#pragma once

#include <shardlib/collectives/communicator.hpp>
#include <shardlib/collectives/detail/reduce.hpp>
#include <shardlib/collectives/detail/region_copy.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <immintrin.h>
#define SHARDLIB_CPU_RELAX() _mm_pause()
#else
#define SHARDLIB_CPU_RELAX() std::this_thread::yield()
#endif

namespace shardlib::coll {

/// Thrown in every device waiting in a collective when another device's SPMD body failed.
class RunAborted : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

namespace detail {

/// State shared by all devices of one threads run.
class ThreadWorld {
 public:
  ThreadWorld(int devices, std::chrono::milliseconds timeout)
      : devices_(devices), timeout_(timeout), finished_(static_cast<std::size_t>(devices)),
        mail_cv_(static_cast<std::size_t>(devices)) {
    for (auto& f : finished_) f.store(false);
    unsigned hw = std::thread::hardware_concurrency();
    spin_ = hw != 0 && static_cast<unsigned>(devices) <= hw;
  }

  int devices() const noexcept { return devices_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Whether waiting may busy-spin (devices do not outnumber cores).
  bool may_spin() const noexcept { return spin_; }

  /// Ends the run: every device waiting now or later throws RunAborted with `message`.
  void abort(int device, const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_.load()) return;
      abort_message_ = "shardlib: device " + std::to_string(device) + " failed: " + message;
      aborted_.store(true);
    }
    for (auto& cv : mail_cv_) cv.notify_all();
  }
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  [[noreturn]] void throw_aborted() const {
    std::lock_guard<std::mutex> lock(mutex_);
    throw RunAborted(abort_message_);
  }

  void set_finished(int device) noexcept { finished_[static_cast<std::size_t>(device)].store(true); }
  bool finished(int device) const noexcept { return finished_[static_cast<std::size_t>(device)].load(); }

  // Eager point-to-point mailboxes, keyed by (group id, source world device, dest world device, tag).
  // A post wakes its destination device's waits alone (a pipeline's 8 stages on 2 cores: waking
  // every waiting device at each send cost the stages' time).
  using MailKey = std::tuple<const void*, int, int, int>;
  void post(const MailKey& key, const void* data, std::size_t bytes) {
    std::vector<std::byte> msg(bytes);
    if (bytes) std::memcpy(msg.data(), data, bytes);
    {
      std::lock_guard<std::mutex> lock(mail_mutex_);
      mail_[key].push_back(std::move(msg));
    }
    mail_cv_[static_cast<std::size_t>(std::get<2>(key))].notify_all();
  }
  /// Blocks until a message for `key` arrives; checks abort, the sender finishing, the timeout.
  /// `where()` names the call for error messages; it runs only when there is an error.
  template <class Where>
  std::vector<std::byte> take(const MailKey& key, int sender_device, const Where& where) {
    auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mail_mutex_);
    for (;;) {
      auto it = mail_.find(key);
      if (it != mail_.end() && !it->second.empty()) {
        auto msg = std::move(it->second.front());
        it->second.pop_front();
        return msg;
      }
      if (aborted()) {
        lock.unlock();
        throw_aborted();
      }
      if (finished(sender_device))
        throw CollectiveError("shardlib: " + where() + ": device " + std::to_string(sender_device) +
                              " finished its SPMD body without sending this message");
      if (std::chrono::steady_clock::now() - start > timeout_)
        throw CollectiveError("shardlib: " + where() + ": no message from device " + std::to_string(sender_device) +
                              " after " + std::to_string(timeout_.count()) + " ms");
      mail_cv_[static_cast<std::size_t>(std::get<2>(key))].wait_for(lock, std::chrono::milliseconds(20));
    }
  }

 private:
  int devices_;
  std::chrono::milliseconds timeout_;
  bool spin_ = false;
  std::vector<std::atomic<bool>> finished_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;
  std::string abort_message_;
  std::mutex mail_mutex_;
  std::vector<std::condition_variable> mail_cv_;  // one per destination device
  std::map<MailKey, std::deque<std::vector<std::byte>>> mail_;
};

/// What one member posts for a collective: enough for peers to check the call and copy.
struct Slot {
  Kind kind{};
  DType dtype{};
  Op op{};
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;                          // all_reduce, broadcast; permute: send count
  std::size_t recv_count = 0;                     // permute
  int dest = -1, source = -1;                     // permute
  const std::size_t* counts = nullptr;            // uneven blocks (send side for all_to_all)
  const std::size_t* recv_counts = nullptr;       // all_to_all
  std::size_t uniform = 0, recv_uniform = 0;      // block size when counts == nullptr
  bool exchange = false;                          // exchange (counted as all_to_all)
  const Region* send_regions = nullptr;           // exchange: size() each
  const Region* recv_regions = nullptr;
  int color = 0, key = 0;                         // split
  std::shared_ptr<void> created;                  // split: the new group's state (leader's slot)
  std::size_t block(int r) const noexcept { return counts ? counts[r] : uniform; }
  std::size_t recv_block(int r) const noexcept { return recv_counts ? recv_counts[r] : recv_uniform; }
};

/// State shared by the members of one group.
class ThreadGroup {
 public:
  ThreadGroup(std::shared_ptr<ThreadWorld> world, std::vector<int> devices)
      : world_(std::move(world)), devices_(std::move(devices)), slots_(devices_.size()),
        stamps_(devices_.size()) {
    for (auto& s : stamps_) s.store(0);
  }

  int size() const noexcept { return static_cast<int>(devices_.size()); }
  int device(int rank) const noexcept { return devices_[static_cast<std::size_t>(rank)]; }
  ThreadWorld& world() noexcept { return *world_; }
  const std::shared_ptr<ThreadWorld>& world_ptr() const noexcept { return world_; }
  Slot& slot(int rank) noexcept { return slots_[static_cast<std::size_t>(rank)]; }
  /// What the group's way of moving data keeps for all members (device memory: each member's
  /// stream events); set by whoever makes the group, before its members use it.
  std::shared_ptr<void>& moves_state() noexcept { return moves_state_; }

  /// Returns once every member has arrived (see the file comment for what ends a wait).
  /// `where()` names the call for error messages; it runs only when there is an error.
  template <class Where>
  void arrive_and_wait(int rank, const Where& where) {
    const int n = size();
    if (n == 1) return;
    std::uint64_t g = generation_.load(std::memory_order_acquire);
    stamps_[static_cast<std::size_t>(rank)].store(g + 1, std::memory_order_relaxed);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(g + 1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        cv_.notify_all();
      }
      return;
    }
    ThreadWorld& w = *world_;
    if (w.may_spin()) {
      for (int i = 0; i < 500; ++i) {  // ~10 us of pause: longer only hurts when a peer shares the core
        if (generation_.load(std::memory_order_acquire) != g) return;
        SHARDLIB_CPU_RELAX();
      }
    }
    for (int i = 0; i < 64; ++i) {
      if (generation_.load(std::memory_order_acquire) != g) return;
      if (w.aborted()) w.throw_aborted();
      std::this_thread::yield();
    }
    auto start = std::chrono::steady_clock::now();
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    struct Leave {
      std::atomic<int>& s;
      ~Leave() { s.fetch_sub(1, std::memory_order_seq_cst); }
    } leave{sleepers_};
    std::unique_lock<std::mutex> lock(mutex_);
    while (generation_.load(std::memory_order_seq_cst) == g) {
      if (w.aborted()) {
        lock.unlock();
        w.throw_aborted();
      }
      std::string missing;
      bool someone_finished = false;
      for (int r = 0; r < n; ++r)
        if (stamps_[static_cast<std::size_t>(r)].load(std::memory_order_relaxed) != g + 1) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(device(r));
          someone_finished = someone_finished || w.finished(device(r));
        }
      // A member seen as finished may have arrived, completed this barrier and left (its stamp
      // read above can be stale): it published the new generation before finishing, so a
      // fresh look at the generation tells the two apart.
      if ((someone_finished || std::chrono::steady_clock::now() - start > w.timeout()) &&
          generation_.load(std::memory_order_seq_cst) != g)
        break;
      if (someone_finished)
        throw CollectiveError("shardlib: " + where() + ": device(s) " + missing +
                              " finished their SPMD body without calling it; a collective must be called by every "
                              "device of its group");
      if (std::chrono::steady_clock::now() - start > w.timeout())
        throw CollectiveError("shardlib: " + where() + ": device(s) " + missing + " did not arrive within " +
                              std::to_string(w.timeout().count()) +
                              " ms; was the collective called by only some devices of the group?");
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

 private:
  std::shared_ptr<ThreadWorld> world_;
  std::shared_ptr<void> moves_state_;
  std::vector<int> devices_;  // world device of each rank
  std::vector<Slot> slots_;
  std::vector<std::atomic<std::uint64_t>> stamps_;  // generation each member last arrived for
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> arrived_{0};
  std::atomic<int> sleepers_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
};

inline void copy_bytes(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes && dst != src) std::memcpy(dst, src, bytes);
}

/// How a threads communicator moves data, in host memory: memcpy, the host reduction; every copy
/// is done when it returns, so the ordering hooks do nothing. (collectives/threads_device.hpp
/// has the form for GPU memory, which orders the members' streams with events.) The hooks, in
/// the order a collective calls them: `posted` once this member's slot is posted (before the
/// first meeting); `reading(me, r)` before it reads rank r's buffers; `phase` when all_reduce's
/// first phase is queued (`reading_phase(me, r)` before its second phase reads rank r's output);
/// `finishing` before the last meeting; `finished` after it.
struct HostMoves {
  static constexpr bool host = true;
  static std::shared_ptr<void> make_state(int /*members*/) { return nullptr; }
  void posted(ThreadGroup&, int) {}
  void reading(ThreadGroup&, int /*me*/, int /*peer*/) {}
  void phase(ThreadGroup&, int) {}
  void reading_phase(ThreadGroup&, int /*me*/, int /*peer*/) {}
  void finishing(ThreadGroup&, int) {}
  void finished(ThreadGroup&, int) {}
  void copy(void* dst, const void* src, std::size_t bytes) { copy_bytes(dst, src, bytes); }
  void copy_region(void* dst, const Region& dr, const void* src, const Region& sr, std::size_t e) {
    detail::copy_region(dst, dr, src, sr, e);
  }
  void reduce(void* out, const void* const* in, int inputs, std::size_t n, DType t, Op op) {
    detail::reduce(out, in, inputs, n, t, op);
  }
  /// send's copy into a host message and recv's out of one (one side is a member's buffer).
  void message_copy(void* dst, const void* src, std::size_t bytes) { copy_bytes(dst, src, bytes); }
};

}  // namespace detail

/// One device's handle on a threads group (see the file comment). Created by the runtime
/// (`world`) and by `split`; used only from its device's thread. `Moves` says how data moves:
/// detail::HostMoves (ThreadCommunicator, host memory) or the GPU form of
/// collectives/threads_device.hpp; the protocol, its checks and its errors are the same.
template <class Moves>
class BasicThreadCommunicator final : public Communicator {
 public:
  /// The world communicator of `device` in `world`.
  static std::unique_ptr<BasicThreadCommunicator> world(std::shared_ptr<detail::ThreadGroup> group, int device,
                                                        Moves moves = {}) {
    return std::unique_ptr<BasicThreadCommunicator>(
        new BasicThreadCommunicator(std::move(group), device, "world", std::move(moves)));
  }
  /// A fresh world: the state its devices share.
  static std::shared_ptr<detail::ThreadGroup> make_world(int devices, std::chrono::milliseconds timeout) {
    return make_world(std::make_shared<detail::ThreadWorld>(devices, timeout));
  }
  /// A fresh world group of the devices of `world` (another group over the same run: its aborts,
  /// finished devices and timeout hold for both).
  static std::shared_ptr<detail::ThreadGroup> make_world(std::shared_ptr<detail::ThreadWorld> world) {
    const int devices = world->devices();
    std::vector<int> all(static_cast<std::size_t>(devices));
    for (int i = 0; i < devices; ++i) all[static_cast<std::size_t>(i)] = i;
    auto g = std::make_shared<detail::ThreadGroup>(std::move(world), std::move(all));
    g->moves_state() = Moves::make_state(devices);
    return g;
  }

  std::string_view backend() const noexcept override { return "threads"; }
  bool accepts_device_memory() const noexcept override { return !Moves::host; }
  bool buffered_sends() const noexcept override { return true; }  // a send posts its message

 protected:
  void do_all_gather(const void* send, void* recv, const Blocks& blocks, DType t) override {
    auto& me = begin(Kind::all_gather, t, "all_gather");
    set_blocks(me, blocks);
    me.send = send;
    me.recv = recv;
    meet_posted("all_gather");
    std::string error;
    for (int r = 0; r < size() && error.empty(); ++r) {
      const auto& s = g_->slot(r);
      if (s.dtype != t || !same_blocks(s, me)) error = mismatch_text("all_gather", "block counts or element type", r);
    }
    verdict("all_gather", error);
    const std::size_t e = size_of(t);
    for (int r = 0; r < size(); ++r) {
      const auto& s = g_->slot(r);
      moves_.reading(*g_, rank(), r);
      moves_.copy(static_cast<char*>(recv) + blocks.offset(r) * e, s.send, blocks.count(r) * e);
    }
    finish("all_gather");
  }

  void do_reduce_scatter(const void* send, void* recv, const Blocks& blocks, DType t, Op op) override {
    auto& me = begin(Kind::reduce_scatter, t, "reduce_scatter");
    me.op = op;
    set_blocks(me, blocks);
    me.send = send;
    meet_posted("reduce_scatter");
    std::string error;
    for (int r = 0; r < size() && error.empty(); ++r) {
      const auto& s = g_->slot(r);
      if (s.dtype != t || s.op != op || !same_blocks(s, me))
        error = mismatch_text("reduce_scatter", "block counts, element type or op", r);
    }
    verdict("reduce_scatter", error);
    const std::size_t off = blocks.offset(rank()) * size_of(t);
    for (int r = 0; r < size(); ++r) moves_.reading(*g_, rank(), r);
    gather_inputs([&](int r) { return static_cast<const char*>(g_->slot(r).send) + off; });
    moves_.reduce(recv, inputs_.data(), size(), blocks.count(rank()), t, op);
    finish("reduce_scatter");
  }

  void do_all_reduce(const void* send, void* recv, std::size_t count, DType t, Op op) override {
    auto& me = begin(Kind::all_reduce, t, "all_reduce");
    me.op = op;
    me.count = count;
    me.send = send;
    me.recv = recv;
    meet_posted("all_reduce");
    std::string error;
    for (int r = 0; r < size() && error.empty(); ++r) {
      const auto& s = g_->slot(r);
      if (s.dtype != t || s.op != op || s.count != count)
        error = mismatch_text("all_reduce", "element count, element type or op", r);
    }
    verdict("all_reduce", error);
    // Phase 1: reduce block rank() of everyone's input into this device's output.
    const std::size_t e = size_of(t), n = static_cast<std::size_t>(size());
    const std::size_t base = count / n, extra = count % n;
    auto block_off = [&](int r) { return static_cast<std::size_t>(r) * base + std::min<std::size_t>(static_cast<std::size_t>(r), extra); };
    auto block_len = [&](int r) { return base + (static_cast<std::size_t>(r) < extra ? 1 : 0); };
    const std::size_t off = block_off(rank()) * e;
    for (int r = 0; r < size(); ++r) moves_.reading(*g_, rank(), r);
    gather_inputs([&](int r) { return static_cast<const char*>(g_->slot(r).send) + off; });
    moves_.reduce(static_cast<char*>(recv) + off, inputs_.data(), size(), block_len(rank()), t, op);
    moves_.phase(*g_, rank());
    meet("all_reduce");
    // Phase 2: copy the other blocks from their owners' outputs.
    for (int r = 0; r < size(); ++r)
      if (r != rank()) {
        moves_.reading_phase(*g_, rank(), r);
        moves_.copy(static_cast<char*>(recv) + block_off(r) * e, static_cast<const char*>(g_->slot(r).recv) + block_off(r) * e,
                    block_len(r) * e);
      }
    finish("all_reduce");
  }

  void do_all_to_all(const void* send, const Blocks& sb, void* recv, const Blocks& rb, DType t) override {
    auto& me = begin(Kind::all_to_all, t, "all_to_all");
    set_blocks(me, sb);
    me.recv_counts = rb.data();
    me.recv_uniform = rb.is_uniform() ? rb.count(0) : 0;
    me.send = send;
    meet_posted("all_to_all");
    std::string error;
    for (int p = 0; p < size() && error.empty(); ++p)
      for (int q = 0; q < size() && error.empty(); ++q) {
        const auto& sp = g_->slot(p);
        if (sp.dtype != t) error = mismatch_text("all_to_all", "element type", p);
        else if (sp.block(q) != g_->slot(q).recv_block(p))
          error = "shardlib: " + where("all_to_all") + ": rank " + std::to_string(p) + " sends " +
                  std::to_string(sp.block(q)) + " elements to rank " + std::to_string(q) + ", which expects " +
                  std::to_string(g_->slot(q).recv_block(p));
      }
    verdict("all_to_all", error);
    const std::size_t e = size_of(t);
    for (int p = 0; p < size(); ++p) {
      const auto& sp = g_->slot(p);
      std::size_t from = 0;
      for (int q = 0; q < rank(); ++q) from += sp.block(q);
      moves_.reading(*g_, rank(), p);
      moves_.copy(static_cast<char*>(recv) + rb.offset(p) * e, static_cast<const char*>(sp.send) + from * e, rb.count(p) * e);
    }
    finish("all_to_all");
  }

  void do_exchange(const void* send, std::span<const Region> send_regions, void* recv,
                   std::span<const Region> recv_regions, DType t) override {
    constexpr std::string_view call = "exchange";
    auto& me = begin(Kind::all_to_all, t, call);
    me.exchange = true;
    me.send = send;
    me.recv = recv;
    me.send_regions = send_regions.data();
    me.recv_regions = recv_regions.data();
    meet_posted(call);
    std::string error;
    for (int p = 0; p < size() && error.empty(); ++p) {
      const auto& sp = g_->slot(p);
      if (sp.dtype != t) {
        error = mismatch_text(call, "element type", p);
        break;
      }
      for (int q = 0; q < size(); ++q) {
        const std::size_t sent = sp.send_regions[q].count(), expected = g_->slot(q).recv_regions[p].count();
        if (sent != expected) {
          error = "shardlib: " + where(call) + ": rank " + std::to_string(p) + " sends " + std::to_string(sent) +
                  " elements to rank " + std::to_string(q) + ", which expects " + std::to_string(expected);
          break;
        }
      }
    }
    verdict(call, error);
    const std::size_t e = size_of(t);
    bool done = false;
    if constexpr (Moves::host) done = copy_in_slabs(recv, recv_regions, e);
    if (!done) {
      for (int p = 0; p < size(); ++p) {
        const auto& sp = g_->slot(p);
        moves_.reading(*g_, rank(), p);
        moves_.copy_region(recv, recv_regions[static_cast<std::size_t>(p)], sp.send, sp.send_regions[rank()], e);
      }
    }
    finish(call);
  }

  void do_broadcast(void* buf, std::size_t count, DType t, int root) override {
    auto& me = begin(Kind::broadcast, t, "broadcast");
    me.count = count;
    me.root = root;
    me.send = buf;
    meet_posted("broadcast");
    std::string error;
    for (int r = 0; r < size() && error.empty(); ++r) {
      const auto& s = g_->slot(r);
      if (s.dtype != t || s.count != count || s.root != root)
        error = mismatch_text("broadcast", "element count, element type or root", r);
    }
    verdict("broadcast", error);
    if (rank() != root) {
      moves_.reading(*g_, rank(), root);
      moves_.copy(buf, g_->slot(root).send, count * size_of(t));
    }
    finish("broadcast");
  }

  void do_send(const void* buf, std::size_t count, DType t, int peer, int tag) override {
    check_thread("send");
    if constexpr (Moves::host) {
      g_->world().post({g_.get(), rank(), peer, tag}, buf, count * size_of(t));
    } else {  // through host memory (waits for this device's queued work)
      std::vector<std::byte> msg(count * size_of(t));
      moves_.message_copy(msg.data(), buf, msg.size());
      g_->world().post({g_.get(), rank(), peer, tag}, msg.data(), msg.size());
    }
  }

  void do_recv(void* buf, std::size_t count, DType t, int peer, int tag) override {
    check_thread("recv");
    auto msg = g_->world().take({g_.get(), peer, rank(), tag}, g_->device(peer), [this] { return where("recv"); });
    if (msg.size() != count * size_of(t))
      throw CollectiveError("shardlib: " + where("recv") + ": the message from rank " + std::to_string(peer) + " has " +
                            std::to_string(msg.size()) + " bytes, but " + std::to_string(count) + " elements of " +
                            std::string(coll::name(t)) + " (" + std::to_string(count * size_of(t)) + " bytes) were expected");
    moves_.message_copy(buf, msg.data(), msg.size());
  }

  void do_permute(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count, int source,
                  DType t) override {
    auto& me = begin(Kind::permute, t, "permute");
    me.send = send;
    me.count = send_count;
    me.dest = dest;
    me.recv_count = recv_count;
    me.source = source;
    meet_posted("permute");
    std::string error;
    for (int r = 0; r < size() && error.empty(); ++r) {
      const auto& s = g_->slot(r);
      if (s.dtype != t)
        error = mismatch_text("permute", "element type", r);
      else if (s.source != -1 && (g_->slot(s.source).dest != r || g_->slot(s.source).count != s.recv_count))
        error = "shardlib: " + where("permute") + ": rank " + std::to_string(r) + " expects " +
                std::to_string(s.recv_count) + " elements from rank " + std::to_string(s.source) + ", which sends " +
                std::to_string(g_->slot(s.source).count) + " elements to " +
                (g_->slot(s.source).dest == -1 ? std::string("nobody") : "rank " + std::to_string(g_->slot(s.source).dest));
      else if (s.dest != -1 && g_->slot(s.dest).source != r)
        error = "shardlib: " + where("permute") + ": rank " + std::to_string(r) + " sends to rank " +
                std::to_string(s.dest) + ", which does not receive from it";
    }
    verdict("permute", error);
    if (source != -1) {
      moves_.reading(*g_, rank(), source);
      moves_.copy(recv, g_->slot(source).send, recv_count * size_of(t));
    }
    finish("permute");
  }

  void do_barrier() override {
    check_thread("barrier");
    g_->slot(rank()).kind = Kind::barrier;
    g_->slot(rank()).exchange = false;
    meet_posted("barrier");  // checks that every member is in a barrier
    for (int r = 0; r < size(); ++r) moves_.reading(*g_, rank(), r);  // (GPU streams: every member's reaches this point)
    finish("barrier");
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name) override {
    auto& me = begin(Kind::barrier, DType::u8, "split");
    me.color = color;
    me.key = key;
    me.created.reset();
    meet_posted("split");
    // Members of my color, ordered by (key, rank); the first creates the shared state.
    std::vector<std::pair<int, int>> members;
    for (int r = 0; r < size(); ++r)
      if (g_->slot(r).color == color && color >= 0) members.emplace_back(g_->slot(r).key, r);
    std::sort(members.begin(), members.end());
    if (color >= 0 && members.front().second == rank()) {
      std::vector<int> devices;
      for (auto& m : members) devices.push_back(g_->device(m.second));
      auto created = std::make_shared<detail::ThreadGroup>(g_->world_ptr(), std::move(devices));
      created->moves_state() = Moves::make_state(created->size());
      me.created = std::move(created);
    }
    meet("split");
    std::unique_ptr<Communicator> out;
    if (color >= 0) {
      int new_rank = 0;
      while (members[static_cast<std::size_t>(new_rank)].second != rank()) ++new_rank;
      auto group = std::static_pointer_cast<detail::ThreadGroup>(g_->slot(members.front().second).created);
      out.reset(new BasicThreadCommunicator(std::move(group), new_rank, std::move(name), moves_));
    }
    meet("split");
    me.created.reset();
    return out;
  }

 private:
  BasicThreadCommunicator(std::shared_ptr<detail::ThreadGroup> group, int rank, std::string name, Moves moves)
      : Communicator(rank, group->size(), std::move(name)), g_(std::move(group)), owner_(std::this_thread::get_id()),
        moves_(std::move(moves)) {
    inputs_.resize(static_cast<std::size_t>(size()));
  }

  void check_thread(std::string_view call) const {
    if (std::this_thread::get_id() != owner_)
      throw CollectiveError("shardlib: " + where(call) + ": this communicator belongs to device " +
                            std::to_string(g_->device(rank())) +
                            " and was used from another thread; each device uses its own Context");
  }
  detail::Slot& begin(Kind k, DType t, std::string_view call) {
    check_thread(call);
    auto& s = g_->slot(rank());
    s = detail::Slot{};
    s.kind = k;
    s.dtype = t;
    return s;
  }
  /// Exchange copies where every piece is a box with the same number of rows (dim 0) in the
  /// same shape on both sides, e.g. the column blocks of a matrix: copied band of rows by band of
  /// rows, every peer inside a band, so the destination is written front to back while it is in
  /// cache (peer by peer, each pass would walk the whole destination: 1.8x slower measured for a
  /// 64 MiB gather of column blocks on 8 devices). False, copying nothing, when the pieces do not
  /// have that form.
  bool copy_in_slabs(void* recv, std::span<const Region> recv_regions, std::size_t e) const {
    std::size_t rows = 0, row_bytes = 0;
    int pieces = 0;
    for (int p = 0; p < size(); ++p) {
      const Region& dst = recv_regions[static_cast<std::size_t>(p)];
      if (dst.count() == 0) continue;
      const Region& src = g_->slot(p).send_regions[rank()];
      if (dst.rank < 2 || src.rank != dst.rank || (rows && dst.extent[0] != rows)) return false;
      for (int k = 0; k < dst.rank; ++k)
        if (src.extent[static_cast<std::size_t>(k)] != dst.extent[static_cast<std::size_t>(k)]) return false;
      rows = dst.extent[0];
      row_bytes += dst.count() / rows * e;
      ++pieces;
    }
    if (pieces < 2) return false;
    const std::size_t band = std::max<std::size_t>(1, (std::size_t{64} << 10) / std::max<std::size_t>(row_bytes, 1));
    for (std::size_t r0 = 0; r0 < rows; r0 += band) {
      const std::size_t n = std::min(band, rows - r0);
      for (int p = 0; p < size(); ++p) {
        Region dst = recv_regions[static_cast<std::size_t>(p)];
        if (dst.count() == 0) continue;
        Region src = g_->slot(p).send_regions[rank()];
        dst.offset += r0 * dst.stride[0];
        src.offset += r0 * src.stride[0];
        dst.extent[0] = src.extent[0] = n;
        detail::copy_region(recv, dst, g_->slot(p).send, src, e);
      }
    }
    return true;
  }

  // Dry runs (see Communicator): in GPU memory, the same fills on this device's stream.
  void dry_zero(void* p, std::size_t count, DType t) override {
    if constexpr (Moves::host) Communicator::dry_zero(p, count, t);
    else moves_.zero(p, count * size_of(t));
  }
  void dry_copy(void* dst, const void* src, std::size_t count, DType t) override {
    if constexpr (Moves::host) Communicator::dry_copy(dst, src, count, t);
    else if (dst != src) moves_.copy(dst, src, count * size_of(t));
  }
  void dry_exchange(const void* send, std::span<const Region> send_regions, void* recv, std::span<const Region> recv_regions,
                    DType t) override {
    if constexpr (Moves::host) {
      Communicator::dry_exchange(send, send_regions, recv, recv_regions, t);
    } else {
      const std::size_t e = size_of(t), me = static_cast<std::size_t>(rank());
      for (int p = 0; p < size(); ++p)
        if (p != rank()) moves_.zero_region(recv, recv_regions[static_cast<std::size_t>(p)], e);
      moves_.copy_region(recv, recv_regions[me], send, send_regions[me], e);
    }
  }

  static void set_blocks(detail::Slot& s, const Blocks& b) noexcept {
    s.counts = b.data();
    s.uniform = b.is_uniform() ? b.count(0) : 0;
  }
  bool same_blocks(const detail::Slot& a, const detail::Slot& b) const noexcept {
    for (int r = 0; r < size(); ++r)
      if (a.block(r) != b.block(r)) return false;
    return true;
  }
  /// First barrier of a collective: every slot is posted; check all members are in this call.
  void meet_posted(std::string_view call) {
    moves_.posted(*g_, rank());
    if (size() > 1) g_->arrive_and_wait(rank(), [&] { return where(call); });
    const Kind k = g_->slot(rank()).kind;
    const bool ex = g_->slot(rank()).exchange;
    std::string error;
    for (int r = 0; r < size() && error.empty(); ++r)
      if (g_->slot(r).kind != k || g_->slot(r).exchange != ex) error = mismatch_text(call, "collective", r);
    verdict(call, error);
  }
  /// A later barrier. Slots are not read after the last one: a peer may already be posting
  /// its next call.
  void meet(std::string_view call) {
    if (size() > 1) g_->arrive_and_wait(rank(), [&] { return where(call); });
  }
  /// The last meeting of a collective that moved data: nobody's buffers are read after it (on
  /// GPU streams: each member's later work waits for the others' reads).
  void finish(std::string_view call) {
    moves_.finishing(*g_, rank());
    meet(call);
    moves_.finished(*g_, rank());
  }
  /// Throws `error` unless it is empty, once every member has it: after the first meeting every
  /// member checks the same slots in the same order, so all reach the same verdict, and they meet
  /// again before throwing, so that none unwinds (freeing the blocks or regions its slot points
  /// to) or posts its next call into its slot while a peer still reads it. (AddressSanitizer
  /// caught all_to_all's check reading the stack of a peer that had thrown.)
  void verdict(std::string_view call, const std::string& error) {
    if (error.empty()) return;
    meet(call);
    throw CollectiveError(error);
  }
  std::string mismatch_text(std::string_view call, std::string_view what, int r) const {
    const auto& s = g_->slot(r);
    return "shardlib: " + where(call) + ": rank " + std::to_string(r) + " (device " + std::to_string(g_->device(r)) +
           ") called " + std::string(s.exchange ? "exchange" : coll::name(s.kind)) + " on " +
           std::string(coll::name(s.dtype)) + " with a different " + std::string(what) +
           "; every device of a group must make the same collective call";
  }
  template <class F>
  void gather_inputs(F&& at) {
    // This device's own input first: the reduction's output may alias only inputs_[0].
    inputs_[0] = at(rank());
    for (int r = 0, i = 1; r < size(); ++r)
      if (r != rank()) inputs_[static_cast<std::size_t>(i++)] = at(r);
  }

  std::shared_ptr<detail::ThreadGroup> g_;
  std::thread::id owner_;
  Moves moves_;
  std::vector<const void*> inputs_;
};

/// The threads backend's communicator over host memory.
using ThreadCommunicator = BasicThreadCommunicator<detail::HostMoves>;

}  // namespace shardlib::coll
