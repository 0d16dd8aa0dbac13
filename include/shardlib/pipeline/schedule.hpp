// SPDX-License-Identifier: Apache-2.0
/// @file
/// Pipeline schedules as data: which micro-batch and which chunk of layers each stage runs, forward
/// or backward, in which time slot. `pipeline::schedule(kind, stages, microbatches, chunks)` builds
/// the table; `to_string()` prints it before anything runs (as `coll::dry_run` does for the
/// collectives), and the runner (runner.hpp) follows exactly that table: each stage runs its ops in
/// the table's order, and the activations and gradients cross the stage boundaries at the slot
/// boundaries the table says.
///
/// The time model: a forward of one chunk of layers for one micro-batch takes one slot, its
/// backward `backward_slots` (2 by default: the backward of a GEMM is two GEMMs; 3 when the
/// forward is recomputed in the backward). An op starts in the first slot where its stage is free
/// and its inputs arrived: a forward needs the previous virtual stage's forward of the micro-batch,
/// a backward the next virtual stage's backward (the last one: its own forward).
///
/// - GPipe: every forward, then every backward (micro-batch order); holds all m micro-batches'
///   activations (or, recomputed, only their inputs).
/// - 1F1B (PipeDream-flush): stage s runs min(p - s - 1, m) forwards, then alternates one forward
///   and one backward, then the remaining backwards: at most p - s micro-batches in flight.
/// - Interleaved 1F1B (Megatron-LM): each stage holds v chunks of layers, virtual stage c p + s;
///   micro-batches go in groups of p through chunk 0, then chunk 1, ...; the bubble is divided by v.
///   m must be a multiple of p (Megatron's rule).
///
/// Pure host code: no tensors, no devices.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardlib::pipeline {

/// A pipeline schedule (see the file comment).
enum class Schedule : std::uint8_t { gpipe, one_f_one_b, interleaved };

/// "gpipe", "1f1b", "interleaved".
constexpr std::string_view to_string(Schedule s) noexcept {
  switch (s) {
    case Schedule::gpipe: return "gpipe";
    case Schedule::one_f_one_b: return "1f1b";
    case Schedule::interleaved: return "interleaved";
  }
  return "?";
}

/// The schedule named `name` ("gpipe", "1f1b", "interleaved"); throws std::invalid_argument
/// listing the names.
inline Schedule schedule_from_string(std::string_view name) {
  for (Schedule s : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved})
    if (to_string(s) == name) return s;
  throw std::invalid_argument("shardlib: pipeline: no schedule named '" + std::string(name) +
                              "' (there are gpipe, 1f1b, interleaved)");
}

/// One op of a stage: the forward or backward of chunk `chunk` (of this stage's `chunks`) for one
/// micro-batch, from slot `start` for `slots` slots.
struct Op {
  bool forward = true;
  int microbatch = 0;
  int chunk = 0;
  int start = 0;
  int slots = 1;
  int end() const noexcept { return start + slots; }
};

/// A schedule's table: per stage, its ops in the order they run, each with its slots.
struct Table {
  Schedule kind = Schedule::gpipe;
  int stages = 1, microbatches = 1, chunks = 1, backward_slots = 2;
  std::vector<std::vector<Op>> ops;  ///< ops[stage], in the order the stage runs them
  int length = 0;                    ///< slots from the first op's start to the last op's end

  /// Virtual stages: stages × chunks; virtual stage c·p + s is chunk c of stage s.
  int virtual_stages() const noexcept { return stages * chunks; }
  int virtual_stage(int stage, int chunk) const noexcept { return chunk * stages + stage; }
  /// The fraction of stage-slots in which a stage is idle: the bubble.
  double bubble() const noexcept {
    long long busy = 0;
    for (const auto& s : ops)
      for (const Op& o : s) busy += o.slots;
    const long long all = static_cast<long long>(length) * stages;
    return all ? 1.0 - static_cast<double>(busy) / static_cast<double>(all) : 0.0;
  }
  /// The bubble of the ideal schedule: (p − 1) / (v·m + p − 1).
  double ideal_bubble() const noexcept {
    return static_cast<double>(stages - 1) / static_cast<double>(chunks * microbatches + stages - 1);
  }
  /// The most (micro-batch, chunk) forwards whose backward had not run yet, over the stage's ops:
  /// how many sets of activations the stage holds at its high point.
  int peak_in_flight(int stage) const {
    int now = 0, peak = 0;
    for (const Op& o : ops.at(static_cast<std::size_t>(stage))) {
      now += o.forward ? 1 : -1;
      peak = std::max(peak, now);
    }
    return peak;
  }
  /// The forwards alone (an evaluation or inference pass: no backward), each stage's in this
  /// table's order, each as early as its input allows.
  Table forwards() const;
  /// The table as text: a header, then a row per stage and a column per slot ("F3" the forward
  /// of micro-batch 3, "B3" its backward over its slots, "F3:1" chunk 1's forward, "." idle).
  std::string to_string() const {
    const bool chunked = chunks > 1;
    std::vector<std::vector<std::string>> cell(static_cast<std::size_t>(stages),
                                               std::vector<std::string>(static_cast<std::size_t>(length), "."));
    std::size_t width = 1;
    for (int s = 0; s < stages; ++s)
      for (const Op& o : ops[static_cast<std::size_t>(s)]) {
        std::string c = (o.forward ? "F" : "B") + std::to_string(o.microbatch);
        if (chunked) c += ":" + std::to_string(o.chunk);
        width = std::max(width, c.size());
        for (int t = o.start; t < o.end(); ++t) cell[static_cast<std::size_t>(s)][static_cast<std::size_t>(t)] = c;
      }
    char head[256];
    std::snprintf(head, sizeof head, "%s: %d stages, %d micro-batches%s, %d slots (forward 1, backward %d); bubble %.3f (ideal %.3f)\n",
                  std::string(pipeline::to_string(kind)).c_str(), stages, microbatches,
                  chunked ? (", " + std::to_string(chunks) + " chunks per stage").c_str() : "", length, backward_slots,
                  bubble(), ideal_bubble());
    std::string out = head;
    for (int s = 0; s < stages; ++s) {
      out += "stage " + std::to_string(s) + (s < 10 ? " " : "") + " |";
      for (const std::string& c : cell[static_cast<std::size_t>(s)]) out += " " + c + std::string(width - c.size(), ' ');
      out += " | in flight at most " + std::to_string(peak_in_flight(s)) + "\n";
    }
    return out;
  }
};

namespace detail {
[[noreturn]] inline void bad_schedule(Schedule kind, const std::string& what) {
  throw std::invalid_argument("shardlib: pipeline schedule " + std::string(to_string(kind)) + ": " + what);
}

/// Stage s's ops, in order (slots not yet assigned).
inline std::vector<Op> stage_order(Schedule kind, int p, int m, int v, int s, int b) {
  std::vector<Op> f, bw, out;
  if (kind == Schedule::interleaved) {  // Megatron-LM's order: groups of p micro-batches per chunk
    for (int k = 0; k < m * v; ++k) {
      const int group = k / (p * v), within = k % (p * v), mb = group * p + within % p;
      f.push_back({true, mb, within / p, 0, 1});
      bw.push_back({false, mb, v - 1 - within / p, 0, b});
    }
  } else {
    for (int mb = 0; mb < m; ++mb) {
      f.push_back({true, mb, 0, 0, 1});
      bw.push_back({false, mb, 0, 0, b});
    }
  }
  const int n = static_cast<int>(f.size());
  int warmup = n;  // GPipe: every forward first
  if (kind == Schedule::one_f_one_b) warmup = std::min(p - s - 1, n);
  if (kind == Schedule::interleaved) warmup = std::min((p - s - 1) * 2 + (v - 1) * p, n);
  for (int k = 0; k < warmup; ++k) out.push_back(f[static_cast<std::size_t>(k)]);
  for (int k = warmup; k < n; ++k) {  // steady state: one forward, one backward
    out.push_back(f[static_cast<std::size_t>(k)]);
    out.push_back(bw[static_cast<std::size_t>(k - warmup)]);
  }
  for (int k = n - warmup; k < n; ++k) out.push_back(bw[static_cast<std::size_t>(k)]);
  return out;
}
/// Gives each op of `t` its slots: each starts in the first slot where its stage is free and its
/// input has arrived (t.ops' order per stage kept). Sets t.length.
inline void assign_slots(Table& t) {
  const Schedule kind = t.kind;
  const int stages = t.stages, microbatches = t.microbatches;
  t.length = 0;
  const int V = stages * t.chunks;
  std::vector<int> fwd_end(static_cast<std::size_t>(V * microbatches), -1), bwd_end(fwd_end);
  auto at = [&](int vs, int mb) { return static_cast<std::size_t>(vs * microbatches + mb); };
  std::vector<std::size_t> next(static_cast<std::size_t>(stages), 0);
  std::vector<int> free(static_cast<std::size_t>(stages), 0);
  std::size_t left = 0;
  for (const auto& s : t.ops) left += s.size();
  for (int slot = 0; left > 0; ++slot) {
    if (slot > 1000000000) throw std::logic_error("shardlib: pipeline schedule: the ops never finish (a bug in the order)");
    bool progress = false;
    for (int s = 0; s < stages; ++s) {
      auto& ops = t.ops[static_cast<std::size_t>(s)];
      std::size_t& k = next[static_cast<std::size_t>(s)];
      if (k == ops.size() || free[static_cast<std::size_t>(s)] > slot) continue;
      Op& o = ops[k];
      const int vs = t.virtual_stage(s, o.chunk);
      const int ready = o.forward ? (vs == 0 ? 0 : fwd_end[at(vs - 1, o.microbatch)])
                                  : (vs == V - 1 ? fwd_end[at(vs, o.microbatch)] : bwd_end[at(vs + 1, o.microbatch)]);
      if (ready < 0 || ready > slot) continue;
      o.start = slot;
      (o.forward ? fwd_end : bwd_end)[at(vs, o.microbatch)] = o.end();
      free[static_cast<std::size_t>(s)] = o.end();
      t.length = std::max(t.length, o.end());
      ++k;
      --left;
      progress = true;
    }
    if (!progress) {
      bool busy = false;
      for (int s = 0; s < stages; ++s) busy = busy || free[static_cast<std::size_t>(s)] > slot;
      if (!busy) throw std::logic_error("shardlib: pipeline schedule " + std::string(to_string(kind)) + ": the order deadlocks at slot " + std::to_string(slot));
    }
  }
}
}  // namespace detail

/// The table of schedule `kind` for `stages` stages (p), `microbatches` micro-batches (m) and
/// `chunks` chunks of layers per stage (v: 1 but for interleaved, which needs 2 or more); a
/// backward takes `backward_slots` slots (>= 1). Throws std::invalid_argument naming the bad count.
/// m < p runs (1F1B then holds m, with a larger bubble: the table shows it).
inline Table schedule(Schedule kind, int stages, int microbatches, int chunks = 1, int backward_slots = 2) {
  if (stages < 1) detail::bad_schedule(kind, std::to_string(stages) + " stages: there must be at least 1");
  if (microbatches < 1)
    detail::bad_schedule(kind, std::to_string(microbatches) + " micro-batches: there must be at least 1");
  if (backward_slots < 1)
    detail::bad_schedule(kind, "a backward of " + std::to_string(backward_slots) + " slots: it takes at least 1");
  if (kind != Schedule::interleaved && chunks != 1)
    detail::bad_schedule(kind, std::to_string(chunks) + " chunks per stage: only the interleaved schedule has more than 1");
  if (kind == Schedule::interleaved) {
    if (chunks < 2)
      detail::bad_schedule(kind, std::to_string(chunks) + " chunks per stage: the interleaved schedule needs 2 or more");
    if (microbatches % stages != 0)
      detail::bad_schedule(kind, std::to_string(microbatches) + " micro-batches on " + std::to_string(stages) +
                                     " stages: interleaving takes micro-batches in groups of the stage count (m a multiple of p)");
  }
  Table t;
  t.kind = kind;
  t.stages = stages;
  t.microbatches = microbatches;
  t.chunks = chunks;
  t.backward_slots = backward_slots;
  for (int s = 0; s < stages; ++s) t.ops.push_back(detail::stage_order(kind, stages, microbatches, chunks, s, backward_slots));
  detail::assign_slots(t);
  return t;
}

inline Table Table::forwards() const {
  Table t = *this;
  for (auto& ops : t.ops) std::erase_if(ops, [](const Op& o) { return !o.forward; });
  detail::assign_slots(t);
  return t;
}

/// The layers [first, last) of `layers` that chunk `chunk` of stage `stage` holds under `t`: the
/// layers in order over the virtual stages (chunk c of stage s is virtual stage c·p + s). With one
/// chunk per stage the stages may be uneven (the first layers % p stages hold one more); the
/// interleaved schedule needs layers a multiple of p·v. Throws std::invalid_argument naming the
/// counts when there are more virtual stages than layers or the layers do not split.
inline std::pair<int, int> layers_of(const Table& t, int layers, int stage, int chunk) {
  const int V = t.virtual_stages();
  if (layers < V)
    throw std::invalid_argument("shardlib: pipeline: " + std::to_string(layers) + " layers cannot fill " + std::to_string(t.stages) +
                                " stages" + (t.chunks > 1 ? " of " + std::to_string(t.chunks) + " chunks" : std::string()) +
                                ": every virtual stage needs a layer (" + std::to_string(V) + " needed)");
  if (t.chunks > 1 && layers % V != 0)
    throw std::invalid_argument("shardlib: pipeline: " + std::to_string(layers) + " layers on " + std::to_string(t.stages) +
                                " stages of " + std::to_string(t.chunks) + " chunks: each stage's layers must split into " +
                                std::to_string(t.chunks) + " equal chunks (layers a multiple of " + std::to_string(V) + ")");
  if (stage < 0 || stage >= t.stages || chunk < 0 || chunk >= t.chunks)
    throw std::out_of_range("shardlib: pipeline: layers_of stage " + std::to_string(stage) + " chunk " + std::to_string(chunk) +
                            " of a table of " + std::to_string(t.stages) + " stages and " + std::to_string(t.chunks) + " chunks");
  const int vs = t.virtual_stage(stage, chunk), base = layers / V, extra = layers % V;
  const int first = vs * base + std::min(vs, extra);
  return {first, first + base + (vs < extra ? 1 : 0)};
}

}  // namespace shardlib::pipeline
