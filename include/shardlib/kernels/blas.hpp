// SPDX-License-Identifier: Apache-2.0
/// @file
/// Which BLAS does the host GEMM's work, which of its kernels runs, and how many threads it may
/// use: what `Runtime::describe()` and the benchmarks report, and the knob the runtime turns.
///
/// ```
/// shardlib::kernels::BlasInfo b = shardlib::kernels::blas_info();
/// std::puts(b.kernel().c_str());   // "openblas 0.3.21 Cooperlake", or "eigen" without a BLAS
/// ```
///
/// OpenBLAS picks its kernel (its "core") when the program starts, from the CPU, unless
/// `OPENBLAS_CORETYPE` names one; `openblas_get_corename()` says which it took. Its thread count
/// is one setting for the whole process: `set_blas_threads` sets it (the runtime sets each
/// device's share of the host; with several in-process devices every device calls the BLAS at
/// once, from its own thread). `set_blas_core` changes the kernel while the program runs, as
/// `OPENBLAS_CORETYPE` would have at its start (the runtime does it where OpenBLAS misjudged the
/// CPU: runtime/host.hpp).
///
/// Needs neither Eigen nor Kokkos. OpenBLAS's functions are declared weak, so that a program
/// linked against another BLAS still links: they are then null, and the report says less.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#if defined(__GNUC__) || defined(__clang__)
// OpenBLAS's own queries and thread control (cblas.h declares them the same way).
extern "C" {
void openblas_set_num_threads(int) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
char* openblas_get_config(void) __attribute__((weak));
// A DYNAMIC_ARCH OpenBLAS's kernel choice: `quit` forgets it, `init` makes it again (from
// OPENBLAS_CORETYPE when set, else from the CPU) and initialises the chosen kernel's parameters.
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}
#define SHARDLIB_OPENBLAS_WEAK 1
#endif

namespace shardlib::kernels {

/// Which GEMM does the work for float and double, for reports and benchmarks: "openblas" when
/// Eigen hands its products to OpenBLAS, "blas" for another BLAS under `EIGEN_USE_BLAS`, "eigen"
/// for Eigen's own kernel. Other element types always use Eigen's own kernel.
constexpr const char* gemm_backend() noexcept {
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_HAVE_OPENBLAS) && SHARDLIB_HAVE_OPENBLAS
  return "openblas";
#elif defined(EIGEN_USE_BLAS)
  return "blas";
#else
  return "eigen";
#endif
}

/// What the host GEMM runs on, as far as the BLAS says.
struct BlasInfo {
  /// gemm_backend(): "openblas", "blas" or "eigen".
  std::string backend;
  /// OpenBLAS's version ("0.3.21"), from its configuration string; empty when unknown.
  std::string version;
  /// The kernel OpenBLAS runs ("Cooperlake", "Haswell", "Prescott"; a build for one target may
  /// say "HASWELL"); empty when the BLAS does not say (another BLAS, or Eigen's own kernel).
  std::string core;
  /// OpenBLAS's configuration string ("OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake
  /// MAX_THREADS=64"); empty when unknown.
  std::string config;
  /// Whether this OpenBLAS chooses its kernel when the program starts (built with DYNAMIC_ARCH),
  /// so that OPENBLAS_CORETYPE can change it.
  bool dynamic_arch = false;
  /// False when the backend is OpenBLAS but the program did not load it: a linker that drops
  /// unused libraries (`--as-needed`) leaves it out of a program that makes no GEMM call.
  bool loaded = true;

  /// One short name for records: "openblas 0.3.21 Cooperlake", "blas", "eigen", "openblas (not
  /// loaded)".
  std::string kernel() const {
    if (!loaded) return backend + " (not loaded)";
    std::string s = backend;
    if (!version.empty()) s += " " + version;
    if (!core.empty()) s += " " + core;
    return s;
  }
};

/// What this process's GEMM runs on (asks OpenBLAS when it is the backend).
inline BlasInfo blas_info() {
  BlasInfo b;
  b.backend = gemm_backend();
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_OPENBLAS_WEAK)
  if (openblas_get_corename != nullptr)
    if (const char* c = openblas_get_corename()) b.core = c;
  if (openblas_get_config != nullptr)
    if (const char* c = openblas_get_config()) b.config = c;
  const std::string_view cfg = b.config;
  if (cfg.substr(0, 9) == "OpenBLAS ") {
    const std::size_t end = cfg.find(' ', 9);
    b.version = std::string(cfg.substr(9, end == std::string_view::npos ? std::string_view::npos : end - 9));
  }
  b.dynamic_arch = cfg.find("DYNAMIC_ARCH") != std::string_view::npos;
  b.loaded = b.backend != "openblas" || openblas_get_config != nullptr;
#endif
  return b;
}

/// Whether this process's OpenBLAS can change its kernel while running (`set_blas_core`): it
/// chooses at start (DYNAMIC_ARCH) and exports its choice's `gotoblas_dynamic_init`/`_quit`.
inline bool blas_core_settable() {
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_OPENBLAS_WEAK)
  return gotoblas_dynamic_init != nullptr && gotoblas_dynamic_quit != nullptr && openblas_get_corename != nullptr &&
         blas_info().dynamic_arch;
#else
  return false;
#endif
}

/// Makes OpenBLAS run its kernel `core` ("SkylakeX", "Haswell") from now on, as
/// `OPENBLAS_CORETYPE=core` would have when the program started, and returns the kernel it runs
/// afterwards: OpenBLAS itself checks that the CPU and OS support the kernel's instructions and
/// takes an older one when they do not (Prescott for a name it does not know). The environment is
/// left as it was. std::nullopt, changing nothing, where the kernel cannot be set
/// (`blas_core_settable()` is false). Call it while no GEMM runs anywhere in the process: the
/// runtime does, once, before its devices start (runtime/host.hpp says when).
inline std::optional<std::string> set_blas_core([[maybe_unused]] const std::string& core) {
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_OPENBLAS_WEAK)
  if (!blas_core_settable()) return std::nullopt;
  static std::mutex m;
  const std::lock_guard<std::mutex> lock(m);
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::optional<std::string> saved = before ? std::optional<std::string>(before) : std::nullopt;
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (saved) ::setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
  else ::unsetenv("OPENBLAS_CORETYPE");
  const char* now = openblas_get_corename();
  return std::string(now ? now : "");
#else
  return std::nullopt;
#endif
}

namespace detail {
inline std::atomic<int>& blas_threads_setting() noexcept {
  static std::atomic<int> n{1};  // one thread per call until a runtime says otherwise
  return n;
}
}  // namespace detail

/// The BLAS thread count last set by set_blas_threads (1 until then: every call runs on its
/// caller's thread alone).
inline int blas_threads() noexcept { return detail::blas_threads_setting().load(std::memory_order_relaxed); }

/// Sets the BLAS's thread count for the whole process (OpenBLAS: openblas_set_num_threads; a
/// BLAS with no such call keeps its own). Call it while no GEMM runs: the runtime does, before it
/// starts the devices.
inline void set_blas_threads(int n) noexcept {
  if (n < 1) n = 1;
  detail::blas_threads_setting().store(n, std::memory_order_relaxed);
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_OPENBLAS_WEAK)
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(n);
#endif
}

/// Whether this process can make the BLAS run single-threaded for a while (OpenBLAS loaded, its
/// thread count settable): what `BlasSingleThreaded` needs.
inline bool blas_threads_settable() noexcept {
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_OPENBLAS_WEAK)
  return openblas_set_num_threads != nullptr;
#else
  return false;
#endif
}

/// While one lives (anywhere in the process), every BLAS call runs on its caller's thread alone:
/// for code that spreads independent products over threads of its own (kernels::gemm's batches).
/// The last one to go gives the BLAS `blas_threads()` back. Meanwhile a product elsewhere in the
/// process (another in-process device's) runs on one thread too: slower, never wrong.
class BlasSingleThreaded {
 public:
  BlasSingleThreaded() {
    const std::lock_guard<std::mutex> lock(mutex());
    if (active()++ == 0) apply(1);
  }
  ~BlasSingleThreaded() {
    const std::lock_guard<std::mutex> lock(mutex());
    if (--active() == 0) apply(blas_threads());
  }
  BlasSingleThreaded(const BlasSingleThreaded&) = delete;
  BlasSingleThreaded& operator=(const BlasSingleThreaded&) = delete;

 private:
  static std::mutex& mutex() noexcept {
    static std::mutex m;
    return m;
  }
  static int& active() noexcept {
    static int n = 0;
    return n;
  }
  static void apply([[maybe_unused]] int n) noexcept {
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_OPENBLAS_WEAK)
    if (openblas_set_num_threads != nullptr) openblas_set_num_threads(n);
#endif
  }
};

}  // namespace shardlib::kernels
