// SPDX-License-Identifier: Apache-2.0
/// @file
/// Comparing plans: the candidates (a recipe on a mesh) a program planned on shapes alone (the
/// simulate backend, docs/16_planning.md), each with what one device holds, sends and computes
/// in a step, as one table for devices of a profile (plan/profile.hpp): those that fit in the
/// device's memory first, fastest first by the cost model's step time (plan/cost.hpp), with
/// tokens per second and the fraction of the device's peak; the others after, with why they do
/// not fit.
#pragma once

#include <shardlib/collectives/counters.hpp>
#include <shardlib/memory.hpp>
#include <shardlib/plan/cost.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardlib::plan {

/// One candidate's plan: a recipe on a mesh, and one step on one device of it (and what other
/// devices planned compute and send: the step's time is the slowest's).
struct Candidate {
  std::string name;      ///< "zero3", "dp_tp"
  std::string mesh;      ///< its mesh, "{data: 128, model: 8}"
  int device = 0;        ///< the device planned
  MemoryUsage memory;    ///< the step's memory account (its `peak`: the step's high point)
  coll::CommStats comm;  ///< the step's collectives on that device
  Work work;             ///< what the device computes and sends in the step (the cost model's input)
  /// What other devices of the same mesh compute and send in the step, where they were planned
  /// too (a pipeline's last stage, with the LM head, beside its first): a step ends when its
  /// slowest device does, so the candidate's time is the largest of theirs and `work`'s.
  std::vector<Work> other_devices;
  std::string failed;  ///< why it could not be planned (an exception's message); empty when planned

  /// The work of the slowest device planned (`work` or one of `other_devices`) on devices of
  /// `profile`, and its step time: the candidate's.
  std::pair<const Work*, StepTime> slowest_time(const Profile& profile) const {
    std::pair<const Work*, StepTime> s{&work, predict(work, profile)};
    for (const Work& o : other_devices)
      if (const StepTime t = predict(o, profile); t.total() > s.second.total()) s = {&o, t};
    return s;
  }
  /// The work of the slowest device planned on devices of `profile`.
  const Work& slowest(const Profile& profile) const { return *slowest_time(profile).first; }
  /// The cost model's step time on devices of `profile`: the slowest planned device's.
  StepTime time(const Profile& profile) const { return slowest_time(profile).second; }
};

/// The table of `candidates` on devices of `profile`, each step `tokens_per_step` tokens of the
/// whole mesh (see the file comment). Throws std::invalid_argument for a profile whose memory is
/// 0 or less.
inline std::string table(std::vector<Candidate> candidates, const Profile& profile, std::int64_t tokens_per_step) {
  const std::int64_t device_memory = profile.memory;
  if (device_memory <= 0)
    throw std::invalid_argument("shardlib: plan::table: a device memory of " + std::to_string(device_memory) +
                                " bytes; give the devices' memory in bytes, more than 0");
  const auto fits = [&](const Candidate& c) { return c.failed.empty() && c.memory.peak <= device_memory; };
  struct Row {
    Candidate c;
    StepTime t;               // the slowest planned device's step time
    std::uint64_t gemm_flops;  // ... and its GEMM FLOPs
  };
  std::vector<Row> rows;
  for (Candidate& c : candidates) {
    Row r{std::move(c), {}, 0};
    if (r.c.failed.empty()) {
      const auto [w, t] = r.c.slowest_time(profile);
      r.t = t;
      r.gemm_flops = w->gemm_flops;
    }
    rows.push_back(std::move(r));
  }
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    if (fits(a.c) != fits(b.c)) return fits(a.c);
    if (fits(a.c)) return a.t.total() < b.t.total();
    if (a.c.failed.empty() != b.c.failed.empty()) return a.c.failed.empty();
    return a.c.memory.peak < b.c.memory.peak;
  });
  const auto text = [](std::int64_t b) { return MemoryUsage::bytes_text(b); };
  char line[640];
  std::string s = "plans for " + profile.name + " devices of " + text(device_memory) + ", " +
                  std::to_string(profile.node_size) +
                  " to a node (one step on one device; those that fit first, fastest first)\n";
  std::snprintf(line, sizeof line, "  %-4s %-15s %-32s %6s %9s %9s %9s %9s %9s %9s %10s %10s %10s %9s %7s\n", "", "recipe",
                "mesh", "device", "params", "grads", "state", "act. peak", "tmp. peak", "peak", "intra/step",
                "inter/step", "step (ms)", "tok/s", "of peak");
  s += line;
  int rank = 0;
  std::int64_t smallest = -1;
  for (const auto& [c, t, gemm_flops] : rows) {
    if (!c.failed.empty()) continue;
    if (smallest < 0 || c.memory.peak < smallest) smallest = c.memory.peak;
    const std::string flag = fits(c) ? std::to_string(++rank) + "." : "--";
    const double secs = t.total();
    const double tok = secs > 0 ? static_cast<double>(tokens_per_step) / secs : 0;
    const double of_peak = secs > 0 && profile.peak_flops > 0
                               ? static_cast<double>(gemm_flops) / secs / profile.peak_flops
                               : 0;
    std::snprintf(line, sizeof line, "  %-4s %-15s %-32s %6d %9s %9s %9s %9s %9s %9s %10s %10s %10.4g %9.3g %6.1f%%\n",
                  flag.c_str(), c.name.c_str(), c.mesh.c_str(), c.device, text(c.memory.parameters()).c_str(),
                  text(c.memory.gradients()).c_str(), text(c.memory.optimizer_state()).c_str(),
                  text(c.memory.peak_of(MemoryRole::activations)).c_str(),
                  text(c.memory.peak_of(MemoryRole::temporaries)).c_str(), text(c.memory.peak).c_str(),
                  coll::bytes_text(t.intra_bytes).c_str(), coll::bytes_text(t.inter_bytes).c_str(), secs * 1e3, tok,
                  100 * of_peak);
    s += line;
  }
  for (const Row& r : rows) {
    const Candidate& c = r.c;
    if (fits(c)) continue;
    s += "  excluded: " + c.name + " on " + c.mesh + ": ";
    s += c.failed.empty() ? "needs " + text(c.memory.peak) + " at its peak, more than the " + text(device_memory)
                          : c.failed;
    s += "\n";
  }
  if (rank == 0)
    s += smallest >= 0 ? "  nothing fits: the smallest peak is " + text(smallest) + " per device (more devices, or "
                                                                                       "devices with that much memory)\n"
                       : "  nothing could be planned\n";
  s += "  step: GEMMs + other kernels + the pipeline's bubble + collectives (nothing overlapped; plan/cost.hpp), of "
       "the slowest device planned; of peak: its GEMM FLOPs counted (recomputation included) per second, over the "
       "device's peak; memory: the device shown\n";
  for (const std::string& n : profile.notes) s += "  profile: " + n + "\n";
  return s;
}

/// Each part of `t` in milliseconds, one line: "GEMMs 12.1 ms, kernels 3.0 ms, bubble 0 ms, intra-node 2.2 ms
/// (1.5 GiB), inter-node 0 ms (0 B): 17.3 ms".
inline std::string breakdown(const StepTime& t) {
  char b[320];
  std::snprintf(b, sizeof b,
                "GEMMs %.4g ms, other kernels %.4g ms, bubble %.4g ms, intra-node %.4g ms (%s sent), inter-node "
                "%.4g ms (%s sent): %.4g ms",
                t.gemm * 1e3, t.kernels * 1e3, t.bubble * 1e3, t.intra_node * 1e3,
                coll::bytes_text(t.intra_bytes).c_str(), t.inter_node * 1e3, coll::bytes_text(t.inter_bytes).c_str(),
                t.total() * 1e3);
  return b;
}

}  // namespace shardlib::plan
