// SPDX-License-Identifier: Apache-2.0
// The cost model (plan/cost.hpp) and device profiles (plan/profile.hpp): pure functions of their
// inputs, checked against the formulas by hand.
#include <shardlib/plan/cost.hpp>

#include <doctest/doctest.h>

#include <string>

namespace sl = shardlib;
namespace plan = sl::plan;
using sl::coll::CallRecord;
using sl::coll::Kind;

TEST_SUITE_BEGIN("plan");

namespace {
CallRecord call(Kind k, int size, std::uint64_t sent, int first, int last, std::uint64_t received = 0) {
  return CallRecord{k, "group", size, sent, received == 0 ? sent : received, first, last};
}
plan::Profile simple() {
  plan::Profile p;
  p.name = "test";
  p.gemm_rate = 1e12;
  p.gemm_call = 1e-6;
  p.memory_bandwidth = 1e11;
  p.kernel_call = 2e-6;
  p.peak_flops = 2e12;
  p.memory = 1 << 30;
  p.node_size = 4;
  p.intra_node = {1e-6, 1e10, "a"};
  p.inter_node = {1e-5, 1e9, "b"};
  return p;
}
}  // namespace

TEST_CASE("link_of: a call within one node's devices is intra-node, one that spans nodes inter-node") {
  CHECK(plan::link_of(call(Kind::all_reduce, 4, 8, 4, 7), 4) == plan::LinkKind::intra_node);
  CHECK(plan::link_of(call(Kind::all_reduce, 2, 8, 3, 4), 4) == plan::LinkKind::inter_node);
  CHECK(plan::link_of(call(Kind::all_gather, 8, 8, 0, 56), 8) == plan::LinkKind::inter_node);  // a strided group
  CHECK(plan::link_of(call(Kind::send, 2, 8, 5, 6), 8) == plan::LinkKind::intra_node);
  // devices unknown: by the group's size
  CHECK(plan::link_of(call(Kind::all_reduce, 4, 8, -1, -1), 4) == plan::LinkKind::intra_node);
  CHECK(plan::link_of(call(Kind::all_reduce, 5, 8, -1, -1), 4) == plan::LinkKind::inter_node);
}

TEST_CASE("steps_of: rings for gathers, the fewer of ring and tree for all_reduce, one for point to point") {
  CHECK(plan::steps_of(call(Kind::all_gather, 8, 1, 0, 7)) == 7);
  CHECK(plan::steps_of(call(Kind::reduce_scatter, 8, 1, 0, 7)) == 7);
  CHECK(plan::steps_of(call(Kind::all_to_all, 4, 1, 0, 3)) == 3);
  CHECK(plan::steps_of(call(Kind::all_reduce, 2, 1, 0, 1)) == 2);     // ring 2, tree 2
  CHECK(plan::steps_of(call(Kind::all_reduce, 1024, 1, 0, 1023)) == 20);  // tree: 2 log2 1024
  CHECK(plan::steps_of(call(Kind::broadcast, 5, 1, 0, 4)) == 3);
  CHECK(plan::steps_of(call(Kind::send, 2, 1, 0, 1)) == 1);
  CHECK(plan::steps_of(call(Kind::all_reduce, 1, 1, 0, 0)) == 0);
  CHECK(plan::ceil_log2(1) == 0);
  CHECK(plan::ceil_log2(65536) == 16);
}

TEST_CASE("predict: each part by its formula, collectives by the link they cross, the bubble on the compute") {
  const plan::Profile p = simple();
  plan::Work w;
  w.gemm_flops = 3'000'000'000;  // 3 ms at 1e12
  w.gemm_calls = 10;             // + 10 us
  w.kernel_bytes = 200'000'000;  // 2 ms at 1e11
  w.kernel_calls = 100;          // + 200 us
  w.calls = {call(Kind::all_reduce, 4, 10'000'000, 0, 3),   // intra: a tree's 2 log2 4 = 4 steps (a ring's 6): 4 us + 1 ms
             call(Kind::all_gather, 8, 1'000'000, 0, 7),    // inter: 7 x 10 us + 1 ms
             call(Kind::send, 2, 0, 0, 1)};                 // to itself: nothing
  plan::StepTime t = plan::predict(w, p);
  CHECK(t.gemm == doctest::Approx(3e-3 + 10e-6));
  CHECK(t.kernels == doctest::Approx(2e-3 + 200e-6));
  CHECK(t.intra_node == doctest::Approx(4e-6 + 1e-3));
  CHECK(t.inter_node == doctest::Approx(70e-6 + 1e-3));
  CHECK(t.intra_bytes == 10'000'000);
  CHECK(t.inter_bytes == 1'000'000);
  CHECK(t.bubble == 0);
  CHECK(t.total() == doctest::Approx(t.gemm + t.kernels + t.intra_node + t.inter_node));
  w.bubble = 0.25;  // idle a quarter of the step: compute / 0.75 in all
  t = plan::predict(w, p);
  CHECK(t.bubble == doctest::Approx(t.compute() / 3));
  // each product of a batch pays the per-product cost (a host BLAS: a call a matrix)
  plan::Profile host = p;
  host.gemm_call = 0;
  host.gemm_product = 2e-6;
  w.gemm_products = 40;  // 10 calls of 4 matrices: + 80 us
  CHECK(plan::predict(w, host).gemm == doctest::Approx(3e-3 + 80e-6));
  CHECK(plan::predict(w, p).gemm == doctest::Approx(3e-3 + 10e-6));  // gemm_product 0: per call only
  // a batch's FLOPs at the batched rate; none given (the presets): at gemm_rate
  w.batched_gemm_flops = 1'000'000'000;  // 1 of the 3 GFLOP: 1 ms at 1e12, 4 ms at 2.5e11
  CHECK(plan::predict(w, host).gemm == doctest::Approx(3e-3 + 80e-6));
  host.batched_gemm_rate = 2.5e11;
  CHECK(plan::predict(w, host).gemm == doctest::Approx(2e-3 + 4e-3 + 80e-6));
  w.batched_gemm_flops = 0;
  CHECK(plan::predict(w, host).gemm == doctest::Approx(3e-3 + 80e-6));
  host.batched_gemm_rate = 0;
  // Devices sharing one's compute: the compute C is each one's while all run; alone a device
  // needs C / shared, so the step is the longer of C and C / (shared (1 - b)).
  host.shared = 2;
  w.bubble = 0.25;  // alone: C / 2 / 0.75 = 0.67 C < C: the idle stages' time is the others'
  CHECK(plan::predict(w, host).bubble == 0);
  w.bubble = 0.75;  // alone: C / 2 / 0.25 = 2 C: a bubble of C
  t = plan::predict(w, host);
  CHECK(t.bubble == doctest::Approx(t.compute()));
  host.shared = 0.5;  // less than 1 is taken as 1
  t = plan::predict(w, host);
  CHECK(t.bubble == doctest::Approx(3 * t.compute()));
  w.bubble = 0;
  // a broadcast moves its buffer once: the root's bytes over n - 1 (3 steps of a tree over 5)
  const CallRecord root{Kind::broadcast, "group", 5, 4'000'000, 0, 0, 4};
  CHECK(plan::call_seconds(root, p.intra_node) == doctest::Approx(3e-6 + 1'000'000 / 1e10));
  const CallRecord other{Kind::broadcast, "group", 5, 0, 1'000'000, 0, 4};
  CHECK(plan::call_seconds(other, p.intra_node) == doctest::Approx(3e-6 + 1'000'000 / 1e10));
}

TEST_CASE("work_since: the FLOP count's change since a reading, fused products included, and the recorded calls") {
  sl::kernels::count_gemm(1, 2, 3, 4);  // before the reading: not counted
  const sl::kernels::FlopCount before = sl::kernels::flop_count();
  sl::coll::CommRecorder rec(sl::coll::keep_calls);
  sl::kernels::count_gemm(3, 4, 5, 6);           // 3 products of 2 * 4 * 5 * 6 FLOPs, one call
  sl::kernels::count_gemm(1, 7, 7, 7);           // one product: not a batch
  sl::kernels::count_kernel(1000);
  sl::kernels::count_kernel(24);
  sl::kernels::count_fused_products(500);        // FLOPs alone: no GEMM call or product
  sl::coll::CommRecorder::record(Kind::all_reduce, 64, 64, "group {x}", 4, 0, 3);
  const plan::Work w = plan::work_since(before, rec);
  CHECK(w.gemm_flops == 3 * 2 * 4 * 5 * 6 + 2 * 7 * 7 * 7 + 500);
  CHECK(w.gemm_calls == 2);
  CHECK(w.gemm_products == 4);
  CHECK(w.batched_gemm_flops == 3 * 2 * 4 * 5 * 6);  // the batch's; not the lone product's or the fused ones'
  CHECK(w.kernel_calls == 2);
  CHECK(w.kernel_bytes == 1024);
  REQUIRE(w.calls.size() == 1);
  CHECK(w.calls[0].kind == Kind::all_reduce);
  CHECK(w.calls[0].group_size == 4);
  CHECK(w.bubble == 0);
}

TEST_CASE("presets: each figure with its source; an unknown name lists the known ones") {
  for (const std::string& n : plan::Profile::presets()) {
    const plan::Profile p = plan::Profile::preset(n);
    CAPTURE(n);
    CHECK(p.gemm_rate > 0);
    CHECK(p.gemm_rate < p.peak_flops);
    CHECK(p.memory_bandwidth > 0);
    CHECK(p.node_size == 8);
    CHECK(p.intra_node.bandwidth > p.inter_node.bandwidth);
    CHECK(!p.source.empty());
    CHECK(!p.intra_node.source.empty());
    CHECK(!p.inter_node.source.empty());
  }
  CHECK(plan::Profile::preset("h100").peak_flops == doctest::Approx(989.4e12));
  CHECK(plan::Profile::preset("a100").peak_flops == doctest::Approx(312e12));
  CHECK_THROWS_WITH_AS(plan::Profile::preset("v100"),
                       doctest::Contains("no device profile 'v100' (the presets: h100, h200, a100"),
                       std::invalid_argument);
}

TEST_CASE("profile JSON: to_json and parse round trip; a missing link kind falls back to a named default") {
  const plan::Profile p = simple();
  const plan::Profile q = plan::Profile::parse(p.to_json(), "p.json");
  CHECK(q.name == "test");
  CHECK(q.gemm_rate == doctest::Approx(p.gemm_rate));
  CHECK(q.gemm_call == doctest::Approx(p.gemm_call));
  CHECK(q.gemm_product == 0);
  CHECK(q.shared == 1);
  CHECK(q.memory_bandwidth == doctest::Approx(p.memory_bandwidth));
  CHECK(q.kernel_call == doctest::Approx(p.kernel_call));
  CHECK(q.peak_flops == doctest::Approx(p.peak_flops));
  CHECK(q.memory == p.memory);
  CHECK(q.node_size == 4);
  CHECK(q.inter_node.latency == doctest::Approx(1e-5));
  CHECK(q.inter_node.source == "b");
  CHECK(q.notes.empty());
  plan::Profile unmeasured = simple();  // a link of no bandwidth (not measured) is left out of the file
  unmeasured.inter_node = {};
  CHECK(unmeasured.to_json().find("inter_node") == std::string::npos);
  const plan::Profile u = plan::Profile::parse(unmeasured.to_json(), "u.json");
  CHECK(u.inter_node.bandwidth == doctest::Approx(plan::Profile::preset("h100").inter_node.bandwidth));
  CHECK(u.notes.size() == 1);

  const std::string one_link = R"({"name": "host", "gemm_rate": 5e10, "gemm_call": 1e-6, "memory_bandwidth": 1e10,
    "kernel_call": 1e-6, "memory": 1e9, "node_size": 8,
    "intra_node": {"latency": 2e-6, "bandwidth": 5e9, "source": "measured"}})";
  const plan::Profile h = plan::Profile::parse(one_link, "host.json", "a100");
  CHECK(h.intra_node.bandwidth == doctest::Approx(5e9));
  CHECK(h.inter_node.bandwidth == doctest::Approx(plan::Profile::preset("a100").inter_node.bandwidth));
  REQUIRE(h.notes.size() == 1);
  CHECK(h.notes[0].find("inter_node: not in host.json; the a100 default instead") == 0);
  CHECK(h.peak_flops == 0);
  // per-call costs and latencies may be 0 (a calibration that saw none); rates may not
  std::string free_calls = one_link;
  const std::string one_us = "\"gemm_call\": 1e-6";
  free_calls.replace(free_calls.find(one_us), one_us.size(), "\"gemm_call\": 0");
  CHECK(plan::Profile::parse(free_calls, "f.json").gemm_call == 0);
  // a host's calibration: a cost per product and the devices sharing a core set, round trip;
  // a profile without them (an older file) has neither
  plan::Profile calibrated = simple();
  calibrated.gemm_product = 3e-6;
  calibrated.shared = 4;
  calibrated.batched_gemm_rate = 6e10;
  const plan::Profile c = plan::Profile::parse(calibrated.to_json(), "c.json");
  CHECK(c.gemm_product == doctest::Approx(3e-6));
  CHECK(c.shared == doctest::Approx(4));
  CHECK(c.batched_gemm_rate == doctest::Approx(6e10));
  CHECK(h.gemm_product == 0);
  CHECK(h.shared == 1);
  CHECK(h.batched_gemm_rate == 0);
  std::string lone = one_link;
  lone.replace(lone.find("\"node_size\": 8"), 14, "\"node_size\": 8, \"shared\": 0.5");
  CHECK_THROWS_WITH_AS(plan::Profile::parse(lone, "s.json"),
                       doctest::Contains("profile s.json: \"shared\" is 0.5; it must be 1 or more"), std::invalid_argument);
  lone = one_link;
  lone.replace(lone.find("\"node_size\": 8"), 14, "\"node_size\": 8, \"gemm_product\": -1");
  CHECK_THROWS_WITH_AS(plan::Profile::parse(lone, "g.json"), doctest::Contains("\"gemm_product\" is -1"),
                       std::invalid_argument);

  CHECK_THROWS_WITH_AS(plan::Profile::parse(R"({"gemm_rate": 1})", "x.json"),
                       doctest::Contains("profile x.json: no \"gemm_call\" (a number)"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan::Profile::parse(R"({"name": "x", "gemm_rate": -1})", "x.json"),
                       doctest::Contains("\"gemm_rate\" is -1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan::Profile::parse("[1, 2]", "x.json"),
                       doctest::Contains("profile x.json is not a profile's JSON: '{' expected"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan::Profile::parse(R"({"a": 1} x)", "x.json"), doctest::Contains("text after the object"),
                       std::invalid_argument);
  std::string bad_link = one_link;
  bad_link.replace(bad_link.find("\"bandwidth\": 5e9"), 16, "\"bandwidth\": 0");
  CHECK_THROWS_WITH_AS(plan::Profile::parse(bad_link, "h.json"),
                       doctest::Contains("\"bandwidth\" of \"intra_node\" is 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan::Profile::load("/nonexistent/p.json"), doctest::Contains("cannot read the profile /nonexistent/p.json"),
                       std::runtime_error);
}

TEST_SUITE_END();
