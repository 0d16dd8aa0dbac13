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

#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace sl = shardlib;

gpt::Config plan_config() {
  gpt::Config c;
  c.vocab = 64, c.seq = 16, c.dim = 32, c.heads = 8, c.ff = 64, c.layers = 2, c.batch = 8;
  return c;
}

/// The second step's report of each device of a real run (the first step makes the optimizer's
/// state): on `devices` threads devices, or under mpirun on the MPI run (this process's device).
template <class R>
std::vector<std::pair<int, gpt::StepReport>> real_reports(int devices, const gpt::Config& cfg) {
  std::vector<std::pair<int, gpt::StepReport>> out;
  std::mutex m;
  auto body = [&](sl::Context& ctx) {
    gpt::train<R>(ctx, cfg, 2, [&](int s, const gpt::StepReport& r) {
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

template <class R>
gpt::StepReport simulated_report(int devices, int device, const gpt::Config& cfg) {
  gpt::StepReport out;
  sl::Runtime::simulate(devices, device).spmd([&](sl::Context& ctx) {
    CHECK(sl::shape_only());
    CHECK(ctx.backend() == "simulate");
    CHECK(ctx.num_devices() == devices);
    CHECK(ctx.device() == device);
    gpt::train<R>(ctx, cfg, 2, [&](int s, const gpt::StepReport& r) {
      if (s == 1) out = r;
    });
  });
  CHECK(!sl::shape_only());  // the mode ends with the run
  return out;
}

/// Recipe R on `devices` threads devices (under mpirun: on the MPI run's) against each device
/// simulated alone.
template <class R>
void simulated_equals_real(int devices, const gpt::Config& cfg = plan_config()) {
  for (const auto& [d, want] : real_reports<R>(devices, cfg)) {
    const gpt::StepReport sim = simulated_report<R>(sl::test::mpi_runtime() ? sl::test::mpi_runtime()->num_devices() : devices, d, cfg);
    INFO(R::name << " on " << devices << " devices, device " << d);
    CHECK(sim.memory.bytes == want.memory.bytes);
    CHECK(sim.memory.peaks == want.memory.peaks);
    CHECK(sim.memory.peak == want.memory.peak);
    CHECK(want.memory.peak > 0);
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

TEST_CASE("simulate: a 3.5-billion-parameter step planned on 1,024 and on 256 simulated devices, without its memory") {
  if (sl::test::mpi_runtime()) return;  // one process's work: the threads run covers it
  gpt::Config c;
  c.vocab = 32768, c.seq = 1024, c.dim = 4096, c.heads = 32, c.ff = 16384, c.layers = 16, c.batch = 1024;
  const std::int64_t hk = c.heads * c.head_dim();
  const std::int64_t psi = c.vocab * c.dim + c.seq * c.dim +
                           c.layers * (4 * c.dim + 4 * c.dim * hk + 2 * c.dim * c.ff) + 2 * c.dim + c.dim * c.vocab;
  const auto t0 = std::chrono::steady_clock::now();
  const gpt::StepReport r = simulated_report<gpt::Zero3>(1024, 5, c);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("planned a step of " << psi << " parameters on device 5 of 1,024 in " << seconds
                               << " s: " << r.memory.to_string());
  // f32 ZeRO-3 with AdamW: a device's gradients are its parameters' shard, its state twice that.
  CHECK(r.memory.gradients() == r.memory.parameters());
  CHECK(r.memory.optimizer_state() == 2 * r.memory.parameters());
  CHECK(r.memory.peak > 16 * psi / 1024);  // gathered weights and activations come on top
  CHECK(r.trace.totals.total_calls() > 0);
  // Every device of 256 simulated in turn: ZeRO-3 keeps each parameter once over the mesh, so
  // their shards add up to the model, 4 bytes per parameter, whatever the uneven blocks (the
  // heads split over 256 devices: devices past the 32nd hold no attention weights).
  std::int64_t params = 0, grads = 0, state = 0;
  for (int d = 0; d < 256; ++d) {
    const gpt::StepReport rd = simulated_report<gpt::Zero3>(256, d, c);
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
}
