// SPDX-License-Identifier: Apache-2.0
/// @file
/// The mpi backend's watchdog (collectives/mpi.hpp): a thread per process that ends the process
/// when one MPI call of a collective has waited longer than SHARDLIB_MPI_TIMEOUT, saying which
/// call, group and rank, so that a collective some rank never reaches (a rank stuck, or in another
/// call) does not hang the job silently. MPI cannot cancel a blocking call, and the runtime asks
/// for MPI_THREAD_FUNNELED (only the main thread calls MPI), so the watchdog does not call MPI: it
/// prints the reason on stderr and exits with status 124, and mpirun then ends the other ranks.
/// Compiled only with SHARDLIB_HAVE_MPI.
#pragma once

#include <shardlib/collectives/communicator.hpp>
#include <shardlib/collectives/detail/timeout.hpp>

#if defined(SHARDLIB_HAVE_MPI)

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace shardlib::coll::detail::mpi {

/// SHARDLIB_MPI_TIMEOUT in seconds (default 600, NCCL's and PyTorch's; 0: no watchdog). Throws
/// CollectiveError on a value that is not a number >= 0.
inline double timeout_from_environment() { return detail::timeout_from_environment("SHARDLIB_MPI_TIMEOUT", "mpi"); }

/// The exit status of a process the watchdog ends (Runtime::stalled_device_exit_status's, and
/// timeout(1)'s).
inline constexpr int watchdog_exit_status = 124;

/// The process's watchdog (see the file comment): which collective call this process waits in,
/// since when, and a thread that ends the process when the wait passes the timeout.
class Watchdog {
 public:
  /// What the process is in: a call on a group, since a time (call == nullptr: none).
  struct Call {
    const char* call = nullptr;
    const std::string* group = nullptr;  // the communicator's name (alive while the call runs)
    int rank = 0, size = 0;
    std::chrono::steady_clock::time_point since{};
  };

  /// The process's watchdog, started on first use; nullptr when SHARDLIB_MPI_TIMEOUT is 0.
  static Watchdog* get() {
    static const double timeout = timeout_from_environment();  // (a bad value throws at every call)
    if (timeout <= 0) return nullptr;
    static Watchdog w(timeout);
    return &w;
  }

  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  /// This process enters `c`; returns what it was in before (restored by leave()).
  Call enter(const Call& c) {
    std::lock_guard lock(m_);
    Call before = current_;
    current_ = c;
    return before;
  }
  void leave(const Call& before) {
    std::lock_guard lock(m_);
    current_ = before;
  }
  double timeout() const noexcept { return timeout_; }

 private:
  explicit Watchdog(double timeout_s) : timeout_(timeout_s) { thread_ = std::thread([this] { loop(); }); }

  void loop() {
    const auto poll = std::chrono::milliseconds(std::clamp(static_cast<long>(timeout_ * 250), 10L, 1000L));
    std::unique_lock lock(m_);
    while (!stop_) {
      cv_.wait_for(lock, poll);
      if (stop_ || current_.call == nullptr) continue;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - current_.since).count();
      if (waited <= timeout_) continue;
      std::fprintf(stderr,
                   "shardlib: mpi backend: %s on %s (rank %d of %d) has waited %.0f s (SHARDLIB_MPI_TIMEOUT=%g): "
                   "another rank of the group has not reached this collective (it is stuck, has failed, or called a "
                   "different one; SHARDLIB_CHECK_COLLECTIVES=1 compares the calls); ending this process with exit "
                   "status %d, so that mpirun ends the job\n",
                   current_.call, current_.group->c_str(), current_.rank, current_.size, waited, timeout_,
                   watchdog_exit_status);
      std::fflush(stderr);
      std::_Exit(watchdog_exit_status);
    }
  }

  double timeout_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  Call current_;
  std::thread thread_;
};

/// While alive, the watchdog knows this process waits in `call` on a group (a no-op without a
/// watchdog). Scopes nest: the outer call is restored.
class Watch {
 public:
  Watch(const char* call, const std::string& group, int rank, int size) : w_(Watchdog::get()) {
    if (w_) before_ = w_->enter({call, &group, rank, size, std::chrono::steady_clock::now()});
  }
  ~Watch() {
    if (w_) w_->leave(before_);
  }
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

 private:
  Watchdog* w_;
  Watchdog::Call before_;
};

}  // namespace shardlib::coll::detail::mpi

#endif  // SHARDLIB_HAVE_MPI
