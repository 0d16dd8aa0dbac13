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
#pragma once

#include <array>
#include <cstdint>
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
  CommRecorder(const CommRecorder&) = delete;
  CommRecorder& operator=(const CommRecorder&) = delete;
  ~CommRecorder() { top() = prev_; }

  const KindStats& operator[](Kind k) const noexcept { return stats_[k]; }
  /// Calls of every kind (barriers included).
  std::uint64_t total_calls() const noexcept { return stats_.total_calls(); }
  std::uint64_t total_bytes_sent() const noexcept { return stats_.total_bytes_sent(); }
  std::uint64_t total_bytes_received() const noexcept { return stats_.total_bytes_received(); }
  void reset() noexcept { stats_ = {}; }
  /// What was counted so far, as a value.
  const CommStats& stats() const noexcept { return stats_; }

  /// One line per kind that was called: "all_reduce: 2 calls, 96 B sent, 96 B received".
  std::string to_string() const { return stats_.to_string(); }

  /// Adds one call to every recorder alive on this thread (called by Communicator).
  static void record(Kind k, std::uint64_t sent, std::uint64_t received) noexcept {
    for (CommRecorder* r = top(); r; r = r->prev_) {
      auto& st = r->stats_[k];
      ++st.calls;
      st.bytes_sent += sent;
      st.bytes_received += received;
    }
  }

 private:
  static CommRecorder*& top() noexcept {
    static thread_local CommRecorder* t = nullptr;
    return t;
  }
  CommRecorder* prev_;
  CommStats stats_{};
};

}  // namespace shardlib::coll
