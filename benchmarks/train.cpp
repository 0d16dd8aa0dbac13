// SPDX-License-Identifier: Apache-2.0
// Training benchmark: tokens per second of each recipe of examples/gpt/gpt.hpp (docs/08_training.md)
// training the small GPT with AdamW, one JSON record per recipe on stdout, progress on stderr.
// Driven by `benchmarks/run train` (which runs the same model and strategy in JAX beside it); run
// alone as
//   bench_train --devices 8 --recipe dp,zero1,zero2,zero3,tp,dp_tp,pp_dp,pp_zero1,pp_zero2,pp_tp [--steps 10]
//               [--warmup 2] [--vocab 512 --seq 128 --dim 256 --heads 8 --ff 1024 --layers 2 --batch 16]
//               [--stages 2 --microbatches 8]
//   bench_train --bubble --devices 4: the pipeline schedules (GPipe, 1F1B, interleaved with 2 chunks)
//               on every device a stage, m = 2p micro-batches, 4p layers: each stage's idle fraction
//               measured (1 - its time in forwards and backwards / the step's) beside the ideal bubble
//               (p - 1) / (v m + p - 1); part "bubble", one record per schedule, with the first
//               stage's peak of activation bytes in its last step (activation_peak_bytes, the
//               memory account's own peak of the role). The ideal is that of
//               equal stages: benchmarks/run passes --vocab 64, so the last stage's LM head and loss
//               add little to its work.
//               `mpirun -np 4 bench_train --bubble --backend mpi`: a process per stage;
//               `--transport permutes`: the slot-boundary permutes instead of point-to-point sends (p2p).
// A step is the whole training loop's step: the batch made on the devices, zero_grad, forward,
// backward, optimizer step and the loss read back. `seconds` is the median step time (device 0's
// clock; every step ends with the loss's all_reduce, so devices leave it together);
// tokens_per_second = batch * seq / seconds. baseline: the same model, batch and optimizer on one
// device (the "replicated" recipe on a runtime of one device), so ratio_to_baseline is the
// recipe's speed-up over one device. Records carry the collectives of one step and the per-device
// memory by role after it.
#include "../examples/gpt/gpt.hpp"
#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace sl = shardlib;

namespace {

struct Result {
  double seconds = 0, first_loss = 0, last_loss = 0;
  gpt::StepReport report;
};

template <class R>
Result measure(sl::Runtime& rt, const gpt::Config& cfg, int warmup, int steps) {
  Result res;
  rt.spmd([&](sl::Context& ctx) {
    std::vector<double> times;
    auto last = bench::Clock::now();
    gpt::train<R>(ctx, cfg, warmup + steps, [&](int s, const gpt::StepReport& r) {
      const auto now = bench::Clock::now();
      if (s >= warmup) times.push_back(std::chrono::duration<double>(now - last).count());
      last = now;
      if (ctx.device() != 0) return;
      if (s == 0) res.first_loss = r.loss;
      res.last_loss = r.loss;
      res.report = r;
    });
    if (ctx.device() == 0) res.seconds = bench::median(times);
  });
  return res;
}

/// A pipelined recipe's steps: as measure(), and the stages' idle fractions (each device's median
/// over the timed steps, then their mean).
struct PipeResult : Result {
  double idle = 0;
};
template <class R>
PipeResult measure_pipelined(sl::Runtime& rt, const gpt::Config& cfg, const gpt::PipeConfig& pc, int warmup, int steps) {
  PipeResult res;
  rt.spmd([&](sl::Context& ctx) {
    std::vector<double> times, idles;
    auto last = bench::Clock::now();
    gpt::train_pipelined<R>(ctx, cfg, pc, warmup + steps, [&](int s, const gpt::StepReport& r) {
      const auto now = bench::Clock::now();
      if (s >= warmup) {
        times.push_back(std::chrono::duration<double>(now - last).count());
        idles.push_back(r.pipeline.idle_fraction());
      }
      last = now;
      if (ctx.device() != 0) return;
      if (s == 0) res.first_loss = r.loss;
      res.last_loss = r.loss;
      res.report = r;
    });
    double mine = bench::median(idles), all = 0;  // (under mpi each process knows its own device's)
    ctx.world().all_reduce(&mine, &all, 1, sl::coll::DType::f64, sl::coll::Op::sum);
    if (ctx.device() == 0) {
      res.seconds = bench::median(times);
      res.idle = all / ctx.num_devices();
    }
  });
  return res;
}

std::string stats_json(const sl::coll::CommStats& s) {
  std::ostringstream o;
  o << "{";
  bool first = true;
  for (int k = 0; k < sl::coll::num_kinds; ++k) {
    const auto& st = s[static_cast<sl::coll::Kind>(k)];
    if (st.calls == 0) continue;
    o << (first ? "" : ", ") << "\"" << sl::coll::name(static_cast<sl::coll::Kind>(k)) << "\": " << st.calls;
    first = false;
  }
  return o.str() + "}";
}

sl::coll::CommStats sum(const gpt::StepReport& r) {
  sl::coll::CommStats s;
  for (int k = 0; k < sl::coll::num_kinds; ++k) {
    const auto kind = static_cast<sl::coll::Kind>(k);
    for (const auto* p : {&r.forward, &r.backward, &r.update}) {
      s[kind].calls += (*p)[kind].calls;
      s[kind].bytes_sent += (*p)[kind].bytes_sent;
      s[kind].bytes_received += (*p)[kind].bytes_received;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, false)) return 0;
  gpt::Config cfg;
  cfg.vocab = bench::arg(argc, argv, "--vocab", 512);
  cfg.seq = bench::arg(argc, argv, "--seq", 128);
  cfg.dim = bench::arg(argc, argv, "--dim", 256);
  cfg.heads = bench::arg(argc, argv, "--heads", 8);
  cfg.ff = bench::arg(argc, argv, "--ff", 1024);
  cfg.layers = bench::arg(argc, argv, "--layers", 2);
  cfg.batch = bench::arg(argc, argv, "--batch", 16);
  const int devices = static_cast<int>(bench::arg(argc, argv, "--devices", 8));
  const int steps = static_cast<int>(bench::arg(argc, argv, "--steps", 10));
  const int warmup = static_cast<int>(bench::arg(argc, argv, "--warmup", 2));
  std::string recipes = "dp,zero1,zero2,zero3,tp,dp_tp";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--recipe") == 0) recipes = argv[i + 1];

  bool bubble = false;
  for (int i = 1; i < argc; ++i) bubble = bubble || std::strcmp(argv[i], "--bubble") == 0;
  if (bubble) {  // the schedules' bubbles, measured, on every device a stage
    namespace pp = sl::pipeline;
    // threads devices; or, with --backend mpi under mpirun, a process per device. --transport
    // permutes: the slot-boundary permutes (nccl's transport) in place of point-to-point sends.
    bool permutes = false;
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--transport") != 0) continue;
      const char* v = i + 1 < argc ? argv[i + 1] : "";
      if (std::strcmp(v, "permutes") != 0 && std::strcmp(v, "p2p") != 0) {
        std::fprintf(stderr, "bench_train: --transport is p2p or permutes, not '%s'\n", v);
        return 2;
      }
      permutes = std::strcmp(v, "permutes") == 0;
    }
    bool from_args = false;
    for (int i = 1; i < argc; ++i) from_args = from_args || std::strcmp(argv[i], "--backend") == 0;
    auto rt = from_args ? sl::Runtime::from_args(argc, argv, devices) : sl::Runtime::threads(devices);
    const int stages = rt.num_devices();
    gpt::Config c = cfg;
    c.layers = 4 * stages;
    for (pp::Schedule k : {pp::Schedule::gpipe, pp::Schedule::one_f_one_b, pp::Schedule::interleaved}) {
      gpt::PipeConfig pc{stages, 2 * stages, k, k == pp::Schedule::interleaved ? 2 : 1, false};
      if (permutes) pc.transport = pp::Transport::slot_permutes;
      c.batch = std::max<std::int64_t>(cfg.batch / pc.microbatches, 1) * pc.microbatches;
      std::fprintf(stderr, "train: bubble of %s on %d stages, %d micro-batches ...\n", std::string(pp::to_string(k)).c_str(),
                   stages, pc.microbatches);
      const PipeResult r = measure_pipelined<gpt::PP>(rt, c, pc, warmup, steps);
      if (r.seconds == 0) continue;  // (not the process of device 0)
      const pp::Table t = pc.table();
      std::printf("{\"bench\": \"train\", \"part\": \"bubble\", \"name\": \"%s\", \"backend\": \"%s\", \"transport\": \"%s\", \"devices\": %d, "
                  "\"seconds\": %.6g, \"baseline\": \"the ideal bubble (p - 1) / (v m + p - 1)\", \"baseline_seconds\": %.6g, "
                  "\"bubble\": %.4g, \"bubble_ideal\": %.4g, \"bubble_table\": %.4g, \"stages\": %d, \"microbatches\": %d, "
                  "\"chunks\": %d, \"tokens_per_second\": %.6g, \"activation_peak_bytes\": %lld, "
                  "\"config\": {\"layers\": %lld, \"batch\": %lld, \"vocab\": %lld}}\n",
                  std::string(pp::to_string(k)).c_str(), std::string(sl::to_string(rt.backend())).c_str(),
                  permutes ? "slot_permutes" : "point_to_point", rt.num_devices(), r.seconds, r.seconds * (1 - t.ideal_bubble()) / (1 - r.idle),
                  r.idle, t.ideal_bubble(), t.bubble(), pc.stages, pc.microbatches, pc.chunks,
                  static_cast<double>(c.batch * c.seq) / r.seconds,
                  (long long)r.report.memory.peak_of(sl::MemoryRole::activations), (long long)c.layers, (long long)c.batch,
                  (long long)c.vocab);
      std::fflush(stdout);
    }
    return 0;
  }
  const int stages = static_cast<int>(bench::arg(argc, argv, "--stages", 2));
  const int microbatches = static_cast<int>(bench::arg(argc, argv, "--microbatches", 8));
  auto one = sl::Runtime::threads(1);
  std::fprintf(stderr, "train: one device (the baseline) ...\n");
  const Result base = measure<gpt::Replicated>(one, cfg, warmup, steps);
  auto rt = sl::Runtime::threads(devices);
  const double tokens = static_cast<double>(cfg.batch * cfg.seq);
  std::stringstream list(recipes);
  for (std::string name; std::getline(list, name, ',');) {
    std::fprintf(stderr, "train: %s on %d devices ...\n", name.c_str(), devices);
    Result r;
    const gpt::PipeConfig pc{stages, microbatches, sl::pipeline::Schedule::one_f_one_b, 1, false};
    if (name == "pp_dp") r = measure_pipelined<gpt::PPxDP>(rt, cfg, pc, warmup, steps);
    else if (name == "pp_zero1") r = measure_pipelined<gpt::PPxZero1>(rt, cfg, pc, warmup, steps);
    else if (name == "pp_zero2") r = measure_pipelined<gpt::PPxZero2>(rt, cfg, pc, warmup, steps);
    else if (name == "pp_tp") r = measure_pipelined<gpt::PPxTP>(rt, cfg, pc, warmup, steps);
    else if (name == "dp") r = measure<gpt::DP>(rt, cfg, warmup, steps);
    else if (name == "zero1") r = measure<gpt::Zero1>(rt, cfg, warmup, steps);
    else if (name == "zero2") r = measure<gpt::Zero2>(rt, cfg, warmup, steps);
    else if (name == "zero3") r = measure<gpt::Zero3>(rt, cfg, warmup, steps);
    else if (name == "tp") r = measure<gpt::TP>(rt, cfg, warmup, steps);
    else if (name == "dp_tp") r = measure<gpt::DPxTP>(rt, cfg, warmup, steps);
    else {
      std::fprintf(stderr, "bench_train: unknown recipe '%s' (dp, zero1, zero2, zero3, tp, dp_tp, pp_dp, pp_zero1, pp_zero2, pp_tp)\n",
                   name.c_str());
      return 2;
    }
    const sl::MemoryUsage& m = r.report.memory;
    std::printf(
        "{\"bench\": \"train\", \"part\": \"recipe\", \"name\": \"%s\", \"backend\": \"threads\", \"devices\": %d, "
        "\"seconds\": %.6g, \"baseline\": \"one device\", \"baseline_seconds\": %.6g, \"ratio_to_baseline\": %.4g, "
        "\"tokens_per_second\": %.6g, \"baseline_tokens_per_second\": %.6g, \"steps\": %d, \"first_loss\": %.6g, "
        "\"last_loss\": %.6g, \"collectives\": %s, \"parameters_bytes\": %lld, \"gradients_bytes\": %lld, "
        "\"optimizer_state_bytes\": %lld, \"activations_bytes\": %lld, \"config\": {\"vocab\": %lld, \"seq\": %lld, "
        "\"dim\": %lld, \"heads\": %lld, \"ff\": %lld, \"layers\": %lld, \"batch\": %lld}}\n",
        name.c_str(), devices, r.seconds, base.seconds, r.seconds / base.seconds, tokens / r.seconds,
        tokens / base.seconds, steps, r.first_loss, r.last_loss, stats_json(sum(r.report)).c_str(),
        (long long)m.parameters(), (long long)m.gradients(), (long long)m.optimizer_state(),
        (long long)m.activations(), (long long)cfg.vocab, (long long)cfg.seq, (long long)cfg.dim,
        (long long)cfg.heads, (long long)cfg.ff, (long long)cfg.layers, (long long)cfg.batch);
    std::fflush(stdout);
  }
}
