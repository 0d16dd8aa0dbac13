// SPDX-License-Identifier: Apache-2.0
// Planning a run on shapes alone (the simulate backend: runtime.hpp, collectives/simulated.hpp,
// detail/shape_only.hpp): a training step of examples/gpt run as one simulated device of N, with
// no tensor storage and no kernels, must report exactly the memory account (bytes by role, each
// role's peak, the step's peak) and exactly the collectives (kind, group, bytes, in order) of the
// same device in a real run on N threads devices, for every recipe; and it must run on meshes
// far larger than the devices at hand, at sizes no host could hold.
#include <doctest/doctest.h>

#include "../../examples/gpt/gpt.hpp"
#include "../collectives/harness.hpp"

#include <shardlib/plan.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

namespace sl = shardlib;

gpt::Config plan_config() {
  gpt::Config c;
  c.vocab = 64, c.seq = 16, c.dim = 32, c.heads = 8, c.ff = 64, c.layers = 2, c.batch = 8;
  return c;
}

/// Two steps of recipe R (a pipelined one with `pc`), `on_step(step, report)` after each.
template <class R>
auto trainer(const gpt::Config& cfg, gpt::PipeConfig pc = {}) {
  return [cfg, pc](sl::Context& ctx, const auto& on_step) {
    if constexpr (gpt::Pipelined<R>)
      gpt::train_pipelined<R>(ctx, cfg, pc, 2, on_step);
    else
      gpt::train<R>(ctx, cfg, 2, on_step);
  };
}

/// The second step's report of each device of a real run (the first step makes the optimizer's
/// state): on `devices` threads devices, or under mpirun on the MPI run (this process's device).
template <class Train>
std::vector<std::pair<int, gpt::StepReport>> real_reports(int devices, const Train& train) {
  std::vector<std::pair<int, gpt::StepReport>> out;
  std::mutex m;
  auto body = [&](sl::Context& ctx) {
    train(ctx, [&](int s, const gpt::StepReport& r) {
      std::lock_guard<std::mutex> lock(m);
      if (s == 1) out.emplace_back(ctx.device(), r);
    });
  };
  if (sl::Runtime* rt = sl::test::mpi_runtime())
    rt->spmd(body);
  else
    sl::Runtime::threads(devices).spmd(body);
  return out;
}

template <class Train>
gpt::StepReport simulated_report(int devices, int device, const Train& train) {
  gpt::StepReport out;
  sl::Runtime::simulate(devices, device).spmd([&](sl::Context& ctx) {
    CHECK(sl::shape_only());
    CHECK(ctx.backend() == "simulate");
    CHECK(ctx.num_devices() == devices);
    CHECK(ctx.device() == device);
    train(ctx, [&](int s, const gpt::StepReport& r) {
      if (s == 1) out = r;
    });
  });
  CHECK(!sl::shape_only());  // the mode ends with the run
  return out;
}

/// Recipe R on `devices` threads devices (under mpirun: on the MPI run's) against each device
/// simulated alone: memory account, collectives and GEMM FLOPs.
template <class R>
void simulated_equals_real(int devices, const gpt::Config& cfg = plan_config(), gpt::PipeConfig pc = {}) {
  const auto train = trainer<R>(cfg, pc);
  const int n = sl::test::mpi_runtime() ? sl::test::mpi_runtime()->num_devices() : devices;
  if (gpt::Pipelined<R> && n % pc.stages != 0) return;  // (mpirun -np 2: the 4-stage cases)
  if (std::is_same_v<R, gpt::DPxCP> && n % cfg.cp != 0) return;  // (mpirun -np 5, 7: --cp 2 needs an even count)
  for (const auto& [d, want] : real_reports(devices, train)) {
    const gpt::StepReport sim = simulated_report(n, d, train);
    INFO(R::name << " on " << n << " devices, device " << d);
    CHECK(sim.memory.bytes == want.memory.bytes);
    CHECK(sim.memory.peaks == want.memory.peaks);
    CHECK(sim.memory.peak == want.memory.peak);
    CHECK(want.memory.peak > 0);
    CHECK(sim.work.gemm_flops == want.work.gemm_flops);
    CHECK(sim.work.gemm_calls == want.work.gemm_calls);
    CHECK(sim.work.gemm_products == want.work.gemm_products);
    CHECK(sim.work.batched_gemm_flops == want.work.batched_gemm_flops);
    CHECK(sim.work.kernel_bytes == want.work.kernel_bytes);
    CHECK(sim.work.kernel_calls == want.work.kernel_calls);
    CHECK(sim.work.bubble == want.work.bubble);
    if (d == 0) CHECK(want.work.gemm_flops > 0);  // (a device past a short batch's blocks may compute nothing)
    if (d == 0) CHECK(want.work.kernel_calls > 0);
    REQUIRE(sim.work.calls.size() == want.work.calls.size());
    for (std::size_t i = 0; i < sim.work.calls.size(); ++i) {  // the devices each call joins: the cost model's links
      CHECK(sim.work.calls[i].first_device == want.work.calls[i].first_device);
      CHECK(sim.work.calls[i].last_device == want.work.calls[i].last_device);
    }
    CHECK_MESSAGE(sim.trace.to_string() == want.trace.to_string(),
                  "simulated\n" << sim.trace.to_string() << "real\n" << want.trace.to_string());
  }
}

}  // namespace

TEST_SUITE("train") {
TEST_CASE("simulate: a step's memory account and collectives, shape-only, equal a real run's for every recipe") {
  simulated_equals_real<gpt::DP>(4);
  simulated_equals_real<gpt::Zero1>(4);
  simulated_equals_real<gpt::Zero2>(4);
  simulated_equals_real<gpt::Zero3>(4);
  simulated_equals_real<gpt::TP>(4);
  simulated_equals_real<gpt::DPxTP>(4);
  simulated_equals_real<gpt::DPxCP>(4);
  simulated_equals_real<gpt::DP>(3);  // uneven: a batch of 8 over 3 devices
  simulated_equals_real<gpt::Zero3>(3);
}

TEST_CASE("simulate: pipelined recipes (1F1B, GPipe recomputed, interleaved; with DP, TP, ZeRO) equal a real run's too") {
  namespace pp = sl::pipeline;
  gpt::Config cfg = plan_config();
  cfg.layers = 4;
  simulated_equals_real<gpt::PPxDP>(4, cfg, {.stages = 2, .microbatches = 4, .schedule = pp::Schedule::one_f_one_b});
  simulated_equals_real<gpt::PPxDP>(4, cfg, {.stages = 4, .microbatches = 2, .schedule = pp::Schedule::gpipe, .recompute = true});
  simulated_equals_real<gpt::PPxTP>(4, cfg, {.stages = 2, .microbatches = 2, .schedule = pp::Schedule::one_f_one_b});
  simulated_equals_real<gpt::PPxZero2>(4, cfg, {.stages = 2, .microbatches = 4, .schedule = pp::Schedule::one_f_one_b});
  simulated_equals_real<gpt::PPxDP>(4, cfg, {.stages = 2, .microbatches = 4, .schedule = pp::Schedule::interleaved, .chunks = 2});
  simulated_equals_real<gpt::PPxDPxTP>(8, cfg, {.stages = 2, .microbatches = 2, .schedule = pp::Schedule::one_f_one_b});
}

TEST_CASE("simulate: each collective carries the devices it joins (a mesh group's members; a send's two ends)") {
  if (sl::test::mpi_runtime()) return;
  auto check = [](sl::Context& ctx) {
    using Mesh = sl::Mesh<"data", "model">;
    Mesh mesh(ctx, {4, 2});  // device = 2 data + model
    const auto t = sl::coll::trace([&] {
      std::vector<float> x(8, 1.f);
      ctx.group(mesh, {0}).all_reduce(x.data(), x.data(), 8, sl::coll::DType::f32, sl::coll::Op::sum);  // over "data"
      ctx.group(mesh, {1}).all_reduce(x.data(), x.data(), 8, sl::coll::DType::f32, sl::coll::Op::sum);  // over "model"
      ctx.world().all_reduce(x.data(), x.data(), 8, sl::coll::DType::f32, sl::coll::Op::sum);
    });
    REQUIRE(t.calls.size() == 3);
    const int d = ctx.device(), model = d % 2, data = d / 2;
    CHECK(t.calls[0].first_device == model);
    CHECK(t.calls[0].last_device == 6 + model);
    CHECK(t.calls[1].first_device == 2 * data);
    CHECK(t.calls[1].last_device == 2 * data + 1);
    CHECK(t.calls[2].first_device == 0);
    CHECK(t.calls[2].last_device == 7);
    // the cost model: "model" pairs stay in a node of 2 or 4; "data" spans nodes of 4
    CHECK(sl::plan::link_of(t.calls[1], 2) == sl::plan::LinkKind::intra_node);
    CHECK(sl::plan::link_of(t.calls[0], 4) == sl::plan::LinkKind::inter_node);
    CHECK(sl::plan::link_of(t.calls[2], 8) == sl::plan::LinkKind::intra_node);
  };
  sl::Runtime::threads(8).spmd(check);
  sl::Runtime::simulate(8, 5).spmd(check);
}

TEST_CASE("simulate: the ZeRO paper's memory per device (Rajbhandari et al. 2020, Table 1: 16 bytes per parameter "
          "in mixed precision with Adam), summed over every device of the mesh, exactly") {
  if (sl::test::mpi_runtime()) return;
  // bf16 parameters and gradients (2 + 2 bytes), float32 master weights and Adam's two moments
  // (K = 12): DP keeps all on every device; ZeRO-1 shards the 12, ZeRO-2 also the gradients,
  // ZeRO-3 everything. Summed over N devices, whatever the uneven blocks:
  gpt::Config c = plan_config();
  c.vocab = 96, c.dim = 48, c.heads = 4, c.ff = 80, c.layers = 3, c.seq = 12;
  const std::int64_t hk = c.heads * c.head_dim();
  const std::int64_t psi = c.vocab * c.dim + c.seq * c.dim +
                           c.layers * (4 * c.dim + 4 * c.dim * hk + 2 * c.dim * c.ff) + 2 * c.dim + c.dim * c.vocab;
  const int n = 7;
  auto sums = [&](auto recipe) {
    using R = decltype(recipe);
    std::int64_t p = 0, g = 0, s = 0;
    for (int d = 0; d < n; ++d) {
      gpt::StepReport r;
      sl::Runtime::simulate(n, d).spmd([&](sl::Context& ctx) {
        gpt::train<R, sl::bf16>(ctx, c, 2, [&](int step, const gpt::StepReport& rep) {
          if (step == 1) r = rep;
        });
      });
      p += r.memory.parameters(), g += r.memory.gradients(), s += r.memory.optimizer_state();
    }
    return std::array<std::int64_t, 3>{p, g, s};
  };
  const std::array<std::int64_t, 3> dp{2 * psi * n, 2 * psi * n, 12 * psi * n}, z1{2 * psi * n, 2 * psi * n, 12 * psi},
      z2{2 * psi * n, 2 * psi, 12 * psi}, z3{2 * psi, 2 * psi, 12 * psi};
  CHECK(sums(gpt::DP{}) == dp);
  CHECK(sums(gpt::Zero1{}) == z1);
  CHECK(sums(gpt::Zero2{}) == z2);
  CHECK(sums(gpt::Zero3{}) == z3);
}

TEST_CASE("simulate: GEMM FLOPs are counted per device, 2 M N K per product, the same shape-only") {
  auto step = [](sl::Context& ctx) {
    using Mesh = sl::Mesh<"data", "model">;
    Mesh mesh(ctx, {2, 2});
    using X = sl::DistributedTensor<float, Mesh, sl::Spec<"data", sl::none>>;
    using W = sl::DistributedTensor<float, Mesh, sl::Spec<sl::none, "model">>;
    sl::Param w(W::random(mesh, {64, 96}, 1));
    const X x = X::random(mesh, {32, 64}, 2);
    const std::uint64_t f0 = sl::kernels::flop_count().gemm;
    sl::backward(sl::sum_all(sl::matmul(x, w)));
    return sl::kernels::flop_count().gemm - f0;
  };
  // Each device: its [16, 64] rows of x times its [64, 48] columns of w forward, and the
  // gradient of w, [64, 16] x [16, 48], backward (x is no Param: no gradient of x).
  const std::uint64_t want = 2ull * 16 * 48 * 64 + 2ull * 64 * 48 * 16;
  if (!sl::test::mpi_runtime())
    sl::Runtime::threads(4).spmd([&](sl::Context& ctx) { CHECK(step(ctx) == want); });
  sl::Runtime::simulate(4, 3).spmd([&](sl::Context& ctx) { CHECK(step(ctx) == want); });
}

TEST_CASE("simulate: a batched product is one GEMM call of as many products, the same shape-only") {
  auto step = [](sl::Context& ctx) {
    using Mesh = sl::Mesh<"data">;
    Mesh mesh(ctx, {2});
    using T = sl::DistributedTensor<float, Mesh, sl::Spec<"data", sl::none, sl::none>>;
    const T a = T::random(mesh, {12, 4, 5}, 1), b = T::random(mesh, {12, 5, 3}, 2);
    const sl::kernels::FlopCount f0 = sl::kernels::flop_count();
    (void)sl::einsum<"bij,bjk->bik">(a, b);
    return sl::kernels::flop_count() - f0;
  };
  // Each device: 6 of the 12 [4, 5] x [5, 3] products, in one call.
  auto check = [](const sl::kernels::FlopCount& d) {
    CHECK(d.gemm == 2ull * 6 * 4 * 3 * 5);
    CHECK(d.gemm_calls == 1);
    CHECK(d.gemm_products == 6);
    CHECK(d.batched_gemm == d.gemm);  // all of it in a batch
  };
  if (!sl::test::mpi_runtime()) sl::Runtime::threads(2).spmd([&](sl::Context& ctx) { check(step(ctx)); });
  sl::Runtime::simulate(2, 1).spmd([&](sl::Context& ctx) { check(step(ctx)); });
}

TEST_CASE("simulate: a 3.5-billion-parameter step planned on 1,024 and on 256 simulated devices, without its memory") {
  if (sl::test::mpi_runtime()) return;  // one process's work: the threads run covers it
  gpt::Config c;
  c.vocab = 32768, c.seq = 1024, c.dim = 4096, c.heads = 32, c.ff = 16384, c.layers = 16, c.batch = 1024;
  const std::int64_t hk = c.heads * c.head_dim();
  const std::int64_t psi = c.vocab * c.dim + c.seq * c.dim +
                           c.layers * (4 * c.dim + 4 * c.dim * hk + 2 * c.dim * c.ff) + 2 * c.dim + c.dim * c.vocab;
  const auto t0 = std::chrono::steady_clock::now();
  const gpt::StepReport r = simulated_report(1024, 5, trainer<gpt::Zero3>(c));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("planned a step of " << psi << " parameters on device 5 of 1,024 in " << seconds
                               << " s: " << r.memory.to_string() << "; " << r.work.gemm_flops << " GEMM FLOPs");
  // f32 ZeRO-3 with AdamW: a device's gradients are its parameters' shard, its state twice that.
  CHECK(r.memory.gradients() == r.memory.parameters());
  CHECK(r.memory.optimizer_state() == 2 * r.memory.parameters());
  CHECK(r.memory.peak > 16 * psi / 1024);  // gathered weights and activations come on top
  CHECK(r.trace.totals.total_calls() > 0);
  // A step's GEMMs are about 6 FLOPs per parameter and token (2 forward, 4 backward; Kaplan et
  // al.): this device's one sequence of 1,024 tokens, less the embedding's lookup, plus attention.
  const double six_nt = 6.0 * static_cast<double>(psi) * 1024;
  CHECK(static_cast<double>(r.work.gemm_flops) > 0.9 * six_nt);
  CHECK(static_cast<double>(r.work.gemm_flops) < 1.1 * six_nt);
  // Every device of 256 simulated in turn: ZeRO-3 keeps each parameter once over the mesh, so
  // their shards add up to the model, 4 bytes per parameter, whatever the uneven blocks (the
  // heads split over 256 devices: devices past the 32nd hold no attention weights).
  std::int64_t params = 0, grads = 0, state = 0;
  for (int d = 0; d < 256; ++d) {
    const gpt::StepReport rd = simulated_report(256, d, trainer<gpt::Zero3>(c));
    params += rd.memory.parameters(), grads += rd.memory.gradients(), state += rd.memory.optimizer_state();
  }
  CHECK(params == 4 * psi);
  CHECK(grads == 4 * psi);
  CHECK(state == 8 * psi);
}

TEST_CASE("simulate: bad meshes and devices are refused by name") {
  CHECK_THROWS_WITH_AS(sl::Runtime::simulate(0), doctest::Contains("1 to 65536 devices, not 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sl::Runtime::simulate(-3), doctest::Contains("not -3"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sl::Runtime::simulate(65537), doctest::Contains("not 65537"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sl::Runtime::simulate(8, 8), doctest::Contains("device 8 is not one of the 8 devices"),
                       std::invalid_argument);
  // A split that needs the others (no size) cannot be simulated.
  auto w = sl::coll::SimulatedCommunicator::world(4, 1);
  CHECK_THROWS_WITH_AS(w->split(0, 0, "x"), doctest::Contains("without its size"), std::logic_error);
  auto g = w->split(0, 1, 2, "pair");
  REQUIRE(g);
  CHECK(g->size() == 2);
  CHECK(g->rank() == 1);
  // From the arguments: --backend simulate --devices N [--simulate-device R].
  auto from = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int argc = static_cast<int>(args.size());
    return sl::Runtime::from_args(argc, argv.data());
  };
  {
    auto rt = from({"prog", "--backend", "simulate", "--devices", "4096", "--simulate-device", "17"});
    CHECK(rt.backend() == sl::Backend::simulate);
    CHECK(rt.num_devices() == 4096);
    CHECK(rt.first_local_device() == 17);
    CHECK(rt.describe().find("device 17 of 4096 simulated devices") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(from({"prog", "--backend", "simulate", "--devices", "70000"}),
                       doctest::Contains("--devices must be a whole number from 1 to 65536, got '70000'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(from({"prog", "--backend", "simulate", "--devices", "8", "--simulate-device", "8"}),
                       doctest::Contains("--simulate-device must be a whole number from 0 to 7, got '8'"),
                       std::invalid_argument);
}

TEST_CASE("plan::table: those that fit first, fastest first by the cost model; the others with why; nothing fits says the smallest") {
  namespace plan = sl::plan;
  auto cand = [](const char* name, std::int64_t peak, std::uint64_t flops, const char* failed = "") {
    plan::Candidate c;
    c.name = name;
    c.mesh = "{data: 8}";
    c.memory.peak = peak;
    c.memory.bytes[0] = peak / 4;
    c.work.gemm_flops = flops;
    c.work.calls = {sl::coll::CallRecord{sl::coll::Kind::all_reduce, "world", 8, 1000, 1000, 0, 7}};
    c.failed = failed;
    return c;
  };
  const std::int64_t gib = std::int64_t{1} << 30;
  plan::Profile p = plan::Profile::preset("h100");
  p.memory = 80 * gib;
  const std::string t = plan::table({cand("big", 100 * gib, 1), cand("slow", 10 * gib, 900'000'000'000'000),
                                     cand("fast", 20 * gib, 5'000'000'000),
                                     cand("broken", 0, 0, "gpt: --tp 3 does not divide the 8 devices")},
                                    p, 1000);
  INFO(t);
  CHECK(t.find("1.   fast") != std::string::npos);
  CHECK(t.find("2.   slow") != std::string::npos);
  CHECK(t.find("--   big") != std::string::npos);
  CHECK(t.find("plans for h100 devices of 80 GiB, 8 to a node") != std::string::npos);
  CHECK(t.find("excluded: big on {data: 8}: needs 100 GiB at its peak, more than the 80 GiB") != std::string::npos);
  CHECK(t.find("excluded: broken on {data: 8}: gpt: --tp 3 does not divide the 8 devices") != std::string::npos);
  const std::string none = plan::table({cand("big", 100 * gib, 1), cand("bigger", 200 * gib, 1)}, p, 1000);
  CHECK(none.find("nothing fits: the smallest peak is 100 GiB per device") != std::string::npos);
  // A step ends with its slowest device: another planned device's longer step is the candidate's
  // (a pipeline's last stage beside its first), and ranks it.
  plan::Candidate piped = cand("piped", 10 * gib, 5'000'000'000);
  plan::Work last_stage = piped.work;
  last_stage.gemm_flops = 900'000'000'000'000;
  piped.other_devices.push_back(last_stage);
  CHECK(&piped.slowest(p) == &piped.other_devices[0]);
  CHECK(piped.time(p).total() == doctest::Approx(plan::predict(last_stage, p).total()));
  CHECK(piped.time(p).total() > plan::predict(piped.work, p).total());
  const std::string two = plan::table({piped, cand("fast", 20 * gib, 6'000'000'000)}, p, 1000);
  INFO(two);
  CHECK(two.find("1.   fast") != std::string::npos);
  CHECK(two.find("2.   piped") != std::string::npos);
  p.memory = 0;
  CHECK_THROWS_WITH_AS(plan::table({}, p, 1), doctest::Contains("a device memory of 0 bytes"), std::invalid_argument);
  // a profile's fallbacks are said under the table
  plan::Profile q = plan::Profile::preset("a100");
  q.notes = {"inter_node: not in f.json; the a100 default instead"};
  CHECK(plan::table({cand("fast", gib, 1)}, q, 1).find("profile: inter_node: not in f.json") != std::string::npos);
}
}
