#!/usr/bin/env python3
"""The PyTorch peer of bench_gpu_block (benchmarks/gpu_block.cpp): the same pre-LN transformer
layer's training step (forward + backward seeded with dy, gradients set to None before it) on the
same GPU and shapes, so that scripts/gpu-check.sh and the report put the two side by side.

  python3 block_torch.py [--configs gpt2,large] [--dtypes bf16,tf32] [--no-compile] [--quick]

Forms (the record's backend):
  torch-eager    the attention written out as a user writes it from the docs, as ours is: scores =
                 q k^T * scale + mask (an additive causal mask), softmax, @ v; every parameter a
                 leaf in the dtype (bf16, or float32 with TF32 matmuls: torch.backends.cuda.matmul
                 .allow_tf32)
  torch-compile  torch.compile of the same layer with F.scaled_dot_product_attention(is_causal=True)
                 (flash attention); bf16 only (compile time is counted out: warm-ups first)
Layer: x [B, S, D]; a = layer_norm(x) (weight, bias); q, k, v = a @ Wq, Wk, Wv ([D, H K]);
o = attention; x1 = x + o @ Wo; h = layer_norm(x1); y = x1 + gelu(h @ W1) @ W2 (exact erf, as
shardlib's gelu). Timing as bench_gpu_block's: warm-ups, then 7 batches of back-to-back steps
(about 0.2 s each), torch.cuda.synchronize() after each, the median per step. One JSON record per
case on stdout (bench "gpu", part "block", name "<config> fwd+bwd" / "<config> fwd", devices 1);
progress on stderr. Exit status 3 when torch cannot be imported or sees no GPU.
"""
import argparse
import json
import math
import os
import sys

CONFIGS = {"gpt2": (8, 1024, 768, 12, 64, 3072), "large": (4, 2048, 2048, 16, 128, 8192),
           "small": (2, 128, 256, 4, 64, 1024)}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="gpt2,large")
    ap.add_argument("--dtypes", default="bf16,tf32")
    ap.add_argument("--no-compile", action="store_true", help="eager only (torch.compile takes a minute to warm up)")
    ap.add_argument("--compile-configs", default="gpt2", help="the configs torch.compile runs (its warm-up is long)")
    ap.add_argument("--quick", action="store_true", help="small shapes, two batches (a check of the script)")
    args = ap.parse_args(argv)
    for c in args.configs.split(","):
        if c not in CONFIGS:
            ap.error(f"--configs: unknown config '{c}' ({', '.join(CONFIGS)})")
    for d in args.dtypes.split(","):
        if d not in ("bf16", "tf32", "f32"):
            ap.error(f"--dtypes: unknown dtype '{d}' (bf16, tf32, f32)")
    return args


ARGS = parse_args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_cuda import cuda_torch, seconds_per_call  # noqa: E402

torch, F, DEV, GPU = cuda_torch("block_torch.py")


def layer_params(cfg, dtype):
    b, s, d, h, k, f = cfg
    g = torch.Generator(device=DEV).manual_seed(1)

    def w(*shape):
        return ((torch.rand(*shape, device=DEV, generator=g) * 2 - 1) * 0.02).to(dtype).requires_grad_()

    p = {"g1": torch.ones(d, device=DEV, dtype=dtype, requires_grad=True),
         "b1": torch.zeros(d, device=DEV, dtype=dtype, requires_grad=True),
         "g2": torch.ones(d, device=DEV, dtype=dtype, requires_grad=True),
         "b2": torch.zeros(d, device=DEV, dtype=dtype, requires_grad=True),
         "wq": w(d, h * k), "wk": w(d, h * k), "wv": w(d, h * k), "wo": w(h * k, d), "w1": w(d, f), "w2": w(f, d)}
    x = ((torch.rand(b, s, d, device=DEV, generator=g) * 2 - 1)).to(dtype)
    dy = ((torch.rand(b, s, d, device=DEV, generator=g) * 2 - 1)).to(dtype)
    mask = torch.full((s, s), float("-inf"), device=DEV, dtype=dtype).triu(1)
    return p, x, dy, mask


def layer(p, x, mask, cfg, sdpa):
    b, s, d, h, k, f = cfg
    a = F.layer_norm(x, (d,), p["g1"], p["b1"])
    q = (a @ p["wq"]).view(b, s, h, k).transpose(1, 2)
    kk = (a @ p["wk"]).view(b, s, h, k).transpose(1, 2)
    v = (a @ p["wv"]).view(b, s, h, k).transpose(1, 2)
    if sdpa:
        o = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
    else:
        scores = q @ kk.transpose(-2, -1) * (1.0 / math.sqrt(k)) + mask
        o = torch.softmax(scores, dim=-1) @ v
    x1 = x + o.transpose(1, 2).reshape(b, s, h * k) @ p["wo"]
    hh = F.layer_norm(x1, (d,), p["g2"], p["b2"])
    return x1 + F.gelu(hh @ p["w1"]) @ p["w2"]


def flops(cfg, backward):
    b, s, d, h, k, f = cfg
    t, hk = b * s, h * k
    fwd = 2 * t * d * hk * 3 + 2 * t * hk * d + 2 * 2 * t * d * f + 2 * 2 * b * h * s * s * k / 2
    return 3 * fwd if backward else fwd


def seconds_per_step(fn):
    """bench_gpu_block's timing: 3 warm-ups, then 7 batches of about 0.2 s (2 of one step with --quick)."""
    if ARGS.quick:
        return seconds_per_call(torch, fn, reps=2, target=0.0, warmups=3, max_iters=1)
    return seconds_per_call(torch, fn, reps=7, target=0.2, warmups=3, max_iters=50, min_iters=2)


def case(name, dtype_name, backend, cfg, backward, fn):
    secs = seconds_per_step(fn)
    b, s, d, h, k, f = cfg
    rec = {"bench": "gpu", "part": "block", "name": f"{name} {'fwd+bwd' if backward else 'fwd'}", "backend": backend,
           "devices": 1, "gpu": GPU, "dtype": dtype_name, "shape": f"B{b} S{s} D{d} H{h} K{k} F{f}", "seconds": secs,
           "tflops": flops(cfg, backward) / secs * 1e-12, "baseline": None, "baseline_seconds": None,
           "torch": torch.__version__}
    print(json.dumps(rec), flush=True)
    print(f"  {backend} {rec['name']} {dtype_name}: {secs * 1e3:.3f} ms, {rec['tflops']:.1f} TFLOP/s", file=sys.stderr,
          flush=True)


def main():
    configs = ["small"] if ARGS.quick else ARGS.configs.split(",")
    for cname in configs:
        cfg = CONFIGS[cname]
        for dname in ARGS.dtypes.split(","):
            torch.backends.cuda.matmul.allow_tf32 = dname == "tf32"
            torch.backends.cudnn.allow_tf32 = dname == "tf32"
            dtype = torch.bfloat16 if dname == "bf16" else torch.float32
            label = {"bf16": "bf16", "tf32": "float32+tf32", "f32": "float32"}[dname]
            p, x, dy, mask = layer_params(cfg, dtype)
            forms = [("torch-eager", lambda p, x, m: layer(p, x, m, cfg, False))]
            if dname == "bf16" and not ARGS.no_compile and (ARGS.quick or cname in ARGS.compile_configs.split(",")):
                forms.append(("torch-compile", torch.compile(lambda p, x, m: layer(p, x, m, cfg, True))))
            for backend, fn in forms:
                def step(fn=fn):
                    for t in p.values():
                        t.grad = None
                    fn(p, x, mask).backward(dy)

                def fwd(fn=fn):
                    with torch.no_grad():
                        fn(p, x, mask)

                try:
                    case(cname, label, backend, cfg, True, step)
                    case(cname, label, backend, cfg, False, fwd)
                except Exception as e:  # a form that cannot run here (no triton for compile): said, not fatal
                    print(f"block_torch.py: {backend} {cname} {label} failed: {type(e).__name__}: {e}", file=sys.stderr)
            del p, x, dy, mask
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
