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
#include <vector>

namespace {

constexpr const char* usage = R"(usage: gpt [--recipe dp|zero1|zero2|zero3|tp|dp_tp|cp|pp|pp_dp|pp_tp|pp_zero1|pp_zero2|replicated] [--cp N]
           [--cp-kind all_to_all|ring] [--moe E] [--top-k 1|2] [--capacity-factor CF]
           [--devices N] [--steps N] [--layers N] [--dim N] [--batch N] [--seq N] [--vocab N] [--heads N]
           [--ff N] [--precision f32|bf16|f16] [--check 0|1] [--describe 0|1]
           [--stages P] [--microbatches M] [--schedule gpipe|1f1b|interleaved] [--chunks V] [--recompute 0|1]
           [--data PATH|synthetic] [--eval-every N] [--sample N] [--temperature T] [--log-every N] [--val-below L]
           [--save DIR] [--every K] [--resume DIR]
  --recipe R     the recipe of docs/08_training.md (dp); pp*: pipeline parallelism
                 (docs/11_pipeline_parallel.md) alone or with DP, TP, ZeRO-1 or ZeRO-2 over the other
                 devices; cp: context parallelism, the sequence split over a "seq" axis of --cp
                 devices, DP over the rest (docs/14_attention.md)
  --cp N         cp: devices on the "seq" axis, a divisor of the devices (2)
  --cp-kind K    cp: attention over the split sequence as Ulysses' all-to-alls (all_to_all, the
                 default) or ring attention (ring: keys and values passed around the "seq" axis)
  --moe E        a mixture of E experts as the MLP of every other block (Switch's placement), the
                 experts split over "data" (recipe dp; docs/15_experts.md); 0: dense (0)
  --top-k K      moe: experts per token, 1 (Switch) or 2 (GShard) (1)
  --capacity-factor CF  moe: slots per expert and device, ceil(K * tokens * CF / E) (1.25)
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

}  // namespace

int main(int argc, char** argv) {
  return example::main(argc, argv, "gpt", usage, [](example::Args& args) {
    gpt::Config cfg;
    const std::string recipe =
        args.choice("--recipe", "dp", {"dp", "zero1", "zero2", "zero3", "tp", "dp_tp", "cp", "pp", "pp_dp", "pp_tp", "pp_zero1", "pp_zero2", "replicated"});
    const std::string precision = args.choice("--precision", "f32", {"f32", "bf16", "f16"});
    const int steps = static_cast<int>(args.integer("--steps", 20, 1, max_steps));
    cfg.layers = args.integer("--layers", cfg.layers, 1, max_size);
    cfg.dim = args.integer("--dim", cfg.dim, 1, max_size);
    cfg.heads = args.integer("--heads", cfg.heads, 1, max_size);
    cfg.ff = args.integer("--ff", cfg.ff, 1, max_size);
    const long long vocab = args.integer("--vocab", -1, 2, max_size);  // one token: nothing to predict, a loss of 0
    cfg.seq = args.integer("--seq", cfg.seq, 1, max_tokens);
    cfg.batch = args.integer("--batch", cfg.batch, 1, max_tokens);
    cfg.cp = static_cast<int>(args.integer("--cp", cfg.cp, 1, max_size));
    cfg.moe = args.integer("--moe", 0, 0, max_size);
    cfg.top_k = static_cast<int>(args.integer("--top-k", 1, 1, 2));
    cfg.capacity_factor = args.real("--capacity-factor", 1.25, 1e-6, 1e6);
    cfg.cp_kind = args.choice("--cp-kind", "all_to_all", {"all_to_all", "ring"}) == "ring" ? shardlib::ContextParallel::ring
                                                                                          : shardlib::ContextParallel::all_to_all;
    const bool check = args.boolean("--check");
    const bool describe = args.boolean("--describe");
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
    if (rt.backend() == shardlib::Backend::simulate) {  // a plan: shapes, bytes and collectives, no values
      if (check || sample > 0 || val_below > 0 || !save.empty() || !resume.empty())
        args.fail("--backend simulate plans a run on shapes alone: it has no values to --check, --sample, "
                  "--val-below, --save or --resume");
    }
    if (recipe == "pp") pc.stages = rt.num_devices();
    if (cfg.moe > 0 && recipe != "dp" && recipe != "replicated")
      args.fail("--moe runs with --recipe dp (the experts split over \"data\"), not " + recipe);
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
    }
    namespace d = gpt::driver;
    const d::Run run{recipe,
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
    if (pipelined) {
      if (precision == "bf16") return d::pipelined<shardlib::bf16>(rt, run);
      if (precision == "f16") return d::pipelined<shardlib::f16>(rt, run);
      return d::pipelined<float>(rt, run);
    }
    if (precision == "bf16") return d::dense<shardlib::bf16>(rt, run);
    if (precision == "f16") return d::dense<shardlib::f16>(rt, run);
    return d::dense<float>(rt, run);
  });
}
