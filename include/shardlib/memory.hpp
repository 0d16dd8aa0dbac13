// SPDX-License-Identifier: Apache-2.0
/// @file
/// Where tensor blocks come from and what they are for: each device's block cache (a caching
/// allocator, as PyTorch's) and its ledger of live bytes by role (parameters, gradients,
/// optimizer state, activations, temporaries), the per-device memory a training recipe reports.
///
/// Every block a tensor, a reshard or a backward rule allocates comes from `block_cache(ctx)`;
/// the block is counted under the role current on the allocating thread (`MemoryRoleScope`,
/// default `activations`) until its last owner releases it. `tag_memory(t, role)` moves a live
/// block to another role: `Param` tags its value as parameters, a parameter's gradient is tagged
/// as gradients, an optimizer tags its state, and a backward pass counts what it makes as
/// temporaries. Free blocks kept by the cache are not counted.
#pragma once

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/runtime/runtime.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace shardlib {

/// What a block of tensor memory holds, for the per-device accounting.
enum class MemoryRole : std::uint8_t {
  parameters,       ///< values of `Param`s (the model's weights)
  gradients,        ///< parameters' gradients (pending between passes, resolved, or kept by an optimizer)
  optimizer_state,  ///< an optimizer's moments and momentum buffers
  activations,      ///< inputs, activations, saved tensors, the forward's scratch: everything else (the default)
  /// What a backward pass makes besides parameters' gradients: the activations' gradients, its
  /// rules' scratch, a checkpoint's recomputed interior, a pipeline stage's received gradients.
  /// Apart from `activations` so that what a schedule holds between forward and backward is read
  /// alone (`peak_of(MemoryRole::activations)`), the backward's transient bytes beside it.
  temporaries,
};
inline constexpr std::size_t num_memory_roles = 5;

/// The role's name: "parameters", "gradients", "optimizer_state", "activations", "temporaries".
constexpr const char* to_string(MemoryRole r) noexcept {
  switch (r) {
    case MemoryRole::parameters: return "parameters";
    case MemoryRole::gradients: return "gradients";
    case MemoryRole::optimizer_state: return "optimizer_state";
    case MemoryRole::activations: return "activations";
    case MemoryRole::temporaries: return "temporaries";
  }
  return "?";
}

/// What a device's block cache asked of its memory space (memory.hpp's block_cache_stats): blocks
/// handed out again from the cache, blocks allocated from the space (cudaMalloc in GPU memory),
/// blocks given back to it (cudaFree, which waits for the whole GPU).
struct BlockCacheStats {
  std::uint64_t hits = 0;
  std::uint64_t space_allocations = 0;
  std::uint64_t space_frees = 0;
};

/// Live bytes of one device by role (requested sizes, not the cache's rounded blocks).
struct MemoryUsage {
  std::array<std::int64_t, num_memory_roles> bytes{};
  /// The largest total of live bytes since the device started or `reset_peak_memory` (PyTorch's
  /// max_memory_allocated): what a step needs at its high point, not after it.
  std::int64_t peak = 0;
  /// Each role's own largest live bytes over the same span (each at its own high point, so they
  /// need not add up to `peak`): `peak_of(MemoryRole::activations)` is what a schedule holds
  /// between forward and backward, whatever the gradients, state and backward's temporaries beside it.
  std::array<std::int64_t, num_memory_roles> peaks{};
  std::int64_t operator[](MemoryRole r) const noexcept { return bytes[static_cast<std::size_t>(r)]; }
  std::int64_t peak_of(MemoryRole r) const noexcept { return peaks[static_cast<std::size_t>(r)]; }
  std::int64_t parameters() const noexcept { return (*this)[MemoryRole::parameters]; }
  std::int64_t gradients() const noexcept { return (*this)[MemoryRole::gradients]; }
  std::int64_t optimizer_state() const noexcept { return (*this)[MemoryRole::optimizer_state]; }
  std::int64_t activations() const noexcept { return (*this)[MemoryRole::activations]; }
  std::int64_t temporaries() const noexcept { return (*this)[MemoryRole::temporaries]; }
  std::int64_t total() const noexcept {
    std::int64_t t = 0;
    for (std::int64_t b : bytes) t += b;
    return t;
  }
  /// One line: "parameters 1.5 MiB, gradients 1.5 MiB, optimizer_state 3 MiB, activations 12 KiB,
  /// temporaries 0 B; peak 20 MiB".
  std::string to_string() const {
    std::string s;
    for (std::size_t r = 0; r < num_memory_roles; ++r) {
      if (r) s += ", ";
      s += shardlib::to_string(static_cast<MemoryRole>(r));
      s += ' ';
      s += bytes_text(bytes[r]);
    }
    return s + "; peak " + bytes_text(peak);
  }
  /// "512 B", "12 KiB", "1.5 MiB", "2.25 GiB".
  static std::string bytes_text(std::int64_t b) {
    const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(b);
    int u = 0;
    while (std::abs(v) >= 1024 && u < 4) v /= 1024, ++u;
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.3g %s", v, unit[u]);
    return buf;
  }
};

namespace detail {

/// The role new blocks are counted under, on this thread (each device runs on its own thread).
inline MemoryRole& current_memory_role() noexcept {
  thread_local MemoryRole role = MemoryRole::activations;
  return role;
}

/// One device's live bytes by role. Atomic: a block may be released on another thread.
struct MemoryLedger {
  std::array<std::atomic<std::int64_t>, num_memory_roles> bytes{}, peaks{};
  std::atomic<std::int64_t> total{0}, peak{0};
  static void raise(std::atomic<std::int64_t>& p, std::int64_t v) noexcept {
    for (std::int64_t q = p.load(std::memory_order_relaxed);
         v > q && !p.compare_exchange_weak(q, v, std::memory_order_relaxed);) {
    }
  }
  void add(MemoryRole r, std::int64_t n) noexcept {
    const auto i = static_cast<std::size_t>(r);
    raise(peaks[i], bytes[i].fetch_add(n, std::memory_order_relaxed) + n);
    raise(peak, total.fetch_add(n, std::memory_order_relaxed) + n);
  }
  /// Moves `n` live bytes from one role to another (the total, hence the peak, unchanged; the
  /// receiving role's own peak may rise).
  void move(MemoryRole from, MemoryRole to, std::int64_t n) noexcept {
    bytes[static_cast<std::size_t>(from)].fetch_sub(n, std::memory_order_relaxed);
    const auto i = static_cast<std::size_t>(to);
    raise(peaks[i], bytes[i].fetch_add(n, std::memory_order_relaxed) + n);
  }
  void reset_peak() noexcept {
    peak.store(total.load(std::memory_order_relaxed), std::memory_order_relaxed);
    for (std::size_t r = 0; r < num_memory_roles; ++r)
      peaks[r].store(bytes[r].load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  MemoryUsage usage() const noexcept {
    MemoryUsage u;
    for (std::size_t r = 0; r < num_memory_roles; ++r) {
      u.bytes[r] = bytes[r].load(std::memory_order_relaxed);
      u.peaks[r] = peaks[r].load(std::memory_order_relaxed);
    }
    u.peak = peak.load(std::memory_order_relaxed);
    return u;
  }
};

/// Per-device cache of blocks (in host memory those of 64 KiB or more; in GPU memory all, in
/// multiples of 512 bytes), as PyTorch's caching allocator: a block
/// freed by one tensor is handed to the next of a similar size instead of going back to the OS
/// (glibc returns blocks above 32 MiB to the OS at once, and touching fresh pages again cost 4x
/// the reshard itself at 64 MiB). In host memory it holds at most SHARDLIB_BLOCK_CACHE_MB
/// (default 1024) MiB of free blocks: a released block that does not fit under that cap evicts
/// the blocks released longest ago, so that the sizes a loop uses now stay cached and stale ones
/// go. In GPU memory it keeps every free block by default, as PyTorch's caching allocator does (a
/// cap of 1 GiB sent a transformer layer's activations through cudaFree, which waits for the whole
/// GPU, and cudaMalloc on every training step: 14.6 ms a step against 10.2 uncapped on an H100);
/// SHARDLIB_BLOCK_CACHE_MB caps it too. When the space's allocator fails, this cache's free blocks
/// go back to it and the allocation is tried again, then every other device's cache of the space
/// in this process too (PyTorch's allocator does the same). Thread-safe: a tensor may be destroyed
/// on another thread than its device's. Keeps the device's MemoryLedger (each live block under its
/// role) and counts what it asks of the space (BlockCacheStats): a training step in steady state
/// asks for nothing.
template <class MemorySpace>
class BlockCache : public std::enable_shared_from_this<BlockCache<MemorySpace>> {
 public:
  /// The default cap on free bytes held: 1 GiB in host memory, none in GPU memory (see above).
  static constexpr std::size_t default_cap =
      detail::host_memory_v<MemorySpace> ? std::size_t{1024} << 20 : std::numeric_limits<std::size_t>::max();
  /// In host memory, blocks smaller than this bypass the cache (malloc is cheap there).
  static constexpr std::size_t min_bytes = std::size_t{64} << 10;
  /// Whether a block of `bytes` goes through the cache: in GPU memory every block does, since
  /// cudaMalloc costs microseconds and cudaFree waits for the whole GPU (a host synchronisation
  /// in every op on small tensors otherwise).
  static constexpr bool cached(std::size_t bytes) noexcept {
    if constexpr (detail::host_memory_v<MemorySpace>) return bytes >= min_bytes;
    else return true;
  }
  /// The deleter of every block: returns it to the cache and takes it off the ledger.
  /// `tag_memory` finds it with std::get_deleter to move the block to another role.
  struct Release {
    std::shared_ptr<BlockCache> cache;
    std::size_t bytes;      // the block's size (a cached block may be larger than asked)
    std::size_t requested;  // what the ledger counts
    MemoryRole role;
    void operator()(void* p) const noexcept {
      cache->ledger_.add(role, -static_cast<std::int64_t>(requested));
      if (!is_shape_only(p)) cache->release(p, bytes);
    }
  };

  /// A cache holding at most SHARDLIB_BLOCK_CACHE_MB MiB of free blocks (default_cap without it).
  BlockCache() {
    if (const char* e = std::getenv("SHARDLIB_BLOCK_CACHE_MB")) cap_ = std::strtoull(e, nullptr, 10) << 20;
    enroll();
  }
  /// A cache holding at most `cap_bytes` of free blocks.
  explicit BlockCache(std::size_t cap_bytes) : cap_(cap_bytes) { enroll(); }
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache() {
    {
      std::lock_guard<std::mutex> lock(registry().m);
      auto& all = registry().caches;
      all.erase(std::remove(all.begin(), all.end(), this), all.end());
    }
    trim();
  }
  /// A block of at least `bytes` (uninitialised), returned to the cache when the last owner goes;
  /// counted under the thread's current role until then. Shape-only (detail/shape_only.hpp): an
  /// address range with no memory behind it, counted the same.
  std::shared_ptr<void> allocate(std::size_t bytes) {
    if (bytes == 0) return {};
    const std::size_t requested = bytes;
    if (shape_only()) {
      ledger_.add(current_memory_role(), static_cast<std::int64_t>(requested));
      return std::shared_ptr<void>(shape_only_block(bytes),
                                   Release{this->shared_from_this(), bytes, requested, current_memory_role()});
    }
    if constexpr (!detail::host_memory_v<MemorySpace>) bytes = (bytes + 511) / 512 * 512;  // small blocks of near sizes reuse each other
    void* p = nullptr;
    if (cached(bytes)) {
      std::lock_guard<std::mutex> lock(m_);
      auto it = by_size_.lower_bound(bytes);
      if (it != by_size_.end() && it->first - bytes <= bytes / 4) {  // waste at most a quarter
        p = it->second->p;
        bytes = it->first;
        cached_ -= bytes;
        lru_.erase(it->second);
        by_size_.erase(it);
        ++stats_.hits;
      }
    }
    if (!p) {
      try {
        p = MemorySpace().allocate(bytes);  // the space's own allocator: no allocation record
      } catch (const std::bad_alloc&) {  // this cache's free blocks back to the space, then every cache's
        if (trim() > 0) {
          try {
            p = MemorySpace().allocate(bytes);
          } catch (const std::bad_alloc&) {
          }
        }
        if (!p) {
          if (trim_others() == 0) throw;
          p = MemorySpace().allocate(bytes);
        }
      }
      if (cached(bytes)) stats_.space_allocations.fetch_add(1, std::memory_order_relaxed);
    }
    const MemoryRole role = current_memory_role();
    ledger_.add(role, static_cast<std::int64_t>(requested));
    return std::shared_ptr<void>(p, Release{this->shared_from_this(), bytes, requested, role});
  }
  /// What this cache has asked of its memory space since it began.
  BlockCacheStats stats() const noexcept {
    return {stats_.hits.load(std::memory_order_relaxed), stats_.space_allocations.load(std::memory_order_relaxed),
            stats_.space_frees.load(std::memory_order_relaxed)};
  }
  /// Bytes of free blocks held.
  std::size_t cached_bytes() const {
    std::lock_guard<std::mutex> lock(m_);
    return cached_;
  }
  /// Returns every free block to the memory space; the bytes returned.
  std::size_t trim() noexcept {
    std::list<Free> all;
    {
      std::lock_guard<std::mutex> lock(m_);
      all.swap(lru_);
      by_size_.clear();
      cached_ = 0;
    }
    std::size_t n = 0;
    for (const Free& f : all) {
      MemorySpace().deallocate(f.p, f.bytes);
      n += f.bytes;
    }
    stats_.space_frees.fetch_add(all.size(), std::memory_order_relaxed);
    return n;
  }
  /// Live bytes by role.
  MemoryUsage usage() const noexcept { return ledger_.usage(); }
  /// Moves a live block (one this cache allocated) to `role`; false when `owner` is not one.
  bool retag(const std::shared_ptr<void>& owner, MemoryRole role) noexcept {
    Release* r = std::get_deleter<Release>(owner);
    if (!r || r->cache.get() != this) return false;
    if (r->role != role) {
      ledger_.move(r->role, role, static_cast<std::int64_t>(r->requested));
      r->role = role;
    }
    return true;
  }
  /// Starts the peak over from the bytes live now.
  void reset_peak() noexcept { ledger_.reset_peak(); }

 private:
  /// A free block: in `lru_` (oldest release first) and in `by_size_` (by its bytes).
  struct Free {
    void* p;
    std::size_t bytes;
    typename std::multimap<std::size_t, typename std::list<Free>::iterator>::iterator sized;
  };
  void release(void* p, std::size_t bytes) noexcept {
    std::list<Free> evicted;
    if (cached(bytes) && bytes <= cap_) {
      try {
        std::lock_guard<std::mutex> lock(m_);
        while (cached_ + bytes > cap_) {  // make room: the blocks released longest ago go
          by_size_.erase(lru_.front().sized);
          cached_ -= lru_.front().bytes;
          evicted.splice(evicted.end(), lru_, lru_.begin());
        }
        lru_.push_back({p, bytes, {}});
        try {
          lru_.back().sized = by_size_.emplace(bytes, std::prev(lru_.end()));
        } catch (...) {
          lru_.pop_back();
          throw;
        }
        cached_ += bytes;
        p = nullptr;
      } catch (...) {  // no memory for the cache's own nodes: the block goes back to the space
      }
    }
    for (const Free& f : evicted) MemorySpace().deallocate(f.p, f.bytes);
    if (p) MemorySpace().deallocate(p, bytes);
    stats_.space_frees.fetch_add(evicted.size() + (p && cached(bytes) ? 1 : 0), std::memory_order_relaxed);
  }
  /// The caches of this memory space in this process (to trim them all when the space runs out).
  struct Registry {
    std::mutex m;
    std::vector<BlockCache*> caches;
  };
  static Registry& registry() {
    static Registry r;
    return r;
  }
  void enroll() {
    std::lock_guard<std::mutex> lock(registry().m);
    registry().caches.push_back(this);
  }
  /// Returns the free blocks of every other cache of the space to it; the bytes returned.
  std::size_t trim_others() noexcept {
    std::lock_guard<std::mutex> lock(registry().m);
    std::size_t n = 0;
    for (BlockCache* c : registry().caches)
      if (c != this) n += c->trim();
    return n;
  }
  struct Counters {
    std::atomic<std::uint64_t> hits{0}, space_allocations{0}, space_frees{0};
  };
  mutable std::mutex m_;
  std::list<Free> lru_;
  std::multimap<std::size_t, typename std::list<Free>::iterator> by_size_;
  std::size_t cached_ = 0;
  std::size_t cap_ = default_cap;
  MemoryLedger ledger_;
  Counters stats_;
};

/// The block cache of this device (held by the Context; blocks keep it alive).
template <class MemorySpace>
BlockCache<MemorySpace>& block_cache(Context& ctx) {
  struct Holder {
    std::shared_ptr<BlockCache<MemorySpace>> cache = std::make_shared<BlockCache<MemorySpace>>();
  };
  return *ctx.state<Holder>().cache;
}

}  // namespace detail

/// Counts the blocks this thread allocates in its lifetime under `role` (then restores the
/// previous role): `{ sl::MemoryRoleScope s(sl::MemoryRole::optimizer_state); make state }`.
class MemoryRoleScope {
 public:
  explicit MemoryRoleScope(MemoryRole role) noexcept : prev_(detail::current_memory_role()) {
    detail::current_memory_role() = role;
  }
  ~MemoryRoleScope() { detail::current_memory_role() = prev_; }
  MemoryRoleScope(const MemoryRoleScope&) = delete;
  MemoryRoleScope& operator=(const MemoryRoleScope&) = delete;

 private:
  MemoryRole prev_;
};

/// This device's live tensor bytes by role, in `MemorySpace` (host memory by default).
template <class MemorySpace = Kokkos::HostSpace>
MemoryUsage memory_usage(Context& ctx) {
  return detail::block_cache<MemorySpace>(ctx).usage();
}

/// What this device's block cache in `MemorySpace` (host memory by default) has asked of the
/// space: a training step in steady state asks for nothing (`space_allocations` and
/// `space_frees` do not move; on the host, blocks under 64 KiB bypass the cache and are not
/// counted).
template <class MemorySpace = Kokkos::HostSpace>
BlockCacheStats block_cache_stats(Context& ctx) {
  return detail::block_cache<MemorySpace>(ctx).stats();
}

/// Starts this device's peaks (`MemoryUsage::peak` and each role's) over from the bytes live now, in
/// `MemorySpace` (host memory by default): to measure one step's high point.
template <class MemorySpace = Kokkos::HostSpace>
void reset_peak_memory(Context& ctx) {
  detail::block_cache<MemorySpace>(ctx).reset_peak();
}

/// Counts the block of tensor `t` (any `DistributedTensor`) under `role` from now on. The block
/// is shared by every tensor that views it, so they move together. A tensor with an empty block
/// has nothing to move.
template <class Tensor>
void tag_memory(const Tensor& t, MemoryRole role) noexcept {
  if (t.block_owner())
    detail::block_cache<typename Tensor::memory_space>(t.context()).retag(t.block_owner(), role);
}

}  // namespace shardlib
