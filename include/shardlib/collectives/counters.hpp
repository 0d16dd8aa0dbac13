// SPDX-License-Identifier: Apache-2.0
/// @file
/// Counting what collectives cost: calls and bytes per collective kind, for this device.
///
/// A `CommRecorder` (DTensor's CommDebugMode is the model) counts every collective that the
/// current device calls while it is alive. Devices are threads under the `threads` backend and
/// processes under `mpi`, so the active recorders are per thread. Recorders nest: each one
/// alive on the thread sees every call.
///
/// Bytes are the payload this device sends to and receives from *other* devices, as the
/// algorithm-independent minimum (nccl-tests' conventions):
/// | kind | bytes_sent | bytes_received |
/// |---|---|---|
/// | all_gather | own piece × (n-1) | the other pieces |
/// | reduce_scatter | input − own block | own block × (n-1) |
/// | all_reduce | 2(n-1)/n × buffer | 2(n-1)/n × buffer |
/// | all_to_all, exchange | input − block kept | output − block kept |
/// | broadcast | root: buffer × (n-1) | others: buffer |
/// | send / recv / permute | what goes to another device | what comes from another device |
///
/// exchange (an all-to-all of strided regions) counts as all_to_all: its bytes are the regions
/// for and from the other ranks, the self pair left out.
///
/// A recorder made with `keep_calls` also keeps each call in order (kind, group, bytes): the
/// trace of a block of code. `coll::trace(f)` runs `f` under such a recorder and returns it as a
/// `CommTrace`, whose `to_string()` is one line per collective:
///
/// ```
/// 3 collectives: 1.50 MiB sent, 1.50 MiB received (this device)
///   1. all_gather over group {data} of mesh {data: 4, model: 2} (4 devices): 384 KiB sent, 384 KiB received
/// ```
///
/// shardlib's collectives follow from the tensors' types, shapes and mesh, never from their
/// values, so the trace of one training step is the plan of every step with the same shapes
/// (but for a mixture-of-experts layer's all-to-alls, which send the tokens its router chose:
/// moe/moe.hpp).
///
/// `coll::dry_run(f)` is the trace of `f` before it runs for real: while it runs `f`, every
/// collective of this device is counted but not performed (no data moves, no device waits for
/// another); each receive buffer gets what this device contributed itself and zeros in place
/// of the others' parts (all_gather: its own block; reduce_scatter: its own block of its input;
/// all_reduce: its input; all_to_all and exchange: the pair to itself; broadcast from another
/// root, recv, a permute from another device: zeros). The local work of `f` runs on those values,
/// so what `f` computes is meaningless: dry-run a step on state you throw away (a model made for
/// it, copies), never on the parameters you train. Every device of the group must dry-run the
/// same code; a branch on a value that came from a collective may differ from the real run.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace shardlib::coll {

/// Kinds of collective, as counted.
enum class Kind : std::uint8_t { all_gather, reduce_scatter, all_reduce, all_to_all, broadcast, send, recv, permute, barrier };
inline constexpr int num_kinds = 9;

constexpr std::string_view name(Kind k) noexcept {
  constexpr std::string_view names[] = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast",
                                        "send",       "recv",           "permute",    "barrier"};
  return names[static_cast<int>(k)];
}

/// What one kind of collective cost.
struct KindStats {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
};

/// "1.50 MiB", "384 KiB", "96 B": a byte count as people read it.
inline std::string bytes_text(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return std::to_string(b) + " B";
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

/// One collective call, as a recorder with `keep_calls` saw it.
struct CallRecord {
  Kind kind{};
  std::string group;   ///< the communicator's name: "world", "group {model} of mesh {data: 4, model: 2}"
  int group_size = 0;  ///< devices in the group
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  /// The lowest and highest device of the run (world rank) the call joins: the group's members,
  /// or for send, recv and permute this device and its peers; -1 when unknown (a group not made
  /// by Context::group). Whether a call stays within a node follows from them (plan/cost.hpp).
  int first_device = -1, last_device = -1;

  /// "all_gather over group {data} of mesh {data: 4} (4 devices): 384 KiB sent, 384 KiB received".
  std::string to_string() const {
    return std::string(name(kind)) + " over " + group + " (" + std::to_string(group_size) + " device" +
           (group_size == 1 ? "" : "s") + "): " + bytes_text(bytes_sent) + " sent, " + bytes_text(bytes_received) +
           " received";
  }
};

/// Tag: a recorder that keeps each call (see the file comment).
struct KeepCalls {};
inline constexpr KeepCalls keep_calls{};

/// Calls and bytes per kind: what a recorder counted, as a value that outlives it.
struct CommStats {
  std::array<KindStats, num_kinds> kinds{};

  const KindStats& operator[](Kind k) const noexcept { return kinds[static_cast<std::size_t>(k)]; }
  KindStats& operator[](Kind k) noexcept { return kinds[static_cast<std::size_t>(k)]; }
  /// Calls of every kind (barriers included).
  std::uint64_t total_calls() const noexcept {
    std::uint64_t n = 0;
    for (const auto& s : kinds) n += s.calls;
    return n;
  }
  std::uint64_t total_bytes_sent() const noexcept {
    std::uint64_t n = 0;
    for (const auto& s : kinds) n += s.bytes_sent;
    return n;
  }
  std::uint64_t total_bytes_received() const noexcept {
    std::uint64_t n = 0;
    for (const auto& s : kinds) n += s.bytes_received;
    return n;
  }
  /// One line per kind that was called: "all_reduce: 2 calls, 96 B sent, 96 B received".
  std::string to_string() const {
    std::string s;
    for (int k = 0; k < num_kinds; ++k) {
      const auto& st = kinds[static_cast<std::size_t>(k)];
      if (st.calls == 0) continue;
      s += std::string(name(static_cast<Kind>(k))) + ": " + std::to_string(st.calls) + " call" +
           (st.calls == 1 ? "" : "s") + ", " + std::to_string(st.bytes_sent) + " B sent, " +
           std::to_string(st.bytes_received) + " B received\n";
    }
    return s;
  }
};

/// Counts collectives called by this device while alive (see the file comment).
class CommRecorder {
 public:
  CommRecorder() : prev_(top()) { top() = this; }
  /// Counts and keeps each call in order (`calls()`).
  explicit CommRecorder(KeepCalls) : CommRecorder() { keep_ = true; }
  CommRecorder(const CommRecorder&) = delete;
  CommRecorder& operator=(const CommRecorder&) = delete;
  ~CommRecorder() { top() = prev_; }

  const KindStats& operator[](Kind k) const noexcept { return stats_[k]; }
  /// Calls of every kind (barriers included).
  std::uint64_t total_calls() const noexcept { return stats_.total_calls(); }
  std::uint64_t total_bytes_sent() const noexcept { return stats_.total_bytes_sent(); }
  std::uint64_t total_bytes_received() const noexcept { return stats_.total_bytes_received(); }
  void reset() noexcept {
    stats_ = {};
    calls_.clear();
  }
  /// What was counted so far, as a value.
  const CommStats& stats() const noexcept { return stats_; }
  /// The calls in order (empty unless made with `keep_calls`).
  const std::vector<CallRecord>& calls() const noexcept { return calls_; }

  /// One line per kind that was called: "all_reduce: 2 calls, 96 B sent, 96 B received".
  std::string to_string() const { return stats_.to_string(); }

  /// Adds one call of the group `group` (of `group_size` devices) to every recorder alive on this
  /// thread (called by Communicator). A recorder that keeps calls and cannot grow its list drops
  /// the call from the list (it is still counted).
  static void record(Kind k, std::uint64_t sent, std::uint64_t received, std::string_view group = {},
                     int group_size = 0, int first_device = -1, int last_device = -1) noexcept {
    for (CommRecorder* r = top(); r; r = r->prev_) {
      auto& st = r->stats_[k];
      ++st.calls;
      st.bytes_sent += sent;
      st.bytes_received += received;
      if (r->keep_) {
        try {
          r->calls_.push_back(CallRecord{k, std::string(group), group_size, sent, received, first_device, last_device});
        } catch (...) {  // out of memory: the counts stay right
        }
      }
    }
  }

 private:
  static CommRecorder*& top() noexcept {
    static thread_local CommRecorder* t = nullptr;
    return t;
  }
  CommRecorder* prev_;
  CommStats stats_{};
  bool keep_ = false;
  std::vector<CallRecord> calls_;
};

/// The collectives a block of code called on this device, in order, with their bytes: what
/// `coll::trace` returns (see the file comment).
struct CommTrace {
  CommStats totals;
  std::vector<CallRecord> calls;

  /// A first line of totals, then one numbered line per call (barriers included).
  std::string to_string() const {
    std::string s = std::to_string(calls.size()) + (calls.size() == 1 ? " collective" : " collectives") + ": " +
                    bytes_text(totals.total_bytes_sent()) + " sent, " + bytes_text(totals.total_bytes_received()) +
                    " received (this device)\n";
    for (std::size_t i = 0; i < calls.size(); ++i) s += "  " + std::to_string(i + 1) + ". " + calls[i].to_string() + "\n";
    return s;
  }
};

/// Runs `f()` on this device and returns the collectives it called, in order, with bytes (and
/// its result is dropped). Every device of the group must run it, as it runs `f`. An exception
/// from `f` propagates.
template <class F>
CommTrace trace(F&& f) {
  CommRecorder rec(keep_calls);
  static_cast<F&&>(f)();
  return CommTrace{rec.stats(), rec.calls()};
}

/// While alive on this device (thread), collectives are counted and not performed (see
/// `dry_run` in the file comment). Scopes nest.
class DryRun {
 public:
  DryRun() noexcept : prev_(flag()) { flag() = true; }
  DryRun(const DryRun&) = delete;
  DryRun& operator=(const DryRun&) = delete;
  ~DryRun() { flag() = prev_; }
  /// Whether this device is in a dry run now.
  static bool active() noexcept { return flag(); }

 private:
  static bool& flag() noexcept {
    static thread_local bool f = false;
    return f;
  }
  bool prev_;
};

/// The collectives `f()` would call on this device, in order, with bytes, without performing
/// them (see the file comment: `f`'s values are meaningless).
template <class F>
CommTrace dry_run(F&& f) {
  DryRun dry;
  return trace(static_cast<F&&>(f));
}

}  // namespace shardlib::coll
