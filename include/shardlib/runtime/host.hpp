// SPDX-License-Identifier: Apache-2.0
/// @file
/// Each device's share of the host, and whether the BLAS kernel suits the CPU.
///
/// **Threads per device.** The devices of one host share its cores: the in-process devices of
/// the threads backend, or the MPI ranks on one node. Each device gets
/// `max(1, cores available / devices on this host)` threads, for the BLAS (OpenBLAS's thread
/// count) and for its Kokkos host execution space (an OpenMP Kokkos); one device alone on a
/// 2-core machine uses both cores, and 8 devices on 2 cores get one thread each. The cores
/// available are those of the process's CPU affinity mask (`taskset`, `mpirun --bind-to`,
/// a container's cpuset), not the machine's. `SHARDLIB_THREADS_PER_DEVICE` (or the program's
/// `--threads-per-device` argument) sets the share instead, from 1 to the cores available.
///
/// **The BLAS's kernel.** OpenBLAS picks its kernel from the CPU when the program starts; a CPU
/// it does not know gets an old one (an Intel Emerald Rapids was seen running Prescott's SSE3
/// kernel, 5x slower than SkylakeX's AVX-512 one), and `OPENBLAS_CORETYPE` forces one whatever
/// the CPU. `blas_advice` compares the kernel with the CPU's vector extensions and says when it is
/// far below them, with the one-line fix; the runtime prints that once per process on stderr
/// (`SHARDLIB_NO_BLAS_WARNING=1` silences it) and puts it in `Runtime::describe()`. Where the
/// fix is only the kernel's name (OpenBLAS chose by itself, with DYNAMIC_ARCH, and misjudged the
/// CPU), the runtime applies it instead, once per process before its devices start
/// (`blas_core_to_take`, `take_blas_core_once`): users get the kernel their CPU supports without
/// touching their environment. `OPENBLAS_CORETYPE`, when set, is the user's choice and is kept;
/// `SHARDLIB_BLAS_CORE=keep` keeps OpenBLAS's own choice (and its warning).
///
/// The decisions are pure functions of plain values (`thread_share`, `blas_advice`), tested
/// without a machine of each kind; `cores_available`, `detect_cpu` and `kernels::blas_info` read
/// this machine, and the runtime applies the result.
#pragma once

#include <shardlib/kernels/blas.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace shardlib::host {

/// The environment variable that sets the threads per device.
inline constexpr const char* threads_per_device_variable = "SHARDLIB_THREADS_PER_DEVICE";
/// The environment variable that silences the BLAS kernel warning (any value but "0").
inline constexpr const char* no_blas_warning_variable = "SHARDLIB_NO_BLAS_WARNING";
/// The environment variable that, set to "keep", stops the runtime from switching OpenBLAS's
/// kernel where OpenBLAS misjudged the CPU (see the file comment).
inline constexpr const char* blas_core_variable = "SHARDLIB_BLAS_CORE";

/// How many threads each device of this host gets, and why.
struct ThreadShare {
  /// Threads for each device: its BLAS calls and its Kokkos host execution space.
  int per_device = 1;
  /// The cores the share was taken from, and the devices sharing them.
  int cores = 1;
  int devices_on_host = 1;
  /// Whether an override set it (then `source` names the override).
  bool overridden = false;
  /// Where it came from, for reports: "2 cores / 1 device on this host", "8 devices on this host
  /// share 2 cores: 1 each", "SHARDLIB_THREADS_PER_DEVICE=2".
  std::string source;
};

/// The threads of each device: `max(1, cores / devices_on_host)`, or `override_value` when given.
/// `cores` is the number of cores available to this host's devices (at least 1);
/// `override_name` names the override in messages ("SHARDLIB_THREADS_PER_DEVICE",
/// "--threads-per-device"). Throws std::invalid_argument, naming the override, its value and
/// the limit, when the override is not a whole number from 1 to `cores`.
inline ThreadShare thread_share(int cores, int devices_on_host, std::optional<std::string_view> override_value = {},
                                std::string_view override_name = threads_per_device_variable) {
  ThreadShare s;
  s.cores = std::max(1, cores);
  s.devices_on_host = std::max(1, devices_on_host);
  const std::string plural = s.devices_on_host == 1 ? "" : "s";
  if (override_value) {
    const std::string text(*override_value);
    errno = 0;
    char* end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno == ERANGE || v < 1 || v > s.cores)
      throw std::invalid_argument("shardlib: " + std::string(override_name) + " must be a whole number from 1 to " +
                                  std::to_string(s.cores) + " (the cores this host's devices may run on), got '" + text + "'");
    s.per_device = static_cast<int>(v);
    s.overridden = true;
    s.source = std::string(override_name) + "=" + text;
    return s;
  }
  s.per_device = std::max(1, s.cores / s.devices_on_host);
  if (s.devices_on_host > s.cores)
    s.source = std::to_string(s.devices_on_host) + " devices on this host share " + std::to_string(s.cores) +
               " core" + (s.cores == 1 ? "" : "s") + ": 1 each";
  else
    s.source = std::to_string(s.cores) + " core" + (s.cores == 1 ? "" : "s") + " / " +
               std::to_string(s.devices_on_host) + " device" + plural + " on this host";
  return s;
}

/// The cores this process may run on: the size of its CPU affinity mask (Linux), else the
/// hardware's thread count; at least 1.
inline int cores_available() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

/// The threads-per-device override from the environment (SHARDLIB_THREADS_PER_DEVICE), if set.
inline std::optional<std::string> threads_override_from_env() {
  if (const char* s = std::getenv(threads_per_device_variable)) return std::string(s);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// The BLAS kernel against the CPU.

/// Vector extensions that matter for GEMM, oldest first.
enum class Isa { unknown, sse, avx, avx2, avx512 };

/// "SSE", "AVX", "AVX2", "AVX-512" ("unknown").
constexpr std::string_view to_string(Isa i) noexcept {
  switch (i) {
    case Isa::sse: return "SSE";
    case Isa::avx: return "AVX";
    case Isa::avx2: return "AVX2";
    case Isa::avx512: return "AVX-512";
    default: return "unknown";
  }
}

/// Bytes in one vector register of `i` (16 for SSE, 32 for AVX/AVX2, 64 for AVX-512; 0 unknown).
constexpr int vector_bytes(Isa i) noexcept {
  switch (i) {
    case Isa::sse: return 16;
    case Isa::avx:
    case Isa::avx2: return 32;
    case Isa::avx512: return 64;
    default: return 0;
  }
}

/// A note when the host kernels' vector math (kernels/vmath.hpp: Eigen's packets, whose width is
/// the compiler's flags') was compiled for narrower vectors than this CPU has: `packet_bytes` is
/// the build's float packet. Empty when the build uses what the CPU has (or the CPU is unknown).
inline std::string simd_advice(Isa cpu, int packet_bytes) {
  const int have = vector_bytes(cpu);
  if (have <= packet_bytes) return {};
  return "this CPU has " + std::string(to_string(cpu)) + " (" + std::to_string(have / 4) +
         " floats a vector) but the kernels were compiled for " + std::to_string(packet_bytes / 4) +
         "; build with -march=native for 2-4x faster elementwise, softmax and norm kernels";
}

/// What this CPU supports, as far as GEMM kernels care.
struct CpuFeatures {
  /// Whether the CPU could be asked (x86 with a compiler that can ask); false elsewhere.
  bool known = false;
  /// The best vector extension usable here (the CPU has it and the OS enabled it).
  Isa best = Isa::unknown;
  /// The CPU's name ("AMD EPYC 9555 64-Core Processor"), when the system says; may be empty.
  std::string model;
};

/// This machine's CPU (x86: through the compiler's CPU query, which also checks that the OS
/// saves the vector registers; elsewhere unknown).
inline CpuFeatures detect_cpu() {
  CpuFeatures c;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  c.known = true;
  c.best = __builtin_cpu_supports("avx512f")  ? Isa::avx512
           : __builtin_cpu_supports("avx2")   ? Isa::avx2
           : __builtin_cpu_supports("avx")    ? Isa::avx
                                              : Isa::sse;
#endif
#if defined(__linux__)
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::size_t b = line.find_first_not_of(" \t", colon + 1);
        if (b != std::string::npos) c.model = line.substr(b);
      }
      break;
    }
#endif
  return c;
}

/// The vector extension an OpenBLAS x86 kernel ("core") is written for, from its name as
/// `openblas_get_corename()` gives it (any case); Isa::unknown for a name not listed here (another
/// architecture's kernels, or a newer OpenBLAS's).
inline Isa core_isa(std::string_view core) {
  std::string n;
  for (char ch : core) n += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (std::string_view k : {"skylakex", "cooperlake", "sapphirerapids"})
    if (n == k) return Isa::avx512;
  for (std::string_view k : {"haswell", "zen", "excavator"})
    if (n == k) return Isa::avx2;
  for (std::string_view k : {"sandybridge", "bulldozer", "piledriver", "steamroller"})
    if (n == k) return Isa::avx;
  for (std::string_view k : {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "opteron", "opteron_sse3",
                             "barcelona", "bobcat", "katmai", "coppermine", "northwood", "banias", "athlon", "nano",
                             "generic"})
    if (n == k) return Isa::sse;
  return Isa::unknown;
}

/// What to tell the user about the BLAS kernel.
struct BlasAdvice {
  /// Whether GEMM runs far below what the CPU supports (then the runtime warns once).
  bool warn = false;
  /// One sentence: what runs, and against what; empty when the kernel suits the CPU.
  std::string text;
  /// The fix, one line a user can type ("unset OPENBLAS_CORETYPE"); empty when none is needed.
  std::string fix;
};

/// Whether `blas` (what runs) is far below `cpu` (what the CPU supports); `coretype` is the value
/// of OPENBLAS_CORETYPE when it is set. Far below: no BLAS at all (Eigen's own kernel); an AVX-512
/// CPU on a kernel without AVX-512; an AVX2 CPU on a kernel older than Haswell. An unknown CPU or
/// kernel name gives a neutral note, never a warning.
inline BlasAdvice blas_advice(const CpuFeatures& cpu, const kernels::BlasInfo& blas,
                              std::optional<std::string_view> coretype = {}) {
  BlasAdvice a;
  const std::string on_cpu = "on this CPU" + (cpu.model.empty() ? std::string() : " (" + cpu.model + ")");
  if (blas.backend == "eigen") {
    a.warn = true;
    a.text = "no BLAS: float and double GEMM run Eigen's own kernel, several times slower than OpenBLAS " + on_cpu +
             " (this build of shardlib found no OpenBLAS)";
    a.fix = "install OpenBLAS (Debian/Ubuntu: apt install libopenblas-dev) and configure the build again";
    return a;
  }
  if (!blas.loaded) {
    a.text = "OpenBLAS is not loaded in this program (it makes no GEMM call), so its kernel is not known";
    return a;
  }
  if (blas.core.empty()) {
    a.text = "the BLAS (" + blas.backend + ") does not say which kernel it runs";
    return a;
  }
  const Isa kernel = core_isa(blas.core);
  if (kernel == Isa::unknown) {
    a.text = "OpenBLAS kernel " + blas.core + " (not one shardlib can compare with the CPU)";
    return a;
  }
  if (!cpu.known || cpu.best == Isa::unknown) {
    a.text = "OpenBLAS kernel " + blas.core + " (" + std::string(to_string(kernel)) +
             "); this CPU's vector extensions are unknown, so it is not compared";
    return a;
  }
  const bool far_below = (cpu.best == Isa::avx512 && kernel != Isa::avx512) ||
                         (cpu.best == Isa::avx2 && kernel < Isa::avx2);
  if (!far_below) return a;
  a.warn = true;
  const std::string good = cpu.best == Isa::avx512 ? "SkylakeX" : "Haswell";
  const std::string what = "OpenBLAS runs its " + blas.core + " kernel (" + std::string(to_string(kernel)) + ") " +
                           on_cpu + ", which has " + std::string(to_string(cpu.best)) + ": GEMM runs at a fraction of the speed this CPU allows";
  if (coretype && !coretype->empty()) {
    a.text = what + ", because OPENBLAS_CORETYPE=" + std::string(*coretype) + " forces that kernel";
    a.fix = "unset OPENBLAS_CORETYPE (or export OPENBLAS_CORETYPE=" + good + ")";
  } else if (!blas.dynamic_arch) {
    a.text = what + "; this OpenBLAS was built for that kernel alone (no DYNAMIC_ARCH), so OPENBLAS_CORETYPE cannot change it";
    a.fix = "use an OpenBLAS built with DYNAMIC_ARCH=1 (Debian's libopenblas0-pthread is)";
  } else {
    a.text = what + ", as OpenBLAS " + (blas.version.empty() ? std::string() : blas.version + " ") +
             "does not recognise this CPU";
    a.fix = "export OPENBLAS_CORETYPE=" + good;
  }
  return a;
}

/// The kernel the runtime switches OpenBLAS to, or std::nullopt to leave it: only where OpenBLAS
/// chose by itself (no `coretype`, the value of OPENBLAS_CORETYPE; built with DYNAMIC_ARCH) a
/// kernel far below what `cpu` supports, as `blas_advice` judges, and `keep` (SHARDLIB_BLAS_CORE
/// is "keep") is false. "SkylakeX" for an AVX-512 CPU, "Haswell" for an AVX2 one: the kernels
/// every x86-64 DYNAMIC_ARCH OpenBLAS since 0.3.x has.
inline std::optional<std::string> blas_core_to_take(const CpuFeatures& cpu, const kernels::BlasInfo& blas,
                                                    std::optional<std::string_view> coretype = {}, bool keep = false) {
  if (keep || (coretype && !coretype->empty()) || blas.backend == "eigen" || !blas.loaded || !blas.dynamic_arch)
    return std::nullopt;
  if (!blas_advice(cpu, blas, coretype).warn) return std::nullopt;
  if (cpu.best == Isa::avx512) return std::string("SkylakeX");
  if (cpu.best == Isa::avx2) return std::string("Haswell");
  return std::nullopt;
}

/// Whether SHARDLIB_BLAS_CORE's value (`value`, std::nullopt when unset) asks to keep OpenBLAS's
/// own kernel: "keep" does; unset or empty does not. Throws std::invalid_argument, naming the
/// variable, its value and the one it takes, for any other value: a misspelt "Keep" or a kernel's
/// name must not be read as "switch".
inline bool blas_core_keep(std::optional<std::string_view> value) {
  if (!value || value->empty()) return false;
  if (*value == "keep") return true;
  throw std::invalid_argument("shardlib: " + std::string(blas_core_variable) + " is '" + std::string(*value) +
                              "'; the one value it takes is 'keep' (keep OpenBLAS's own kernel; to force a kernel, "
                              "set OPENBLAS_CORETYPE instead), or leave it unset");
}

/// What `take_blas_core_once` did in this process.
struct BlasSwitch {
  /// Whether the kernel was switched (then `from` is OpenBLAS's own choice, `to` the one it runs).
  bool switched = false;
  std::string from, to;
  /// One sentence for `describe()`; empty when nothing was switched or tried.
  std::string text;
};

/// Once per process (later calls return the first call's result): switches OpenBLAS's kernel
/// where `blas_core_to_take` says so for this CPU, this BLAS and this environment. The runtime
/// calls it when it starts, before any device runs a GEMM. Throws std::invalid_argument (and
/// switches nothing) when SHARDLIB_BLAS_CORE has a value other than "keep" (`blas_core_keep`).
inline const BlasSwitch& take_blas_core_once() {
  static const BlasSwitch result = [] {
    BlasSwitch r;
    std::optional<std::string_view> coretype;
    if (const char* s = std::getenv("OPENBLAS_CORETYPE")) coretype = s;
    std::optional<std::string_view> keep_value;
    if (const char* s = std::getenv(blas_core_variable)) keep_value = s;
    const bool keep = blas_core_keep(keep_value);
    const kernels::BlasInfo before = kernels::blas_info();
    const std::optional<std::string> want = blas_core_to_take(detect_cpu(), before, coretype, keep);
    if (!want) return r;
    const std::optional<std::string> now = kernels::set_blas_core(*want);
    if (!now) return r;
    r.from = before.core;
    r.to = *now;
    r.switched = r.to != r.from;
    r.text = "OpenBLAS " + before.version + " chose its " + r.from + " kernel, not knowing this CPU; shardlib " +
             (r.switched ? "switched it to " + r.to : "asked for " + *want + " but OpenBLAS kept " + r.to) + " (" +
             blas_core_variable + "=keep keeps OpenBLAS's choice)";
    return r;
  }();
  return result;
}

/// The one-line warning for `a` ("shardlib warning: ... Fix: ..."), or empty when `a.warn` is false.
inline std::string blas_warning_text(const BlasAdvice& a) {
  if (!a.warn) return {};
  return "shardlib warning: " + a.text + ". Fix: " + a.fix + "   (" + no_blas_warning_variable + "=1 silences this)";
}

/// Whether SHARDLIB_NO_BLAS_WARNING asks for silence (set, and not "0").
inline bool blas_warning_silenced() {
  const char* s = std::getenv(no_blas_warning_variable);
  return s && *s && std::string_view(s) != "0";
}

/// This process's advice: this CPU, this BLAS, this environment's OPENBLAS_CORETYPE.
inline BlasAdvice blas_advice_here() {
  std::optional<std::string_view> coretype;
  if (const char* s = std::getenv("OPENBLAS_CORETYPE")) coretype = s;
  return blas_advice(detect_cpu(), kernels::blas_info(), coretype);
}

/// Prints `blas_warning_text(a)` to `out` the first time it is called with `once` (later calls
/// print nothing), unless the warning is silenced; returns whether it printed.
inline bool warn_blas_once(const BlasAdvice& a, std::once_flag& once, std::FILE* out = stderr) {
  bool printed = false;
  std::call_once(once, [&] {
    if (!a.warn || blas_warning_silenced()) return;
    std::fprintf(out, "%s\n", blas_warning_text(a).c_str());
    std::fflush(out);
    printed = true;
  });
  return printed;
}

/// The process's one warning about the BLAS kernel (see warn_blas_once); the runtime calls it.
inline void warn_blas_once_per_process() {
  static std::once_flag once;
  static const BlasAdvice advice = blas_advice_here();
  warn_blas_once(advice, once);
}

}  // namespace shardlib::host
