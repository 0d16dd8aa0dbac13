// SPDX-License-Identifier: Apache-2.0
/// @file
/// Comparing plans: the candidates (a recipe on a mesh) a program planned on shapes alone (the
/// simulate backend, docs/16_planning.md), each with what one device holds, sends and computes
/// in a step, as one table for devices of a given memory: those that fit first, the others after
/// with why they do not.
///
/// The ranking of those that fit is by bytes sent per device and step, least first: a proxy for
/// the step's time until the cost model (issue "planning at scale", item 3) turns bytes and FLOPs
/// into seconds; the table says so in its header.
#pragma once

#include <shardlib/collectives/counters.hpp>
#include <shardlib/memory.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardlib::plan {

/// One candidate's plan: a recipe on a mesh, and one step on one device of it.
struct Candidate {
  std::string name;            ///< "zero3", "dp_tp"
  std::string mesh;            ///< its mesh, "{data: 128, model: 8}"
  int device = 0;              ///< the device planned
  MemoryUsage memory;          ///< the step's memory account (its `peak`: the step's high point)
  coll::CommStats comm;        ///< the step's collectives on that device
  std::uint64_t gemm_flops = 0;  ///< the step's GEMM FLOPs on that device (kernels::flop_count)
  std::string failed;          ///< why it could not be planned (an exception's message); empty when planned
};

/// The table of `candidates` for devices of `device_memory` bytes each (see the file comment).
/// Throws std::invalid_argument for a device memory of 0 or less.
inline std::string table(std::vector<Candidate> candidates, std::int64_t device_memory) {
  if (device_memory <= 0)
    throw std::invalid_argument("shardlib: plan::table: a device memory of " + std::to_string(device_memory) +
                                " bytes; give the devices' memory in bytes, more than 0");
  const auto fits = [&](const Candidate& c) { return c.failed.empty() && c.memory.peak <= device_memory; };
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
    if (fits(a) != fits(b)) return fits(a);
    if (fits(a)) return a.comm.total_bytes_sent() < b.comm.total_bytes_sent();
    if (a.failed.empty() != b.failed.empty()) return a.failed.empty();
    return a.memory.peak < b.memory.peak;
  });
  const auto text = [](std::int64_t b) { return MemoryUsage::bytes_text(b); };
  char line[512];
  std::string s = "plans for devices of " + text(device_memory) +
                  " (one step on one device; those that fit first, least traffic first: time is not predicted yet)\n";
  std::snprintf(line, sizeof line, "  %-4s %-13s %-30s %6s %10s %10s %10s %10s %10s %12s %10s\n", "", "recipe", "mesh",
                "device", "params", "grads", "state", "act. peak", "peak", "sent/step", "GEMM TF");
  s += line;
  int rank = 0;
  std::int64_t smallest = -1;
  for (const Candidate& c : candidates) {
    if (!c.failed.empty()) continue;
    if (smallest < 0 || c.memory.peak < smallest) smallest = c.memory.peak;
    const std::string flag = fits(c) ? std::to_string(++rank) + "." : "--";
    std::snprintf(line, sizeof line, "  %-4s %-13s %-30s %6d %10s %10s %10s %10s %10s %12s %10.4g\n", flag.c_str(),
                  c.name.c_str(), c.mesh.c_str(), c.device, text(c.memory.parameters()).c_str(),
                  text(c.memory.gradients()).c_str(),
                  text(c.memory.optimizer_state()).c_str(), text(c.memory.peak_of(MemoryRole::activations)).c_str(),
                  text(c.memory.peak).c_str(), coll::bytes_text(c.comm.total_bytes_sent()).c_str(),
                  static_cast<double>(c.gemm_flops) * 1e-12);
    s += line;
  }
  for (const Candidate& c : candidates) {
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
  return s;
}

}  // namespace shardlib::plan
