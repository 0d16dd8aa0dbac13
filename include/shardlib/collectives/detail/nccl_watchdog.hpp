// SPDX-License-Identifier: Apache-2.0
/// @file
/// The nccl backend's watchdog (collectives/nccl.hpp): a thread per communicator that retires
/// each collective's CUDA event and aborts the communicator on an asynchronous NCCL error or
/// when a collective runs past SHARDLIB_NCCL_TIMEOUT, so that a failed rank never hangs the job
/// silently. Compiled only with SHARDLIB_HAVE_NCCL.
#pragma once

#include <shardlib/collectives/communicator.hpp>
#include <shardlib/collectives/detail/timeout.hpp>

#if defined(SHARDLIB_HAVE_NCCL)

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace shardlib::coll::detail::nccl {

/// SHARDLIB_NCCL_TIMEOUT in seconds (default 600; 0: no timeout). Throws CollectiveError on
/// a value that is not a number >= 0.
inline double timeout_from_environment() { return detail::timeout_from_environment("SHARDLIB_NCCL_TIMEOUT", "nccl"); }

/// Watches one communicator's collectives (see the file comment): the caller records an event
/// after each; a thread retires finished ones, and aborts the communicator on an asynchronous
/// NCCL error or when the oldest has run past the timeout.
class Watchdog {
 public:
  Watchdog(ncclComm_t comm, int device, std::string who, double timeout_s)
      : comm_(comm), device_(device), who_(std::move(who)), timeout_(timeout_s) {
    thread_ = std::thread([this] { loop(); });
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
    cudaSetDevice(device_);
    for (auto& p : pending_) cudaEventDestroy(p.event);
    for (auto e : free_) cudaEventDestroy(e);
  }

  /// After enqueuing `call` on `stream`: records an event there. Returns CUDA's error, if any.
  cudaError_t enqueued(const char* call, cudaStream_t stream) {
    std::lock_guard lock(m_);
    cudaEvent_t e = nullptr;
    if (!free_.empty()) {
      e = free_.back();
      free_.pop_back();
    } else if (cudaError_t rc = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); rc != cudaSuccess) {
      return rc;
    }
    if (cudaError_t rc = cudaEventRecord(e, stream); rc != cudaSuccess) {
      free_.push_back(e);
      return rc;
    }
    pending_.push_back({e, std::chrono::steady_clock::now(), call});
    return cudaSuccess;
  }

  /// Whether the communicator was aborted, and why.
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  std::string failure() const {
    std::lock_guard lock(m_);
    return failure_;
  }

 private:
  struct Pending {
    cudaEvent_t event;
    std::chrono::steady_clock::time_point since;
    const char* call;
  };

  void loop() {
    cudaSetDevice(device_);
    std::unique_lock lock(m_);
    while (!stop_ && !failed()) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stop_) break;
      while (!pending_.empty() && cudaEventQuery(pending_.front().event) == cudaSuccess) {
        free_.push_back(pending_.front().event);
        pending_.pop_front();
      }
      ncclResult_t async = ncclSuccess;
      ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
      std::string why;
      if (rc != ncclSuccess) {
        why = std::string("ncclCommGetAsyncError failed: ") + ncclGetErrorString(rc);
      } else if (async != ncclSuccess && async != ncclInProgress) {
        why = std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async) + " (" +
              ncclGetLastError(comm_) + ")";
      } else if (timeout_ > 0 && !pending_.empty()) {
        const double age = std::chrono::duration<double>(std::chrono::steady_clock::now() - pending_.front().since).count();
        if (age > timeout_)
          why = std::string(pending_.front().call) + " has not finished after " + std::to_string(static_cast<long>(age)) +
                " s (SHARDLIB_NCCL_TIMEOUT=" + std::to_string(static_cast<long>(timeout_)) +
                "): another rank may have failed, or called a different collective";
      }
      if (!why.empty()) {
        failure_ = "shardlib: " + who_ + ": " + why + "; the communicator was aborted";
        failed_.store(true, std::memory_order_release);
        std::fprintf(stderr, "%s\n", failure_.c_str());
        ncclCommAbort(comm_);
      }
    }
  }

  ncclComm_t comm_;
  int device_;
  std::string who_;
  double timeout_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<bool> failed_{false};
  std::string failure_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_;
  std::thread thread_;
};

}  // namespace shardlib::coll::detail::nccl

#endif  // SHARDLIB_HAVE_NCCL
