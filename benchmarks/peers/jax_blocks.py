#!/usr/bin/env python3
"""The JAX peer of bench_ops's `mlp` part and of bench_grad's `block` part: the same computations,
shapes and shardings, jitted, on N virtual CPU devices (XLA's --xla_force_host_platform_device_count).

usage: jax_blocks.py --bench ops|grad|context [--devices 8] [--layout dp|tp] [--model 2] [--reps 7]
                     [--batch 8 --seq 128 --dmodel 512 --heads 8 --dff 2048] [--json FILE]

--bench ops, the MLP block (benchmarks/ops.cpp, part mlp): y = gelu(x @ w1) @ w2 in float32 on the
  mesh ("data", "model") = (N / m, m), m = --model (2) when it divides N, else 1: x [B, S, D] split
  over "data" by batch, w1 [D, F] by columns over "model", w2 [F, D] by rows, the output constrained
  to x's spec (the row-parallel product's partial sum resolved: one all-reduce). Exact-erf gelu.
--bench grad, the pre-LN transformer block's forward on plain tensors (benchmarks/grad.cpp, the
  `forward` baseline of part block): h = layer_norm(x) * g1 + b1 (eps 1e-5, no affine inside);
  q, k, v = h @ wq, wk, wv reshaped to [B, S, H, E]; scores = einsum(bqhe,bkhe->bhqk) / sqrt(E);
  softmax over the keys; o = einsum(bhqk,bkhe->bqhe) reshaped to [B, S, D]; x1 = x + o @ wo;
  h2 = layer_norm(x1) * g2 + b2; out = x1 + gelu(h2 @ w1) @ w2 (exact erf); loss = sum(out * r).
  --layout dp: mesh (N, 1), batch over "data", weights replicated; tp: mesh (N / m, m), Megatron:
  wq, wk, wv and w1 split by columns over "model", wo and w2 by rows, x1 and out constrained to the
  hidden spec (batch over "data") as bench_grad's sl::reshard does. Also timed: the gradient of the
  loss with respect to x and every weight, gain and bias (jax.value_and_grad, as bench_grad's
  fwd+bwd step; backward_seconds in the record).
--bench context, bench_grad's part context: causal attention's forward and backward (the gradient of
  sum(o * r) with respect to q, k and v, jax.value_and_grad) on [1, 8 seq, heads, dmodel / heads]
  float32 with the sequence split over a mesh ("seq",) of N devices, in each of the forms JAX offers
  without hand-written collectives, one record each: "sequence split" (the einsums on the split
  operands, XLA's SPMD partitioner choosing the collectives), "heads split" (q, k, v constrained to
  the heads split before the einsums and the output back: Ulysses written with sharding
  constraints) and "dot_product_attention" (jax.nn.dot_product_attention, is_causal, on the split
  operands). The goal compares shardlib's ring with the fastest of them.
Weights are uniform in bench_grad's ranges (+-1/sqrt(D), +-1/sqrt(F); gains 1, biases 0), from
numpy's generator (not shardlib's values).

The collectives counted (collectives_per_block, collectives_forward, collectives_forward_backward)
are the ops of each kind in the compiled function's HLO, after XLA's combiners.

Timing: one jitted function, compiled before the timing (compile_seconds); --warmup calls, then
--reps repetitions of as many calls as take ~50 ms (--min-seconds), each ended by
block_until_ready; `seconds` is the median over the repetitions of the time per call. XLA's CPU
client runs each virtual device's ops on a thread pool over all the machine's cores
(host_cores in the record); shardlib's in-process devices run one thread each.

One JSON record per case on stdout (and to --json FILE), named as the matching shardlib record
(bench, part, name, devices, mesh), with backend "jax-cpu"; progress on stderr. Exit status 3 when
jax cannot be imported, 2 on bad arguments.
"""
import argparse
import json
import math
import os
import re
import sys
import time

import jax_env
from jax_env import force_cpu_devices, time_calls


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", choices=("ops", "grad", "context"), required=True)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--layout", choices=("dp", "tp"), default="dp", help="grad: dp or tp (Megatron)")
    ap.add_argument("--model", type=int, default=2, help="the model axis of ops' mlp and grad's tp (2)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-seconds", type=float, default=0.05, help="the least time of one repetition")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dmodel", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dff", type=int, default=2048)
    ap.add_argument("--no-backward", action="store_true", help="grad: the forward only")
    ap.add_argument("--forms", default=None,
                    help="context: the forms to run, comma-separated (all three by default); one per process "
                         "keeps a form that exhausts the memory from taking the others with it")
    ap.add_argument("--json", default=None, help="write the records here (one per line)")
    a = ap.parse_args(argv)
    if a.devices < 1 or a.reps < 1 or a.model < 1:
        ap.error("--devices, --reps and --model must be >= 1")
    if a.dmodel % a.heads:
        ap.error(f"--dmodel {a.dmodel} is not a multiple of --heads {a.heads}")
    return a


ARGS = parse_args()
force_cpu_devices(ARGS.devices)  # before jax is imported

try:
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
except Exception as e:  # noqa: BLE001 -- any failure to import is "no jax"
    print(f"jax_blocks.py: cannot import jax ({type(e).__name__}: {e}); install it (pip install jax)", file=sys.stderr)
    sys.exit(3)


def make_mesh(shape):
    return jax_env.make_mesh(shape, ("data", "model"))


def mesh_text(shape):
    """shardlib's Mesh::to_string of the same mesh."""
    return "{data: %d, model: %d}" % shape


def compiled(fn, args, in_shardings, out_shardings):
    jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings)
    t0 = time.perf_counter()
    c = jitted.lower(*args).compile()
    return c, time.perf_counter() - t0


def collectives(c):
    """Collective ops of each kind in a compiled function's HLO (async pairs counted once, by their
    -start), the kinds that occur only; None when the HLO text cannot be had."""
    try:
        hlo = c.as_text()
    except Exception:  # noqa: BLE001
        return None
    op = re.compile(r"\s(all-reduce|reduce-scatter|all-gather|all-to-all|collective-permute)(-start)?\(")
    counts = {}
    for line in hlo.splitlines():
        m = op.search(line.split("=", 1)[1] if "=" in line else "")
        if m:
            k = m.group(1).replace("-", "_")
            counts[k] = counts.get(k, 0) + 1
    return counts


def uniform(rng, shape, lo, hi):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def common_fields(cfg):
    return {"backend": "jax-cpu", "devices": cfg.devices, "dtype": "float32", "baseline": None,
            "baseline_seconds": None, "jax_version": jax.__version__, "host_cores": os.cpu_count(),
            "reps": cfg.reps}


def mlp(cfg):
    """bench_ops --part mlp."""
    B, S, D, F = cfg.batch, cfg.seq, cfg.dmodel, cfg.dff
    m = cfg.model if cfg.devices % cfg.model == 0 else 1
    shape = (cfg.devices // m, m)
    mesh = make_mesh(shape)
    xs, w1s, w2s = (NamedSharding(mesh, s) for s in (P("data", None, None), P(None, "model"), P("model", None)))
    rng = np.random.default_rng(1)
    x = jax.device_put(uniform(rng, (B, S, D), 0, 1), xs)
    w1 = jax.device_put(uniform(rng, (D, F), 0, 1), w1s)
    w2 = jax.device_put(uniform(rng, (F, D), 0, 1), w2s)

    def block(x, w1, w2):
        h = jnp.einsum("bsd,df->bsf", x, w1)
        a = jax.nn.gelu(h, approximate=False)
        return jnp.einsum("bsf,fd->bsd", a, w2)

    f, compile_s = compiled(block, (x, w1, w2), (xs, w1s, w2s), xs)
    secs = time_calls(f, (x, w1, w2), cfg.reps, cfg.warmup, cfg.min_seconds)
    flops = 2.0 * 2.0 * B * S * D * F
    rec = {"bench": "ops", "part": "mlp", "name": "mlp block", "mesh": mesh_text(shape), "shape": [B, S, D, F],
           "seconds": secs, "gflops": flops / secs * 1e-9, "compile_seconds": compile_s,
           "collectives_per_block": collectives(f)}
    rec.update(common_fields(cfg))
    return [rec]


def layer_norm(x, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps)


def block(cfg):
    """bench_grad --part block: the forward (loss) and, timed apart, its gradient."""
    B, S, D, H, F = cfg.batch, cfg.seq, cfg.dmodel, cfg.heads, cfg.dff
    E = D // H
    if cfg.layout == "dp":
        shape = (cfg.devices, 1)
        col = row = P(None, None)
    else:
        if cfg.devices % cfg.model:
            print(f"jax_blocks.py: --devices {cfg.devices} is not a multiple of --model {cfg.model}", file=sys.stderr)
            sys.exit(2)
        shape = (cfg.devices // cfg.model, cfg.model)
        col, row = P(None, "model"), P("model", None)
    mesh = make_mesh(shape)
    hid = NamedSharding(mesh, P("data", None, None))
    vec = NamedSharding(mesh, P(None))
    cs, rs = NamedSharding(mesh, col), NamedSharding(mesh, row)
    rng = np.random.default_rng(1)
    wd, wf = 1 / math.sqrt(D), 1 / math.sqrt(F)
    params = {
        "x": (uniform(rng, (B, S, D), -1, 1), hid),
        "g1": (np.ones(D, np.float32), vec), "b1": (np.zeros(D, np.float32), vec),
        "g2": (np.ones(D, np.float32), vec), "b2": (np.zeros(D, np.float32), vec),
        "wq": (uniform(rng, (D, D), -wd, wd), cs), "wk": (uniform(rng, (D, D), -wd, wd), cs),
        "wv": (uniform(rng, (D, D), -wd, wd), cs), "w1": (uniform(rng, (D, F), -wd, wd), cs),
        "wo": (uniform(rng, (D, D), -wd, wd), rs), "w2": (uniform(rng, (F, D), -wf, wf), rs),
    }
    p = {k: jax.device_put(v, s) for k, (v, s) in params.items()}
    shardings = {k: s for k, (_, s) in params.items()}
    r = jax.device_put(uniform(rng, (B, S, D), -1, 1), hid)
    scale = 1.0 / math.sqrt(E)
    wsc = jax.lax.with_sharding_constraint

    def loss(p, r):
        x = p["x"]
        h = layer_norm(x) * p["g1"] + p["b1"]
        q = jnp.einsum("bsd,de->bse", h, p["wq"]).reshape(B, S, H, E)
        k = jnp.einsum("bsd,de->bse", h, p["wk"]).reshape(B, S, H, E)
        v = jnp.einsum("bsd,de->bse", h, p["wv"]).reshape(B, S, H, E)
        scores = jnp.einsum("bqhe,bkhe->bhqk", q, k) * scale
        att = jax.nn.softmax(scores, axis=3)
        o = jnp.einsum("bhqk,bkhe->bqhe", att, v).reshape(B, S, D)
        x1 = x + wsc(jnp.einsum("bsd,de->bse", o, p["wo"]), hid)
        h2 = layer_norm(x1) * p["g2"] + p["b2"]
        f = jax.nn.gelu(jnp.einsum("bsd,df->bsf", h2, p["w1"]), approximate=False)
        out = x1 + wsc(jnp.einsum("bsf,fd->bsd", f, p["w2"]), hid)
        return jnp.sum(out * r)

    rep = NamedSharding(mesh, P())
    fwd, compile_s = compiled(loss, (p, r), (shardings, hid), rep)
    secs = time_calls(fwd, (p, r), cfg.reps, cfg.warmup, cfg.min_seconds)
    flops = (2 * B * S * D * 3 * D + 2 * 2 * B * H * S * S * E + 2 * B * S * D * D + 2 * 2 * B * S * D * F)
    name = "1 device" if cfg.devices == 1 else f"{cfg.layout} {mesh_text(shape)}"
    rec = {"bench": "grad", "part": "block", "name": name, "layout": cfg.layout, "mesh": mesh_text(shape),
           "shape": {"batch": B, "seq": S, "d_model": D, "heads": H, "head_dim": E, "d_ff": F},
           "seconds": secs, "what": "forward (loss) on plain arrays", "gflops": flops / secs * 1e-9,
           "compile_seconds": compile_s, "loss": float(fwd(p, r)), "collectives_forward": collectives(fwd)}
    if not cfg.no_backward:
        step, bcompile = compiled(jax.value_and_grad(loss), (p, r), (shardings, hid), (rep, shardings))
        fb = time_calls(step, (p, r), cfg.reps, cfg.warmup, cfg.min_seconds)
        rec.update({"forward_backward_seconds": fb, "forward_backward_gflops": 3 * flops / fb * 1e-9,
                    "forward_backward_compile_seconds": bcompile, "backward_over_forward": (fb - secs) / secs,
                    "collectives_forward_backward": collectives(step)})
    rec.update(common_fields(cfg))
    return [rec]


def context(cfg):
    """bench_grad --part context: causal attention forward + backward over a split sequence."""
    S, H = 8 * cfg.seq, cfg.heads
    K = cfg.dmodel // cfg.heads
    mesh = jax_env.make_mesh((cfg.devices,), ("seq",))
    seq = NamedSharding(mesh, P(None, "seq", None, None))
    heads = NamedSharding(mesh, P(None, None, "seq", None))
    rng = np.random.default_rng(1)
    q, k, v, r = (jax.device_put(uniform(rng, (1, S, H, K), -1, 1), seq) for _ in range(4))
    scale = 1.0 / math.sqrt(K)
    causal = np.tril(np.ones((S, S), dtype=bool))
    wsc = jax.lax.with_sharding_constraint

    def attend(q, k, v):
        s = jnp.einsum("bqhe,bkhe->bhqk", q, k) * scale
        s = jnp.where(causal, s, -jnp.inf)
        return jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=3), v)

    forms = {
        "sequence split": attend,
        "heads split": lambda q, k, v: wsc(attend(wsc(q, heads), wsc(k, heads), wsc(v, heads)), seq),
        "dot_product_attention": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                                              implementation="xla"),
    }
    flops = 3 * 2 * 2 * float(S) * S * H * K  # as bench_grad's: fwd + 2x bwd, both products, the whole square
    if cfg.forms:
        unknown = set(cfg.forms.split(",")) - set(forms)
        if unknown:
            raise SystemExit(f"jax_blocks: --forms: no form {sorted(unknown)}; the forms are {sorted(forms)}")
        forms = {n: f for n, f in forms.items() if n in cfg.forms.split(",")}
    records = []
    for name, form in forms.items():
        def loss(q, k, v, r, form=form):
            return jnp.sum(form(q, k, v) * r)
        try:
            step, compile_s = compiled(jax.value_and_grad(loss, argnums=(0, 1, 2)), (q, k, v, r), (seq,) * 4,
                                       (NamedSharding(mesh, P()), (seq,) * 3))
            secs = time_calls(step, (q, k, v, r), cfg.reps, cfg.warmup, cfg.min_seconds)
        except Exception as e:  # noqa: BLE001 -- a form XLA cannot run here (memory): recorded as such
            print(f"jax_blocks: context {name}: failed ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr, flush=True)
            rec = {"bench": "grad", "part": "context", "name": f"jax {name}", "seconds": None, "gflops": None,
                   "error": f"{type(e).__name__}: {str(e)[:500]}"}
        else:
            rec = {"bench": "grad", "part": "context", "name": f"jax {name}", "seconds": secs,
                   "gflops": flops / secs * 1e-9, "compile_seconds": compile_s, "collectives_forward_backward": collectives(step)}
        rec.update({"mesh": "{seq: %d}" % cfg.devices, "dtype": "float32", "causal": True,
                    "shape": {"batch": 1, "seq": S, "heads": H, "head_dim": K}})
        rec.update(common_fields(cfg))
        records.append(rec)
    return records


def main(cfg):
    what = {"ops": "mlp block", "grad": f"transformer block ({cfg.layout})", "context": "causal attention, split sequence"}[cfg.bench]
    print(f"jax_blocks: {what} on {cfg.devices} virtual CPU device(s) ...", file=sys.stderr, flush=True)
    records = mlp(cfg) if cfg.bench == "ops" else block(cfg) if cfg.bench == "grad" else context(cfg)
    for r in records:
        if r["seconds"] is None:
            continue
        extra = (f", fwd+bwd {r['forward_backward_seconds'] * 1e3:.2f} ms" if "forward_backward_seconds" in r else "")
        print(f"jax_blocks: {r['name']} on {r['mesh']}: {r['seconds'] * 1e3:.2f} ms ({r['gflops']:.1f} GFLOP/s){extra}, "
              f"compiled in {r['compile_seconds']:.2f} s", file=sys.stderr, flush=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    if cfg.json:
        with open(cfg.json, "w") as f:
            f.write(lines)
    sys.stdout.write(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
