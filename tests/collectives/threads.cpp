// SPDX-License-Identifier: Apache-2.0
// The threads backend's own promises: no hang on misuse, errors that say what happened,
// f16/bf16 reductions, and progress with more devices than cores.
#include <doctest/doctest.h>
#include <shardlib/runtime/runtime.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

namespace sl = shardlib;
using sl::coll::CollectiveError;
using sl::coll::DType;
using sl::coll::Op;
using namespace std::chrono_literals;

TEST_SUITE("collectives_threads") {
  TEST_CASE("an exception on one device ends the run on every device, with its message") {
    std::atomic<int> aborted{0};
    auto rt = sl::Runtime::threads(6);
    CHECK_THROWS_WITH_AS(rt.spmd([&](sl::Context& ctx) {
      if (ctx.device() == 3) throw std::domain_error("device three is broken");
      try {
        double x = 1;
        ctx.world().all_reduce(&x, &x, 1, DType::f64, Op::sum);  // never completes: device 3 left
      } catch (const sl::coll::RunAborted& e) {
        CHECK(std::string(e.what()) == "shardlib: device 3 failed: device three is broken");
        ++aborted;
        throw;
      }
    }),
                         "device three is broken", std::domain_error);  // the original exception, type kept
    CHECK(aborted == 5);
  }

  TEST_CASE("a collective called by only some devices is reported, not a hang") {
    // The others finish their body without calling it: reported at once.
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(3).spmd([](sl::Context& ctx) {
      if (ctx.device() == 0) ctx.world().barrier();
    }),
                         doctest::Contains("device(s) 1, 2 finished their SPMD body without calling it"), CollectiveError);
    // The others are busy elsewhere: reported after the timeout (a device busy past twice the
    // timeout would end the process: runtime's stalled-device test).
    auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(2, 200ms).spmd([](sl::Context& ctx) {
      if (ctx.device() == 1) {
        std::this_thread::sleep_for(300ms);
        return;
      }
      ctx.world().barrier();
    }),
                         doctest::Contains("device(s) 1 did not arrive within 200 ms"), CollectiveError);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  }

  TEST_CASE("devices that disagree on a call all get an error saying what differs") {
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(4).spmd([](sl::Context& ctx) {
      std::vector<float> a(8), b(8);
      ctx.world().all_reduce(a.data(), b.data(), ctx.device() == 2 ? 7 : 8, DType::f32, Op::sum);
    }),
                         doctest::Contains("with a different element count, element type or op"), CollectiveError);
    // Each side names the other's call (checked on every device: which error spmd rethrows
    // depends on which device throws first).
    std::atomic<int> told{0};
    sl::Runtime::threads(3).spmd([&](sl::Context& ctx) {
      std::vector<float> a(8), b(24);
      try {
        if (ctx.device() == 1) ctx.world().barrier();
        else ctx.world().all_gather(a.data(), b.data(), 8, DType::f32);
      } catch (const CollectiveError& e) {
        const std::string want = ctx.device() == 1 ? "called all_gather" : "called barrier";
        CHECK_MESSAGE(std::string(e.what()).find(want) != std::string::npos, e.what());
        ++told;
      }
    });
    CHECK(told == 3);
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(2).spmd([](sl::Context& ctx) {
      std::vector<int> a(4), b(4);
      std::size_t counts[2] = {2, 2};
      std::size_t wrong[2] = {3, 1};
      ctx.world().all_to_all(a.data(), counts, b.data(), ctx.device() == 0 ? counts : wrong, DType::i32);
    }),
                         doctest::Contains("which expects"), CollectiveError);
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(3).spmd([](sl::Context& ctx) {
      int x = 0, y = 0;
      int n = ctx.num_devices(), me = ctx.device();
      // Device 2 receives from 0, but 0 sends to 1.
      ctx.world().permute(&x, 1, me == 0 ? 1 : -1, &y, 1, me == 1 || me == 2 ? 0 : -1, DType::i32);
      (void)n;
    }),
                         doctest::Contains("expects 1 elements from rank 0, which sends 1 elements to rank 1"), CollectiveError);
  }

  TEST_CASE("bad arguments are refused before any communication") {
    sl::Runtime::threads(2).spmd([](sl::Context& ctx) {
      int x = 0;
      const std::string expected = "shardlib: broadcast on world (threads, rank " + std::to_string(ctx.device()) +
                                   " of 2): root 2 is out of range [0, 2)";
      CHECK_THROWS_WITH_AS(ctx.world().broadcast(&x, 1, DType::i32, 2), expected.c_str(), CollectiveError);
      CHECK_THROWS_WITH_AS(ctx.world().send(&x, 1, DType::i32, -1), doctest::Contains("peer -1 is out of range"), CollectiveError);
      CHECK_THROWS_WITH_AS(ctx.world().all_reduce(nullptr, &x, 1, DType::i32, Op::sum), doctest::Contains("null buffer"), CollectiveError);
      std::size_t three[3] = {1, 1, 1};
      CHECK_THROWS_WITH_AS(ctx.world().all_gather(&x, &x, three, DType::i32), doctest::Contains("3 block counts given for a group of 2"),
                           CollectiveError);
      CHECK_THROWS_WITH_AS(ctx.world().recv(&x, 1, DType::i32, 5), doctest::Contains("peer 5 is out of range"), CollectiveError);
      std::vector<int> buf(8);
      CHECK_THROWS_WITH_AS(ctx.world().reduce_scatter(buf.data(), buf.data() + 2, 2, DType::i32, Op::sum),
                           doctest::Contains("the send and receive buffers overlap; reduce_scatter cannot run in place"),
                           CollectiveError);
      CHECK_THROWS_WITH_AS(ctx.world().all_to_all(buf.data(), buf.data() + 3, 2, DType::i32),
                           doctest::Contains("overlap; all_to_all cannot run in place"), CollectiveError);
    });
  }

  TEST_CASE("exchange: bad arguments are refused before any communication") {
    sl::Runtime::threads(2).spmd([](sl::Context& ctx) {
      using sl::coll::Region;
      auto& c = ctx.world();
      std::vector<int> buf(16);
      std::vector<Region> two(2, Region::contiguous(0, 2)), three(3);
      const std::string at = "shardlib: exchange on world (threads, rank " + std::to_string(ctx.device()) + " of 2): ";
      CHECK_THROWS_WITH_AS(c.exchange(buf.data(), three, buf.data() + 8, two, DType::i32),
                           (at + "3 send regions given for a group of 2").c_str(), CollectiveError);
      CHECK_THROWS_WITH_AS(c.exchange(buf.data(), two, buf.data() + 8, std::span<const Region>(three).first(1), DType::i32),
                           (at + "1 receive regions given for a group of 2").c_str(), CollectiveError);
      std::vector<Region> bad = two;
      bad[1].rank = 9;
      CHECK_THROWS_WITH_AS(c.exchange(buf.data(), bad, buf.data() + 8, two, DType::i32),
                           (at + "send region 1 has rank 9; a region's rank lies in [0, 8]").c_str(), CollectiveError);
      bad[1].rank = -1;
      CHECK_THROWS_WITH_AS(c.exchange(buf.data(), two, buf.data() + 8, bad, DType::i32),
                           doctest::Contains("receive region 1 has rank -1"), CollectiveError);
      CHECK_THROWS_WITH_AS(c.exchange(nullptr, two, buf.data() + 8, two, DType::i32),
                           (at + "null buffer for 4 elements").c_str(), CollectiveError);
      CHECK_THROWS_WITH_AS(c.exchange(buf.data(), two, nullptr, two, DType::i32), doctest::Contains("null buffer"),
                           CollectiveError);
      // Overlap is judged on the elements the regions reach: [0, 2) and [1, 3) overlap ...
      CHECK_THROWS_WITH_AS(c.exchange(buf.data(), two, buf.data() + 1, two, DType::i32),
                           (at + "the send and receive buffers overlap; exchange cannot run in place").c_str(),
                           CollectiveError);
      // ... as does a strided box reaching into the other side (elements 0 and 5; 4 and 5 received) ...
      std::vector<Region> wide = {Region{}, Region::contiguous(1, 0)};
      wide[0].rank = 2;
      wide[0].extent = {2, 1};
      wide[0].stride = {5, 1};
      CHECK_THROWS_WITH_AS(c.exchange(buf.data(), wide, buf.data() + 4, two, DType::i32), doctest::Contains("overlap"),
                           CollectiveError);
      // ... but one buffer whose regions sent, [0, 2), and received, [2, 4), are apart is fine.
      for (std::size_t i = 0; i < 4; ++i) buf[i] = 10 * ctx.device() + static_cast<int>(i);
      const std::vector<Region> out = {Region::contiguous(0, 1), Region::contiguous(1, 1)};
      const std::vector<Region> in = {Region::contiguous(2, 1), Region::contiguous(3, 1)};
      CHECK_NOTHROW(c.exchange(buf.data(), out, buf.data(), in, DType::i32));
      CHECK(buf[2] == ctx.device());       // element `device` of rank 0
      CHECK(buf[3] == 10 + ctx.device());  // element `device` of rank 1
      // A region past the end of the address space.
      bad = two;
      bad[0].stride[0] = ~std::size_t{0};
      CHECK_THROWS_WITH_AS(c.exchange(buf.data(), bad, buf.data() + 8, two, DType::i32),
                           (at + "send region 0 reaches past the end of the address space").c_str(), CollectiveError);
    });
  }

  TEST_CASE("exchange: a pair whose counts disagree fails on every member, naming both ranks") {
    for (int n : {2, 3, 5}) {
      std::atomic<int> failed{0};
      sl::Runtime::threads(n).spmd([&](sl::Context& ctx) {
        using sl::coll::Region;
        const auto un = static_cast<std::size_t>(n);
        std::vector<float> send(4 * un), recv(4 * un);
        std::vector<Region> sr(un), rr(un);
        for (std::size_t p = 0; p < un; ++p) {
          sr[p] = Region::contiguous(4 * p, 3);
          rr[p] = Region::contiguous(4 * p, 3);
        }
        if (ctx.device() == 0) sr[1] = Region::contiguous(4, 4);  // rank 0 sends 4 to rank 1, which expects 3
        try {
          ctx.world().exchange(send.data(), sr, recv.data(), rr, DType::f32);
        } catch (const CollectiveError& e) {
          CHECK_MESSAGE(std::string(e.what()).find("rank 0 sends 4 elements to rank 1, which expects 3") != std::string::npos,
                        e.what());
          ++failed;
        }
        // Everyone can go on.
        double x = 1;
        ctx.world().all_reduce(&x, &x, 1, DType::f64, Op::sum);
        CHECK(x == n);
      });
      CHECK(failed == n);
    }
    // The self pair too.
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(1).spmd([](sl::Context& ctx) {
      float a[4] = {}, b[4] = {};
      sl::coll::Region s = sl::coll::Region::contiguous(0, 2), r = sl::coll::Region::contiguous(0, 3);
      ctx.world().exchange(a, std::span(&s, 1), b, std::span(&r, 1), DType::f32);
    }),
                         doctest::Contains("rank 0 sends 2 elements to rank 0, which expects 3"), CollectiveError);
  }

  TEST_CASE("exchange: devices that make another call or use another element type are told so") {
    std::atomic<int> told{0};
    sl::Runtime::threads(2).spmd([&](sl::Context& ctx) {
      std::vector<int> a(4), b(4);
      std::vector<sl::coll::Region> r(2, sl::coll::Region::contiguous(0, 2));
      r[1].offset = 2;
      try {
        if (ctx.device() == 0) ctx.world().exchange(a.data(), r, b.data(), r, DType::i32);
        else ctx.world().all_to_all(a.data(), b.data(), 2, DType::i32);
      } catch (const CollectiveError& e) {
        const std::string want = ctx.device() == 0 ? "rank 1 (device 1) called all_to_all on i32 with a different collective"
                                                   : "rank 0 (device 0) called exchange on i32 with a different collective";
        CHECK_MESSAGE(std::string(e.what()).find(want) != std::string::npos, e.what());
        ++told;
      }
    });
    CHECK(told == 2);
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(3).spmd([](sl::Context& ctx) {
      std::vector<std::uint32_t> a(3), b(3);
      std::vector<sl::coll::Region> r(3);
      ctx.world().exchange(a.data(), r, b.data(), r, ctx.device() == 2 ? DType::f32 : DType::i32);
    }),
                         doctest::Contains("with a different element type"), CollectiveError);
  }

  TEST_CASE("a communicator is used only by its own device") {
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(1).spmd([](sl::Context& ctx) {
      std::exception_ptr err;
      std::thread other([&] {
        try {
          ctx.world().barrier();
        } catch (...) {
          err = std::current_exception();
        }
      });
      other.join();
      if (err) std::rethrow_exception(err);
    }),
                         doctest::Contains("belongs to device 0 and was used from another thread"), CollectiveError);
  }

  TEST_CASE("a message of the wrong size is reported by recv") {
    CHECK_THROWS_WITH_AS(sl::Runtime::threads(2).spmd([](sl::Context& ctx) {
      double d[2] = {1, 2};
      if (ctx.device() == 0) ctx.world().send(d, 2, DType::f64, 1);
      else ctx.world().recv(d, 1, DType::f64, 0);
    }),
                         doctest::Contains("has 16 bytes, but 1 elements of f64 (8 bytes) were expected"), CollectiveError);
  }

  TEST_CASE("a mesh group needs the run's device count") {
    sl::Runtime::threads(4).spmd([](sl::Context& ctx) {
      sl::MeshShape wrong({"data", "model"}, {4, 2});
      CHECK_THROWS_WITH_AS(ctx.group(wrong, sl::AxisList{1}), doctest::Contains("has 8 devices but the run has 4"),
                           std::invalid_argument);
      sl::MeshShape mesh({"data", "model"}, {2, 2});
      CHECK_THROWS_AS(ctx.group(mesh, sl::AxisList{2}), std::out_of_range);
      CHECK(ctx.group(mesh, sl::AxisList{}).size() == 1);  // a group of one
    });
  }

  TEST_CASE("f16 and bf16 reduce through float") {
    sl::Runtime::threads(3).spmd([](sl::Context& ctx) {
      using sl::float_to_f16;
      using sl::float_to_bf16;
      std::vector<std::uint16_t> h(5), b(5);
      for (std::size_t i = 0; i < 5; ++i) {
        h[i] = float_to_f16(0.5f * static_cast<float>(ctx.device() + 1) + static_cast<float>(i));
        b[i] = float_to_bf16(2.0f * static_cast<float>(ctx.device() + 1) * static_cast<float>(i + 1));
      }
      ctx.world().all_reduce(h.data(), h.data(), 5, DType::f16, Op::sum);
      ctx.world().all_reduce(b.data(), b.data(), 5, DType::bf16, Op::max);
      for (std::size_t i = 0; i < 5; ++i) {
        CHECK(sl::f16_to_float(h[i]) == 3.0f + 3.0f * static_cast<float>(i));  // 0.5+1+1.5 + 3i
        CHECK(sl::bf16_to_float(b[i]) == 6.0f * static_cast<float>(i + 1));
      }
    });
  }

  TEST_CASE("eight devices on two cores make progress through many small collectives") {
    sl::Runtime::threads(8).spmd([](sl::Context& ctx) {
      double x = 0;
      for (int i = 0; i < 2000; ++i) {
        double one = 1;
        ctx.world().all_reduce(&one, &x, 1, DType::f64, Op::sum);
      }
      CHECK(x == 8.0);
    });
  }
}
