// SPDX-License-Identifier: Apache-2.0
// Each device's share of the host (threads for the BLAS and Kokkos) and the BLAS kernel report:
// the pure decisions on made-up machines, then what a runtime of this process applies and says.
// Runs under mpirun too: then the applied share is the MPI runtime's (ranks on this node).
#include <doctest/doctest.h>

#include "../collectives/harness.hpp"
#include "../errors.hpp"

#include <shardlib/kernels/blas.hpp>
#include <shardlib/kernels/gemm.hpp>
#include <shardlib/runtime/host.hpp>
#include <shardlib/runtime/runtime.hpp>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace sl = shardlib;
namespace host = shardlib::host;
using sl::test::message_of;

namespace {
/// Sets (or, with nullptr, unsets) an environment variable for the scope, then puts it back.
struct EnvScope {
  std::string name;
  std::optional<std::string> old;
  EnvScope(const char* n, const char* value) : name(n) {
    if (const char* s = std::getenv(n)) old = s;
    if (value)
      setenv(n, value, 1);
    else
      unsetenv(n);
  }
  ~EnvScope() {
    if (old)
      setenv(name.c_str(), old->c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

/// Threads of a host execution space instance. (With Kokkos 4's deprecated code enabled,
/// `instance.concurrency()` calls the static `concurrency(OpenMP())`: the default instance's.)
int threads_of([[maybe_unused]] const Kokkos::DefaultHostExecutionSpace& e) {
#if defined(KOKKOS_ENABLE_OPENMP) && KOKKOS_VERSION >= 40000
  if constexpr (std::is_same_v<Kokkos::DefaultHostExecutionSpace, Kokkos::OpenMP>) return e.impl_thread_pool_size();
#endif
  return 1;  // no pool (Serial), or a Kokkos 3 that shares one pool: not sized per device
}

host::CpuFeatures cpu(host::Isa best, std::string model = "Test CPU") { return {true, best, std::move(model)}; }
sl::kernels::BlasInfo openblas(std::string core, bool dynamic_arch = true) {
  return {"openblas", "0.3.21", core, "OpenBLAS 0.3.21 " + std::string(dynamic_arch ? "DYNAMIC_ARCH " : "") + core,
          dynamic_arch};
}
}  // namespace

TEST_SUITE("runtime_host") {
  TEST_CASE("thread_share: the host's cores over its devices, at least 1 each") {
    auto one = host::thread_share(2, 1);
    CHECK(one.per_device == 2);  // one device alone uses both cores
    CHECK_FALSE(one.overridden);
    CHECK(one.source == "2 cores / 1 device on this host");
    CHECK(host::thread_share(16, 3).per_device == 5);
    CHECK(host::thread_share(16, 4).source == "16 cores / 4 devices on this host");
    auto crowded = host::thread_share(2, 8);  // more devices than cores: one thread each
    CHECK(crowded.per_device == 1);
    CHECK(crowded.source == "8 devices on this host share 2 cores: 1 each");
    CHECK(host::thread_share(1, 1).per_device == 1);
    CHECK(host::thread_share(0, 0).per_device == 1);  // nonsense counts still give one thread
  }

  TEST_CASE("thread_share: an override within the cores wins, and a bad one is refused by name") {
    auto o = host::thread_share(4, 8, "3");
    CHECK(o.per_device == 3);
    CHECK(o.overridden);
    CHECK(o.source == "SHARDLIB_THREADS_PER_DEVICE=3");
    CHECK(host::thread_share(2, 1, "1").per_device == 1);
    CHECK(host::thread_share(2, 1, "2").per_device == 2);
    const std::string want = "shardlib: SHARDLIB_THREADS_PER_DEVICE must be a whole number from 1 to 2 (the cores "
                             "this host's devices may run on), got '";
    for (const char* bad : {"0", "3", "-1", "two", "", "1.5", "2 ", "99999999999999999999"})
      CHECK(message_of<std::invalid_argument>([&] { host::thread_share(2, 1, bad); }) == want + bad + "'");
    CHECK(message_of<std::invalid_argument>([] { host::thread_share(8, 2, "9", "--threads-per-device"); }) ==
          "shardlib: --threads-per-device must be a whole number from 1 to 8 (the cores this host's devices may run "
          "on), got '9'");
  }

  TEST_CASE("core_isa knows OpenBLAS's x86 kernels in any case, and nothing else") {
    CHECK(host::core_isa("Cooperlake") == host::Isa::avx512);
    CHECK(host::core_isa("SKYLAKEX") == host::Isa::avx512);
    CHECK(host::core_isa("Haswell") == host::Isa::avx2);
    CHECK(host::core_isa("Zen") == host::Isa::avx2);
    CHECK(host::core_isa("Sandybridge") == host::Isa::avx);
    CHECK(host::core_isa("Prescott") == host::Isa::sse);
    CHECK(host::core_isa("NEOVERSEN1") == host::Isa::unknown);
    CHECK(host::core_isa("") == host::Isa::unknown);
  }

  TEST_CASE("simd_advice: kernels compiled narrower than the CPU's vectors get the -march=native note") {
    namespace h = shardlib::host;
    CHECK(h::simd_advice(h::Isa::avx512, 16) ==
          "this CPU has AVX-512 (16 floats a vector) but the kernels were compiled for 4; build with -march=native "
          "for 2-4x faster elementwise, softmax and norm kernels");
    CHECK(h::simd_advice(h::Isa::avx2, 16).find("AVX2 (8 floats a vector)") != std::string::npos);
    CHECK(h::simd_advice(h::Isa::avx512, 64).empty());
    CHECK(h::simd_advice(h::Isa::avx2, 32).empty());
    CHECK(h::simd_advice(h::Isa::unknown, 16).empty());
    CHECK(h::simd_advice(h::Isa::sse, 16).empty());
  }

  TEST_CASE("blas_advice: OPENBLAS_CORETYPE forcing Haswell on an AVX-512 CPU warns, with the fix") {
    auto a = host::blas_advice(cpu(host::Isa::avx512, "AMD EPYC"), openblas("Haswell"), "Haswell");
    CHECK(a.warn);
    CHECK(a.text ==
          "OpenBLAS runs its Haswell kernel (AVX2) on this CPU (AMD EPYC), which has AVX-512: GEMM runs at a fraction "
          "of the speed this CPU allows, because OPENBLAS_CORETYPE=Haswell forces that kernel");
    CHECK(a.fix == "unset OPENBLAS_CORETYPE (or export OPENBLAS_CORETYPE=SkylakeX)");
    CHECK(host::blas_warning_text(a) == "shardlib warning: " + a.text + ". Fix: " + a.fix +
                                            "   (SHARDLIB_NO_BLAS_WARNING=1 silences this)");
  }

  TEST_CASE("blas_advice: OpenBLAS picking Prescott on an AVX-512 CPU by itself warns, fix SkylakeX") {
    auto a = host::blas_advice(cpu(host::Isa::avx512, "INTEL(R) XEON(R) PLATINUM 8580"), openblas("Prescott"));
    CHECK(a.warn);
    CHECK(a.text.find("its Prescott kernel (SSE)") != std::string::npos);
    CHECK(a.text.find("as OpenBLAS 0.3.21 does not recognise this CPU") != std::string::npos);
    CHECK(a.fix == "export OPENBLAS_CORETYPE=SkylakeX");
    // An AVX2 CPU on a kernel older than Haswell: fix Haswell.
    auto b = host::blas_advice(cpu(host::Isa::avx2), openblas("Sandybridge"));
    CHECK(b.warn);
    CHECK(b.fix == "export OPENBLAS_CORETYPE=Haswell");
    // An OpenBLAS built for one target cannot be switched: the fix says what to install.
    auto c = host::blas_advice(cpu(host::Isa::avx512), openblas("HASWELL", false));
    CHECK(c.warn);
    CHECK(c.fix == "use an OpenBLAS built with DYNAMIC_ARCH=1 (Debian's libopenblas0-pthread is)");
  }

  TEST_CASE("blas_core_to_take: only a kernel OpenBLAS misjudged by itself is switched, to the CPU's") {
    // OpenBLAS 0.3.21 on an Emerald Rapids: Prescott by itself -> SkylakeX; AVX2 -> Haswell.
    CHECK(host::blas_core_to_take(cpu(host::Isa::avx512), openblas("Prescott")) == std::optional<std::string>("SkylakeX"));
    CHECK(host::blas_core_to_take(cpu(host::Isa::avx2), openblas("Sandybridge")) == std::optional<std::string>("Haswell"));
    // The user's OPENBLAS_CORETYPE is theirs, even a slow one (the warning says so).
    CHECK_FALSE(host::blas_core_to_take(cpu(host::Isa::avx512), openblas("Haswell"), "Haswell"));
    // SHARDLIB_BLAS_CORE=keep; an OpenBLAS built for one kernel; a kernel that suits the CPU;
    // an unknown CPU or kernel; an AVX CPU (no better kernel to take); no BLAS; not loaded.
    CHECK_FALSE(host::blas_core_to_take(cpu(host::Isa::avx512), openblas("Prescott"), {}, true));
    CHECK_FALSE(host::blas_core_to_take(cpu(host::Isa::avx512), openblas("PRESCOTT", false)));
    CHECK_FALSE(host::blas_core_to_take(cpu(host::Isa::avx512), openblas("Cooperlake")));
    CHECK_FALSE(host::blas_core_to_take(cpu(host::Isa::avx2), openblas("Zen")));
    CHECK_FALSE(host::blas_core_to_take(host::CpuFeatures{}, openblas("Prescott")));
    CHECK_FALSE(host::blas_core_to_take(cpu(host::Isa::avx512), openblas("NEOVERSEN1")));
    CHECK_FALSE(host::blas_core_to_take(cpu(host::Isa::avx), openblas("Prescott")));
    CHECK_FALSE(host::blas_core_to_take(cpu(host::Isa::avx512), {"eigen", "", "", "", false}));
    CHECK_FALSE(host::blas_core_to_take(cpu(host::Isa::avx512), {"openblas", "", "", "", true, false}));
  }

  TEST_CASE("blas_core_keep: SHARDLIB_BLAS_CORE takes 'keep' or nothing; any other value is an error naming it") {
    CHECK_FALSE(host::blas_core_keep(std::nullopt));
    CHECK_FALSE(host::blas_core_keep(""));
    CHECK(host::blas_core_keep("keep"));
    for (const char* bad : {"Keep", "KEEP", "no", "0", "1", "SkylakeX", "keep "}) {
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(host::blas_core_keep(bad),
                           doctest::Contains(doctest::String(("SHARDLIB_BLAS_CORE is '" + std::string(bad) + "'").c_str())),
                           std::invalid_argument);
      CHECK_THROWS_WITH_AS(host::blas_core_keep(bad), doctest::Contains("the one value it takes is 'keep'"),
                           std::invalid_argument);
    }
  }

  TEST_CASE("set_blas_core switches this process's OpenBLAS kernel and back; products stay right") {
    if (!sl::kernels::blas_core_settable()) {
      MESSAGE("skipped: this OpenBLAS cannot change its kernel (not DYNAMIC_ARCH, or not the BLAS)");
      return;
    }
    if (host::detect_cpu().best < host::Isa::avx2) {
      MESSAGE("skipped: the check switches to Haswell's kernel, which needs AVX2");
      return;
    }
#if defined(EIGEN_USE_BLAS) && !defined(EIGEN_USE_MKL)
    // A product on whichever kernel runs: 64 x 48 x 80, against a plain loop.
    auto product_right = [] {
      const int m = 64, n = 48, k = 80;
      std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)), c(static_cast<std::size_t>(m * n));
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
      sl::kernels::detail::blas_gemm('N', 'N', m, n, k, 1.0f, a.data(), m, b.data(), k, 0.0f, c.data(), m);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
          float want = 0;
          for (int l = 0; l < k; ++l) want += a[static_cast<std::size_t>(i + l * m)] * b[static_cast<std::size_t>(l + j * k)];
          if (c[static_cast<std::size_t>(i + j * m)] != want) return false;  // small integers: exact
        }
      return true;
    };
    const std::string before = sl::kernels::blas_info().core;
    const char* env_before = std::getenv("OPENBLAS_CORETYPE");
    const std::optional<std::string> env_saved = env_before ? std::optional<std::string>(env_before) : std::nullopt;
    REQUIRE(sl::kernels::set_blas_core("Haswell") == std::optional<std::string>("Haswell"));
    CHECK(sl::kernels::blas_info().core == "Haswell");
    CHECK(sl::kernels::blas_info().config.find(" Haswell ") != std::string::npos);
    CHECK(product_right());
    // The environment is as it was.
    const char* env_after = std::getenv("OPENBLAS_CORETYPE");
    CHECK((env_after ? std::optional<std::string>(env_after) : std::nullopt) == env_saved);
    // Back to the kernel this process ran (OpenBLAS's choice, or the runtime's).
    CHECK(sl::kernels::set_blas_core(before) == std::optional<std::string>(before));
    CHECK(product_right());
#endif
  }

  TEST_CASE("the runtime takes the CPU's kernel where OpenBLAS misjudged it, and describe() says so") {
    std::optional<sl::Runtime> own;
    sl::Runtime* rt = sl::test::mpi_runtime();
    if (!rt) rt = &own.emplace(sl::Runtime::threads(1));
    const host::BlasSwitch& sw = host::take_blas_core_once();
    const sl::kernels::BlasInfo now = sl::kernels::blas_info();
    // After the runtime started, no kernel is left far below this CPU that the runtime could
    // have switched (whatever this machine is: a switch happened, or none was due).
    std::optional<std::string_view> coretype;
    if (const char* s = std::getenv("OPENBLAS_CORETYPE")) coretype = s;
    const char* keep = std::getenv(host::blas_core_variable);
    const bool kept = keep && std::string_view(keep) == "keep";
    if (sl::kernels::blas_core_settable()) CHECK_FALSE(host::blas_core_to_take(host::detect_cpu(), now, coretype, kept));
    if (sw.switched) {
      CHECK(sw.to == now.core);
      CHECK(sw.text.find("shardlib switched it to " + sw.to) != std::string::npos);
      CHECK(rt->describe().find("\nGEMM note: " + sw.text) != std::string::npos);
      CHECK_FALSE(host::blas_advice_here().warn);
    } else {
      CHECK(rt->describe().find("shardlib switched it") == std::string::npos);
    }
  }

  TEST_CASE("blas_advice: a kernel that suits the CPU says nothing") {
    for (const char* core : {"Cooperlake", "SkylakeX", "SapphireRapids"}) {
      auto a = host::blas_advice(cpu(host::Isa::avx512), openblas(core));
      CHECK_FALSE(a.warn);
      CHECK(a.text.empty());
      CHECK(a.fix.empty());
    }
    CHECK_FALSE(host::blas_advice(cpu(host::Isa::avx512), openblas("SkylakeX"), "SkylakeX").warn);  // forced, but fine
    CHECK_FALSE(host::blas_advice(cpu(host::Isa::avx2), openblas("Haswell")).warn);
    CHECK_FALSE(host::blas_advice(cpu(host::Isa::avx2), openblas("Zen")).warn);
    CHECK_FALSE(host::blas_advice(cpu(host::Isa::avx), openblas("Sandybridge")).warn);
  }

  TEST_CASE("blas_advice: an unknown kernel or CPU gives a neutral note, never a warning") {
    auto arm = host::blas_advice(cpu(host::Isa::unknown), openblas("NEOVERSEN1"));
    CHECK_FALSE(arm.warn);
    CHECK(arm.text == "OpenBLAS kernel NEOVERSEN1 (not one shardlib can compare with the CPU)");
    auto unknown_cpu = host::blas_advice(host::CpuFeatures{}, openblas("Prescott"));
    CHECK_FALSE(unknown_cpu.warn);
    CHECK(unknown_cpu.text == "OpenBLAS kernel Prescott (SSE); this CPU's vector extensions are unknown, so it is not compared");
    auto other_blas = host::blas_advice(cpu(host::Isa::avx512), {"blas", "", "", "", false});
    CHECK_FALSE(other_blas.warn);
    CHECK(other_blas.text == "the BLAS (blas) does not say which kernel it runs");
    CHECK(host::blas_warning_text(other_blas).empty());
    sl::kernels::BlasInfo absent{"openblas", "", "", "", false, false};
    CHECK(absent.kernel() == "openblas (not loaded)");
    auto not_loaded = host::blas_advice(cpu(host::Isa::avx512), absent);
    CHECK_FALSE(not_loaded.warn);
    CHECK(not_loaded.text == "OpenBLAS is not loaded in this program (it makes no GEMM call), so its kernel is not known");
  }

  TEST_CASE("blas_advice: no BLAS (Eigen's own kernel) warns, saying so") {
    auto a = host::blas_advice(cpu(host::Isa::avx512), {"eigen", "", "", "", false});
    CHECK(a.warn);
    CHECK(a.text.find("no BLAS: float and double GEMM run Eigen's own kernel") == 0);
    CHECK(a.fix == "install OpenBLAS (Debian/Ubuntu: apt install libopenblas-dev) and configure the build again");
  }

  TEST_CASE("the BLAS warning prints once, and SHARDLIB_NO_BLAS_WARNING silences it") {
    const auto a = host::blas_advice(cpu(host::Isa::avx512), openblas("Haswell"), "Haswell");
    std::FILE* f = std::tmpfile();
    REQUIRE(f != nullptr);
    auto text = [&] {
      std::string s(4096, '\0');
      std::rewind(f);
      s.resize(std::fread(s.data(), 1, s.size(), f));
      return s;
    };
    {
      EnvScope loud(host::no_blas_warning_variable, nullptr);
      std::once_flag once;
      CHECK(host::warn_blas_once(a, once, f));
      CHECK_FALSE(host::warn_blas_once(a, once, f));  // once
      CHECK(text() == host::blas_warning_text(a) + "\n");
      std::once_flag other;
      CHECK_FALSE(host::warn_blas_once(host::blas_advice(cpu(host::Isa::avx512), openblas("Cooperlake")), other, f));
    }
    {
      EnvScope quiet(host::no_blas_warning_variable, "1");
      std::once_flag once;
      CHECK_FALSE(host::warn_blas_once(a, once, f));
    }
    {
      EnvScope zero(host::no_blas_warning_variable, "0");  // "0" does not silence
      std::once_flag once;
      CHECK(host::warn_blas_once(a, once, f));
    }
    std::fclose(f);
  }

  TEST_CASE("blas_info names the configured backend, and OpenBLAS's kernel and version when it runs") {
    const auto b = sl::kernels::blas_info();
    CHECK(b.backend == sl::kernels::gemm_backend());
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_HAVE_OPENBLAS) && SHARDLIB_HAVE_OPENBLAS
    REQUIRE(b.loaded);  // this executable calls sgemm_ (the kernels suites), so OpenBLAS is loaded
    CHECK_FALSE(b.core.empty());
    CHECK(b.config.rfind("OpenBLAS " + b.version + " ", 0) == 0);
    CHECK_FALSE(b.version.empty());
    CHECK(b.kernel() == "openblas " + b.version + " " + b.core);
#else
    CHECK(b.kernel() == b.backend);
#endif
  }

  TEST_CASE("describe() says the threads per device and where they came from, and the BLAS kernel") {
    host::take_blas_core_once();  // (what a runtime does first: the kernel it names is the one after)
    const auto b = sl::kernels::blas_info();
    auto check = [&](const sl::Runtime& rt) {
      const std::string d = rt.describe();
      const int t = rt.thread_share().per_device;
      CHECK(d.find("\nhost threads: " + std::to_string(t) + " per device (" + rt.thread_share().source) != std::string::npos);
      CHECK(d.find("\nGEMM: " + b.kernel()) != std::string::npos);
      if (!b.config.empty()) CHECK(d.find(" (" + b.config + ")") != std::string::npos);
      CHECK(d.find("\nKokkos host space: " + std::string(Kokkos::DefaultHostExecutionSpace::name())) != std::string::npos);
      CHECK(d.find("\nvector math: Eigen packets of " + std::to_string(sl::kernels::vmath::packet_bytes()) + " bytes (" +
                   sl::kernels::vmath::simd_in_use() + ")") != std::string::npos);
      CHECK((d.find("; double exp, log, tanh, erf: glibc libmvec") != std::string::npos) ==
            sl::kernels::vmath::uses_libmvec());
    };
    if (sl::Runtime* rt = sl::test::mpi_runtime()) {
      check(*rt);
      return;
    }
    auto rt = sl::Runtime::threads(3);
    CHECK(rt.describe().rfind("threads backend, 3 in-process devices\n", 0) == 0);
    check(rt);
  }

  TEST_CASE("each device gets its share of this host: the BLAS's threads, and the Kokkos instance's") {
    const int cores = host::cores_available();
    if (sl::Runtime* rt = sl::test::mpi_runtime()) {
      // All ranks of this job run on this host (mpirun on one machine): they share its cores.
      // (The cores are the union of the ranks' affinity masks; unbound ranks each see them all.)
      const int union_cores = rt->thread_share().cores;
      CHECK(union_cores >= cores);
      const int share = std::min(std::max(1, union_cores / rt->num_devices()), cores);
      CHECK(rt->thread_share().devices_on_host == rt->num_devices());
      CHECK(rt->thread_share().per_device == share);
      rt->spmd([&](sl::Context&) { CHECK(sl::kernels::blas_threads() == share); });
      return;
    }
    EnvScope no_override(host::threads_per_device_variable, nullptr);
    for (int n : {1, 2, cores + 1}) {
      CAPTURE(n);
      auto rt = sl::Runtime::threads(n);
      const int share = std::max(1, cores / n);
      CHECK(rt.thread_share().per_device == share);  // one device alone: all the cores
      rt.spmd([&](sl::Context& ctx) {
        CHECK(sl::kernels::blas_threads() == share);
        if constexpr (sl::KokkosScope::host_space_has_pool() && KOKKOS_VERSION >= 40000)
          CHECK(threads_of(ctx.exec()) == share);  // each device's Kokkos instance: its share too
      });
#if defined(EIGEN_USE_BLAS) && defined(SHARDLIB_OPENBLAS_WEAK)
      if (openblas_get_num_threads != nullptr) CHECK(openblas_get_num_threads() == share);
#endif
    }
  }

  TEST_CASE("SHARDLIB_THREADS_PER_DEVICE and --threads-per-device set the share; bad values are refused") {
    if (sl::test::mpi_runtime()) return;  // threads runtimes only
    const int cores = host::cores_available();
    {
      EnvScope one(host::threads_per_device_variable, "1");
      auto rt = sl::Runtime::threads(1);
      CHECK(rt.thread_share().per_device == 1);
      CHECK(rt.thread_share().source == "SHARDLIB_THREADS_PER_DEVICE=1");
      rt.spmd([&](sl::Context& ctx) {
        CHECK(sl::kernels::blas_threads() == 1);
        CHECK(threads_of(ctx.exec()) == 1);  // the device's own Kokkos instance
      });
    }
    {
      EnvScope zero(host::threads_per_device_variable, "0");
      CHECK(message_of<std::invalid_argument>([] { sl::Runtime::threads(2); }) ==
            "shardlib: SHARDLIB_THREADS_PER_DEVICE must be a whole number from 1 to " + std::to_string(cores) +
                " (the cores this host's devices may run on), got '0'");
      const std::string too_many = std::to_string(cores + 1);
      EnvScope many(host::threads_per_device_variable, too_many.c_str());
      CHECK(message_of<std::invalid_argument>([] { sl::Runtime::threads(1); }).find("got '" + too_many + "'") !=
            std::string::npos);
    }
    {
      EnvScope unset(host::threads_per_device_variable, nullptr);
      char prog[] = "prog", flag[] = "--threads-per-device", value[] = "x";
      char* argv[] = {prog, flag, value, nullptr};
      int argc = 3;
      CHECK(message_of<std::invalid_argument>([&] { sl::Runtime::from_args(argc, argv); }) ==
            "shardlib: --threads-per-device must be a whole number from 1 to " + std::to_string(cores) +
                " (the cores this host's devices may run on), got 'x'");
      char one[] = "1", devices[] = "--devices=2";
      char* argv2[] = {prog, flag, one, devices, nullptr};
      int argc2 = 4;
      auto rt = sl::Runtime::from_args(argc2, argv2);
      CHECK(argc2 == 1);  // its arguments are taken out
      CHECK(rt.thread_share().per_device == 1);
      CHECK(rt.thread_share().source == "--threads-per-device=1");
    }
  }

  TEST_CASE("a Kokkos initialised before the runtime is left as it was, and describe() says so") {
    if (sl::test::mpi_runtime()) return;  // the test main's KokkosScope started Kokkos (threads only)
    auto rt = sl::Runtime::threads(2);
    if constexpr (sl::KokkosScope::host_space_has_pool())
      CHECK(rt.describe().find("Kokkos was initialised before the runtime; left as it was") != std::string::npos);
    else
      CHECK(rt.describe().find("\nKokkos host space: " + std::string(Kokkos::DefaultHostExecutionSpace::name()) +
                               "") != std::string::npos);
    // What the program gave Kokkos itself is found (and then wins over shardlib's share).
    char prog[] = "prog", arg[] = "--kokkos-num-threads=3";
    char* argv[] = {prog, arg, nullptr};
    CHECK(sl::KokkosScope::program_thread_setting(2, argv) == std::optional<std::string>("--kokkos-num-threads=3"));
    EnvScope no_kokkos("KOKKOS_NUM_THREADS", nullptr);
    EnvScope no_omp("OMP_NUM_THREADS", nullptr);
    CHECK(sl::KokkosScope::program_thread_setting(1, argv) == std::nullopt);
    EnvScope kokkos("KOKKOS_NUM_THREADS", "5");
    CHECK(sl::KokkosScope::program_thread_setting(1, argv) == std::optional<std::string>("KOKKOS_NUM_THREADS=5"));
  }
}
