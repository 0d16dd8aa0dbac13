// SPDX-License-Identifier: Apache-2.0
// Training benchmark: tokens per second of each recipe of examples/gpt/gpt.hpp (docs/08_training.md)
// training the small GPT with AdamW, one JSON record per recipe on stdout, progress on stderr.
// Driven by `benchmarks/run train` (which runs the same model and strategy in JAX beside it); run
// alone as
//   bench_train --devices 8 --recipe dp,zero1,zero2,zero3,tp,dp_tp,pp_dp,pp_zero1,pp_zero2,pp_tp,dp_moe [--steps 10]
//               [--warmup 2] [--vocab 512 --seq 128 --dim 256 --heads 8 --ff 1024 --layers 2 --batch 16]
//               [--stages 2 --microbatches 8] [--profile FILE]
//               (pp_dp, pp_zero1, pp_zero2: micro-batches fewer than asked where a stage's data
//               devices would not each get a row of every one; the record's "pipeline" says how many)
//   bench_train --published [--profile F]: GPT-3 175B on 1,024 simulated A100s as Megatron-LM ran it
//               (TP 8, micro-batches of 1, recomputation; PP 16 x DP 8), planned on shapes alone as
//               its first and last device, its TFLOP/s per GPU predicted (the a100 preset, or F)
//               beside the published 140 (part "published")
//   dp_moe: dp with the MLP of every other block a mixture of 2 experts per device over "data"
//               (Switch: top-1, experts of --ff hidden units, capacity factor 1.25: the dense
//               model's FLOPs per token, twice its MLPs' parameters per device), its record's
//               "moe" the layer's settings
//   --profile F: each recipe's step also planned on shapes alone (device 0 of as many simulated
//               devices) and its time predicted by the cost model on F's devices (bench_calibrate
//               writes F): predicted_seconds and prediction_ratio (predicted / measured) in its record
//   bench_train --bubble --devices 4: the pipeline schedules (GPipe, 1F1B, interleaved with 2 chunks)
//               on every device a stage, m = 2p micro-batches, 4p layers: each stage's idle fraction
//               measured (1 - its time in forwards and backwards / the step's) beside the ideal bubble
//               (p - 1) / (v m + p - 1); part "bubble", one record per schedule, with the first
//               stage's peak of activation bytes in its last step (activation_peak_bytes, the
//               memory account's own peak of the role), the most it held at the end of an op
//               (activation_held_bytes, StepStats::held_activations: what the schedule keeps
//               between forwards and backwards, without an op's own scratch), the peak of its
//               backward's temporaries (temporaries_peak_bytes) and that of all its bytes
//               (peak_bytes, parameters and gradients included). The ideal is that of
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

#include <shardlib/plan/cost.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace sl = shardlib;

namespace {

struct Result {
  double seconds = 0, first_loss = 0, last_loss = 0;
  gpt::StepReport report;
};

/// `devices` threads devices; or, with --backend on the command line, the runtime it names
/// (--backend mpi under mpirun: a process per device).
sl::Runtime runtime(int argc, char** argv, int devices) {
  if (bench::has_flag(argc, argv, "--backend")) return sl::Runtime::from_args(argc, argv, devices);
  return sl::Runtime::threads(devices);
}

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

/// Recipe R's second step (the first makes the optimizer's state) planned as device 0 of
/// `devices` simulated devices (--profile: the cost model's prediction beside the measured step).
template <class R>
gpt::StepReport planned(int devices, const gpt::Config& cfg, const gpt::PipeConfig& pc) {
  gpt::StepReport out;
  sl::Runtime::simulate(devices, 0).spmd([&](sl::Context& ctx) {
    auto keep = [&](int s, const gpt::StepReport& r) {
      if (s == 1) out = r;
    };
    if constexpr (gpt::Pipelined<R>) gpt::train_pipelined<R>(ctx, cfg, pc, 2, keep);
    else gpt::train<R>(ctx, cfg, 2, keep);
  });
  return out;
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
  if (bench::answered_backends_query(argc, argv, true)) return 0;
  bench::check_args(argc, argv,
                    {{"--recipe", bench::Takes::word},
                     {"--profile", bench::Takes::word},
                     {"--published"},
                     {"--bubble"},
                     {"--transport", bench::Takes::word, "p2p|permutes"},
                     {"--vocab", bench::Takes::integer},
                     {"--seq", bench::Takes::integer},
                     {"--dim", bench::Takes::integer},
                     {"--heads", bench::Takes::integer},
                     {"--ff", bench::Takes::integer},
                     {"--layers", bench::Takes::integer},
                     {"--batch", bench::Takes::integer},
                     {"--steps", bench::Takes::integer},
                     {"--warmup", bench::Takes::integer},
                     {"--stages", bench::Takes::integer},
                     {"--microbatches", bench::Takes::integer}});
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
  const std::string recipes = bench::text_arg(argc, argv, "--recipe", "dp,zero1,zero2,zero3,tp,dp_tp");
  // --profile F: each record also has the cost model's prediction on F's devices
  const std::string profile_file = bench::text_arg(argc, argv, "--profile", "");
  std::optional<sl::plan::Profile> profile;
  if (!profile_file.empty()) {
    try {
      profile = sl::plan::Profile::load(profile_file);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_train: %s\n", e.what());
      return 2;
    }
  }

  if (bench::has_flag(argc, argv, "--published")) {  // GPT-3 175B on 1,024 A100s, as Megatron-LM reported it, planned on shapes alone
    // Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
    // Megatron-LM" (SC'21, arXiv 2104.04473): GPT-3 175B (96 layers, hidden 12288, 96 heads,
    // sequence 2048, vocabulary 51200) on 1,024 A100s with a batch of 1,536 at 140 TFLOP/s per GPU
    // (about 34 days for 300 billion tokens). The configuration is PTD-P with tensor parallelism 8
    // within a node, micro-batches of 1 and full activation recomputation (the paper's FLOP count
    // includes it); pipeline 16 x data 8 is ours (the paper gives no 1,024-GPU split for it).
    gpt::Config c;
    c.layers = 96, c.dim = 12288, c.heads = 96, c.ff = 4 * 12288, c.vocab = 51200, c.seq = 2048, c.batch = 1536;
    c.tp = 8;
    const int n = 1024, stages = 16, data = n / stages / c.tp;
    gpt::PipeConfig pc{stages, static_cast<int>(c.batch / data), sl::pipeline::Schedule::one_f_one_b, 1, true};
    const sl::plan::Profile a100 = profile ? *profile : sl::plan::Profile::preset("a100");
    const double published_tflops = 140;
    for (int device : {0, n - 1}) {  // the first stage (embedding) and the last (LM head, loss)
      std::fprintf(stderr, "train: GPT-3 175B on %d simulated A100s, device %d (shapes only) ...\n", n, device);
      gpt::StepReport r;
      const auto t0 = bench::Clock::now();
      sl::Runtime::simulate(n, device).spmd([&](sl::Context& ctx) {
        gpt::train_pipelined<gpt::PPxDPxTP, sl::bf16>(ctx, c, pc, 2, [&](int s, const gpt::StepReport& rep) {
          if (s == 1) r = rep;
        });
      });
      const double plan_seconds = std::chrono::duration<double>(bench::Clock::now() - t0).count();
      const sl::plan::StepTime t = sl::plan::predict(r.work, a100);
      const double tflops = static_cast<double>(r.work.gemm_flops) / t.total() * 1e-12;
      const double published_seconds = static_cast<double>(r.work.gemm_flops) / (published_tflops * 1e12);
      std::printf("{\"bench\": \"train\", \"part\": \"published\", \"name\": \"gpt3-175b megatron ptd-p\", "
                  "\"backend\": \"simulate\", \"devices\": %d, \"device\": %d, \"seconds\": %.6g, "
                  "\"baseline\": \"Megatron-LM, 140 TFLOP/s per A100 (Narayanan et al. 2021)\", \"baseline_seconds\": %.6g, "
                  "\"tflops_per_gpu\": %.4g, \"published_tflops_per_gpu\": %.4g, \"prediction_ratio\": %.4g, "
                  "\"tokens_per_second\": %.6g, \"gemm_flops\": %.6g, \"peak_bytes\": %lld, \"plan_seconds\": %.3g, "
                  "\"predicted\": {\"gemm\": %.6g, \"kernels\": %.6g, \"bubble\": %.6g, \"intra_node\": %.6g, "
                  "\"inter_node\": %.6g}, \"profile\": \"%s\", \"config\": {\"tp\": %d, \"stages\": %d, \"data\": %d, "
                  "\"microbatches\": %d, \"recompute\": true, \"precision\": \"bf16\"}}\n",
                  n, device, t.total(), published_seconds, tflops, published_tflops, tflops / published_tflops,
                  static_cast<double>(c.batch * c.seq) / t.total(), static_cast<double>(r.work.gemm_flops),
                  (long long)r.memory.peak, plan_seconds, t.gemm, t.kernels, t.bubble, t.intra_node, t.inter_node,
                  a100.name.c_str(), c.tp, stages, data, pc.microbatches);
      std::fflush(stdout);
    }
    return 0;
  }
  if (bench::has_flag(argc, argv, "--bubble")) {  // the schedules' bubbles, measured, on every device a stage
    namespace pp = sl::pipeline;
    // threads devices; or, with --backend mpi under mpirun, a process per device. --transport
    // permutes: the slot-boundary permutes (nccl's transport) in place of point-to-point sends.
    const bool permutes = bench::text_arg(argc, argv, "--transport", "p2p") == "permutes";
    auto rt = runtime(argc, argv, devices);
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
                  "\"chunks\": %d, \"tokens_per_second\": %.6g, \"activation_peak_bytes\": %lld, \"activation_held_bytes\": %lld, "
                  "\"temporaries_peak_bytes\": %lld, \"peak_bytes\": %lld, \"config\": {\"layers\": %lld, \"batch\": %lld, \"vocab\": %lld}}\n",
                  std::string(pp::to_string(k)).c_str(), std::string(sl::to_string(rt.backend())).c_str(),
                  permutes ? "slot_permutes" : "point_to_point", rt.num_devices(), r.seconds, r.seconds * (1 - t.ideal_bubble()) / (1 - r.idle),
                  r.idle, t.ideal_bubble(), t.bubble(), pc.stages, pc.microbatches, pc.chunks,
                  static_cast<double>(c.batch * c.seq) / r.seconds,
                  (long long)r.report.memory.peak_of(sl::MemoryRole::activations), (long long)r.report.pipeline.held_activations,
                  (long long)r.report.memory.peak_of(sl::MemoryRole::temporaries), (long long)r.report.memory.peak, (long long)c.layers, (long long)c.batch,
                  (long long)c.vocab);
      std::fflush(stdout);
    }
    return 0;
  }
  const int stages = static_cast<int>(bench::arg(argc, argv, "--stages", 2));
  const int microbatches = static_cast<int>(bench::arg(argc, argv, "--microbatches", 8));
  // threads devices, or with --backend mpi under mpirun a process per device (the baseline then
  // measured by the process of device 0 before the others start: they wait at a barrier).
  auto rt = runtime(argc, argv, devices);
  const bool first = rt.first_local_device() == 0;
  Result base;
  if (first) {
    auto one = sl::Runtime::threads(1);
    std::fprintf(stderr, "train: one device (the baseline) ...\n");
    base = measure<gpt::Replicated>(one, cfg, warmup, steps);
  }
  rt.spmd([](sl::Context& ctx) { ctx.world().barrier(); });
  const double tokens = static_cast<double>(cfg.batch * cfg.seq);
  gpt::Config moe_cfg = cfg;  // dp_moe: Switch's layer in every other block, 2 experts a device
  moe_cfg.moe = 2 * rt.num_devices(), moe_cfg.top_k = 1, moe_cfg.capacity_factor = 1.25;
  std::stringstream list(recipes);
  for (std::string name; std::getline(list, name, ',');) {
    if (first) std::fprintf(stderr, "train: %s on %d %s devices ...\n", name.c_str(), rt.num_devices(),
                            std::string(sl::to_string(rt.backend())).c_str());
    Result r;
    const int n = rt.num_devices();
    // A stage's data devices split each micro-batch's rows: fewer micro-batches where they would
    // not all get one (batch 16 in 8 micro-batches of 2 rows over 4 data devices leaves two idle).
    const bool rows_over_data = name == "pp_dp" || name == "pp_zero1" || name == "pp_zero2";
    const std::int64_t data = rows_over_data ? std::max(1, n / std::max(1, stages)) : 1;
    int mb = microbatches;
    while (mb > 1 && (cfg.batch / mb < data || cfg.batch % mb != 0)) --mb;
    if (mb != microbatches && first)
      std::fprintf(stderr, "train: %s: %d micro-batches of %lld rows (not %d), one row at least for each of a stage's %lld data devices\n",
                   name.c_str(), mb, (long long)(cfg.batch / mb), microbatches, (long long)data);
    const gpt::PipeConfig pc{stages, mb, sl::pipeline::Schedule::one_f_one_b, 1, false};
    gpt::StepReport plan;
    if (profile && first) {
      if (name == "pp_dp") plan = planned<gpt::PPxDP>(n, cfg, pc);
      else if (name == "pp_zero1") plan = planned<gpt::PPxZero1>(n, cfg, pc);
      else if (name == "pp_zero2") plan = planned<gpt::PPxZero2>(n, cfg, pc);
      else if (name == "pp_tp") plan = planned<gpt::PPxTP>(n, cfg, pc);
      else if (name == "dp") plan = planned<gpt::DP>(n, cfg, pc);
      else if (name == "zero1") plan = planned<gpt::Zero1>(n, cfg, pc);
      else if (name == "zero2") plan = planned<gpt::Zero2>(n, cfg, pc);
      else if (name == "zero3") plan = planned<gpt::Zero3>(n, cfg, pc);
      else if (name == "tp") plan = planned<gpt::TP>(n, cfg, pc);
      else if (name == "dp_tp") plan = planned<gpt::DPxTP>(n, cfg, pc);
    }
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
    else if (name == "dp_moe") r = measure<gpt::DP>(rt, moe_cfg, warmup, steps);
    else {
      std::fprintf(stderr, "bench_train: unknown recipe '%s' (dp, zero1, zero2, zero3, tp, dp_tp, pp_dp, pp_zero1, pp_zero2, pp_tp, dp_moe)\n",
                   name.c_str());
      return 2;
    }
    if (!first) continue;  // (under mpi, the process of device 0 writes the records)
    const sl::MemoryUsage& m = r.report.memory;
    std::string extra;  // the recipe's own fields: a mixture of experts', a pipeline's
    if (name == "dp_moe")
      extra = "\"moe\": {\"experts\": " + std::to_string(moe_cfg.moe) + ", \"top_k\": " + std::to_string(moe_cfg.top_k) +
            ", \"capacity_factor\": " + std::to_string(moe_cfg.capacity_factor) + "}, ";
    if (name.rfind("pp_", 0) == 0)
      extra += "\"pipeline\": {\"stages\": " + std::to_string(pc.stages) + ", \"microbatches\": " + std::to_string(pc.microbatches) + "}, ";
    std::string predicted;
    if (profile) {
      const sl::plan::StepTime t = sl::plan::predict(plan.work, *profile);
      char buf[1024];
      const sl::plan::Work& w = plan.work;
      std::snprintf(buf, sizeof buf,
                    "\"predicted_seconds\": %.6g, \"prediction_ratio\": %.4g, \"predicted\": {\"gemm\": %.6g, "
                    "\"kernels\": %.6g, \"bubble\": %.6g, \"intra_node\": %.6g, \"inter_node\": %.6g}, "
                    "\"work\": {\"gemm_flops\": %llu, \"gemm_calls\": %llu, \"gemm_products\": %llu, \"batched_gemm_flops\": %llu, "
                    "\"kernel_bytes\": %llu, \"kernel_calls\": %llu, "
                    "\"collective_calls\": %zu, \"bubble\": %.4g}, \"profile\": \"%s\", ",
                    t.total(), t.total() / r.seconds, t.gemm, t.kernels, t.bubble, t.intra_node, t.inter_node,
                    (unsigned long long)w.gemm_flops, (unsigned long long)w.gemm_calls, (unsigned long long)w.gemm_products,
                    (unsigned long long)w.batched_gemm_flops, (unsigned long long)w.kernel_bytes, (unsigned long long)w.kernel_calls, w.calls.size(), w.bubble,
                    profile_file.c_str());
      predicted = buf;
    }
    std::printf(
        "{\"bench\": \"train\", \"part\": \"recipe\", \"name\": \"%s\", \"backend\": \"%s\", \"devices\": %d, "
        "\"seconds\": %.6g, \"baseline\": \"one device\", \"baseline_seconds\": %.6g, \"ratio_to_baseline\": %.4g, "
        "\"tokens_per_second\": %.6g, \"baseline_tokens_per_second\": %.6g, \"steps\": %d, \"first_loss\": %.6g, "
        "\"last_loss\": %.6g, %s%s\"collectives\": %s, \"parameters_bytes\": %lld, \"gradients_bytes\": %lld, "
        "\"optimizer_state_bytes\": %lld, \"activations_bytes\": %lld, \"temporaries_bytes\": %lld, \"config\": {\"vocab\": %lld, \"seq\": %lld, "
        "\"dim\": %lld, \"heads\": %lld, \"ff\": %lld, \"layers\": %lld, \"batch\": %lld}}\n",
        name.c_str(), std::string(sl::to_string(rt.backend())).c_str(), n, r.seconds, base.seconds, r.seconds / base.seconds, tokens / r.seconds,
        tokens / base.seconds, steps, r.first_loss, r.last_loss, predicted.c_str(), extra.c_str(), stats_json(sum(r.report)).c_str(),
        (long long)m.parameters(), (long long)m.gradients(), (long long)m.optimizer_state(),
        (long long)m.activations(), (long long)m.temporaries(), (long long)cfg.vocab, (long long)cfg.seq, (long long)cfg.dim,
        (long long)cfg.heads, (long long)cfg.ff, (long long)cfg.layers, (long long)cfg.batch);
    std::fflush(stdout);
  }
}
