// SPDX-License-Identifier: Apache-2.0
/// @file
/// What a device and its links can do, for the cost model (plan/cost.hpp): a `Profile`. Three
/// come with the library, each figure with its source (`Profile::preset`: "h100", "h200",
/// "a100"); `benchmarks/run calibrate` measures one on the machine at hand and writes it as JSON,
/// which `Profile::load` reads back (docs/16_planning.md, "Calibrating").
///
/// A link is what a collective crosses: `intra_node` (NVLink, or the memory of one host) or
/// `inter_node` (InfiniBand, Ethernet). Each has a latency α (seconds per step of the
/// algorithm) and a bus bandwidth (bytes per second per device, nccl-tests' `busbw`: the
/// algorithm-independent bytes a device sends, which the collectives' counters record, divided by
/// the time).
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace shardlib::plan {

/// Where a collective runs: between devices of one node, or across nodes.
enum class LinkKind { intra_node, inter_node };

constexpr std::string_view to_string(LinkKind k) noexcept { return k == LinkKind::intra_node ? "intra_node" : "inter_node"; }

/// One kind of link (see the file comment).
struct Link {
  double latency = 0;    ///< α: seconds per step of a collective's algorithm
  double bandwidth = 0;  ///< bus bandwidth: bytes per second per device
  std::string source;    ///< where the figures come from
};

/// A device type, its node and its links (see the file comment).
struct Profile {
  std::string name;             ///< "h100", "host"
  std::string source;           ///< where the device's figures come from
  double gemm_rate = 0;         ///< sustained FLOP/s of large GEMMs
  double gemm_call = 0;         ///< seconds per GEMM call besides its FLOPs (launch, packing)
  /// Seconds per product of a GEMM call besides its FLOPs: a host BLAS runs a batch as one call a
  /// matrix (bench_calibrate fits this, not gemm_call); 0 where a batch is one call (cuBLAS).
  double gemm_product = 0;
  /// Sustained FLOP/s of the products in a batched GEMM call (attention's per-head products, far
  /// smaller than a layer's: 48-63 GFLOP/s on a Xeon core where a layer's ran at 210-260); 0: as
  /// gemm_rate (the presets: not measured on a GPU).
  double batched_gemm_rate = 0;
  double memory_bandwidth = 0;  ///< bytes per second of the memory-bound kernels
  double kernel_call = 0;       ///< seconds per memory-bound kernel call besides its bytes
  double peak_flops = 0;        ///< the datasheet's peak FLOP/s (MFU's denominator; 0: unknown)
  std::int64_t memory = 0;      ///< bytes of memory per device
  int node_size = 1;            ///< devices per node
  /// The devices that take turns on one device's compute: a host's in-process devices (or
  /// processes) over its cores, as bench_calibrate found them; 1 where each has its own (a GPU).
  /// The rates above are each device's share while all compute; the cost model's bubble uses it.
  double shared = 1;
  Link intra_node, inter_node;
  std::vector<std::string> notes;  ///< what load() took from a default, said once

  const Link& link(LinkKind k) const noexcept { return k == LinkKind::intra_node ? intra_node : inter_node; }

  /// The names preset() knows.
  static std::vector<std::string> presets() { return {"h100", "h200", "a100"}; }

  /// A device type from published and measured figures, each named in its `source`. Throws
  /// std::invalid_argument for another name, listing the known ones.
  static Profile preset(std::string_view name) {
    // Intra-node bus bandwidth: nccl-tests' all_reduce busbw at large sizes on 8 GPUs of one node.
    const std::string nccl_tests = "nccl-tests all_reduce busbw at large sizes, 8 GPUs of one node (Alaya NeW, "
                                   "\"NCCL-tests in practice\", 2026: ";
    const std::string latency = "; latency assumed (NCCL's per-step cost, a few microseconds)";
    Profile p;
    p.name = std::string(name);
    if (name == "h100" || name == "h200") {
      const bool h200 = name == "h200";
      p.source = std::string("NVIDIA ") + (h200 ? "H200 SXM 141 GB" : "H100 SXM 80 GB") +
                 ": GEMM rate, per-call costs and copy bandwidth measured by shardlib on an H100 and an H200 "
                 "(docs/13, \"What has run where\": bf16 matmul 618-690 TFLOP/s, a launch 3.9-6.6 us, a "
                 "cuBLAS call 6.4-11.3 us, a device copy 4.14-4.22 TB/s on the H200, 0.87 of its 4.8 TB/s); "
                 "peak: the datasheet's 989.4 TFLOP/s bf16 dense";
      p.gemm_rate = 650e12;
      p.gemm_call = 8e-6;
      p.memory_bandwidth = 0.87 * (h200 ? 4.8e12 : 3.35e12);
      p.kernel_call = 5e-6;
      p.peak_flops = 989.4e12;
      p.memory = h200 ? 141'000'000'000LL : 80LL << 30;
      p.node_size = 8;
      p.intra_node = {3e-6, 460e9, nccl_tests + "8xH100 SXM5 460-480 GB/s; NVLink 4, 450 GB/s each way)" + latency};
      p.inter_node = {8e-6, 0.9 * 50e9,
                      "one 400 Gb/s NDR InfiniBand NIC per GPU (DGX H100: 8 ConnectX-7), 50 GB/s, at an assumed "
                      "0.9 of line rate" +
                          latency};
      return p;
    }
    if (name == "a100") {
      p.source = "NVIDIA A100 SXM 80 GB: peak the datasheet's 312 TFLOP/s bf16 dense; GEMM rate assumed at the "
                 "fraction of the peak shardlib measured on the H100 (650 / 989.4); per-call costs as measured "
                 "on the H100; memory the datasheet's 2.039 TB/s at 0.87 (a copy's fraction on the H200)";
      p.gemm_rate = 312e12 * 650 / 989.4;
      p.gemm_call = 8e-6;
      p.memory_bandwidth = 0.87 * 2.039e12;
      p.kernel_call = 5e-6;
      p.peak_flops = 312e12;
      p.memory = 80LL << 30;
      p.node_size = 8;
      p.intra_node = {3e-6, 240e9, nccl_tests + "8xA100 SXM4 230-250 GB/s; NVLink 3)" + latency};
      p.inter_node = {8e-6, 0.9 * 25e9,
                      "one 200 Gb/s HDR InfiniBand NIC per GPU (DGX A100, Selene: 8 per node), 25 GB/s, at an "
                      "assumed 0.9 of line rate" +
                          latency};
      return p;
    }
    std::string known;
    for (const auto& n : presets()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("shardlib: no device profile '" + std::string(name) + "' (the presets: " + known +
                                "; or a file that benchmarks/run calibrate wrote)");
  }

  /// The profile as JSON (what benchmarks/run calibrate writes, what load() reads). A link of no
  /// bandwidth (not measured) is left out: load() then takes the named default and says so.
  std::string to_json() const {
    std::string s = "{\n";
    auto str = [&](const char* k, const std::string& v, bool more = true) {
      s += std::string("  \"") + k + "\": \"" + escape(v) + "\"" + (more ? ",\n" : "\n");
    };
    auto num = [&](const char* k, double v) {
      char b[64];
      std::snprintf(b, sizeof b, "%.9g", v);
      s += std::string("  \"") + k + "\": " + b + ",\n";
    };
    auto link = [&](const char* k, const Link& l) {
      if (!(l.bandwidth > 0)) return;
      char b[128];
      std::snprintf(b, sizeof b, "{\"latency\": %.9g, \"bandwidth\": %.9g, \"source\": ", l.latency, l.bandwidth);
      s += std::string("  \"") + k + "\": " + b + "\"" + escape(l.source) + "\"},\n";
    };
    str("name", name);
    str("source", source);
    num("gemm_rate", gemm_rate);
    num("gemm_call", gemm_call);
    num("gemm_product", gemm_product);
    num("batched_gemm_rate", batched_gemm_rate);
    num("memory_bandwidth", memory_bandwidth);
    num("kernel_call", kernel_call);
    num("peak_flops", peak_flops);
    num("shared", shared);
    s += "  \"memory\": " + std::to_string(memory) + ",\n";
    link("intra_node", intra_node);
    link("inter_node", inter_node);
    return s + "  \"node_size\": " + std::to_string(node_size) + "\n}\n";
  }

  /// Reads a profile from JSON text (`what`: its name in messages). A link kind it lacks comes
  /// from preset `fallback` and says so in `notes`. Throws std::invalid_argument for text that is
  /// not such an object, a missing or non-positive figure, naming it.
  static Profile parse(std::string_view text, const std::string& what, std::string_view fallback = "h100") {
    Json j(text, what);
    const Json::Object top = j.object_top();
    auto fail = [&](const std::string& m) -> void { throw std::invalid_argument("shardlib: profile " + what + ": " + m); };
    // Rates, sizes and bandwidths must be more than 0; per-call costs and latencies 0 or more.
    auto number = [&](const Json::Object& o, const std::string& k, const std::string& in, bool zero_ok = false) {
      auto it = o.numbers.find(k);
      if (it == o.numbers.end()) fail("no \"" + k + "\"" + in + " (a number)");
      const double v = it->second;
      if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_ok)) {
        char b[64];
        std::snprintf(b, sizeof b, "%g", v);
        fail("\"" + k + "\"" + in + " is " + b + "; it must be " + (zero_ok ? "0 or more" : "more than 0"));
      }
      return v;
    };
    auto text_of = [&](const Json::Object& o, const std::string& k) {
      auto it = o.strings.find(k);
      return it == o.strings.end() ? std::string() : it->second;
    };
    Profile p;
    p.name = text_of(top, "name");
    if (p.name.empty()) p.name = what;
    p.source = text_of(top, "source");
    p.gemm_rate = number(top, "gemm_rate", "");
    p.gemm_call = number(top, "gemm_call", "", true);
    p.memory_bandwidth = number(top, "memory_bandwidth", "");
    p.kernel_call = number(top, "kernel_call", "", true);
    auto peak = top.numbers.find("peak_flops");
    p.peak_flops = peak == top.numbers.end() ? 0 : peak->second;
    // Optional (older profiles lack them): no per-product cost, no batched rate of its own, no sharing.
    if (top.numbers.count("gemm_product")) p.gemm_product = number(top, "gemm_product", "", true);
    if (top.numbers.count("batched_gemm_rate")) p.batched_gemm_rate = number(top, "batched_gemm_rate", "", true);
    if (top.numbers.count("shared")) {
      p.shared = number(top, "shared", "");
      if (p.shared < 1) {
        char b[64];
        std::snprintf(b, sizeof b, "%g", p.shared);
        fail(std::string("\"shared\" is ") + b + "; it must be 1 or more (devices taking turns on one's compute)");
      }
    }
    p.memory = static_cast<std::int64_t>(number(top, "memory", ""));
    p.node_size = static_cast<int>(number(top, "node_size", ""));
    for (LinkKind k : {LinkKind::intra_node, LinkKind::inter_node}) {
      const std::string key(to_string(k));
      Link& l = k == LinkKind::intra_node ? p.intra_node : p.inter_node;
      auto it = top.objects.find(key);
      if (it == top.objects.end()) {
        const Profile d = preset(fallback);
        l = d.link(k);
        p.notes.push_back(key + ": not in " + what + "; the " + std::string(fallback) + " default instead (" +
                          l.source + ")");
        continue;
      }
      l.latency = number(it->second, "latency", " of \"" + key + "\"", true);
      l.bandwidth = number(it->second, "bandwidth", " of \"" + key + "\"");
      l.source = text_of(it->second, "source");
    }
    return p;
  }

  /// parse() of the file at `path`. Throws std::runtime_error when it cannot be read.
  static Profile load(const std::string& path, std::string_view fallback = "h100") {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("shardlib: cannot read the profile " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    return parse(ss.str(), path, fallback);
  }

 private:
  static std::string escape(const std::string& v) {
    std::string o;
    for (char c : v) {
      if (c == '"' || c == '\\') o += '\\';
      if (c == '\n') {
        o += "\\n";
        continue;
      }
      o += c;
    }
    return o;
  }

  /// The JSON a profile is: objects of strings, numbers and objects (one level of nesting).
  class Json {
   public:
    struct Object {
      std::map<std::string, double> numbers;
      std::map<std::string, std::string> strings;
      std::map<std::string, Object> objects;
    };
    Json(std::string_view t, const std::string& what) : t_(t), what_(what) {}
    Object object_top() {
      Object o = object(0);
      space();
      if (i_ != t_.size()) error("text after the object");
      return o;
    }

   private:
    [[noreturn]] void error(const std::string& m) const {
      throw std::invalid_argument("shardlib: profile " + what_ + " is not a profile's JSON: " + m + " at character " +
                                  std::to_string(i_));
    }
    void space() {
      while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
    }
    void expect(char c) {
      space();
      if (i_ >= t_.size() || t_[i_] != c) error(std::string("'") + c + "' expected");
      ++i_;
    }
    std::string string() {
      expect('"');
      std::string s;
      while (i_ < t_.size() && t_[i_] != '"') {
        char c = t_[i_++];
        if (c == '\\' && i_ < t_.size()) {
          c = t_[i_++];
          if (c == 'n') c = '\n';
        }
        s += c;
      }
      if (i_ >= t_.size()) error("an unterminated string");
      ++i_;
      return s;
    }
    Object object(int depth) {
      if (depth > 1) error("objects nested too deep");
      Object o;
      expect('{');
      space();
      if (i_ < t_.size() && t_[i_] == '}') {
        ++i_;
        return o;
      }
      while (true) {
        const std::string k = string();
        expect(':');
        space();
        if (i_ >= t_.size()) error("a value expected");
        if (t_[i_] == '"') o.strings[k] = string();
        else if (t_[i_] == '{') o.objects[k] = object(depth + 1);
        else o.numbers[k] = number();
        space();
        if (i_ < t_.size() && t_[i_] == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return o;
      }
    }
    double number() {
      const std::size_t start = i_;
      while (i_ < t_.size() && (std::isdigit(static_cast<unsigned char>(t_[i_])) || t_[i_] == '-' || t_[i_] == '+' ||
                                t_[i_] == '.' || t_[i_] == 'e' || t_[i_] == 'E'))
        ++i_;
      const std::string s(t_.substr(start, i_ - start));
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size()) error("a number, a string or an object expected");
      return v;
    }
    std::string_view t_;
    std::string what_;
    std::size_t i_ = 0;
  };
};

}  // namespace shardlib::plan
