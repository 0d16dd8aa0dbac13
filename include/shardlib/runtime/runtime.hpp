// SPDX-License-Identifier: Apache-2.0
/// @file
/// Starting an SPMD program: the body runs once per device, on one of the backends.
///
/// ```
/// auto rt = shardlib::Runtime::from_args(argc, argv);   // --backend, --devices, or the environment
/// rt.spmd([](shardlib::Context& ctx) { ... ctx.world().all_reduce(...); });
/// ```
/// - `threads`: N virtual CPU devices in this process, one thread each (the embedded default,
///   like XLA's forced host device count). N from `--devices N`, else `SHARDLIB_DEVICES`.
/// - `mpi`: one device per MPI process (`mpirun -np N prog`), on one host or many.
/// - `nccl`: as mpi, one GPU per process (local rank % GPUs on its node), and the reshards of
///   tensors in GPU memory run on NCCL, on the device's stream (builds with SHARDLIB_HAVE_NCCL).
/// - `simulate`: one device of N (up to 65,536) that need not exist, shape-only
///   (detail/shape_only.hpp: tensors have shapes and bytes, no storage; kernels do nothing) with
///   collectives counted and not performed (collectives/simulated.hpp): the program's memory
///   account and collectives on a mesh it does not have. Device 0, or `--simulate-device R`
///   (SHARDLIB_SIMULATE_DEVICE). Only the backend picks it.
/// The backend is `--backend threads|mpi|nccl`, else `SHARDLIB_BACKEND`, else mpi when the
/// program was started by mpirun (and shardlib was built with MPI), else threads.
///
/// The Runtime also owns the process's Kokkos initialisation (KokkosScope) and, under mpi,
/// MPI's (unless the program initialised MPI itself).
///
/// Each device gets its share of the host's cores (runtime/host.hpp): `max(1, cores available /
/// devices on this host)` threads for the BLAS and for its Kokkos host execution space (on an
/// OpenMP Kokkos), where the devices on this host are the in-process devices (threads) or the MPI
/// ranks on this node (mpi); `--threads-per-device N` or `SHARDLIB_THREADS_PER_DEVICE` sets it.
/// `describe()` says the share and where it came from, and which BLAS kernel runs.
#pragma once

#include <shardlib/collectives/communicator.hpp>
#include <shardlib/collectives/simulated.hpp>
#include <shardlib/collectives/threads.hpp>
#include <Kokkos_Core.hpp>  // (KOKKOS_ENABLE_CUDA, before the test below)
#if defined(KOKKOS_ENABLE_CUDA)
#include <shardlib/collectives/threads_device.hpp>
#endif
#include <shardlib/kernels/blas.hpp>
#include <shardlib/kernels/vmath.hpp>
#include <shardlib/mesh.hpp>
#include <shardlib/runtime/host.hpp>
#include <shardlib/runtime/kokkos_scope.hpp>

#if defined(SHARDLIB_HAVE_MPI)
#include <shardlib/collectives/mpi.hpp>
#endif
#if defined(SHARDLIB_HAVE_NCCL)
#include <shardlib/collectives/nccl.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__unix__)
#include <sys/resource.h>
#endif

namespace shardlib {

/// Which backend runs the devices.
enum class Backend { threads, mpi, nccl, simulate };

constexpr std::string_view to_string(Backend b) noexcept {
  return b == Backend::threads ? "threads" : b == Backend::mpi ? "mpi" : b == Backend::nccl ? "nccl" : "simulate";
}

/// Whether this build of shardlib has the nccl backend (SHARDLIB_HAVE_NCCL: the shardlib-nccl
/// dependency, or CMake's shardlib::nccl).
constexpr bool has_nccl() noexcept {
#if defined(SHARDLIB_HAVE_NCCL)
  return true;
#else
  return false;
#endif
}

/// Whether this build of shardlib has the MPI backend.
constexpr bool has_mpi() noexcept {
#if defined(SHARDLIB_HAVE_MPI)
  return true;
#else
  return false;
#endif
}

namespace detail {
/// Whether blocks in `MemorySpace` are read and written by host kernels (HostSpace, and the
/// host-accessible CUDA spaces: pinned and unified memory) rather than by the space's own
/// execution space's kernels (CudaSpace).
template <class MemorySpace>
inline constexpr bool host_memory_v = Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;
/// Whether this Kokkos has a default execution space apart from the host's (CUDA enabled).
inline constexpr bool has_device_space_v =
    !std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace>;
/// The execution space whose kernels work on blocks in `MemorySpace`: the host's for host memory,
/// the space's own otherwise (Kokkos::Cuda for Kokkos::CudaSpace).
template <class MemorySpace>
using exec_space_t = std::conditional_t<host_memory_v<MemorySpace>, Kokkos::DefaultHostExecutionSpace,
                                        typename MemorySpace::execution_space>;
struct NoDeviceSpace {};
/// What a Context keeps of its device execution space instance: nothing without one.
using DeviceInstance = std::conditional_t<has_device_space_v, Kokkos::DefaultExecutionSpace, NoDeviceSpace>;

/// Context::group's check, before a group is made, that every device makes the same one: making a
/// group is a split of the whole world, and two devices making different groups at the same point
/// would pair in it silently (wrong groups). (A device that makes none leaves the others waiting
/// here, as in any collective it skips: not this check's to tell.)
/// One all_reduce of a few words over `world` (not counted; skipped in a dry run, as
/// Communicator::mismatch is); when they differ, a std::logic_error on every device naming the
/// groups each device asked for.
inline void agree_on_group(coll::Communicator& world, const std::string& name, bool device_memory) {
  constexpr std::size_t kept = 120;  // bytes of the name compared word by word (and shown); then a hash
  std::vector<std::int64_t> words(2 + kept / 8, 0);
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the whole name
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  words[0] = static_cast<std::int64_t>((h & ~std::uint64_t{1}) | (device_memory ? 1u : 0u));
  words[1] = static_cast<std::int64_t>(name.size());
  for (std::size_t i = 0; i < std::min(name.size(), kept); ++i)
    words[2 + i / 8] |= static_cast<std::int64_t>(static_cast<unsigned char>(name[i])) << (8 * (i % 8));
  const std::vector<std::int64_t> all = world.mismatch(std::span<const std::int64_t>(words));
  if (all.empty()) return;
  const std::size_t n = words.size(), devices = all.size() / n;
  const auto text = [&](std::size_t d) {
    const std::int64_t* w = all.data() + d * n;
    std::string s;
    for (std::size_t i = 0; i < std::min(static_cast<std::size_t>(w[1]), kept); ++i)
      s += static_cast<char>((w[2 + i / 8] >> (8 * (i % 8))) & 0xff);
    if (static_cast<std::size_t>(w[1]) > kept) s += "...";
    return "'" + s + "'" + (w[0] & 1 ? " (device memory)" : "");
  };
  std::string what;  // the distinct groups, each with the devices asking for it
  std::vector<bool> told(devices, false);
  for (std::size_t d = 0; d < devices; ++d) {
    if (told[d]) continue;
    std::string who;
    std::size_t count = 0;
    for (std::size_t e = d; e < devices; ++e)
      if (!told[e] && std::equal(all.begin() + static_cast<std::ptrdiff_t>(e * n),
                                 all.begin() + static_cast<std::ptrdiff_t>((e + 1) * n),
                                 all.begin() + static_cast<std::ptrdiff_t>(d * n))) {
        told[e] = true;
        if (count++ < 8) who += (who.empty() ? "" : ", ") + std::to_string(e);
      }
    if (count > 8) who += " and " + std::to_string(count - 8) + " more";
    what += (what.empty() ? "" : "; ") + std::string(count > 1 ? "devices " : "device ") + who + " ask" +
            (count > 1 ? "" : "s") + " for " + text(d);
  }
  throw std::logic_error("shardlib: Context::group: the devices ask for different groups at the same point (" +
                         what +
                         "); making a group is collective over all devices, so every device must ask for the same "
                         "groups in the same order: ask for them up front, before code that only some devices run");
}
}  // namespace detail

/// One device's view of the run, handed to the SPMD body: who it is, and its communicators.
class Context {
 public:
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// This device, 0 <= device() < num_devices().
  int device() const noexcept { return device_; }
  int num_devices() const noexcept { return devices_; }
  /// "threads", "mpi" or "simulate" (the nccl backend's host collectives are mpi's: see
  /// device_world()).
  std::string_view backend() const noexcept { return world_->backend(); }
  /// All devices of the run.
  coll::Communicator& world() noexcept { return *world_; }
  /// The devices that check a factory's shape together (tensor.hpp): the world, or, while a
  /// pipeline stage's code runs (pipeline::StageScope), the devices of this device's stage, which
  /// alone run that code.
  coll::Communicator& agreement_group() noexcept { return agreement_ ? *agreement_ : *world_; }
  /// Internal (pipeline::StageScope): sets the agreement group (null: the world); returns the last.
  coll::Communicator* exchange_agreement_group(coll::Communicator* g) noexcept {
    std::swap(agreement_, g);
    return g;
  }

  /// This device's group along `axes` of `mesh` (the devices sharing its coordinates on the other
  /// axes), ranked by group rank (MeshShape::group_rank). Created on first use, which is
  /// collective over all devices (every device asks for the same group, in the same order: checked,
  /// a std::logic_error on every device naming the groups asked for when not; and never first
  /// inside a pipeline stage's code, std::logic_error), then cached: later calls cost a lookup.
  coll::Communicator& group(const MeshShape& mesh, const AxisList& axes) { return group_of(*world_, groups_, mesh, axes); }
  template <MeshType M>
  coll::Communicator& group(const M& mesh, const AxisList& axes) {
    return group(mesh.shape(), axes);
  }

  /// The collectives on device memory: under the nccl backend, its NCCL communicator over all
  /// devices (on this device's stream, the one of `exec_for<Kokkos::CudaSpace>()`); under
  /// threads on a CUDA-enabled Kokkos, the in-process devices' communicator over GPU memory
  /// (collectives/threads_device.hpp, on the same stream); nullptr otherwise (mpi, or no
  /// device memory), where tensors in device memory go through host memory.
  coll::Communicator* device_world() noexcept { return device_world_; }
  /// This device's group along `axes` of `mesh` on device_world() (as group(); collective on
  /// first use). Throws std::logic_error without a device world.
  coll::Communicator& device_group(const MeshShape& mesh, const AxisList& axes) {
    if (!device_world_)
      throw std::logic_error("shardlib: Context::device_group: the " + std::string(backend()) +
                             " backend has no collectives on device memory (the nccl backend has)");
    return group_of(*device_world_, device_groups_, mesh, axes);
  }

 private:
  struct CachedGroup {
    MeshShape mesh;
    AxisList axes;
    std::unique_ptr<coll::Communicator> comm;
  };
  coll::Communicator& group_of(coll::Communicator& parent, std::vector<CachedGroup>& cache, const MeshShape& mesh,
                               const AxisList& axes) {
    for (auto& g : cache)
      if (g.mesh == mesh && g.axes == axes) return *g.comm;
    mesh.require_devices(devices_);
    const int key = mesh.group_rank(device_, axes);  // also validates `axes`
    AxisList rest;
    for (int a = 0; a < mesh.rank(); ++a)
      if (!axes.contains(a)) rest.push_back(a);
    const int color = mesh.group_rank(device_, rest);  // which group: coordinates on the other axes
    std::string name = "group {";
    for (int i = 0; i < axes.size(); ++i) name += (i ? ", " : "") + mesh.name(axes[i]).str();
    name += "} of mesh " + mesh.to_string();
    if (agreement_)  // a stage's code runs on its devices alone: the others would never join the split
      throw std::logic_error("shardlib: Context::group: " + name + (&parent == device_world_ ? " (device memory)" : "") +
                             " first asked for inside a pipeline stage's code (pipeline::StageScope), which the other "
                             "stages' devices do not run; making a group is collective over all devices: ask for it "
                             "on every device before the scope (StageScope makes every group of its own mesh)");
    detail::agree_on_group(*world_, name, &parent == device_world_);
    auto comm = parent.split(color, key, mesh.group_size(axes), std::move(name));
    std::vector<int> members = mesh.group_devices(device_, axes);  // ranked as `key` ranks them
    for (int& m : members) m = parent.world_device(m);
    comm->set_world_devices(std::move(members));
    cache.push_back({mesh, axes, std::move(comm)});
    return *cache.back().comm;
  }

 public:

  /// The Kokkos execution space instance this device's kernels run on: its own instance per
  /// in-process device where Kokkos can make one (Kokkos 4 and later), else the default one.
  const Kokkos::DefaultHostExecutionSpace& exec() const noexcept { return exec_; }
  /// The instance whose kernels work on blocks in `MemorySpace`: exec() for host memory; on a
  /// CUDA-enabled Kokkos, this device's own instance of Kokkos::Cuda (its own stream) for
  /// Kokkos::CudaSpace. Kernels on it are ordered by its stream: nothing waits on the host until
  /// the host reads a result.
  template <class MemorySpace>
  const detail::exec_space_t<MemorySpace>& exec_for() const noexcept {
    if constexpr (detail::host_memory_v<MemorySpace>) {
      return exec_;
    } else {
      static_assert(std::is_same_v<detail::exec_space_t<MemorySpace>, Kokkos::DefaultExecutionSpace>,
                    "shardlib: tensors in device memory live in the memory of Kokkos's default execution space "
                    "(Kokkos::CudaSpace on a CUDA-enabled Kokkos)");
      return device_exec_;
    }
  }
  /// Whether other devices of this process launch kernels at the same time (the threads backend
  /// with several devices). Kokkos 3 cannot run some kernels from several threads at once;
  /// detail::kernel_guard serialises those.
  bool shares_process() const noexcept { return shares_process_; }

  /// State that a higher layer keeps per device (a cache, a pool), created on first use and
  /// destroyed with the Context. Use from this device's thread only, like the Context.
  template <class T>
  T& state() {
    static const char key = 0;  // one address per T
    for (auto& s : states_)
      if (s.key == &key) return *static_cast<T*>(s.value.get());
    states_.push_back({&key, std::make_shared<T>()});
    return *static_cast<T*>(states_.back().value.get());
  }

  /// Internal: the runtime creates one Context per device.
  Context(int device, int devices, std::unique_ptr<coll::Communicator> world,
          Kokkos::DefaultHostExecutionSpace exec = {}, bool shares_process = false,
          detail::DeviceInstance device_exec = {}, coll::Communicator* device_world = nullptr)
      : device_(device), devices_(devices), world_(std::move(world)), exec_(std::move(exec)),
        device_exec_(std::move(device_exec)), shares_process_(shares_process), device_world_(device_world) {}

 private:
  int device_;
  int devices_;
  std::unique_ptr<coll::Communicator> world_;
  struct State {
    const void* key;
    std::shared_ptr<void> value;
  };
  Kokkos::DefaultHostExecutionSpace exec_;
  [[no_unique_address]] detail::DeviceInstance device_exec_;
  bool shares_process_ = false;
  coll::Communicator* device_world_ = nullptr;  // the Runtime's (nccl backend)
  coll::Communicator* agreement_ = nullptr;     // pipeline::StageScope: the stage's devices
  std::vector<CachedGroup> groups_, device_groups_;
  std::vector<State> states_;  // after groups_: destroyed first, as it may refer to them
};

namespace detail {
/// One host execution space instance per in-process device (see Context::exec). On an OpenMP
/// Kokkos each has `threads_each` threads (0: an equal part of the default instance's pool, at
/// least 1).
inline std::vector<Kokkos::DefaultHostExecutionSpace> host_instances(int n, [[maybe_unused]] int threads_each = 0) {
  using Exec = Kokkos::DefaultHostExecutionSpace;
#if KOKKOS_VERSION >= 40000
#if defined(KOKKOS_ENABLE_OPENMP)
  if constexpr (std::is_same_v<Exec, Kokkos::OpenMP>) {
    // partition_space aborts when there are more parts than threads: instances of their own size.
    std::vector<Exec> out;
    const int each = threads_each > 0 ? threads_each : std::max(1, Exec().concurrency() / n);
    for (int i = 0; i < n; ++i) out.emplace_back(each);
    return out;
  } else
#endif
  {
    return Kokkos::Experimental::partition_space(Exec(), std::vector<int>(static_cast<std::size_t>(n), 1));
  }
#else
  return std::vector<Exec>(static_cast<std::size_t>(n), Exec());
#endif
}

/// One instance of the default (device) execution space per in-process device, each with its
/// own stream on a CUDA-enabled Kokkos (partition_space), so that the devices' kernels and copies
/// overlap on the GPU. Empty objects where the default execution space is the host's.
/// (A template, so that the discarded branch is not compiled: on a host-only Kokkos 4 or 5,
/// partition_space of the default space gives host instances, which are no DeviceInstance.)
template <class Instance = DeviceInstance>
std::vector<Instance> device_instances(int n) {
#if KOKKOS_VERSION >= 40000
  if constexpr (!std::is_same_v<Instance, NoDeviceSpace>)
    return Kokkos::Experimental::partition_space(Instance(), std::vector<int>(static_cast<std::size_t>(n), 1));
  else
#endif
    return std::vector<Instance>(static_cast<std::size_t>(n));
}

#if defined(SHARDLIB_HAVE_NCCL)
/// The CUDA stream of a device instance (nullptr without a CUDA-enabled Kokkos: NCCL then makes
/// a stream of its own).
inline cudaStream_t device_stream([[maybe_unused]] const DeviceInstance& d) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<DeviceInstance, Kokkos::Cuda>) return d.cuda_stream();
#endif
  return nullptr;
}
#endif

/// Serialises a kernel launch where the Kokkos in use cannot run it from several threads at
/// once: Kokkos 3's Serial backend shares one reduction buffer among all callers, and its other
/// host backends one thread pool. Kokkos 4 and later need no lock (each device has its instance).
inline std::unique_lock<std::mutex> kernel_guard([[maybe_unused]] const Context& ctx, [[maybe_unused]] bool reduction) {
#if KOKKOS_VERSION < 40000
  static std::mutex m;
  if (ctx.shares_process()) {
#if defined(KOKKOS_ENABLE_SERIAL)
    if (!reduction && std::is_same_v<Kokkos::DefaultHostExecutionSpace, Kokkos::Serial>) return {};
#endif
    return std::unique_lock<std::mutex>(m);
  }
#endif
  return {};
}

/// kernel_guard for kernels on blocks in `Mem`: host memory's kernels run on the host instance
/// and take it; device memory's are queued on the device's stream and need none.
template <class Mem>
std::unique_lock<std::mutex> kernel_guard_for(const Context& ctx, bool reduction) {
  if constexpr (host_memory_v<Mem>) return kernel_guard(ctx, reduction);
  else return {};
}

#if defined(SHARDLIB_HAVE_MPI)
/// This process's host as MPI sees it: the ranks of `comm` on it (MPI_COMM_TYPE_SHARED), this
/// rank among them, and the cores they may run on together (the union of their CPU affinity
/// masks; on other systems than Linux, this process's cores).
struct MpiHost {
  int ranks = 1;
  int rank = 0;
  int cores = 1;
};
inline MpiHost mpi_host(MPI_Comm comm) {
  MpiHost h;
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS || node == MPI_COMM_NULL) {
    h.cores = host::cores_available();
    return h;  // as if alone on the host
  }
  MPI_Comm_size(node, &h.ranks);
  MPI_Comm_rank(node, &h.rank);
#if defined(__linux__)
  cpu_set_t set, all;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0)  // unknown: the first CPUs, as many as there are
    for (int c = 0, n = host::cores_available(); c < n && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  MPI_Allreduce(&set, &all, static_cast<int>(sizeof(set)), MPI_BYTE, MPI_BOR, node);
  h.cores = std::max(1, CPU_COUNT(&all));
#else
  h.cores = host::cores_available();
#endif
  MPI_Comm_free(&node);
  return h;
}
#endif
}  // namespace detail

/// Runs SPMD bodies on a backend (see the file comment).
class Runtime {
 public:
  /// How long a threads collective waits for missing devices before it reports them.
  static std::chrono::milliseconds default_timeout() {
    if (const char* s = std::getenv("SHARDLIB_COLLECTIVE_TIMEOUT_MS")) return std::chrono::milliseconds(parse_int(s, "SHARDLIB_COLLECTIVE_TIMEOUT_MS", 86400000));
    return std::chrono::milliseconds(120000);
  }

  /// The most in-process devices the threads backend starts here, and what bounds it: 4096 (its
  /// collectives visit every member), the address space (`ulimit -v`: each device is a thread
  /// whose stack reserves `ulimit -s`, 8 MiB by default; at most half the space goes to stacks)
  /// and the processes a user may run (`ulimit -u`).
  struct ThreadsLimit {
    int devices;
    std::string why;
  };
  static ThreadsLimit max_threads_devices() {
    ThreadsLimit lim{4096, "the threads backend's own limit"};
#if defined(__unix__)
    rlimit stack{}, as{}, nproc{};
    const std::uint64_t stack_bytes = ::getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY
                                          ? std::max<std::uint64_t>(stack.rlim_cur, 1u << 16)
                                          : std::uint64_t{2} << 20;  // glibc's default when unlimited
    if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
      const std::uint64_t n = as.rlim_cur / 2 / (stack_bytes + (std::uint64_t{1} << 20));
      if (n < static_cast<std::uint64_t>(lim.devices))
        lim = {static_cast<int>(std::max<std::uint64_t>(n, 1)),
               "the address-space limit (ulimit -v) of " + std::to_string(as.rlim_cur >> 20) + " MiB holds the stacks (" +
                   std::to_string(stack_bytes >> 20) + " MiB each, ulimit -s) of about that many device threads"};
    }
    if (::getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY &&
        nproc.rlim_cur < static_cast<rlim_t>(lim.devices) + 64)
      lim = {static_cast<int>(std::max<rlim_t>(nproc.rlim_cur, 65) - 64),
             "the process limit (ulimit -u) of " + std::to_string(nproc.rlim_cur) + " threads"};
#endif
    return lim;
  }

  /// How a run of the threads backend ends when a device does not return after the run was
  /// aborted (another device threw, or a collective timed out waiting for it): a device that has
  /// not returned within the collective timeout of the abort makes the process exit with this
  /// status, printing which device and why (a thread cannot be stopped from outside, and
  /// returning from spmd() would leave it running over the caller's objects), as NCCL's
  /// watchdog ends a process whose GPU collective hangs.
  static constexpr int stalled_device_exit_status = 124;

  /// `devices` in-process virtual devices. Each gets `max(1, cores available / devices)` host
  /// threads, or SHARDLIB_THREADS_PER_DEVICE's (see the file comment). Throws
  /// std::invalid_argument past max_threads_devices().
  static Runtime threads(int devices, std::chrono::milliseconds timeout = default_timeout()) {
    return threads(devices, timeout, nullptr, nullptr, {});
  }

  /// Device `device` of a simulated run of `devices` (1 to 65,536; see the file comment): spmd()
  /// runs the body once, on the calling thread, shape-only, its collectives counted and not
  /// performed. Throws std::invalid_argument for a device count or index out of range.
  static Runtime simulate(int devices, int device = 0) { return simulate(devices, device, nullptr, nullptr); }

 private:
  /// A threads-per-device override: its value and where it came from (for messages).
  struct ThreadsOverride {
    std::optional<std::string> value;
    std::string name = host::threads_per_device_variable;
  };
  /// The program's `--threads-per-device` when given (`cli`), else SHARDLIB_THREADS_PER_DEVICE.
  static ThreadsOverride threads_override(std::optional<std::string> cli) {
    if (cli) return {std::move(cli), "--threads-per-device"};
    return {host::threads_override_from_env(), host::threads_per_device_variable};
  }

  static Runtime simulate(int devices, int device, int* argc, char** argv) {
    coll::SimulatedCommunicator::world(devices, device);  // checks both (the spmd body gets its own)
    Runtime rt(Backend::simulate);
    rt.devices_ = devices;
    rt.mpi_rank_ = device;
    rt.share_ = host::thread_share(host::cores_available(), 1, std::nullopt, host::threads_per_device_variable);
    rt.start_kokkos(argc, argv, 1);
    return rt;
  }

  static Runtime threads(int devices, std::chrono::milliseconds timeout, int* argc, char** argv,
                         std::optional<std::string> threads_arg) {
    if (devices < 1)
      throw std::invalid_argument("shardlib: the threads backend needs at least 1 device, got " + std::to_string(devices));
    if (const ThreadsLimit lim = max_threads_devices(); devices > lim.devices)
      throw std::invalid_argument("shardlib: " + std::to_string(devices) + " devices: the threads backend runs at most " +
                                  std::to_string(lim.devices) + " in one process here (" + lim.why +
                                  "); use fewer, or the mpi backend (one device per process)");
    const ThreadsOverride o = threads_override(std::move(threads_arg));
    Runtime rt(Backend::threads);
    rt.devices_ = devices;
    rt.timeout_ = timeout;
    rt.share_ = host::thread_share(host::cores_available(), devices, o.value, o.name);
    // Kokkos's own pool (for code that uses the default instance): the devices' threads together,
    // at most the cores; each device's instance has its share (host_instances).
    rt.start_kokkos(argc, argv, std::min(rt.share_.per_device * devices, rt.share_.cores));
    return rt;
  }

 public:

#if defined(SHARDLIB_HAVE_MPI)
  /// One device per MPI process. Initialises MPI unless the program already did (then the
  /// program also finalises it), then Kokkos, with this rank's share of its node's cores (the
  /// ranks on one node share them; see the file comment).
  static Runtime mpi(int* argc = nullptr, char*** argv = nullptr) { return mpi(argc, argv, {}); }

 private:
  static Runtime mpi(int* argc, char*** argv, std::optional<std::string> threads_arg) {
    const ThreadsOverride o = threads_override(std::move(threads_arg));
    Runtime rt(Backend::mpi);
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        throw std::runtime_error("shardlib: MPI_Init_thread failed");
      rt.owns_mpi_ = true;
    }
    MPI_Comm_size(MPI_COMM_WORLD, &rt.devices_);
    MPI_Comm_rank(MPI_COMM_WORLD, &rt.mpi_rank_);
    const detail::MpiHost h = detail::mpi_host(MPI_COMM_WORLD);
    rt.host_rank_ = h.rank;
    rt.share_ = host::thread_share(h.cores, h.ranks, o.value, o.name);
    if (const int own = host::cores_available(); !rt.share_.overridden && rt.share_.per_device > own) {
      rt.share_.per_device = own;  // a rank bound to fewer cores than its share
      rt.share_.source += ", at most the " + std::to_string(own) + " this process is bound to";
    }
    rt.start_kokkos(argc, argv ? *argv : nullptr, rt.share_.per_device);
    return rt;
  }

 public:
#endif

#if defined(SHARDLIB_HAVE_NCCL)
  /// One GPU per MPI process: the mpi backend (MPI and Kokkos started as Runtime::mpi does), with
  /// an NCCL communicator over all processes on this device's own stream, on GPU
  /// `local rank % GPUs of its node` (as Kokkos picks it under mpirun). Reshards of tensors in GPU
  /// memory run on NCCL there; everything in host memory on MPI. Throws coll::CollectiveError on
  /// every process when one cannot start (no GPU, two processes on one GPU: see
  /// NcclCommunicator::world), std::runtime_error when Kokkos runs on another GPU than NCCL.
  static Runtime nccl(int* argc = nullptr, char*** argv = nullptr) { return nccl(argc, argv, {}); }

 private:
  static Runtime nccl(int* argc, char*** argv, std::optional<std::string> threads_arg) {
    Runtime rt = mpi(argc, argv, std::move(threads_arg));
    rt.backend_ = Backend::nccl;
    rt.device_instance_ = detail::device_instances(1)[0];
    auto world = coll::NcclCommunicator::world(MPI_COMM_WORLD, detail::device_stream(*rt.device_instance_));
#if defined(KOKKOS_ENABLE_CUDA)
    if (const int kokkos_gpu = Kokkos::Cuda().cuda_device(); kokkos_gpu != world->device())
      throw std::runtime_error("shardlib: nccl backend, rank " + std::to_string(rt.mpi_rank_) + ": Kokkos runs on GPU " +
                               std::to_string(kokkos_gpu) + " and NCCL on GPU " + std::to_string(world->device()) +
                               " (local rank % GPUs); start Kokkos on that GPU: --kokkos-map-device-id-by=mpi_rank, "
                               "or --kokkos-device-id=" + std::to_string(world->device()));
#endif
    rt.device_world_ = std::move(world);
    return rt;
  }

 public:
#endif

  /// Whether this process was started by an MPI launcher (mpirun/mpiexec of Open MPI, MPICH and
  /// others, srun with PMI/PMIx): what `from_args` picks the mpi backend by.
  static bool launched_by_mpirun() noexcept {
    return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK") ||
           std::getenv("MPI_LOCALNRANKS");
  }

  /// The backend and device count from the arguments (`--backend B`, `--devices N`, which are
  /// removed from argv) or the environment (SHARDLIB_BACKEND, SHARDLIB_DEVICES); see the file
  /// comment. `default_devices` is the threads device count when neither says. Each device's
  /// host threads: `--threads-per-device N`, else SHARDLIB_THREADS_PER_DEVICE, else its share.
  static Runtime from_args(int& argc, char** argv, int default_devices = 1) {
    std::optional<std::string> backend = take_arg(argc, argv, "--backend");
    std::optional<std::string> devices = take_arg(argc, argv, "--devices");
    std::optional<std::string> threads_arg = take_arg(argc, argv, "--threads-per-device");
    if (!backend)
      if (const char* s = std::getenv("SHARDLIB_BACKEND")) backend = s;
    const char* devices_from = "--devices";
    if (!devices)
      if (const char* s = std::getenv("SHARDLIB_DEVICES")) devices = s, devices_from = "SHARDLIB_DEVICES";
    if (!backend) backend = has_mpi() && launched_by_mpirun() ? "mpi" : "threads";
    if (*backend == "simulate") {
      std::optional<std::string> device = take_arg(argc, argv, "--simulate-device");
      const char* device_from = "--simulate-device";
      if (!device)
        if (const char* s = std::getenv("SHARDLIB_SIMULATE_DEVICE")) device = s, device_from = "SHARDLIB_SIMULATE_DEVICE";
      const int n = devices ? parse_int(*devices, devices_from, coll::max_simulated_devices) : default_devices;
      const int d = device ? parse_int(*device, device_from, n - 1, 0) : 0;
      return simulate(n, d, &argc, argv);
    }
    if (*backend == "threads")
      return threads(devices ? parse_int(*devices, devices_from) : default_devices, default_timeout(), &argc, argv,
                     std::move(threads_arg));
    if (*backend == "mpi") {
#if defined(SHARDLIB_HAVE_MPI)
      Runtime rt = mpi(&argc, &argv, std::move(threads_arg));
      if (devices && parse_int(*devices, devices_from) != rt.devices_)
        throw std::invalid_argument(std::string("shardlib: ") + devices_from + " " + *devices + " but MPI started " +
                                    std::to_string(rt.devices_) +
                                    " processes; under mpi the device count is the process count (mpirun -np N)");
      return rt;
#else
      throw std::invalid_argument("shardlib: backend 'mpi' was asked for, but this build has no MPI "
                                  "(configure with MPI installed, or -Dmpi=enabled)");
#endif
    }
    if (*backend == "nccl") {
#if defined(SHARDLIB_HAVE_NCCL)
      Runtime rt = nccl(&argc, &argv, std::move(threads_arg));
      if (devices && parse_int(*devices, devices_from) != rt.devices_)
        throw std::invalid_argument(std::string("shardlib: ") + devices_from + " " + *devices + " but MPI started " +
                                    std::to_string(rt.devices_) +
                                    " processes; under nccl the device count is the process count (mpirun -np N)");
      return rt;
#else
      throw std::invalid_argument("shardlib: backend 'nccl' was asked for, but this build has no NCCL backend (it "
                                  "needs the CUDA toolkit's NCCL and MPI: the shardlib-nccl dependency, or CMake's "
                                  "shardlib::nccl, which define SHARDLIB_HAVE_NCCL)");
#endif
    }
    throw std::invalid_argument("shardlib: unknown backend '" + *backend + "'; use threads, mpi, nccl or simulate");
  }

  Runtime(Runtime&& o) noexcept
      : backend_(o.backend_), devices_(o.devices_), mpi_rank_(o.mpi_rank_), host_rank_(o.host_rank_),
        owns_mpi_(std::exchange(o.owns_mpi_, false)), timeout_(o.timeout_), share_(std::move(o.share_)),
        kokkos_(std::move(o.kokkos_)), device_instance_(std::move(o.device_instance_)),
        device_world_(std::move(o.device_world_)) {}
  Runtime& operator=(Runtime&&) noexcept = delete;
  ~Runtime() {
    device_world_.reset();  // before Kokkos (its stream) and MPI
    device_instance_.reset();
#if defined(SHARDLIB_HAVE_MPI)
    if (owns_mpi_) {
      kokkos_.reset();  // Kokkos goes first: it may hold MPI-aware resources
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
#endif
  }

  Backend backend() const noexcept { return backend_; }
  /// Devices of the run (threads: virtual devices; mpi: processes).
  int num_devices() const noexcept { return devices_; }
  /// The run, on several lines: the backend and devices ("threads backend, 8 in-process devices"
  /// or "mpi backend, 4 processes"), then this process's host threads per device and where they
  /// came from, the GEMM (backend, BLAS kernel, its configuration, threads) and advice when the
  /// kernel is far below the CPU, and Kokkos's host execution space. For example:
  /// ```
  /// threads backend, 2 in-process devices
  /// host threads: 1 per device (2 cores / 2 devices on this host; SHARDLIB_THREADS_PER_DEVICE sets it)
  /// GEMM: openblas 0.3.21 Cooperlake, 1 thread per device (OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64)
  /// Kokkos host space: OpenMP, pool of 2 threads (set by shardlib), 1 per device
  /// ```
  std::string describe() const {
    std::string s = backend_ == Backend::threads
                        ? "threads backend, " + std::to_string(devices_) + " in-process device" + (devices_ == 1 ? "" : "s")
                    : backend_ == Backend::simulate
                        ? "simulate backend: device " + std::to_string(mpi_rank_) + " of " + std::to_string(devices_) +
                              " simulated devices, shape-only (no tensor storage, kernels skipped, collectives "
                              "counted and not performed)"
                        : std::string(to_string(backend_)) + " backend, " + std::to_string(devices_) + " process" +
                              (devices_ == 1 ? "" : "es") + (backend_ == Backend::nccl ? " (one GPU each)" : "");
    const int t = share_.per_device;
    s += "\nhost threads: " + std::to_string(t) + " per device (" + share_.source +
         (share_.overridden ? "" : std::string("; ") + host::threads_per_device_variable + " sets it") + ")";
    const kernels::BlasInfo blas = kernels::blas_info();
    s += "\nGEMM: " + blas.kernel();
    if (blas.backend != "eigen" && blas.loaded) s += ", " + std::to_string(t) + " thread" + (t == 1 ? "" : "s") + " per device";
    if (!blas.config.empty()) s += " (" + blas.config + ")";
    if (const host::BlasSwitch& sw = host::take_blas_core_once(); !sw.text.empty()) s += "\nGEMM note: " + sw.text;
    const host::BlasAdvice advice = host::blas_advice_here();
    if (!advice.text.empty()) s += "\nGEMM " + std::string(advice.warn ? "warning: " : "note: ") + advice.text;
    if (!advice.fix.empty()) s += ". Fix: " + advice.fix;
    s += "\nvector math: Eigen packets of " + std::to_string(kernels::vmath::packet_bytes()) + " bytes (" +
         kernels::vmath::simd_in_use() + ")" +
         (kernels::vmath::uses_libmvec() ? "; double exp, log, tanh, erf: glibc libmvec" : "");
    const std::string simd = host::simd_advice(host::detect_cpu().best, kernels::vmath::packet_bytes());
    if (!simd.empty()) s += "\nvector math note: " + simd;
    s += "\nKokkos host space: " + (kokkos_ ? kokkos_->host_threads_note() : std::string("not initialised"));
    if (kokkos_ && KokkosScope::host_space_has_pool() && backend_ == Backend::threads)
      s += ", " + std::to_string(kokkos_threads_each()) + " per device";
    return s;
  }
  /// Each device's host threads (its BLAS calls, and its Kokkos host execution space where
  /// shardlib sized it), and where the number came from.
  const host::ThreadShare& thread_share() const noexcept { return share_; }
  /// This process's first device (0 under threads; the MPI rank under mpi): for printing once.
  int first_local_device() const noexcept { return mpi_rank_; }

  /// Runs `body(Context&)` once per device and returns when all are done. If a device throws,
  /// the run ends: the other devices' pending collectives throw RunAborted, and spmd rethrows
  /// the first device's exception here. Under mpi, an exception propagates from this process.
  template <class Body>
  void spmd(Body&& body) {
    kernels::set_blas_threads(share_.per_device);  // the BLAS's count is the process's: set it for this run
    if (backend_ == Backend::threads) {
      run_threads(body);
      return;
    }
    if (backend_ == Backend::simulate) {
      const ShapeOnlyScope shape_only;
      const coll::DryRun dry;
      Context ctx(mpi_rank_, devices_, coll::SimulatedCommunicator::world(devices_, mpi_rank_));
      body(ctx);
      return;
    }
#if defined(SHARDLIB_HAVE_MPI)
    Context ctx(mpi_rank_, devices_, coll::MpiCommunicator::world(), {}, false,
                device_world_ ? *device_instance_ : detail::device_instances(1)[0], device_world_.get());
    body(ctx);
#endif
  }

 private:
  explicit Runtime(Backend b) : backend_(b) {}

  // Kokkos gets the program's remaining arguments (its own --kokkos-* options) when there are
  // any, and `pool` host threads where its host space has a pool. Then OpenBLAS's kernel where it
  // misjudged the CPU (host::take_blas_core_once), and the BLAS warning, once per process, from
  // the first process of each host.
  void start_kokkos(int* argc, char** argv, int pool) {
    kokkos_ = argc && argv ? std::make_unique<KokkosScope>(*argc, argv, pool) : std::make_unique<KokkosScope>(pool);
    host::take_blas_core_once();  // every process: each has its own OpenBLAS
    if (host_rank_ == 0) host::warn_blas_once_per_process();
  }
  // Threads of each in-process device's Kokkos instance: the share where shardlib sized the pool
  // or the share was set explicitly; otherwise an equal part of the pool the program chose.
  int kokkos_threads_each() const {
    if (share_.overridden || (kokkos_ && kokkos_->host_threads_by() == KokkosScope::HostThreadsBy::shardlib))
      return share_.per_device;
    return std::max(1, KokkosScope::host_pool_size() / devices_);
  }

  template <class Body>
  void run_threads(Body& body) {
    auto world = coll::ThreadCommunicator::make_world(devices_, timeout_);
    const std::vector<Kokkos::DefaultHostExecutionSpace> spaces = detail::host_instances(devices_, kokkos_threads_each());
    const std::vector<detail::DeviceInstance> device_spaces = detail::device_instances(devices_);
#if defined(KOKKOS_ENABLE_CUDA)
    // Collectives over GPU memory between the devices' streams (a group of its own over the
    // same run: an abort or a finished device ends its waits too).
    using DeviceComm = coll::ThreadDeviceCommunicator<Kokkos::Cuda>;
    auto device_world = DeviceComm::make_world(world->world_ptr());
#endif
    std::exception_ptr first;
    bool first_is_root_cause = false;
    std::string first_what;
    std::mutex m;
    std::condition_variable returned;
    std::vector<char> done(static_cast<std::size_t>(devices_), 0);
    int finished = 0;
    std::optional<std::chrono::steady_clock::time_point> aborted_at;
    auto run_device = [&](int d) {
      try {
        std::unique_ptr<coll::Communicator> device_comm;
#if defined(KOKKOS_ENABLE_CUDA)
        device_comm = DeviceComm::world(device_world, d, {device_spaces[static_cast<std::size_t>(d)]});
#endif
        Context ctx(d, devices_, coll::ThreadCommunicator::world(world, d), spaces[static_cast<std::size_t>(d)],
                    devices_ > 1, device_spaces[static_cast<std::size_t>(d)], device_comm.get());
        body(ctx);
      } catch (...) {
        std::exception_ptr e = std::current_exception();
        bool root_cause = true;
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(e);
        } catch (const coll::RunAborted& a) {
          root_cause = false;
          what = a.what();
        } catch (const std::exception& x) {
          what = x.what();
        } catch (...) {
        }
        {
          std::lock_guard<std::mutex> lock(m);
          if (!first || (root_cause && !first_is_root_cause)) {
            first = e;
            first_is_root_cause = root_cause;
            first_what = what;
          }
          if (!aborted_at) aborted_at = std::chrono::steady_clock::now();
        }
        world->world().abort(d, what);
      }
      world->world().set_finished(d);
      {
        std::lock_guard<std::mutex> lock(m);
        done[static_cast<std::size_t>(d)] = 1;
        ++finished;
      }
      returned.notify_all();
    };
    if (devices_ == 1) {
      run_device(0);
    } else {
      std::vector<std::thread> threads;
      threads.reserve(static_cast<std::size_t>(devices_));
      for (int d = 0; d < devices_; ++d) {
        try {
          threads.emplace_back(run_device, d);
        } catch (const std::system_error& e) {  // the others end at their first collective
          const std::string what = "shardlib: the threads backend could not start device " + std::to_string(d) + " of " +
                                   std::to_string(devices_) + " (" + e.what() +
                                   "): use fewer devices, or the mpi backend (one device per process)";
          world->world().abort(d, what);
          for (int r = d; r < devices_; ++r) world->world().set_finished(r);
          for (auto& t : threads) t.join();
          throw std::runtime_error(what);
        }
      }
      wait_for_devices(m, returned, finished, aborted_at, done, first_what);
      for (auto& t : threads) t.join();
    }
    if (first) std::rethrow_exception(first);
  }

  // Waits until every device has returned. After an abort, a device that has not returned within
  // the collective timeout once all the others have ends the process (stalled_device_exit_status).
  void wait_for_devices(std::mutex& m, std::condition_variable& returned, const int& finished,
                        const std::optional<std::chrono::steady_clock::time_point>& aborted_at,
                        const std::vector<char>& done, const std::string& first_what) const {
    std::unique_lock<std::mutex> lock(m);
    while (finished < devices_) {
      if (!aborted_at) {
        returned.wait(lock);
        continue;
      }
      const auto deadline = *aborted_at + timeout_;
      if (returned.wait_until(lock, deadline) != std::cv_status::timeout || finished == devices_) continue;
      if (std::chrono::steady_clock::now() < deadline) continue;
      std::string stalled;
      for (int d = 0; d < devices_; ++d)
        if (!done[static_cast<std::size_t>(d)]) stalled += (stalled.empty() ? "" : ", ") + std::to_string(d);
      std::fprintf(stderr,
                   "shardlib: device %s did not return within %lld ms after the run was aborted (%s); a stalled "
                   "thread cannot be stopped, so the process exits with status %d\n",
                   stalled.c_str(), static_cast<long long>(timeout_.count()), first_what.c_str(),
                   stalled_device_exit_status);
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(stalled_device_exit_status);
    }
  }

  static std::optional<std::string> take_arg(int& argc, char** argv, const char* name) {
    std::size_t len = std::strlen(name);
    for (int i = 1; i < argc; ++i) {
      std::optional<std::string> value;
      int used = 0;
      if (std::strcmp(argv[i], name) == 0) {
        if (i + 1 >= argc) throw std::invalid_argument(std::string("shardlib: ") + name + " needs a value");
        value = argv[i + 1];
        used = 2;
      } else if (std::strncmp(argv[i], name, len) == 0 && argv[i][len] == '=') {
        value = argv[i] + len + 1;
        used = 1;
      }
      if (used) {
        for (int j = i; j + used <= argc; ++j) argv[j] = argv[j + used];  // argv[argc] (nullptr) moves too
        argc -= used;
        return value;
      }
    }
    return std::nullopt;
  }
  static int parse_int(const std::string& s, const char* what, long max = 65536, long min = 1) {
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < min || v > max)
      throw std::invalid_argument(std::string("shardlib: ") + what + " must be a whole number from " +
                                  std::to_string(min) + " to " +
                                  std::to_string(max) + ", got '" + s + "'");
    return static_cast<int>(v);
  }

  Backend backend_;
  int devices_ = 1;
  int mpi_rank_ = 0;
  int host_rank_ = 0;  // among the processes of this host (mpi), for printing once per host
  bool owns_mpi_ = false;
  std::chrono::milliseconds timeout_{120000};
  host::ThreadShare share_;
  std::unique_ptr<KokkosScope> kokkos_;
  // nccl: this process's device instance (its stream). Optional: a Kokkos::Cuda made before
  // Kokkos::initialize aborts ("device not initialized"), and the Runtime starts Kokkos itself.
  std::optional<detail::DeviceInstance> device_instance_;
  std::unique_ptr<coll::Communicator> device_world_;  // nccl: the NCCL communicator over all processes
};

}  // namespace shardlib
