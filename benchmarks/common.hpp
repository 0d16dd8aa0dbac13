// SPDX-License-Identifier: Apache-2.0
// Shared by the benchmarks: the command line (checked before anything runs), the warm-up, and
// the alternating timer.
#pragma once

#include <shardlib/collectives/communicator.hpp>
#include <shardlib/kernels/blas.hpp>
#include <shardlib/runtime/host.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#if defined(__GNUC__) || defined(__clang__)
// OpenBLAS's thread count, weak so that a program without OpenBLAS links (then it is null).
extern "C" int openblas_get_num_threads(void) __attribute__((weak));
#endif

namespace bench {

using Clock = std::chrono::steady_clock;
using shardlib::coll::DType;
using shardlib::coll::Op;

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__OPTIMIZE__)
/// A benchmark compiled without optimisation says so when it starts: outside a release build
/// (build/, where CI compiles them only to keep them compiling) they compile at -O0, and their
/// figures mean nothing. `benchmarks/run` measures them in its own release build (build-bench/).
inline const bool unoptimised_build_warned = [] {
  std::fputs("warning: this benchmark was compiled without optimisation: its figures mean nothing "
             "(benchmarks/run NAME builds and runs it in a release build)\n", stderr);
  return true;
}();
#endif

/// `v` as a record's JSON number, 6 significant digits (std::to_string's 6 decimals would write a
/// per-call cost of 0.4 us as 0.000000).
inline std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Questions benchmarks/run asks an executable before it runs it; each prints its answer and
/// returns true, and the caller then exits.
/// - `prog --backends`: the backends this build has ("threads mpi").
/// - `prog --blas-kernel`: the BLAS kernel its GEMM runs here once a runtime has started
///   ("openblas 0.3.21 Cooperlake"; see kernels/blas.hpp and runtime/host.hpp), which
///   benchmarks/run puts into every record of the executable.
inline bool answered_backends_query(int argc, char** argv, bool has_mpi) {
  if (argc != 2) return false;
  if (std::strcmp(argv[1], "--backends") == 0) {
    std::printf("threads%s\n", has_mpi ? " mpi" : "");
    return true;
  }
  if (std::strcmp(argv[1], "--blas-kernel") == 0) {
    shardlib::host::take_blas_core_once();  // as the runtime does before its devices start
    std::printf("%s\n", shardlib::kernels::blas_info().kernel().c_str());
    return true;
  }
  return false;
}

/// What a command-line flag takes after it.
enum class Takes { nothing, integer, number, word };

/// A flag a benchmark program reads: its name, what follows it, and for a word the values it may
/// take ("a|b|c"; null: any word).
struct Flag {
  const char* name;
  Takes takes = Takes::nothing;
  const char* choices = nullptr;
};

/// The flags Runtime::from_args takes: a program that starts its runtime from the command line
/// accepts them too. (The runtime also takes `--name=value`; the benchmarks, which read
/// `--devices` themselves in places, do not.)
inline constexpr Flag runtime_flags[] = {{"--backend", Takes::word, "threads|mpi|nccl|simulate"},
                                         {"--devices", Takes::integer},
                                         {"--threads-per-device", Takes::integer},
                                         {"--simulate-device", Takes::integer}};

/// The program's name for its messages: argv[0] after its last '/'.
inline std::string program_name(char** argv) {
  const char* p = argv[0] ? std::strrchr(argv[0], '/') : nullptr;
  return p ? p + 1 : argv[0] ? argv[0] : "benchmark";
}

/// Why the command line is not one the program reads (empty: it is): every argument one of
/// `flags` or of runtime_flags, none given twice, each value given, integers and numbers whole,
/// words among their choices.
inline std::string args_fault(int argc, char** argv, std::initializer_list<Flag> flags) {
  auto parses = [](const std::string& v, Takes t) {
    if (v.empty()) return false;
    char* end = nullptr;
    errno = 0;
    if (t == Takes::integer) (void)std::strtoll(v.c_str(), &end, 10);
    else (void)std::strtod(v.c_str(), &end);
    return errno == 0 && *end == '\0';
  };
  std::vector<std::string> seen;  // a flag given twice: the programs read its first value only
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (std::find(seen.begin(), seen.end(), a) != seen.end()) return "'" + a + "' given twice";
    seen.push_back(a);
    const Flag* f = nullptr;
    for (const Flag& k : flags)
      if (a == k.name) f = &k;
    if (!f)
      for (const Flag& k : runtime_flags)
        if (a == k.name) f = &k;
    if (!f) return "unknown argument '" + a + "'";
    if (f->takes == Takes::nothing) continue;
    if (i + 1 >= argc) return std::string(f->name) + " needs a value";
    const std::string value = argv[++i];
    if (f->takes == Takes::integer && !parses(value, Takes::integer))
      return std::string(f->name) + " takes an integer, not '" + value + "'";
    if (f->takes == Takes::number && !parses(value, Takes::number))
      return std::string(f->name) + " takes a number, not '" + value + "'";
    if (f->takes == Takes::word && f->choices) {
      std::vector<std::string> words;  // the choices, "a|b|c"
      for (std::string c = f->choices;;) {
        const std::size_t bar = c.find('|');
        words.push_back(c.substr(0, bar));
        if (bar == std::string::npos) break;
        c.erase(0, bar + 1);
      }
      if (std::find(words.begin(), words.end(), value) == words.end()) {
        std::string list;  // "a, b or c"
        for (std::size_t k = 0; k < words.size(); ++k)
          list += (k == 0 ? "" : k + 1 == words.size() ? " or " : ", ") + words[k];
        return std::string(f->name) + " is " + list + ", not '" + value + "'";
      }
    }
  }
  return {};
}

/// Checks the command line before anything runs (args_fault): on a fault prints "PROGRAM:
/// FAULT" and exits with status 1. An unknown or misspelt flag was ignored before, and the run
/// measured something other than what was asked.
inline void check_args(int argc, char** argv, std::initializer_list<Flag> flags) {
  const std::string fault = args_fault(argc, argv, flags);
  if (fault.empty()) return;
  std::fprintf(stderr, "%s: %s\n", program_name(argv).c_str(), fault.c_str());
  std::exit(1);
}

/// The number after `name` on the command line, or `fallback` (check_args has checked it).
inline long long arg(int argc, char** argv, const char* name, long long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

/// The word after `name` on the command line, or `fallback`.
inline std::string text_arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

/// Whether the switch `flag` is on the command line.
inline bool has_flag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

/// ~50 ms of barriers before the first measurement, so the device threads have been spread over
/// the cores (right after they start, a single-case run measured 0.1 ms for an 8-byte all_gather
/// that takes 1 us once they are).
inline void warm_up(shardlib::coll::Communicator& comm) {
  for (auto start = Clock::now();;) {
    comm.barrier();
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    comm.all_reduce(&elapsed, &elapsed, 1, DType::f64, Op::min);  // all devices leave together
    if (elapsed >= 0.05) break;
  }
}

/// Seconds per call of `op` and of `other` (when given), the slowest device's, median over
/// repetitions that alternate the two (so drift and order effects hit both alike).
template <class F, class G>
std::pair<double, double> time_ops(shardlib::coll::Communicator& comm, F&& op, G* other) {
  op();  // warm up
  if (other) (*other)();
  comm.barrier();
  // Calls per repetition: enough for ~20 ms, agreed on by all devices.
  auto t0 = Clock::now();
  op();
  double one = std::chrono::duration<double>(Clock::now() - t0).count();
  comm.all_reduce(&one, &one, 1, DType::f64, Op::max);
  int iters = std::clamp(static_cast<int>(0.02 / std::max(one, 1e-9)), 1, 20000);
  auto rep = [&](auto& f) {
    comm.barrier();
    auto s = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    double t = std::chrono::duration<double>(Clock::now() - s).count() / iters;
    comm.all_reduce(&t, &t, 1, DType::f64, Op::max);
    return t;
  };
  std::vector<double> a, b;
  for (int r = 0; r < 7; ++r) {
    if (other && r % 2) b.push_back(rep(*other));  // odd repetitions: the baseline first
    a.push_back(rep(op));
    if (other && r % 2 == 0) b.push_back(rep(*other));
  }
  return {median(a), other ? median(b) : 0.0};
}

/// The threads one GEMM call runs on: OpenBLAS's own count when the program is linked against it,
/// else 1 (Eigen's kernel, not parallelised in these builds).
inline int gemm_threads() {
#if defined(__GNUC__) || defined(__clang__)
  if (openblas_get_num_threads != nullptr) return openblas_get_num_threads();
#endif
  return 1;
}

}  // namespace bench
