#!/usr/bin/env python3
"""The PyTorch DTensor peer (CPU, gloo, one process per device) of bench_reshard, of bench_ops's
`overhead` part and of its MLP block: the same moves, ops and shapes as the shardlib records of the
same name. Started by torchrun:

  python -m torch.distributed.run --nproc_per_node N dtensor_bench.py --bench reshard|overhead|mlp|block
         [--min-bytes 1048576] [--max-bytes 67108864] [--n 32] [--layout dp|tp] [--model 2] [--reps 7]
         [--batch 8 --seq 128 --dmodel 512 --heads 8 --dff 2048] [--json FILE]

--bench reshard: a float32 rows x cols tensor (cols = 1024 // N * N, rows a multiple of N, as
  bench_reshard) as a DTensor with the source placements, then `redistribute` to the target:
  S0->R [Shard(0)] -> [Replicate()], S1->R, R->S0, P->R [Partial()] -> [Replicate()] (from_local
  of each rank's addend), P->S0, S0->S1, S0->R uneven. No XY->YX: DTensor's placements cannot
  order two mesh dims on one tensor dim the other way round.
--bench overhead: the ops of bench_ops --part overhead on float32 32x32 (--n) DTensors replicated
  on a one-process mesh (eager torch ops through DTensor's dispatch).
--bench mlp: y = gelu(x @ w1) @ w2 on the mesh (data, model) = (N/m, m), m = 2 when it divides N:
  x [8, 128, 512] Shard(0) over data, w1 [512, 2048] Shard(1) over model, w2 Shard(0) over model,
  the partial sum redistributed to x's placements (one all_reduce), as bench_ops's mlp.
--bench block: bench_grad's pre-LN transformer block (the same as jax_blocks.py --bench grad):
  layer_norm (eps 1e-5, no affine inside) * g + b, q/k/v projections, softmax attention over 8 heads
  of 64, the output projection and a residual, a second norm, the exact-erf gelu MLP and a
  residual, loss = sum(out * r); --layout dp: mesh (N, 1), the batch over data, weights
  replicated; tp: mesh (N/m, m), Megatron (wq, wk, wv, w1 Shard(1) over model, wo, w2 Shard(0),
  the row-parallel products' partial sums redistributed to the hidden placements). `seconds`: the
  forward (the loss); `forward_backward_seconds`: the loss and its backward into every parameter.

Each process uses (cores // N, at least 1) torch threads, as shardlib's devices share the cores.
Timing: --reps repetitions of as many calls as take ~20 ms, between barriers; the slowest rank's
time per call, median over the repetitions. Rank 0 prints one JSON record per case (backend
"dtensor-gloo"). Exit status 3 when torch cannot be imported.
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", choices=("reshard", "overhead", "mlp", "block"), required=True)
    ap.add_argument("--layout", choices=("dp", "tp"), default="dp")
    ap.add_argument("--model", type=int, default=2)
    for flag, default in (("batch", 8), ("seq", 128), ("dmodel", 512), ("heads", 8), ("dff", 2048)):
        ap.add_argument("--" + flag, type=int, default=default)
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--min-seconds", type=float, default=0.02)
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


ARGS = parse_args()
try:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    except ImportError:
        from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor
        from torch.distributed._tensor.placement_types import _Partial as Partial
except Exception as e:  # noqa: BLE001
    print(f"dtensor_bench.py: cannot import torch ({type(e).__name__}: {e}); install it (pip install torch)",
          file=sys.stderr)
    sys.exit(3)


def time_calls(f, reps, min_seconds):
    """The slowest rank's seconds per call of f(), median of `reps` repetitions."""
    f()
    f()
    dist.barrier()
    t0 = time.perf_counter()
    f()
    one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(one, op=dist.ReduceOp.MAX)
    iters = max(1, min(20000, int(min_seconds / max(one.item(), 1e-9))))
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            f()
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(t.item())
    return statistics.median(times)


def common(n):
    return {"backend": "dtensor-gloo", "devices": n, "torch_version": torch.__version__,
            "torch_threads": torch.get_num_threads(), "baseline": None, "baseline_seconds": None}


def reshard(cfg, n, rank):
    cols = max(n, 1024 // n * n)
    sizes, s = [], cfg.min_bytes
    while s <= cfg.max_bytes:
        sizes.append(s)
        s *= 4
    if not sizes or sizes[-1] != cfg.max_bytes:
        sizes.append(cfg.max_bytes)
    rows_for = lambda b: max(b // 4 // cols // n, 1) * n  # noqa: E731
    mesh = init_device_mesh("cpu", (n,))
    gen = torch.Generator().manual_seed(1)
    records = []

    def case(name, rows, src, dst):
        full = torch.rand(rows, cols, generator=gen) * 2 - 1  # the same on every rank (same seed, same calls)
        if src == "P":
            local = full / n  # each rank's addend: their sum is `full`
            a = DTensor.from_local(local, mesh, [Partial()], run_check=False)
        else:
            a = distribute_tensor(full, mesh, [src])
        out = a.redistribute(mesh, [dst])
        got = out.full_tensor()
        assert torch.allclose(got, full, rtol=1e-4, atol=1e-5), name
        secs = time_calls(lambda: a.redistribute(mesh, [dst]).to_local(), cfg.reps, cfg.min_seconds)
        rec = {"bench": "reshard", "part": "reshard", "name": name, "rows": rows, "cols": cols, "bytes": rows * cols * 4,
               "seconds": secs, "how": "DTensor.redistribute"}
        rec.update(common(n))
        if rank == 0:
            print(f"  dtensor {name:<22} {n} processes {rows * cols * 4:>10} B  {secs * 1e6:10.1f} us", file=sys.stderr,
                  flush=True)
        return rec

    moves = [("reshard S0->R", Shard(0), Replicate()), ("reshard S1->R", Shard(1), Replicate()),
             ("reshard R->S0", Replicate(), Shard(0)), ("reshard P->R", "P", Replicate()),
             ("reshard P->S0", "P", Shard(0)), ("reshard S0->S1", Shard(0), Shard(1))]
    for name, src, dst in moves:
        for b in sizes:
            records.append(case(name, rows_for(b), src, dst))
    if n > 1:
        records.append(case("reshard S0->R uneven", rows_for(cfg.max_bytes) - 1, Shard(0), Replicate()))
    return records


def overhead(cfg, n, rank):
    m = cfg.n
    mesh = init_device_mesh("cpu", (n,))
    gen = torch.Generator().manual_seed(1)
    rep = [Replicate()]
    d = lambda *shape: distribute_tensor(torch.rand(*shape, generator=gen), mesh, rep)  # noqa: E731
    a, b, w, bias = d(m, m), d(m, m), d(m, m), d(m)
    gelu, softmax = torch.nn.functional.gelu, torch.nn.functional.softmax
    ops = [("add", lambda: a + b), ("scale", lambda: a * 2.0), ("gelu", lambda: gelu(a)),
           ("bias_add_broadcast", lambda: a + bias), ("sum_dim1", lambda: a.sum(1)),
           ("softmax_dim1", lambda: softmax(a, dim=1)), ("matmul", lambda: a @ w),
           ("transpose", lambda: w.transpose(0, 1).contiguous()), ("reshape_merge", lambda: a.reshape(-1))]
    records = []
    for name, f in ops:
        secs = time_calls(f, cfg.reps, cfg.min_seconds)
        rec = {"bench": "ops", "part": "overhead", "name": name, "shape": [m, m], "seconds": secs,
               "how": "eager torch op on a replicated DTensor"}
        rec.update(common(n))
        records.append(rec)
        if rank == 0:
            print(f"  dtensor {name:<20} {secs * 1e6:8.2f} us", file=sys.stderr, flush=True)
    return records


def mlp(cfg, n, rank):
    model = 2 if n % 2 == 0 else 1
    mesh = init_device_mesh("cpu", (n // model, model), mesh_dim_names=("data", "model"))
    gen = torch.Generator().manual_seed(1)
    B, S, D, F = 8, 128, 512, 2048
    x = distribute_tensor(torch.rand(B, S, D, generator=gen), mesh, [Shard(0), Replicate()])
    w1 = distribute_tensor(torch.rand(D, F, generator=gen), mesh, [Replicate(), Shard(1)])
    w2 = distribute_tensor(torch.rand(F, D, generator=gen), mesh, [Replicate(), Shard(0)])

    def block():
        h = torch.nn.functional.gelu(x @ w1)
        return (h @ w2).redistribute(mesh, [Shard(0), Replicate()]).to_local()

    secs = time_calls(block, cfg.reps, cfg.min_seconds)
    rec = {"bench": "ops", "part": "mlp", "name": "mlp block", "mesh": "{data: %d, model: %d}" % (n // model, model),
           "shape": [B, S, D, F], "dtype": "float32", "seconds": secs, "gflops": 4.0 * B * S * D * F / secs * 1e-9}
    rec.update(common(n))
    if rank == 0:
        print(f"  dtensor mlp block on {rec['mesh']}: {secs * 1e3:.2f} ms", file=sys.stderr, flush=True)
    return [rec]


def block(cfg, n, rank):
    import math
    B, S, D, H, F = cfg.batch, cfg.seq, cfg.dmodel, cfg.heads, cfg.dff
    E = D // H
    if cfg.layout == "dp" or n == 1:
        shape = (n, 1)
        col = row = [Replicate(), Replicate()]
    else:
        m = cfg.model if n % cfg.model == 0 else 1
        shape = (n // m, m)
        col, row = [Replicate(), Shard(1)], [Replicate(), Shard(0)]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("data", "model"))
    hid, vec = [Shard(0), Replicate()], [Replicate(), Replicate()]
    gen = torch.Generator().manual_seed(1)

    def u(*size, lo=-1.0, hi=1.0):
        return torch.rand(*size, generator=gen) * (hi - lo) + lo

    def param(t, placements):
        return distribute_tensor(t, mesh, placements).requires_grad_()

    wd, wf = 1 / math.sqrt(D), 1 / math.sqrt(F)
    x = param(u(B, S, D), hid)
    g1, b1, g2, b2 = (param(torch.ones(D), vec), param(torch.zeros(D), vec), param(torch.ones(D), vec),
                      param(torch.zeros(D), vec))
    wq, wk, wv = (param(u(D, D, lo=-wd, hi=wd), col) for _ in range(3))
    w1 = param(u(D, F, lo=-wd, hi=wd), col)
    wo, w2 = param(u(D, D, lo=-wd, hi=wd), row), param(u(F, D, lo=-wf, hi=wf), row)
    params = [x, g1, b1, g2, b2, wq, wk, wv, w1, wo, w2]
    r = distribute_tensor(u(B, S, D), mesh, hid)

    def norm(t):
        mu = t.mean(-1, keepdim=True)
        return (t - mu) * torch.rsqrt(((t - mu) ** 2).mean(-1, keepdim=True) + 1e-5)

    def loss():
        h = norm(x) * g1 + b1
        q, k, v = ((h @ w).view(B, S, H, E).transpose(1, 2) for w in (wq, wk, wv))
        att = torch.softmax((q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(E)), dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, S, D)
        x1 = x + (o @ wo).redistribute(mesh, hid)
        h2 = norm(x1) * g2 + b2
        out = x1 + (torch.nn.functional.gelu(h2 @ w1) @ w2).redistribute(mesh, hid)
        return (out * r).sum()

    def forward():
        with torch.no_grad():
            return loss().to_local()

    def forward_backward():
        for p in params:
            p.grad = None
        loss().backward()

    fwd = time_calls(forward, cfg.reps, 0.05)
    fb = time_calls(forward_backward, cfg.reps, 0.05)
    mesh_text = "{data: %d, model: %d}" % shape
    name = "1 device" if n == 1 else f"{cfg.layout} {mesh_text}"
    rec = {"bench": "grad", "part": "block", "name": name, "layout": cfg.layout, "mesh": mesh_text,
           "shape": {"batch": B, "seq": S, "d_model": D, "heads": H, "head_dim": E, "d_ff": F},
           "seconds": fwd, "what": "forward (loss) under no_grad", "forward_backward_seconds": fb}
    rec.update(common(n))
    if rank == 0:
        print(f"  dtensor block {name}: forward {fwd * 1e3:.2f} ms, forward + backward {fb * 1e3:.2f} ms", file=sys.stderr,
              flush=True)
    return [rec]


def main(cfg):
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(max(1, (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) // n))
    records = {"reshard": reshard, "overhead": overhead, "mlp": mlp, "block": block}[cfg.bench](cfg, n, rank)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        lines = "".join(json.dumps(r) + "\n" for r in records)
        if cfg.json:
            with open(cfg.json, "w") as f:
                f.write(lines)
        sys.stdout.write(lines)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
