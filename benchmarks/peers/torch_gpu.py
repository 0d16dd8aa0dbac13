#!/usr/bin/env python3
"""The PyTorch peer of bench_gpu (benchmarks/gpu.cpp) on one GPU, eager: the same figures, shapes
and names as bench_gpu's records on 1 device, so that scripts/gpu-check.sh puts them side by side.

  python3 torch_gpu.py [--parts elementwise,matmul,mlp] [--mib 256] [--quick]

elementwise: float32 a + b, gelu (exact erf) and bf16 a + b, gelu on 64M elements (256 MiB of
  float, --mib), rows x 4096; bytes = tensors read + the one written; next to dst.copy_(src) of half
  those bytes (the copy baseline bench_gpu uses: cudaMemcpyAsync device to device).
matmul: x @ w, bf16 2048^3, 4096^3, 8192^3, 16384x4096x16384, float32 4096^3 with and without TF32
  (torch.backends.cuda.matmul.allow_tf32).
mlp: gelu(x @ w1) @ w2 in bf16, T x D x F = 4096x1024x4096, 8192x4096x16384, 8192x8192x32768;
  4 T D F flops.
Timing as bench_gpu's: as many calls as take ~20 ms queued back to back, then
torch.cuda.synchronize(), timed on the host; 7 repetitions, the median per call. One JSON record
per case on stdout (backend "torch-cuda", devices 1); progress on stderr. Exit status 3 when torch
cannot be imported or sees no GPU.
"""
import argparse
import json
import os
import sys


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="elementwise,matmul,mlp")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="small shapes (a check of the script)")
    return ap.parse_args(argv)


ARGS = parse_args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_cuda import cuda_torch, seconds_per_call as _seconds  # noqa: E402

torch, F, DEV, GPU = cuda_torch("torch_gpu.py")


def seconds_per_call(fn, reps=7, target=0.02):
    return _seconds(torch, fn, reps, target)


def record(part, name, **fields):
    r = {"bench": "gpu", "backend": "torch-cuda", "devices": 1, "gpu": GPU, "part": part, "name": name,
         "torch": torch.__version__}
    r.update(fields)
    print(json.dumps(r), flush=True)


def elementwise(mib):
    cols = 4096
    rows = (mib << 20) // 4 // cols
    a = torch.rand(rows, cols, device=DEV)
    b = torch.rand(rows, cols, device=DEV)
    ha, hb = a.to(torch.bfloat16), b.to(torch.bfloat16)
    src = torch.empty(2 * rows * cols * 4, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    for name, dtype, tensors, fn in (("a + b", "float32", 3, lambda: a + b), ("gelu", "float32", 2, lambda: F.gelu(a)),
                                     ("a + b", "bf16", 3, lambda: ha + hb), ("gelu", "bf16", 2, lambda: F.gelu(ha))):
        size = 4 if dtype == "float32" else 2
        nbytes = tensors * rows * cols * size
        s, d = src[: nbytes // 2], dst[: nbytes // 2]
        secs = seconds_per_call(fn)
        base = seconds_per_call(lambda: d.copy_(s))
        gbs, base_gbs = nbytes / secs * 1e-9, nbytes / base * 1e-9
        record("elementwise", name, dtype=dtype, bytes=nbytes, seconds=secs, gbytes_per_second=gbs,
               baseline="torch copy_ D2D", baseline_seconds=base, copy_gbytes_per_second=base_gbs,
               fraction_of_copy=gbs / base_gbs)
        print(f"  torch {name} {dtype}: {gbs:.1f} GB/s, copy {base_gbs:.1f} GB/s", file=sys.stderr)


def matmul(quick):
    f = 16 if quick else 1
    shapes = [("bf16", s // f, s // f, s // f, False) for s in (2048, 4096, 8192)]
    shapes += [("bf16", 16384 // f, 4096 // f, 16384 // f, False), ("float32", 4096 // f, 4096 // f, 4096 // f, False),
               ("float32", 4096 // f, 4096 // f, 4096 // f, True)]
    for dtype, m, k, n, tf32 in shapes:
        t = torch.bfloat16 if dtype == "bf16" else torch.float32
        x = torch.rand(m, k, device=DEV, dtype=t) * 2 - 1
        w = torch.rand(k, n, device=DEV, dtype=t) * 2 - 1
        torch.backends.cuda.matmul.allow_tf32 = tf32
        secs = seconds_per_call(lambda: x @ w)
        torch.backends.cuda.matmul.allow_tf32 = False
        tflops = 2.0 * m * k * n / secs * 1e-12
        record("matmul", f"matmul {m}x{k}x{n}", dtype=dtype + (" (tf32)" if tf32 else ""), seconds=secs, tflops=tflops,
               baseline=None, baseline_seconds=None)
        print(f"  torch matmul {m}x{k}x{n} {dtype}{' tf32' if tf32 else ''}: {tflops:.1f} TFLOP/s", file=sys.stderr)


def mlp(quick):
    sizes = [(256, 64, 256)] if quick else [(4096, 1024, 4096), (8192, 4096, 16384), (8192, 8192, 32768)]
    for t, d, f in sizes:
        x = (torch.rand(t, d, device=DEV) * 2 - 1).to(torch.bfloat16)
        w1 = ((torch.rand(d, f, device=DEV) * 2 - 1) * 0.05).to(torch.bfloat16)
        w2 = ((torch.rand(f, d, device=DEV) * 2 - 1) * 0.05).to(torch.bfloat16)
        secs = seconds_per_call(lambda: F.gelu(x @ w1) @ w2)
        tflops = 4.0 * t * d * f / secs * 1e-12
        record("mlp", f"mlp T{t} D{d} F{f}", dtype="bf16", seconds=secs, tflops=tflops, baseline=None,
               baseline_seconds=None)
        print(f"  torch mlp T{t} D{d} F{f}: {tflops:.1f} TFLOP/s", file=sys.stderr)


def main():
    print(f"torch_gpu.py: torch {torch.__version__} on {GPU}", file=sys.stderr)
    parts = [p for p in ARGS.parts.split(",") if p]
    for p in parts:
        if p == "elementwise":
            elementwise(4 if ARGS.quick else ARGS.mib)
        elif p == "matmul":
            matmul(ARGS.quick)
        elif p == "mlp":
            mlp(ARGS.quick)
        else:
            print(f"torch_gpu.py: unknown part {p!r} (elementwise, matmul, mlp)", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
