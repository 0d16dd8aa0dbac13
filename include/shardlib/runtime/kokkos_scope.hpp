// SPDX-License-Identifier: Apache-2.0
/// @file
/// Kokkos initialisation, once per process, owned by shardlib's runtime entry point.
///
/// Kokkos may be initialised once per process only. The runtime entry point (and the test
/// main) holds a `KokkosScope`: the first scope initialises Kokkos, and it finalises Kokkos
/// when it ends; a scope created while Kokkos is already running (the user initialised it, or
/// an outer scope did) leaves it alone. Works with Kokkos 3.4 to 5.x.
///
/// Host threads: on a Kokkos whose host execution space has a thread pool (OpenMP, Threads), a
/// scope given `host_threads` starts that many (the runtime asks for its devices' share of the
/// host, runtime/host.hpp) instead of Kokkos's default of one per core, which every MPI rank of a
/// node would otherwise take. A count the program gave Kokkos itself (`--kokkos-num-threads`,
/// `--kokkos-threads`, `KOKKOS_NUM_THREADS`, `OMP_NUM_THREADS`) wins, and so does a Kokkos that was
/// running already; `host_threads_note()` says which happened.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlib {

/// RAII owner of the process's Kokkos initialisation (see the file comment).
class KokkosScope {
 public:
  /// Who chose the size of the host execution space's thread pool.
  enum class HostThreadsBy {
    no_pool,     ///< the host space has no thread pool (Serial): nothing to choose
    shardlib,    ///< this scope, from the runtime's share
    program,     ///< the program, through Kokkos's own argument or environment variable
    kokkos,      ///< Kokkos's default (no count was asked for)
    earlier,     ///< Kokkos was running before this scope (the program or an outer scope)
  };

  /// Initialises Kokkos with the program's arguments (it consumes its own `--kokkos-*` ones).
  KokkosScope(int& argc, char** argv) : KokkosScope(argc, argv, 0) {}
  KokkosScope() : KokkosScope(0) {}
  /// As above, and with `host_threads` threads in the host execution space's pool when it has
  /// one and the program did not give Kokkos a count itself (0: Kokkos's default).
  KokkosScope(int& argc, char** argv, int host_threads) { start(argc, argv, host_threads); }
  explicit KokkosScope(int host_threads) {
    int argc = 0;
    start(argc, nullptr, host_threads);
  }
  KokkosScope(const KokkosScope&) = delete;
  KokkosScope& operator=(const KokkosScope&) = delete;
  ~KokkosScope() {
    if (owns_) Kokkos::finalize();
  }

  /// Whether this scope initialised Kokkos (and so will finalise it).
  bool owns_kokkos() const noexcept { return owns_; }
  /// Name of Kokkos's default execution space ("Serial", "OpenMP", "Cuda", ...).
  static std::string execution_space_name() { return Kokkos::DefaultExecutionSpace::name(); }
  /// Whether Kokkos's default host execution space runs on a pool of threads (OpenMP, Threads).
  static constexpr bool host_space_has_pool() noexcept {
#if defined(KOKKOS_ENABLE_OPENMP)
    if (std::is_same_v<Kokkos::DefaultHostExecutionSpace, Kokkos::OpenMP>) return true;
#endif
#if defined(KOKKOS_ENABLE_THREADS)
    if (std::is_same_v<Kokkos::DefaultHostExecutionSpace, Kokkos::Threads>) return true;
#endif
    return false;
  }
  /// Threads of the default host execution space (1 for Serial).
  static int host_pool_size() { return Kokkos::DefaultHostExecutionSpace().concurrency(); }
  /// Who chose the pool's size.
  HostThreadsBy host_threads_by() const noexcept { return by_; }
  /// "Serial" / "OpenMP, pool of 2 threads (set by shardlib)" / "OpenMP, pool of 4 threads (set
  /// by the program: KOKKOS_NUM_THREADS=4)" / "... (Kokkos was initialised before the runtime)".
  std::string host_threads_note() const {
    std::string s = Kokkos::DefaultHostExecutionSpace::name();
    if (by_ == HostThreadsBy::no_pool) return s;
    const int n = host_pool_size();
    s += ", pool of " + std::to_string(n) + " thread" + (n == 1 ? "" : "s") + " (";
    switch (by_) {
      case HostThreadsBy::shardlib: s += "set by shardlib"; break;
      case HostThreadsBy::program: s += "set by the program: " + setting_; break;
      case HostThreadsBy::kokkos: s += "Kokkos's default"; break;
      default: s += "Kokkos was initialised before the runtime; left as it was"; break;
    }
    return s + ")";
  }

  /// The thread count the program gave Kokkos itself, as "NAME=VALUE", if any: an argument
  /// `--kokkos-num-threads`/`--kokkos-threads`, or KOKKOS_NUM_THREADS, or (OpenMP) OMP_NUM_THREADS.
  static std::optional<std::string> program_thread_setting(int argc, char** argv) {
    for (int i = 1; argv && i < argc; ++i)
      if (argv[i] && (std::strncmp(argv[i], "--kokkos-num-threads", 20) == 0 ||
                      std::strncmp(argv[i], "--kokkos-threads", 16) == 0))
        return std::string(argv[i]) + (std::strchr(argv[i], '=') || i + 1 >= argc ? "" : std::string(" ") + argv[i + 1]);
    for (const char* name : {"KOKKOS_NUM_THREADS", "OMP_NUM_THREADS"}) {
#if !defined(KOKKOS_ENABLE_OPENMP)
      if (std::strcmp(name, "OMP_NUM_THREADS") == 0) continue;
#endif
      if (const char* v = std::getenv(name); v && *v) return std::string(name) + "=" + v;
    }
    return std::nullopt;
  }

 private:
  void start(int& argc, char** argv, int host_threads) {
    if (Kokkos::is_initialized()) {
      by_ = host_space_has_pool() ? HostThreadsBy::earlier : HostThreadsBy::no_pool;
      return;
    }
    owns_ = true;
    if (!host_space_has_pool()) {
      by_ = HostThreadsBy::no_pool;
      Kokkos::initialize(argc, argv);
      return;
    }
    if (auto given = program_thread_setting(argc, argv)) {
      by_ = HostThreadsBy::program;
      setting_ = *given;
    } else if (host_threads > 0) {
      by_ = HostThreadsBy::shardlib;
    }
    if (by_ != HostThreadsBy::shardlib) {
      Kokkos::initialize(argc, argv);
      return;
    }
    // The count goes in as one more argument, so that Kokkos still reads the program's own.
#if KOKKOS_VERSION >= 30700
    std::string flag = "--kokkos-num-threads=" + std::to_string(host_threads);
#else
    std::string flag = "--kokkos-threads=" + std::to_string(host_threads);
#endif
    static char program_name[] = "shardlib";
    std::vector<char*> args;
    if (argv && argc > 0)
      args.assign(argv, argv + argc);
    else
      args.push_back(program_name);
    args.push_back(flag.data());
    int n = static_cast<int>(args.size());
    args.push_back(nullptr);
    Kokkos::initialize(n, args.data());
    if (argv && argc > 0) {  // hand back what Kokkos left of the program's arguments
      int out = 0;
      for (int i = 0; i < n; ++i)
        if (args[static_cast<std::size_t>(i)] != flag.data()) argv[out++] = args[static_cast<std::size_t>(i)];
      argc = out;
      argv[argc] = nullptr;
    }
  }

  bool owns_ = false;
  HostThreadsBy by_ = HostThreadsBy::kokkos;
  std::string setting_;
};

}  // namespace shardlib
