// SPDX-License-Identifier: Apache-2.0
// Pipeline parallelism: the schedules' tables (every op once, in dependency order, the bubble of
// the formulas, 1F1B's bound on micro-batches in flight, the bad counts refused), and the runner
// against one device's computation: a residual MLP stack over Mesh<"stage", "data", "model">
// (PP alone, PP x DP, PP x DP x TP), GPipe with and without recomputation, 1F1B and interleaved,
// m = 1, p, 2p, 4p: the same loss and the same gradients as the stack run whole on every device,
// exactly one activation and one gradient of the boundary's bytes per micro-batch and boundary
// (sends under threads, permutes at the slot boundaries under mpi).
// Runs on 2, 4 and 8 threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/pipeline.hpp>

#include "../collectives/harness.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace sl = shardlib;
namespace pp = shardlib::pipeline;
using sl::none;
using sl::Spec;
using Kind = sl::coll::Kind;

namespace {

TEST_SUITE("pipeline") {
TEST_CASE("schedules: every op once, after its inputs, with the bubble of the formulas") {
  for (auto kind : {pp::Schedule::gpipe, pp::Schedule::one_f_one_b, pp::Schedule::interleaved})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 3, 4, 8, 16, 32})
        for (int v : {1, 2, 3})
          for (int b : {1, 2, 3}) {
            if ((kind == pp::Schedule::interleaved) != (v > 1)) continue;
            if (kind == pp::Schedule::interleaved && m % p != 0) continue;
            const pp::Table t = pp::schedule(kind, p, m, v, b);
            CAPTURE(t.to_string());
            const int V = p * v;
            std::map<std::pair<int, int>, int> fend, bend;  // (virtual stage, micro-batch) -> end slot
            for (int s = 0; s < p; ++s) {
              int free = 0;
              for (const pp::Op& o : t.ops[static_cast<std::size_t>(s)]) {
                CHECK(o.start >= free);  // one op at a time, in the table's order
                free = o.end();
                CHECK(o.slots == (o.forward ? 1 : b));
                auto& ends = o.forward ? fend : bend;
                CHECK(ends.emplace(std::pair{t.virtual_stage(s, o.chunk), o.microbatch}, o.end()).second);
              }
            }
            REQUIRE(fend.size() == static_cast<std::size_t>(V * m));
            REQUIRE(bend.size() == static_cast<std::size_t>(V * m));
            for (int vs = 0; vs < V; ++vs)
              for (int mb = 0; mb < m; ++mb) {
                const int fstart = fend.at({vs, mb}) - 1, bstart = bend.at({vs, mb}) - b;
                if (vs > 0) CHECK(fstart >= fend.at({vs - 1, mb}));
                CHECK(bstart >= (vs == V - 1 ? fend.at({vs, mb}) : bend.at({vs + 1, mb})));
              }
            CHECK(t.bubble() == doctest::Approx(double(p - 1) / double(v * m + p - 1)));
            if (kind == pp::Schedule::one_f_one_b)
              for (int s = 0; s < p; ++s) CHECK(t.peak_in_flight(s) == std::min(p - s, m));
            if (kind == pp::Schedule::gpipe)
              for (int s = 0; s < p; ++s) CHECK(t.peak_in_flight(s) == m);
            // The forwards alone (an evaluation pass): each once, after its input, as early as it can.
            const pp::Table f = t.forwards();
            std::map<std::pair<int, int>, int> ffend;
            for (int s = 0; s < p; ++s)
              for (const pp::Op& o : f.ops[static_cast<std::size_t>(s)]) {
                CHECK(o.forward);
                CHECK(ffend.emplace(std::pair{f.virtual_stage(s, o.chunk), o.microbatch}, o.end()).second);
              }
            REQUIRE(ffend.size() == static_cast<std::size_t>(V * m));
            for (const auto& [key, end] : ffend)
              if (key.first > 0) CHECK(end - 1 >= ffend.at({key.first - 1, key.second}));
            if (v == 1) CHECK(f.length == m + p - 1);
            CHECK(f.length <= t.length);
          }
}

TEST_CASE("schedules: printed before running, one row per stage") {
  const std::string s = pp::schedule(pp::Schedule::one_f_one_b, 2, 3).to_string();
  CHECK(s == "1f1b: 2 stages, 3 micro-batches, 12 slots (forward 1, backward 2); bubble 0.250 (ideal 0.250)\n"
             "stage 0  | F0 F1 .  .  B0 B0 F2 B1 B1 .  B2 B2 | in flight at most 2\n"
             "stage 1  | .  F0 B0 B0 F1 B1 B1 F2 B2 B2 .  .  | in flight at most 1\n");
}

TEST_CASE("schedules and layer splits: bad counts are refused, naming them") {
  CHECK_THROWS_WITH_AS(pp::schedule(pp::Schedule::gpipe, 0, 4), doctest::Contains("0 stages"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(pp::schedule(pp::Schedule::one_f_one_b, 2, 0), doctest::Contains("0 micro-batches"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(pp::schedule(pp::Schedule::gpipe, 2, 4, 2), doctest::Contains("only the interleaved schedule"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(pp::schedule(pp::Schedule::interleaved, 2, 4, 1), doctest::Contains("needs 2 or more"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(pp::schedule(pp::Schedule::interleaved, 4, 6, 2), doctest::Contains("6 micro-batches on 4 stages"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(pp::schedule_from_string("zb"), doctest::Contains("gpipe, 1f1b, interleaved"), std::invalid_argument);
  CHECK(pp::schedule_from_string("1f1b") == pp::Schedule::one_f_one_b);
  const pp::Table t = pp::schedule(pp::Schedule::one_f_one_b, 4, 4);
  CHECK_THROWS_WITH_AS(pp::layers_of(t, 3, 0, 0), doctest::Contains("3 layers cannot fill 4 stages"), std::invalid_argument);
  // Uneven stages: 6 layers on 4 stages are 2, 2, 1, 1.
  CHECK(pp::layers_of(t, 6, 0, 0) == std::pair{0, 2});
  CHECK(pp::layers_of(t, 6, 1, 0) == std::pair{2, 4});
  CHECK(pp::layers_of(t, 6, 3, 0) == std::pair{5, 6});
  const pp::Table i = pp::schedule(pp::Schedule::interleaved, 2, 2, 2);
  CHECK_THROWS_WITH_AS(pp::layers_of(i, 6, 0, 0), doctest::Contains("split into 2 equal chunks"), std::invalid_argument);
  CHECK(pp::layers_of(i, 8, 1, 1) == std::pair{6, 8});  // virtual stage 3
}
}

using M = sl::Mesh<"stage", "data", "model">;
template <class S>
using Ten = sl::DistributedTensor<float, M, S>;
using Act = Spec<"data", none>;
using ActT = Ten<Act>;

struct Layer {
  sl::Param<Ten<Spec<none>>> g;
  sl::Param<Ten<Spec<none, "model">>> w1;
  sl::Param<Ten<Spec<"model", none>>> w2;
};
constexpr std::int64_t D = 8, F = 16;

Layer make_layer(const M& mesh, int l) {
  const std::uint64_t s = 10 * static_cast<std::uint64_t>(l + 1);
  return Layer{sl::Param(Ten<Spec<none>>::random(mesh, {D}, s, 0.5f, 1.5f)),
               sl::Param(Ten<Spec<none, "model">>::random(mesh, {D, F}, s + 1, -0.5f, 0.5f)),
               sl::Param(Ten<Spec<"model", none>>::random(mesh, {F, D}, s + 2, -0.5f, 0.5f))};
}
template <class X>
sl::Var<ActT> block(const X& x, const Layer& l) {
  auto h = sl::gelu(sl::matmul(sl::layer_norm<1>(x) * l.g, l.w1));
  return x + sl::reshard<Act>(sl::matmul(h, l.w2));
}
ActT input(const M& mesh, std::int64_t rows, int mb) { return ActT::random(mesh, {rows, D}, 1000 + mb, -1.f, 1.f); }
ActT target(const M& mesh, std::int64_t rows, int mb) { return ActT::random(mesh, {rows, D}, 2000 + mb, -1.f, 1.f); }

/// The largest relative difference between two blocks of the same spec on this device.
template <class A>
double block_diff(const A& a, const A& b) {
  REQUIRE(a.block().num_elements() == b.block().num_elements());
  double worst = 0;
  for (std::int64_t k = 0; k < a.block().num_elements(); ++k) {
    const double x = a.local().data()[k], y = b.local().data()[k];
    worst = std::max(worst, std::abs(x - y) / (1e-3 + std::abs(y)));
  }
  return worst;
}

struct Case {
  pp::Schedule kind;
  int stages, data, model, microbatches, chunks, layers;
  bool recompute;
  float loss_scale = 1;  ///< RunOptions::loss_scale (the reference's backward seeded alike)
  pp::Transport transport = pp::Transport::automatic;
};

/// Runs case `c` pipelined and whole (every layer on every device, the micro-batches one after
/// the other), and compares the loss, each stage's gradients and the boundary traffic.
void check(sl::Context& ctx, const Case& c) {
  CAPTURE(pp::to_string(c.kind));
  CAPTURE(c.stages);
  CAPTURE(c.data);
  CAPTURE(c.model);
  CAPTURE(c.microbatches);
  CAPTURE(c.recompute);
  M mesh(ctx, {c.stages, c.data, c.model});
  const std::int64_t rows = 2 * c.data;  // per micro-batch
  const int m = c.microbatches;
  // Whole: the reference.
  std::vector<Layer> all;
  for (int l = 0; l < c.layers; ++l) all.push_back(make_layer(mesh, l));
  double want_loss = 0;
  std::vector<std::vector<float>> want_out;
  std::vector<double> want_losses;
  for (int mb = 0; mb < m; ++mb) {
    sl::Var<ActT> h(input(mesh, rows, mb));
    for (const Layer& L : all) h = block(h, L);
    want_out.push_back(h.value().to_host());
    auto loss = sl::mse_loss(h, target(mesh, rows, mb));
    want_losses.push_back(loss.value().item());
    sl::backward(loss * (c.loss_scale / float(m)), {.sync = false});
    want_loss += loss.value().to_host()[0] / m;
  }
  for (const Layer& L : all) sl::sync_grads(L.g, L.w1, L.w2);

  // Pipelined: this device holds its stage's chunks of layers.
  const pp::Table table = pp::schedule(c.kind, c.stages, m, c.chunks, c.recompute ? 3 : 2);
  pp::StageScope scope(mesh);
  const int me = mesh.shape().coords(ctx.device())[0];
  std::map<int, Layer> mine;
  for (int ch = 0; ch < c.chunks; ++ch) {
    const auto [first, last] = pp::layers_of(table, c.layers, me, ch);
    for (int l = first; l < last; ++l) mine.emplace(l, make_layer(mesh, l));
  }
  auto stage = [&](int chunk, int mb, const sl::Var<ActT>* in) {
    sl::Var<ActT> h = in ? *in : sl::Var<ActT>(input(mesh, rows, mb));
    const auto [first, last] = pp::layers_of(table, c.layers, me, chunk);
    for (int l = first; l < last; ++l) h = block(h, mine.at(l));
    return h;
  };
  sl::coll::CommRecorder rec;
  const pp::StepStats st = pp::run<ActT>(
      table, mesh, {rows, D}, stage, [&](int mb, const sl::Var<ActT>& out) { return sl::mse_loss(out, target(mesh, rows, mb)); },
      {.recompute = c.recompute, .loss_scale = c.loss_scale, .transport = c.transport});
  const sl::coll::CommStats traffic = rec.stats();
  CHECK(st.loss == doctest::Approx(want_loss).epsilon(1e-6));
  CHECK(st.forwards == m * c.chunks);
  CHECK(st.backwards == m * c.chunks);
  for (auto& entry : mine) {  // not a structured binding: clang 14 cannot capture one (CHECK_MESSAGE)
    const auto l = entry.first;
    auto& L = entry.second;
    sl::sync_grads(L.g, L.w1, L.w2);
    const Layer& R = all[static_cast<std::size_t>(l)];
    CHECK_MESSAGE(block_diff(L.g.grad(), R.g.grad()) <= 1e-5, "layer " << l << " g");
    CHECK_MESSAGE(block_diff(L.w1.grad(), R.w1.grad()) <= 1e-5, "layer " << l << " w1");
    CHECK_MESSAGE(block_diff(L.w2.grad(), R.w2.grad()) <= 1e-5, "layer " << l << " w2");
  }
  // The boundaries: one activation per micro-batch forward, one gradient back, each of the
  // boundary block's bytes (a stage axis of one device moves nothing).
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(ActT::uninitialized(mesh, {rows, D}).block().num_elements()) * 4;
  const int V = c.stages * c.chunks;
  std::uint64_t sends = 0, recvs = 0;
  for (int ch = 0; ch < c.chunks; ++ch) {
    const int vs = table.virtual_stage(me, ch);
    sends += static_cast<std::uint64_t>((vs < V - 1) + (vs > 0)) * static_cast<std::uint64_t>(m);
    recvs += static_cast<std::uint64_t>((vs > 0) + (vs < V - 1)) * static_cast<std::uint64_t>(m);
  }
  if (c.stages == 1) sends = recvs = 0;
  // (point to point: sends and receives; slot_permutes: a collective permute per slot boundary.)
  CHECK(traffic[Kind::permute].bytes_sent + traffic[Kind::send].bytes_sent == sends * block_bytes);
  CHECK(traffic[Kind::permute].bytes_received + traffic[Kind::recv].bytes_received == recvs * block_bytes);
  CHECK(traffic.total_calls() == traffic[Kind::permute].calls + traffic[Kind::send].calls + traffic[Kind::recv].calls +
                                     traffic[Kind::all_reduce].calls);
  if (c.transport == pp::Transport::slot_permutes)
    CHECK(traffic[Kind::send].calls == 0);
  else
    CHECK(traffic[Kind::send].calls == sends);  // one message per crossing (threads and mpi alike)

  // The forwards alone (an evaluation): each micro-batch's loss and output on every device, as
  // the whole stack gives them; nothing recorded; one activation per boundary and micro-batch.
  bool recorded = false;
  sl::coll::CommRecorder rec2;
  const auto losses = pp::forward<ActT>(table, mesh, {rows, D}, stage, [&](int mb, const sl::Var<ActT>& out) {
    recorded = recorded || out.requires_grad();
    return sl::mse_loss(out, target(mesh, rows, mb));
  });
  const std::uint64_t fwd_bytes = rec2.stats()[Kind::permute].bytes_sent + rec2.stats()[Kind::send].bytes_sent;
  CHECK(!recorded);
  REQUIRE(losses.size() == static_cast<std::size_t>(m));
  for (int mb = 0; mb < m; ++mb) {
    REQUIRE(losses[static_cast<std::size_t>(mb)].size() == 1);
    CHECK(losses[static_cast<std::size_t>(mb)][0] == doctest::Approx(want_losses[static_cast<std::size_t>(mb)]).epsilon(1e-6));
  }
  std::uint64_t fwd_sends = 0;
  for (int ch = 0; ch < c.chunks; ++ch) fwd_sends += static_cast<std::uint64_t>(table.virtual_stage(me, ch) < V - 1) * m;
  if (c.stages == 1) fwd_sends = 0;
  CHECK(fwd_bytes == fwd_sends * block_bytes);
  const auto outs = pp::forward<ActT>(table, mesh, {rows, D}, stage, [](int, const sl::Var<ActT>& out) { return out; });
  for (int mb = 0; mb < m; ++mb) {
    const auto& got = outs[static_cast<std::size_t>(mb)];
    const auto& want = want_out[static_cast<std::size_t>(mb)];
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (std::size_t k = 0; k < got.size(); ++k) worst = std::max(worst, std::abs(double(got[k]) - want[k]) / (1e-3 + std::abs(want[k])));
    CHECK(worst <= 1e-5);
  }
}

/// The layers of a stack over p stages: 4, or one a stage where there are more (mpirun -np 5, 7).
int layers(int p) { return std::max(4, p); }

/// The meshes a device count allows: (stages, data, model).
std::vector<std::array<int, 3>> meshes(int n) {
  switch (n) {
    case 1: return {{1, 1, 1}};
    case 2: return {{2, 1, 1}, {1, 2, 1}};
    case 4: return {{4, 1, 1}, {2, 2, 1}};
    case 8: return {{4, 2, 1}, {2, 2, 2}};
    default: return {{n, 1, 1}};
  }
}

TEST_SUITE("pipeline") {
TEST_CASE("gpipe and 1f1b: the loss and gradients of the whole stack, one activation and one gradient per boundary") {
  sl::test::for_each_run([](sl::Context& ctx) {
    for (const auto& [p, d, mo] : meshes(ctx.num_devices()))
      for (int m : {1, p, 2 * p, 4 * p}) {
        check(ctx, {pp::Schedule::one_f_one_b, p, d, mo, m, 1, layers(p), false});
        if (m <= 2 * p) check(ctx, {pp::Schedule::gpipe, p, d, mo, m, 1, layers(p), m == p});
      }
  }, {1, 2, 4, 8});
}

TEST_CASE("interleaved, and uneven stages: the same loss and gradients") {
  sl::test::for_each_run([](sl::Context& ctx) {
    for (const auto& [p, d, mo] : meshes(ctx.num_devices())) {
      check(ctx, {pp::Schedule::interleaved, p, d, mo, p, 2, 2 * p, false});
      check(ctx, {pp::Schedule::interleaved, p, d, mo, 2 * p, 2, 2 * p, true});
      check(ctx, {pp::Schedule::one_f_one_b, p, d, mo, 2, 1, p + 1, false});  // the first stage holds one more
    }
  }, {2, 4, 8});
}

TEST_CASE("run: the slot-boundary permutes (nccl's transport) give the same loss, gradients and traffic") {
  sl::test::for_each_run([](sl::Context& ctx) {
    for (const auto& [p, d, mo] : meshes(ctx.num_devices())) {
      Case c{pp::Schedule::one_f_one_b, p, d, mo, 2 * p, 1, layers(p), false};
      c.transport = pp::Transport::slot_permutes;
      check(ctx, c);
      c = Case{pp::Schedule::interleaved, p, d, mo, p, 2, 2 * p, false};
      c.transport = pp::Transport::slot_permutes;
      check(ctx, c);
    }
  }, {2, 4, 8});
}

TEST_CASE("run: a loss scale (f16) seeds every micro-batch's backward with scale / m") {
  sl::test::for_each_run([](sl::Context& ctx) {
    for (const auto& [p, d, mo] : meshes(ctx.num_devices())) check(ctx, {pp::Schedule::one_f_one_b, p, d, mo, 2 * p, 1, layers(p), false, 1024});
  }, {2, 4});
}

TEST_CASE("run: a loss scale that is not finite and positive is refused, naming it") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1, 1});
    const pp::Table t = pp::schedule(pp::Schedule::gpipe, ctx.num_devices(), 2);
    auto none_fn = [](int, int, const sl::Var<ActT>* in) { return *in; };
    auto loss_fn = [](int, const sl::Var<ActT>& out) { return sl::mean_all(out); };
    for (double bad : {0.0, -2.0, std::numeric_limits<double>::infinity(), std::nan("")})
      CHECK_THROWS_WITH_AS(pp::run<ActT>(t, mesh, {2, D}, none_fn, loss_fn, {.loss_scale = bad}),
                           doctest::Contains("RunOptions::loss_scale is"), std::invalid_argument);
  }, {2});
}

TEST_CASE("run: a table of another stage count than the mesh's axis is refused, naming both") {
  sl::test::for_each_run([](sl::Context& ctx) {
    M mesh(ctx, {ctx.num_devices(), 1, 1});
    const pp::Table t = pp::schedule(pp::Schedule::gpipe, ctx.num_devices() + 1, 2);
    auto none_fn = [](int, int, const sl::Var<ActT>* in) { return *in; };
    auto loss_fn = [](int, const sl::Var<ActT>& out) { return sl::mean_all(out); };
    CHECK_THROWS_WITH_AS(pp::run<ActT>(t, mesh, {2, D}, none_fn, loss_fn),
                         doctest::Contains(doctest::String(("has " + std::to_string(ctx.num_devices() + 1) + " stages but axis 'stage'").c_str())),
                         std::invalid_argument);
  }, {2});
}

/// This device's high point of activation bytes (the memory account's own peak of the role) during
/// one pipelined step of `layers` layers, above what it held before the step; with `held`, the
/// step's StepStats::held_activations (the most at the end of an op) there.
std::int64_t activation_peak(sl::Context& ctx, pp::Schedule kind, int m, int layers, bool recompute,
                             std::int64_t* held = nullptr) {
  const int p = ctx.num_devices();
  M mesh(ctx, {p, 1, 1});
  const std::int64_t rows = 64;  // per micro-batch: each layer's activations are a few KiB
  const pp::Table table = pp::schedule(kind, p, m, 1, recompute ? 3 : 2);
  pp::StageScope scope(mesh);
  const int me = mesh.shape().coords(ctx.device())[0];
  const auto [first, last] = pp::layers_of(table, layers, me, 0);
  std::vector<Layer> mine;
  for (int l = first; l < last; ++l) mine.push_back(make_layer(mesh, l));
  std::vector<ActT> inputs, targets;  // made before the step: what a data loader holds
  for (int mb = 0; mb < m; ++mb) inputs.push_back(input(mesh, rows, mb)), targets.push_back(target(mesh, rows, mb));
  sl::reset_peak_memory(ctx);
  const std::int64_t before = sl::memory_usage(ctx).activations();
  const pp::StepStats stats = pp::run<ActT>(
      table, mesh, {rows, D},
      [&](int, int mb, const sl::Var<ActT>* in) {
        sl::Var<ActT> h = in ? *in : sl::Var<ActT>(inputs[static_cast<std::size_t>(mb)]);
        for (const Layer& L : mine) h = block(h, L);
        return h;
      },
      [&](int mb, const sl::Var<ActT>& out) { return sl::mse_loss(out, targets[static_cast<std::size_t>(mb)]); },
      {.recompute = recompute});
  if (held) *held = stats.held_activations;
  return sl::memory_usage(ctx).peak_of(sl::MemoryRole::activations) - before;
}

TEST_CASE("memory: 1F1B holds p micro-batches' activations whatever m, GPipe m of them, recomputed GPipe their inputs") {
  // The memory account's peak of activations on each stage (the parameters' pending gradients
  // count as gradients, so they are not in it): GPipe's grows by the same bytes a with each
  // micro-batch (f + m a), 1F1B's stays at what GPipe holds with m = p (its in-flight bound), and
  // recomputation keeps far less than a per micro-batch. The backward's own bytes are temporaries,
  // not in it: f is the scratch within a forward op (a product the next op adds and frees). Held
  // at the ends of ops (StepStats::held_activations), without that scratch: 1F1B's stage s holds
  // p - s micro-batches' activations, GPipe's m, so exactly p/m of GPipe's on the first stage.
  sl::test::for_each_run([](sl::Context& ctx) {
    const int p = ctx.num_devices(), L = 2 * p, s = ctx.device();
    std::int64_t hg2 = 0, hg4 = 0, hf2 = 0, hf4 = 0;
    const std::int64_t g1 = activation_peak(ctx, pp::Schedule::gpipe, p, L, false);
    const std::int64_t g2 = activation_peak(ctx, pp::Schedule::gpipe, 2 * p, L, false, &hg2);
    const std::int64_t g4 = activation_peak(ctx, pp::Schedule::gpipe, 4 * p, L, false, &hg4);
    const std::int64_t f2 = activation_peak(ctx, pp::Schedule::one_f_one_b, 2 * p, L, false, &hf2);
    const std::int64_t f4 = activation_peak(ctx, pp::Schedule::one_f_one_b, 4 * p, L, false, &hf4);
    const std::int64_t r2 = activation_peak(ctx, pp::Schedule::gpipe, 2 * p, L, true);
    const std::int64_t r4 = activation_peak(ctx, pp::Schedule::gpipe, 4 * p, L, true);
    INFO("device " << ctx.device() << ": gpipe " << g1 << ", " << g2 << ", " << g4 << "; 1f1b " << f2 << ", " << f4
                   << "; gpipe recomputed " << r2 << ", " << r4);
    const std::int64_t a = (g2 - g1) / p;  // one micro-batch's held activations
    CHECK(a > 0);
    CHECK(g2 - g1 == p * a);
    CHECK(std::abs(g4 - g2 - 2 * p * a) <= 16);  // (the last stage: within its loss's scalars)
    CHECK(f4 == f2);   // no more in flight with more micro-batches
    CHECK(f4 <= g1);   // at most what GPipe holds with p micro-batches
    CHECK(f4 - (g1 - p * a) <= p * a);  // held: at most p of 4p micro-batches' activations
    CHECK((r4 - r2) * 4 < (g4 - g2));   // a layer's inputs, not its activations (two layers a stage)
    // Held between ops: micro-batches' activations only, p - s of them under 1F1B, m under GPipe.
    INFO("held: gpipe " << hg2 << ", " << hg4 << "; 1f1b " << hf2 << ", " << hf4);
    // (the last stage holds the running sum of the losses besides: one float, whatever m)
    const std::int64_t c = s == p - 1 ? std::int64_t(sizeof(float)) : 0;
    CHECK(hf2 == hf4);
    CHECK((hf2 - c) * (2 * p) == (hg2 - c) * (p - s));
    CHECK((hf4 - c) * (4 * p) == (hg4 - c) * (p - s));
    CHECK(hg2 <= g2);
    CHECK(hg4 - hg2 == g4 - g2);
  }, {2, 4});
}

TEST_CASE("StageScope: a group first asked for inside the stages' code is refused, naming it") {
  // The other stages' devices would never join the world split that makes it.
  sl::test::for_each_run([](sl::Context& ctx) {
    const int n = ctx.num_devices();
    M mesh(ctx, {n, 1, 1});
    const sl::MeshShape other({"x"}, {n});
    {
      pp::StageScope scope(mesh);
      sl::coll::Communicator& made = ctx.group(mesh.shape(), sl::AxisList{1, 2});  // the scope made it
      CHECK(made.size() == 1);
      CHECK_THROWS_WITH_AS(ctx.group(other, sl::AxisList{0}),
                           doctest::Contains(("group {x} of mesh {x: " + std::to_string(n) +
                                              "} first asked for inside a pipeline stage's code").c_str()),
                           std::logic_error);
    }
    CHECK(ctx.group(other, sl::AxisList{0}).size() == n);  // outside the scope, made on every device
  }, {1, 2, 4});
}

TEST_CASE("a stage that throws ends every device, with its message") {
  if (sl::test::mpi_runtime()) return;  // (under mpirun an exception ends the job)
  CHECK_THROWS_WITH_AS(sl::Runtime::threads(4).spmd([](sl::Context& ctx) {
    M mesh(ctx, {4, 1, 1});
    pp::StageScope scope(mesh);
    const pp::Table t = pp::schedule(pp::Schedule::one_f_one_b, 4, 4);
    const Layer L = make_layer(mesh, 0);
    const int me = mesh.shape().coords(ctx.device())[0];
    pp::run<ActT>(
        t, mesh, {2, D},
        [&](int, int mb, const sl::Var<ActT>* in) {
          if (me == 2 && mb == 1) throw std::runtime_error("stage 2 failed on micro-batch 1");
          return block(in ? *in : sl::Var<ActT>(input(mesh, 2, mb)), L);
        },
        [&](int mb, const sl::Var<ActT>& out) { return sl::mse_loss(out, target(mesh, 2, mb)); });
  }),
                       "stage 2 failed on micro-batch 1", std::runtime_error);
}
}

}  // namespace
