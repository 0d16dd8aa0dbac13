// SPDX-License-Identifier: Apache-2.0
// Trains a small GPT-style language model with one of the recipes of docs/08_training.md and
// prints, per step, the loss, the collectives of the forward, backward and optimizer step (from
// the counters) and the per-device memory of parameters, gradients and optimizer state.
//
// The flags: `usage` below (`gpt --help` prints it). Under mpirun each rank is a device:
// mpirun -np 4 gpt --recipe zero2
#include "common.hpp"
#include "gpt/driver.hpp"

#include <cmath>
#include <optional>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

constexpr const char* usage = R"(usage: gpt [--recipe dp|zero1|zero2|zero3|tp|dp_tp|cp|pp|pp_dp|pp_tp|pp_dp_tp|pp_zero1|pp_zero2|replicated] [--cp N]
           [--cp-kind all_to_all|ring|ring_zigzag] [--attention-kernel automatic|fused|unfused] [--moe E] [--top-k 1|2] [--capacity-factor CF]
           [--aux-weight W] [--z-loss W] [--router-jitter J]
           [--devices N] [--steps N] [--layers N] [--dim N] [--batch N] [--seq N] [--vocab N] [--heads N]
           [--ff N] [--precision f32|bf16|f16] [--check 0|1] [--describe 0|1] [--tp N]
           [--plan 0|1] [--gpu h100|h200|a100] [--profile FILE] [--node N] [--device-memory GIB] [--model NAME]
           [--stages P] [--microbatches M] [--schedule gpipe|1f1b|interleaved] [--chunks V] [--recompute 0|1]
           [--data PATH|synthetic] [--eval-every N] [--sample N] [--temperature T] [--log-every N] [--val-below L]
           [--save DIR] [--every K] [--resume DIR]
  --recipe R     the recipe of docs/08_training.md (dp); pp*: pipeline parallelism
                 (docs/11_pipeline_parallel.md) alone or with DP, TP, ZeRO-1 or ZeRO-2 over the other
                 devices; cp: context parallelism, the sequence split over a "seq" axis of --cp
                 devices, DP over the rest (docs/14_attention.md)
  --cp N         cp: devices on the "seq" axis, a divisor of the devices (2)
  --tp N         dp_tp, pp_dp_tp: devices on the "model" axis, a divisor of the devices (of each
                 stage's) (2 when they are even)
  --plan 1       with --backend simulate: plan every recipe on the --devices given (dp, zero1-3,
                 tp, dp_tp with 2, 4 and 8 on "model", cp with 2, 4 and 8 on "seq"; pp_dp,
                 pp_zero1 and pp_dp_tp with 2 to 16 stages, micro-batches of one sequence per
                 "data" device, --schedule and --recompute as given) on shapes alone, each as its
                 first and its last device, and print one table: memory per device by role,
                 bytes per step within and across nodes, the predicted step time, tokens/s and
                 fraction of the peak; those that fit first, fastest first (docs/16_planning.md)
  --gpu G        with --backend simulate: predict the step's time on these devices (h100, the
                 default; h200, a100: figures with their sources, docs/16)
  --profile F    ... or on the devices a profile file describes (benchmarks/run calibrate writes one)
  --node N       devices per node (the profile's: 8 for the GPUs); groups within a node use its
                 links, the others the links between nodes
  --device-memory G  each device's memory in GiB (the profile's: 80 for an H100)
  --model NAME   a model's sizes (the other flags may change them): gpt2 (124M: 12 layers, D 768,
                 12 heads, FF 3072, V 50304, S 1024, B 512), 7b (GPT-3 6.7B: 32, 4096, 32, 16384,
                 V 51200, S 2048, B 1024), 175b (GPT-3: 96, 12288, 96, 49152, V 51200, S 2048,
                 B 1536)
  --cp-kind K    cp: attention over the split sequence as Ulysses' all-to-alls (all_to_all, the
                 default) or ring attention (ring: keys and values passed around the "seq" axis;
                 ring_zigzag: the same on the sequence in zig-zag runs, every device an equal
                 share of the causal scores)
  --attention-kernel K  automatic (cuDNN's fused kernel in GPU memory for bf16 and f16, else the
                 ops: the default), fused (no [S, S] scores in memory: cuDNN's, or on the host, for
                 float and double, the blockwise kernel of ring attention on each device; an error
                 where neither runs) or unfused (the ops)
  --moe E        a mixture of E experts as the MLP of every other block (Switch's placement), the
                 experts split over "data" (recipes dp, zero1-3 and dp_tp), each expert's hidden
                 dim over "model" (tp and dp_tp; docs/15_experts.md); 0: dense (0)
  --top-k K      moe: experts per token, 1 (Switch) or 2 (GShard) (1)
  --capacity-factor CF  moe: slots per expert and device, ceil(K * tokens * CF / E) (1.25)
  --aux-weight W moe: the load-balancing loss's weight in the loss (0.01)
  --z-loss W     moe: the router z-loss's weight in the loss (ST-MoE: 0.001); 0: off (0)
  --router-jitter J  moe: Switch's router jitter while training, the router's input times noise
                 in [1 - J, 1 + J] drawn per step and layer (Switch: 0.01); 0: off (0)
  --devices N    in-process devices (4); under mpirun each rank is a device: mpirun -np 4 gpt;
                 with --backend simulate, the devices of a mesh planned on shapes alone (up to
                 65536): one of them runs (--simulate-device R, 0), with no tensor storage and no
                 kernels, and the last step prints its collectives and memory by role (docs/16)
  --steps N      training steps, 1 or more (20)
  --layers N     blocks, 1 or more (2)
  --dim N        the model width D (32), a multiple of --heads
  --heads N      attention heads (4)
  --ff N         the MLP's hidden size (128)
  --vocab N      tokens in the vocabulary, 2 or more (the data's: 256 for bytes; 64 synthetic)
  --seq N        tokens per sequence (16)
  --batch N      sequences per global batch (8); any size on any mesh: blocks may be uneven or empty
  --precision P  f32 (the default); bf16 or f16: parameters and gradients in 16 bits with float32
                 master weights and state (mixed precision; f16 with dynamic loss scaling)
  --check 1      also train on everything replicated (one device's computation) and exit 1 when
                 a step's loss differs by more than 1e-4 relative (1e-2 in 16 bits: gradients
                 are rounded before their reduction)
  --describe 1   before training, print the collectives of a step in order, with group and bytes,
                 from a dry run (coll::dry_run) of one step on a model made for it (every step
                 emits the same: they follow from types, shapes and mesh); pp*: the schedule's
                 table (which micro-batch each stage runs in each slot) and device 0's collectives
  --stages P     pp*: pipeline stages, a divisor of the devices (2; pp: every device a stage)
  --microbatches M  pp*: micro-batches per global batch, a divisor of --batch (4)
  --schedule S   pp*: gpipe, 1f1b (the default) or interleaved (M a multiple of P)
  --chunks V     interleaved: chunks of layers per stage, 2 or more (2); the layers a multiple of P V
  --recompute 1  pp*: recompute each stage's forward in its backward (activation checkpointing)
  --data PATH    what to train on (the project's docs/): a text file (its bytes are the tokens,
                 vocabulary 256), a nanoGPT-style .bin file (uint16 tokens), or a directory (its
                 *.md and *.txt files); the last 10 % validate. Each device reads (mmap) only the
                 sequences of its block of each batch. 'synthetic': a token stream made in the
                 program (no validation part)
  --eval-every N the validation loss every N steps and after the last (0: only after the last)
  --sample N     after training, print N tokens the model writes after a prompt
  --temperature T  sampling temperature, 0 (greedy) to 10 (0.8)
  --log-every N  a progress line (loss, tokens/s, ETA) every N steps (about 40 lines a run)
  --val-below L  exit 1 unless the last validation loss is below L (a check for scripts)
  --save DIR     save the run (parameters, AdamW state, step) to DIR/gpt.h5 after the last step,
                 and every K steps with --every K (each save replaces the last atomically)
  --resume DIR   continue the run saved in DIR, with any recipe (pp* too) on any mesh, up to
                 --steps in all
Also the runtime's --backend threads|mpi|nccl and --threads-per-device N, and Kokkos's
--kokkos-NAME=VALUE. An unknown flag, a flag given twice or without its value, or a value out of
its range: a one-line message and exit status 2.
)";

/// The largest sizes taken: a tensor of the model ([B, H, S, S] the largest) stays far from 2^63
/// elements, where its size would overflow.
constexpr long long max_size = 65536, max_tokens = 8192, max_steps = 1000000000;

/// --plan 1: every recipe that can run on the devices, each planned on shapes alone by
/// `start(runtime, run)` as the first and the last device (the first holds the larger blocks of
/// an uneven split, the last a pipeline's last stage, with the head; the larger peak is shown,
/// the slower step taken), as one table for devices of `profile`.
template <class Start>
int plan_all(shardlib::Runtime& rt, gpt::driver::Run& run, const Start& start, const shardlib::plan::Profile& profile) {
  const int n = rt.num_devices();
  const gpt::Config base = run.cfg;
  const gpt::PipeConfig given = run.pc;
  std::vector<shardlib::plan::Candidate> all;
  auto add = [&](const std::string& recipe, gpt::Config cfg, gpt::PipeConfig pc, const std::string& label) {
    shardlib::plan::Candidate c;
    c.name = label;
    c.mesh = "-";
    run.recipe = recipe;
    run.cfg = cfg;
    run.pc = pc;
    run.plan = &c;
    try {
      start(rt, run);
      if (n > 1) {
        shardlib::plan::Candidate last = c;
        run.plan = &last;
        shardlib::Runtime other = shardlib::Runtime::simulate(n, n - 1);
        start(other, run);
        if (last.memory.peak > c.memory.peak) std::swap(c, last);  // the larger peak shown
        c.other_devices.push_back(std::move(last.work));            // the step: the slower of the two
      }
    } catch (const std::exception& e) {
      c.failed = e.what();
    }
    all.push_back(std::move(c));
  };
  for (const char* r : {"dp", "zero1", "zero2", "zero3", "tp"}) add(r, base, run.pc, r);
  for (int m : {2, 4, 8})
    if (m < n && n % m == 0) {
      gpt::Config cfg = base;
      cfg.tp = m;
      add("dp_tp", cfg, run.pc, "dp_tp");
    }
  for (int s : {2, 4, 8})
    if (s < n && n % s == 0) {
      gpt::Config cfg = base;
      cfg.cp = s;
      add("cp", cfg, run.pc, "cp");
    }
  // Pipelines: micro-batches of one sequence per "data" device (Megatron-LM's micro-batch size 1:
  // the most micro-batches, the smallest bubble), the schedule and recomputation as given.
  auto pipe = [&](const char* recipe, int stages, int tp) {
    const int data = n / stages / std::max(1, tp);
    if (base.batch % data != 0) return;
    gpt::PipeConfig pc = given;
    pc.stages = stages;
    pc.microbatches = static_cast<int>(base.batch / data);
    if (pc.schedule == shardlib::pipeline::Schedule::interleaved &&
        (pc.microbatches % stages != 0 || base.layers % (stages * pc.chunks) != 0))
      return;
    gpt::Config cfg = base;
    cfg.tp = tp;
    std::string label = std::string(recipe) + " m=" + std::to_string(pc.microbatches);
    add(recipe, cfg, pc, label);
  };
  for (int st : {2, 4, 8, 16})
    if (st <= n && n % st == 0 && st <= base.layers) {
      for (const char* r : {"pp_dp", "pp_zero1"}) pipe(r, st, 0);
      for (int m : {2, 4, 8})
        if (st * m <= n && n % (st * m) == 0) pipe("pp_dp_tp", st, m);
    }
  std::printf("planned on %d simulated devices (the first and the last of each, the larger peak shown; shapes only): %lld layers, D %lld, %lld heads, FF %lld, "
              "V %lld, S %lld, B %lld\n%s",
              n, (long long)base.layers, (long long)base.dim, (long long)base.heads, (long long)base.ff,
              (long long)base.vocab, (long long)base.seq, (long long)base.batch,
              shardlib::plan::table(all, profile, base.batch * base.seq).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return example::main(argc, argv, "gpt", usage, [](example::Args& args) {
    gpt::Config cfg;
    const std::string recipe =
        args.choice("--recipe", "dp", {"dp", "zero1", "zero2", "zero3", "tp", "dp_tp", "cp", "pp", "pp_dp", "pp_tp", "pp_dp_tp", "pp_zero1", "pp_zero2", "replicated"});
    const std::string precision = args.choice("--precision", "f32", {"f32", "bf16", "f16"});
    const int steps = static_cast<int>(args.integer("--steps", 20, 1, max_steps));
    const std::string model = args.choice("--model", "", {"", "gpt2", "7b", "175b"});
    long long model_vocab = -1;
    if (!model.empty()) {  // GPT-2 small; GPT-3 6.7B and 175B (Brown et al. 2020, Table 2.1; V as Megatron pads it)
      struct Sizes {
        long long layers, dim, heads, ff, vocab, seq, batch;
      };
      const Sizes z = model == "gpt2"  ? Sizes{12, 768, 12, 3072, 50304, 1024, 512}
                      : model == "7b" ? Sizes{32, 4096, 32, 16384, 51200, 2048, 1024}
                                      : Sizes{96, 12288, 96, 49152, 51200, 2048, 1536};
      cfg.layers = z.layers, cfg.dim = z.dim, cfg.heads = z.heads, cfg.ff = z.ff, cfg.seq = z.seq, cfg.batch = z.batch;
      model_vocab = z.vocab;
    }
    cfg.layers = args.integer("--layers", cfg.layers, 1, max_size);
    cfg.dim = args.integer("--dim", cfg.dim, 1, max_size);
    cfg.heads = args.integer("--heads", cfg.heads, 1, max_size);
    cfg.ff = args.integer("--ff", cfg.ff, 1, max_size);
    const long long vocab = args.integer("--vocab", model_vocab, 2, max_size);  // one token: nothing to predict, a loss of 0
    cfg.seq = args.integer("--seq", cfg.seq, 1, max_tokens);
    cfg.batch = args.integer("--batch", cfg.batch, 1, max_tokens);
    cfg.cp = static_cast<int>(args.integer("--cp", cfg.cp, 1, max_size));
    cfg.moe = args.integer("--moe", 0, 0, max_size);
    cfg.top_k = static_cast<int>(args.integer("--top-k", 1, 1, 2));
    cfg.capacity_factor = args.real("--capacity-factor", 1.25, 1e-6, 1e6);
    cfg.aux_weight = args.real("--aux-weight", cfg.aux_weight, 0, 1e6);
    cfg.z_loss_weight = args.real("--z-loss", 0, 0, 1e6);
    cfg.router_jitter = args.real("--router-jitter", 0, 0, 0.99);
    const std::string cp_kind = args.choice("--cp-kind", "all_to_all", {"all_to_all", "ring", "ring_zigzag"});
    cfg.cp_kind = cp_kind == "ring"          ? shardlib::ContextParallel::ring
                  : cp_kind == "ring_zigzag" ? shardlib::ContextParallel::ring_zigzag
                                             : shardlib::ContextParallel::all_to_all;
    const std::string kernel = args.choice("--attention-kernel", "automatic", {"automatic", "fused", "unfused"});
    cfg.attention_kernel = kernel == "fused"     ? shardlib::AttentionKernel::fused
                           : kernel == "unfused" ? shardlib::AttentionKernel::unfused
                                                 : shardlib::AttentionKernel::automatic;
    const bool check = args.boolean("--check");
    const bool describe = args.boolean("--describe");
    cfg.tp = static_cast<int>(args.integer("--tp", 0, 1, max_size));
    const bool plan = args.boolean("--plan");
    const std::string gpu = args.choice("--gpu", "h100", {"h100", "h200", "a100"});
    const std::string profile_file = args.text("--profile", "");
    const long long node = args.integer("--node", 0, 1, 65536);
    const double device_memory = args.real("--device-memory", 0, 1e-6, 1e9);
    gpt::PipeConfig pc;
    const bool pipelined = recipe.rfind("pp", 0) == 0;
    pc.stages = static_cast<int>(args.integer("--stages", 2, 1, max_size));
    pc.microbatches = static_cast<int>(args.integer("--microbatches", 4, 1, max_tokens));
    pc.schedule = shardlib::pipeline::schedule_from_string(args.choice("--schedule", "1f1b", {"gpipe", "1f1b", "interleaved"}));
    pc.chunks = static_cast<int>(args.integer("--chunks", 2, 2, max_size));
    if (pc.schedule != shardlib::pipeline::Schedule::interleaved) pc.chunks = 1;
    pc.recompute = args.boolean("--recompute");
    const std::string data = args.text("--data", GPT_DEFAULT_CORPUS);
    const int eval_every = static_cast<int>(args.integer("--eval-every", 0, 0, max_steps));
    const int sample = static_cast<int>(args.integer("--sample", 0, 0, 1000000));
    const double temperature = args.real("--temperature", 0.8, 0, 10);
    const int log_every = static_cast<int>(args.integer("--log-every", 0, 1, max_steps));
    const double val_below = args.real("--val-below", 0, 0, 1e6);
    const std::string save = args.text("--save", "");
    const int save_every = static_cast<int>(args.integer("--every", 0, 1, max_steps));
    const std::string resume = args.text("--resume", "");
    args.finish();
#if !defined(GPT_HAVE_IO)
    if (!save.empty() || !resume.empty()) args.fail("--save and --resume need HDF5, which this build did not find");
#endif
    if (save_every > 0 && save.empty()) args.fail("--every needs --save DIR");
    if (!resume.empty() && check) args.fail("--check 1 trains the replicated reference from step 0: not with --resume");
    std::optional<gpt::CorpusStream> corpus;
    if (data != "synthetic") {
      try {
        corpus.emplace(gpt::Corpus::open(data), cfg.seq, cfg.seed);
      } catch (const std::exception& e) {
        args.fail(std::string(e.what()).substr(std::string("gpt: ").size()));
      }
      if (vocab >= 0 && vocab < corpus->corpus().vocab())
        args.fail("--vocab " + std::to_string(vocab) + " is smaller than the data's " + std::to_string(corpus->corpus().vocab()) +
                  " tokens");
      cfg.vocab = vocab >= 0 ? vocab : corpus->corpus().vocab();
      cfg.eval_every = eval_every > 0 ? eval_every : steps;  // at least after the last step
    } else {
      cfg.vocab = vocab >= 0 ? vocab : 64;
      if (sample > 0) args.fail("--sample needs data to prompt the model with: --data PATH, not synthetic");
      if (eval_every > 0 || val_below > 0) args.fail("--eval-every and --val-below need a validation part: --data PATH, not synthetic");
    }
    // The heads split D (head_dim = D / H). Nothing else must divide: every recipe takes uneven
    // or empty blocks (a batch smaller than "data", fewer heads than "model").
    if (cfg.dim % cfg.heads != 0)
      args.fail("--dim " + std::to_string(cfg.dim) + " is not a multiple of --heads " + std::to_string(cfg.heads));
    auto rt = args.runtime(/*default_devices=*/4);
    std::optional<shardlib::plan::Profile> profile;
    if (rt.backend() == shardlib::Backend::simulate) {  // a plan: shapes, bytes and collectives, no values
      if (check || sample > 0 || val_below > 0 || !save.empty() || !resume.empty())
        args.fail("--backend simulate plans a run on shapes alone: it has no values to --check, --sample, "
                  "--val-below, --save or --resume");
      try {
        profile = profile_file.empty() ? shardlib::plan::Profile::preset(gpu) : shardlib::plan::Profile::load(profile_file, gpu);
      } catch (const std::exception& e) {
        args.fail(std::string(e.what()).substr(std::string("shardlib: ").size()));
      }
      if (node > 0) profile->node_size = static_cast<int>(node);
      if (device_memory > 0) profile->memory = static_cast<std::int64_t>(device_memory * 1073741824.0);
    } else if (plan) {
      args.fail("--plan 1 plans on shapes alone: give --backend simulate --devices N (the devices to plan for)");
    } else if (!profile_file.empty() || node > 0 || device_memory > 0) {
      args.fail("--profile, --node and --device-memory describe the devices of a plan: give --backend simulate");
    }
    if (recipe == "pp") pc.stages = rt.num_devices();
    if (cfg.moe > 0 && recipe != "dp" && recipe != "zero1" && recipe != "zero2" && recipe != "zero3" && recipe != "tp" &&
        recipe != "dp_tp" && recipe != "replicated")
      args.fail("--moe runs with --recipe dp or zero1-3 (the experts split over \"data\"), tp or dp_tp (their hidden dim over \"model\" "
                "too), not " + recipe);
    if (cfg.moe > 0 && cfg.top_k > cfg.moe)
      args.fail("--top-k " + std::to_string(cfg.top_k) + " is more than the " + std::to_string(cfg.moe) + " experts");
    if (recipe == "cp" && rt.num_devices() % cfg.cp != 0)
      args.fail("--cp " + std::to_string(cfg.cp) + " does not divide the " + std::to_string(rt.num_devices()) + " devices");
    if (pipelined) {  // the counts the pipeline needs, said before any device starts
      if (rt.num_devices() % pc.stages != 0)
        args.fail("--stages " + std::to_string(pc.stages) + " does not divide the " + std::to_string(rt.num_devices()) + " devices");
      if (cfg.batch % pc.microbatches != 0)
        args.fail("--microbatches " + std::to_string(pc.microbatches) + " does not divide --batch " + std::to_string(cfg.batch));
      try {
        (void)shardlib::pipeline::layers_of(pc.table(), static_cast<int>(cfg.layers), 0, 0);
      } catch (const std::exception& e) {
        args.fail(std::string(e.what()).substr(std::string("shardlib: ").size()) + " (--stages, --microbatches, --chunks, --layers)");
      }
      if (recipe == "pp_dp_tp" && cfg.tp > 0 && (rt.num_devices() / pc.stages) % cfg.tp != 0)
        args.fail("--tp " + std::to_string(cfg.tp) + " does not divide the " + std::to_string(rt.num_devices() / pc.stages) +
                  " devices of each stage");
    }
    namespace d = gpt::driver;
    d::Run run{recipe,
                     cfg,
                     pc,
                     steps,
                     check,
                     describe,
                     corpus ? gpt::DataStream(std::move(*corpus)) : gpt::DataStream(gpt::TokenStream(cfg.vocab, cfg.seq, cfg.seed)),
                     sample,
                     temperature,
                     log_every,
                     val_below,
                     save,
                     resume,
                     save_every};
    auto start = [&](shardlib::Runtime& on, const d::Run& r) {
      if (r.recipe.rfind("pp", 0) == 0) {
        if (precision == "bf16") return d::pipelined<shardlib::bf16>(on, r);
        if (precision == "f16") return d::pipelined<shardlib::f16>(on, r);
        return d::pipelined<float>(on, r);
      }
      if (precision == "bf16") return d::dense<shardlib::bf16>(on, r);
      if (precision == "f16") return d::dense<shardlib::f16>(on, r);
      return d::dense<float>(on, r);
    };
    if (profile) run.profile = &*profile;
    if (plan) return plan_all(rt, run, start, *profile);
    return start(rt, run);
  });
}
