#!/usr/bin/env python3
"""The JAX peer of bench_reshard and of bench_ops's `overhead` part: the same moves and ops, the same
shapes, on N virtual CPU devices (XLA's --xla_force_host_platform_device_count).

usage: jax_layout.py --bench reshard|overhead [--devices 8] [--min-bytes 1048576] [--max-bytes 67108864]
                     [--n 32] [--reps 7] [--json FILE]

--bench reshard: a float32 tensor of rows x cols (cols = 1024 // N * N, rows a multiple of N for
  `bytes` from --min-bytes to --max-bytes by x4, as bench_reshard) put on the devices with the source
  sharding, then a jitted identity with the target sharding as out_shardings (what JAX users write
  to reshard): S0->R, S1->R, R->S0, S0->S1, XY->YX (mesh (N/2, 2): P(("x","y")) -> P(("y","x"))), and
  JAX has no partial-sum arrays; P->R and P->S0 are
  the same moves written as shard_map bodies over the addends (psum, psum_scatter). No uneven case:
  JAX's device_put refuses a dim that the mesh axis does not divide (IndivisibleError).
--bench overhead: the ops of bench_ops --part overhead on float32 32x32 (--n) arrays on one
  device: `seconds` is the eager call (jnp op dispatched through JAX's per-primitive cache, as a
  user writes `a + b`), `jit_seconds` the same op as a jitted function.

Timing: --reps repetitions of as many calls as take ~20 ms, each repetition ended by
block_until_ready (reshard: every call, see time_calls); the median of the time per call. One JSON record per case on stdout (named as
the matching shardlib record: bench, part, name, devices, bytes), backend "jax-cpu". Exit status 3
when jax cannot be imported.
"""
import argparse
import json
import os
import sys

from jax_env import force_cpu_devices, make_mesh, time_calls


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", choices=("reshard", "overhead"), required=True)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--n", type=int, default=32, help="overhead: the arrays' side (32)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--min-seconds", type=float, default=0.02)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.devices < 1 or a.reps < 1 or a.min_bytes < 1 or a.max_bytes < a.min_bytes:
        ap.error("--devices and --reps must be >= 1, 1 <= --min-bytes <= --max-bytes")
    return a


ARGS = parse_args()
force_cpu_devices(ARGS.devices)

try:
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map
except Exception as e:  # noqa: BLE001
    print(f"jax_layout.py: cannot import jax ({type(e).__name__}: {e}); install it (pip install jax)", file=sys.stderr)
    sys.exit(3)


def common(cfg):
    return {"backend": "jax-cpu", "devices": cfg.devices, "jax_version": jax.__version__, "host_cores": os.cpu_count(),
            "baseline": None, "baseline_seconds": None}


def reshard(cfg):
    n = cfg.devices
    cols = max(n, 1024 // n * n)
    sizes = []
    s = cfg.min_bytes
    while s <= cfg.max_bytes:
        sizes.append(s)
        s *= 4
    if not sizes or sizes[-1] != cfg.max_bytes:
        sizes.append(cfg.max_bytes)

    def rows_for(b):
        return max(b // 4 // cols // n, 1) * n

    m1 = make_mesh((n,), ("x",))
    m2 = make_mesh((n // 2, 2), ("x", "y")) if n % 2 == 0 else None
    rng = np.random.default_rng(1)
    records = []

    def identity_case(name, rows, mesh, src, dst):
        data = rng.uniform(-1, 1, size=(rows, cols)).astype(np.float32)
        a = jax.device_put(data, NamedSharding(mesh, src))
        f = jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, dst))
        out = f(a)
        assert np.array_equal(np.asarray(out), data), name  # the move is right
        return time_calls(f, (a,), cfg.reps, min_seconds=cfg.min_seconds, sync_each=True)

    def partial_case(name, rows, scatter):
        data = rng.uniform(-1, 1, size=(n * rows, cols)).astype(np.float32)  # device i's addend: rows i*rows...
        a = jax.device_put(data, NamedSharding(m1, P("x", None)))
        if scatter:
            body = lambda t: jax.lax.psum_scatter(t, "x", scatter_dimension=0, tiled=True)  # noqa: E731
            out_spec = P("x", None)
        else:
            body = lambda t: jax.lax.psum(t, "x")  # noqa: E731
            out_spec = P(None, None)
        try:
            sm = shard_map(body, mesh=m1, in_specs=P("x", None), out_specs=out_spec)
        except TypeError:
            sm = shard_map(body, m1, P("x", None), out_spec)
        f = jax.jit(sm)
        out = np.asarray(f(a))
        want = data.reshape(n, rows, cols).sum(axis=0)
        assert np.allclose(out, want, rtol=1e-4, atol=1e-4), name
        return time_calls(f, (a,), cfg.reps, min_seconds=cfg.min_seconds, sync_each=True)

    cases = [("reshard S0->R", lambda r: identity_case("S0->R", r, m1, P("x", None), P(None, None))),
             ("reshard S1->R", lambda r: identity_case("S1->R", r, m1, P(None, "x"), P(None, None))),
             ("reshard R->S0", lambda r: identity_case("R->S0", r, m1, P(None, None), P("x", None))),
             ("reshard P->R", lambda r: partial_case("P->R", r, False)),
             ("reshard P->S0", lambda r: partial_case("P->S0", r, True)),
             ("reshard S0->S1", lambda r: identity_case("S0->S1", r, m1, P("x", None), P(None, "x")))]
    if m2 is not None:
        cases.append(("reshard XY->YX", lambda r: identity_case("XY->YX", r, m2, P(("x", "y"), None), P(("y", "x"), None))))
    for name, run in cases:
        for b in sizes:
            rows = rows_for(b)
            secs = run(rows)
            rec = {"bench": "reshard", "part": "reshard", "name": name, "rows": rows, "cols": cols,
                   "bytes": rows * cols * 4, "seconds": secs,
                   "how": "shard_map psum/psum_scatter" if "P->" in name else "jit identity, out_shardings"}
            rec.update(common(cfg))
            records.append(rec)
            emit(cfg, rec)
            print(f"  jax {name:<16} {n} devices {rows * cols * 4:>10} B  {secs * 1e6:10.1f} us", file=sys.stderr, flush=True)
    # No uneven case: device_put refuses a dim that the mesh axis does not divide (IndivisibleError).
    return records


def overhead(cfg):
    n = cfg.n
    dev = jax.devices()[0]
    rng = np.random.default_rng(1)
    put = lambda *shape: jax.device_put(rng.uniform(-1, 1, size=shape).astype(np.float32), dev)  # noqa: E731
    a, b, w, bias = put(n, n), put(n, n), put(n, n), put(n)
    ops = [("add", lambda: a + b), ("scale", lambda: a * 2.0),
           ("gelu", lambda: jax.nn.gelu(a, approximate=False)), ("bias_add_broadcast", lambda: a + bias),
           ("sum_dim1", lambda: jnp.sum(a, axis=1)), ("softmax_dim1", lambda: jax.nn.softmax(a, axis=1)),
           ("matmul", lambda: a @ w), ("transpose", lambda: jnp.transpose(w)), ("reshape_merge", lambda: a.reshape(-1))]
    records = []
    for name, f in ops:
        eager = time_calls(lambda: f(), (), cfg.reps, min_seconds=cfg.min_seconds)
        jf = jax.jit(f)
        jitted = time_calls(lambda: jf(), (), cfg.reps, min_seconds=cfg.min_seconds)
        rec = {"bench": "ops", "part": "overhead", "name": name, "shape": [n, n], "seconds": eager, "jit_seconds": jitted,
               "how": "eager jnp call (jit of one op: %.1f us)" % (jitted * 1e6)}
        rec.update(common(cfg))
        records.append(rec)
        emit(cfg, rec)
        print(f"  jax {name:<20} eager {eager * 1e6:8.2f} us  jit {jitted * 1e6:8.2f} us", file=sys.stderr, flush=True)
    return records


def emit(cfg, rec):
    """A record as soon as it is measured (a later case that crashes leaves the earlier ones)."""
    line = json.dumps(rec) + "\n"
    if cfg.json:
        with open(cfg.json, "a") as f:
            f.write(line)
    sys.stdout.write(line)
    sys.stdout.flush()


def main(cfg):
    print(f"jax_layout: {cfg.bench} on {cfg.devices} virtual CPU device(s) ...", file=sys.stderr, flush=True)
    if cfg.json:
        open(cfg.json, "w").close()
    reshard(cfg) if cfg.bench == "reshard" else overhead(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
