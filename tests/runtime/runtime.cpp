// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <shardlib/runtime/runtime.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace sl = shardlib;

namespace {
struct Args {
  std::vector<std::string> store;
  std::vector<char*> ptrs;
  int argc;
  explicit Args(std::vector<std::string> a) : store(std::move(a)) {
    for (auto& s : store) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
    argc = static_cast<int>(store.size());
  }
  std::vector<std::string> left() const { return {ptrs.begin(), ptrs.begin() + argc}; }
};
}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("from_args picks the backend and device count, and removes its arguments") {
    unsetenv("SHARDLIB_DEVICES");
    unsetenv("SHARDLIB_BACKEND");
    Args a({"prog", "--devices", "3", "--other", "x"});
    auto rt = sl::Runtime::from_args(a.argc, a.ptrs.data());
    CHECK(rt.backend() == sl::Backend::threads);
    CHECK(rt.num_devices() == 3);
    CHECK(rt.describe().rfind("threads backend, 3 in-process devices\n", 0) == 0);  // then the host's lines
    CHECK(a.left() == std::vector<std::string>{"prog", "--other", "x"});
    CHECK(a.ptrs[static_cast<std::size_t>(a.argc)] == nullptr);

    Args b({"prog", "--backend=threads", "--devices=5"});
    CHECK(sl::Runtime::from_args(b.argc, b.ptrs.data()).num_devices() == 5);
    CHECK(b.argc == 1);

    Args c({"prog"});
    CHECK(sl::Runtime::from_args(c.argc, c.ptrs.data(), 4).num_devices() == 4);  // the program's default
    setenv("SHARDLIB_DEVICES", "6", 1);
    CHECK(sl::Runtime::from_args(c.argc, c.ptrs.data(), 4).num_devices() == 6);  // the environment wins
    unsetenv("SHARDLIB_DEVICES");
  }

  TEST_CASE("from_args refuses bad values, naming them") {
    Args a({"prog", "--devices", "0"});
    CHECK_THROWS_WITH_AS(sl::Runtime::from_args(a.argc, a.ptrs.data()),
                         "shardlib: --devices must be a whole number from 1 to 65536, got '0'", std::invalid_argument);
    Args b({"prog", "--devices", "four"});
    CHECK_THROWS_AS(sl::Runtime::from_args(b.argc, b.ptrs.data()), std::invalid_argument);
    Args c({"prog", "--backend", "carrier-pigeon"});
    CHECK_THROWS_WITH_AS(sl::Runtime::from_args(c.argc, c.ptrs.data()),
                         "shardlib: unknown backend 'carrier-pigeon'; use threads, mpi, nccl or simulate", std::invalid_argument);
    if (!sl::has_nccl()) {  // this suite's build has no NCCL backend (tests/collectives/nccl checks the one with it)
      Args e({"prog", "--backend", "nccl"});
      CHECK_THROWS_WITH_AS(sl::Runtime::from_args(e.argc, e.ptrs.data()),
                           doctest::Contains("backend 'nccl' was asked for, but this build has no NCCL backend"),
                           std::invalid_argument);
    }
    Args d({"prog", "--devices"});
    CHECK_THROWS_WITH_AS(sl::Runtime::from_args(d.argc, d.ptrs.data()), "shardlib: --devices needs a value",
                         std::invalid_argument);
    CHECK_THROWS_AS(sl::Runtime::threads(0), std::invalid_argument);
    // A bad value from the environment names the variable, not the flag.
    setenv("SHARDLIB_DEVICES", "abc", 1);
    Args e({"prog"});
    CHECK_THROWS_WITH_AS(sl::Runtime::from_args(e.argc, e.ptrs.data()),
                         "shardlib: SHARDLIB_DEVICES must be a whole number from 1 to 65536, got 'abc'", std::invalid_argument);
    unsetenv("SHARDLIB_DEVICES");
  }

  TEST_CASE("a device count past what the threads backend can hold is refused up front, naming the limit") {
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(65536), doctest::Contains("the threads backend runs at most 4096"),
                         std::invalid_argument);
    Args a({"prog", "--devices", "5000"});
    CHECK_THROWS_WITH_AS(sl::Runtime::from_args(a.argc, a.ptrs.data()), doctest::Contains("use fewer, or the mpi backend"),
                         std::invalid_argument);
    // Under an address-space limit (ulimit -v 8 GiB): the stacks it holds bound the count (a child
    // process, which only asks).
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      rlimit as{std::uint64_t{8} << 30, std::uint64_t{8} << 30}, stack{std::uint64_t{8} << 20, RLIM_INFINITY};
      ::setrlimit(RLIMIT_STACK, &stack);
      if (::setrlimit(RLIMIT_AS, &as) != 0) std::_Exit(2);
      const auto lim = sl::Runtime::max_threads_devices();
      bool refused = false;
      try {
        (void)sl::Runtime::threads(1024);
      } catch (const std::invalid_argument& e) {
        refused = std::string(e.what()).find("ulimit -v") != std::string::npos;
      }
      std::_Exit(lim.devices > 100 && lim.devices < 1024 && refused ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  TEST_CASE("a device that stalls past the collective timeout ends the process at the timeout, saying which") {
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const auto start = std::chrono::steady_clock::now();
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::dup2(pipe_fds[1], 2);
      ::close(pipe_fds[0]);
      try {
        sl::Runtime::threads(3, std::chrono::milliseconds(300)).spmd([](sl::Context& ctx) {
          if (ctx.device() == 1) std::this_thread::sleep_for(std::chrono::seconds(20));  // stalls outside collectives
          ctx.world().barrier();
        });
      } catch (...) {
        std::_Exit(10);  // spmd returned: it should not while device 1 sleeps
      }
      std::_Exit(11);
    }
    ::close(pipe_fds[1]);
    std::string err;
    char buf[512];
    for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<std::size_t>(n));
    ::close(pipe_fds[0]);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CAPTURE(err);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == sl::Runtime::stalled_device_exit_status);
    CHECK(err.find("shardlib: device 1 did not return within 300 ms after the run was aborted") != std::string::npos);
    CHECK(err.find("a stalled thread cannot be stopped") != std::string::npos);
    CHECK(seconds < 10.0);  // the timeout and its grace (0.6 s), not the 20 s stall
  }

  TEST_CASE("spmd runs the body once per device, each with its own device id") {
    std::vector<int> seen(5, 0);
    sl::Runtime::threads(5).spmd([&](sl::Context& ctx) {
      CHECK(ctx.num_devices() == 5);
      CHECK(ctx.backend() == "threads");
      CHECK(ctx.world().rank() == ctx.device());
      seen[static_cast<std::size_t>(ctx.device())] += 1;  // each device writes its own element
    });
    CHECK(seen == std::vector<int>(5, 1));
  }
}
