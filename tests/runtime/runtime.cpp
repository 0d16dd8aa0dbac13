// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <shardlib/runtime/runtime.hpp>

#include <cstdlib>
#include <string>
#include <vector>

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
                         "shardlib: unknown backend 'carrier-pigeon'; use threads, mpi or nccl", std::invalid_argument);
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
