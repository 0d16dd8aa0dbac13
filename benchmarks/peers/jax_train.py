#!/usr/bin/env python3
"""The JAX peer of benchmarks/train.cpp: the small GPT of examples/gpt/gpt.hpp trained with AdamW
on the same synthetic token stream, recipe by recipe (dp, zero1, zero2, zero3, tp, dp_tp), on N
virtual CPU devices (XLA's --xla_force_host_platform_device_count), each recipe written with
jax.sharding (Mesh, NamedSharding, PartitionSpec) and one jitted train step.

usage: jax_train.py --recipe dp,zero1,zero2,zero3,tp,dp_tp [--devices 8] [--steps 10] [--warmup 2]
                    [--vocab 64 --seq 16 --dim 32 --heads 4 --ff 128 --layers 2 --batch 8]
                    [--seed 1 --lr 3e-3 --clip 1.0] [--json FILE]
(the sizes' defaults are gpt::Config's; benchmarks/run passes the benchmark's sizes).

The model is gpt::Model::loss: token embedding + learned positions, pre-LN blocks (layer norm with
eps 1e-5 and no affine inside, then * g + b; multi-head causal attention scaled by 1/sqrt(head_dim)
with an additive -1e9 mask; an exact-erf GELU MLP), a final norm, the LM head and the mean
cross-entropy over all B*S tokens. The optimizer is shardlib's AdamW (PyTorch's formulas): clipping
by the global norm (scale min(1, clip / (norm + 1e-6))), betas 0.9/0.999, eps 1e-8, decoupled weight
decay 0.01 on every parameter, bias correction. Initial parameters are uniform in the same ranges as
gpt.hpp's but from numpy's generator (not shardlib's values).

The recipes (gpt.hpp's specs):
  dp     mesh ("data",): batch split over "data", parameters and AdamW state replicated.
  zero1  dp with the state split over "data" on its first unsplit dim (optim::zero_spec_t).
  zero2  zero1 with the gradients constrained to the state's spec (with_sharding_constraint) before
         clipping: "reduce-scattered straight into the state's shards"; XLA picks the collective.
  zero3  parameters and state stored split over "data" (zero_spec_t), each parameter constrained to
         replicated at its use in the forward (XLA gathers it; its gradient goes back split).
  tp     mesh ("model",): heads, the MLP's hidden dim and the vocabulary split over "model" (gpt::TP),
         the residual stream between blocks split along the sequence (sequence parallelism).
  dp_tp  mesh ("data", "model") = (N / m, m), m = 2 for an even N (gpt::DPxTP::model_size).
Where a split does not divide a dim (JAX needs even blocks; shardlib allows uneven ones) the dim is
left unsplit and the record's "notes" says so.

A step, as in train.cpp: the batch made on the host (the TokenStream of gpt.hpp, ported with numpy
uint64 arithmetic) and put on the devices, forward + backward + clip + AdamW in one jitted call with
the parameters and state donated, and the loss read back. `seconds` is the median over the timed
steps (after --warmup steps; compilation is done before them and timed apart as compile_seconds);
tokens_per_second = batch * seq / seconds. The collectives counted are the all-reduce,
reduce-scatter, all-gather, all-to-all and collective-permute ops in the compiled step's HLO (ops
after XLA's combiners: one op may carry several tensors; "collective_bytes" sums their results'
sizes on one device). XLA's CPU pipeline makes no reduce-scatter: a gradient that ends split is
all-reduced and sliced.

One JSON record per recipe on one line each (to --json FILE, and on stdout when no file is given);
progress and a table on stderr. Exit status 3 when jax cannot be imported, 2 on bad arguments.
"""
import argparse
import json
import math
import re
import statistics
import sys
import time

from jax_env import force_cpu_devices

RECIPES = ("dp", "zero1", "zero2", "zero3", "tp", "dp_tp")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=",".join(RECIPES), help="comma-separated: " + ", ".join(RECIPES))
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ff", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--clip", type=float, default=1.0, help="global-norm clipping (0: off)")
    ap.add_argument("--json", default=None, help="write the records here (one per line)")
    ap.add_argument("--check-tokens", action="store_true",
                    help="print TokenStream(vocab, seq, seed).token(n, pos) for a few n, pos and exit")
    a = ap.parse_args(argv)
    a.recipes = [r for r in a.recipe.split(",") if r]
    bad = [r for r in a.recipes if r not in RECIPES]
    if bad:
        ap.error(f"unknown recipe(s) {', '.join(bad)} (known: {', '.join(RECIPES)})")
    if a.devices < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--devices and --steps must be >= 1, --warmup >= 0")
    if a.dim % a.heads:
        ap.error(f"--dim {a.dim} is not a multiple of --heads {a.heads}")
    return a


ARGS = parse_args()
force_cpu_devices(ARGS.devices)  # before jax is imported



def no_jax(e):
    print(f"jax_train.py: cannot import jax ({type(e).__name__}: {e}); install it (pip install jax)",
          file=sys.stderr)
    sys.exit(3)


try:
    import numpy as np  # noqa: E402  (numpy comes with jax)
except Exception as e:  # noqa: BLE001
    no_jax(e)


# ---- Data: gpt::TokenStream -----------------------------------------------------------------------

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def _hash(a, b, c):
    """gpt::TokenStream::hash on uint64 arrays (wrapping arithmetic; b, c as int64 -> uint64)."""
    a, b, c = (np.asarray(x).astype(np.int64).astype(np.uint64) if np.asarray(x).dtype != np.uint64
               else np.asarray(x) for x in (a, b, c))
    with np.errstate(over="ignore"):
        z = a * _M1 + b * _M2 + c * _M3
        z = (z ^ (z >> np.uint64(30))) * _M2
        z = (z ^ (z >> np.uint64(27))) * _M3
        return z ^ (z >> np.uint64(31))


class TokenStream:
    """Token t+1 follows token t by a fixed random permutation of the vocabulary, except one time
    in eight (drawn at random); global batch `step` holds sequences [step*B, (step+1)*B)."""

    def __init__(self, vocab, seq, seed):
        self.vocab, self.seq, self.seed = vocab, seq, np.uint64(seed)
        perm = list(range(vocab))
        for i in range(vocab - 1, 0, -1):  # Fisher-Yates with the stream's hash
            j = int(_hash(self.seed, 0, i) % np.uint64(i + 1))
            perm[i], perm[j] = perm[j], perm[i]
        self.perm = np.array(perm, dtype=np.int64)

    def tokens(self, n, length):
        """Tokens 0..length-1 of global sequences `n` (an int64 array): [len(n), length]."""
        n1 = np.asarray(n, dtype=np.int64) + 1
        v = np.uint64(self.vocab)
        out = np.empty((n1.size, length), dtype=np.int64)
        t = (_hash(self.seed, n1, 0) % v).astype(np.int64)
        out[:, 0] = t
        for i in range(1, length):
            noise = _hash(self.seed, n1, i) % np.uint64(8) == 0
            t = np.where(noise, (_hash(self.seed + np.uint64(1), n1, i) % v).astype(np.int64), self.perm[t])
            out[:, i] = t
        return out

    def token(self, n, pos):
        return int(self.tokens(np.array([n]), pos + 1)[0, pos])

    def batch(self, batch, step):
        """(ids, targets) of global batch `step`, [B, S] int32 each."""
        t = self.tokens(np.arange(step * batch, (step + 1) * batch), self.seq + 1)
        return t[:, :-1].astype(np.int32), t[:, 1:].astype(np.int32)


if ARGS.check_tokens:
    s = TokenStream(ARGS.vocab, ARGS.seq, ARGS.seed)
    for n in (0, 1, 2, 7, 100, 12345):
        for pos in (0, 1, 2, 3, 8, 16):
            print(n, pos, s.token(n, pos))
    sys.exit(0)

try:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
except Exception as e:  # noqa: BLE001 -- any failure to import is "no jax"
    no_jax(e)


# ---- Recipes: a mesh and the specs of activations and parameters ---------------------------------

class Recipe:
    def __init__(self, name, devices):
        self.name = name
        self.fsdp = name == "zero3"
        self.zero = name in ("zero1", "zero2")
        self.grads_to_state = name == "zero2"
        if name in ("dp", "zero1", "zero2", "zero3"):
            self.axes, self.shape = ("data",), (devices,)
            self.act = self.full = P("data", None, None)
            self.ids = P("data", None)
            self.wte = self.head = self.w1 = self.w2 = P(None, None)
            self.qkv = self.wo = P(None, None, None)
        else:
            tp = name == "tp"
            m = devices if tp else (2 if devices % 2 == 0 else 1)  # gpt::DPxTP::model_size
            self.axes, self.shape = (("model",), (devices,)) if tp else (("data", "model"), (devices // m, m))
            d = None if tp else "data"
            self.act = P(d, "model", None)
            self.full = P(d, None, None)
            self.ids = P(d, None)
            self.wte, self.qkv, self.wo = P("model", None), P(None, "model", None), P("model", None, None)
            self.w1, self.w2, self.head = P(None, "model"), P("model", None), P(None, "model")
        devs = np.array(jax.devices()[:devices]).reshape(self.shape)
        try:  # the classic (GSPMD, "auto") axes: shardings by in/out specs and constraints
            from jax.sharding import AxisType
            self.mesh = Mesh(devs, self.axes, axis_types=(AxisType.Auto,) * len(self.axes))
        except (ImportError, TypeError):
            self.mesh = Mesh(devs, self.axes)
        self.notes = []

    def size(self, axis):
        return self.mesh.shape[axis]

    def fit(self, spec, shape, what):
        """`spec` with the axes that do not divide their dim dropped (noted)."""
        dims = list(spec) + [None] * (len(shape) - len(spec))
        for d, ax in enumerate(dims):
            if ax is None:
                continue
            k = math.prod(self.size(a) for a in (ax if isinstance(ax, tuple) else (ax,)))
            if shape[d] % k:
                self.notes.append(f"{what}: dim {d} ({shape[d]}) not split over {ax} ({k} does not divide it)")
                dims[d] = None
        return P(*dims)

    def zero_spec(self, spec, shape, what):
        """optim::zero_spec_t<.., "data">: "data" added to the first unsplit dim (to dim 0 when every
        dim is split; unchanged when "data" already splits it); here the first unsplit dim that
        "data" divides (JAX needs even blocks)."""
        dims = list(spec) + [None] * (len(shape) - len(spec))
        if "data" not in self.axes or any(ax == "data" or (isinstance(ax, tuple) and "data" in ax) for ax in dims):
            return P(*dims)
        k = self.size("data")
        for d, ax in enumerate(dims):
            if ax is None and shape[d] % k == 0:
                if d != dims.index(None):
                    self.notes.append(f"{what}: split over data on dim {d}, not on the first unsplit dim "
                                      f"{dims.index(None)} ({shape[dims.index(None)]} not a multiple of {k})")
                dims[d] = "data"
                return P(*dims)
        self.notes.append(f"{what}: no dim of {tuple(shape)} that data ({k}) divides: left replicated")
        return P(*dims)


# ---- The model -----------------------------------------------------------------------------------

def param_layout(cfg, r):
    """name -> (shape, use spec, init (amp) or constant)."""
    D, H, K, F, V, S = cfg.dim, cfg.heads, cfg.dim // cfg.heads, cfg.ff, cfg.vocab, cfg.seq
    wd, wf = 1 / math.sqrt(D), 1 / math.sqrt(F)
    out = {"wte": ((V, D), r.wte, ("uniform", 0.5)), "wpe": ((S, D), P(None, None), ("uniform", 0.1))}
    for l in range(cfg.layers):
        out.update({
            f"l{l}.g1": ((D,), P(None), ("const", 1.0)), f"l{l}.b1": ((D,), P(None), ("const", 0.0)),
            f"l{l}.wq": ((D, H, K), r.qkv, ("uniform", wd)), f"l{l}.wk": ((D, H, K), r.qkv, ("uniform", wd)),
            f"l{l}.wv": ((D, H, K), r.qkv, ("uniform", wd)), f"l{l}.wo": ((H, K, D), r.wo, ("uniform", wd)),
            f"l{l}.g2": ((D,), P(None), ("const", 1.0)), f"l{l}.b2": ((D,), P(None), ("const", 0.0)),
            f"l{l}.w1": ((D, F), r.w1, ("uniform", wd)), f"l{l}.w2": ((F, D), r.w2, ("uniform", wf)),
        })
    out.update({"gf": ((D,), P(None), ("const", 1.0)), "bf": ((D,), P(None), ("const", 0.0)),
                "head": ((D, V), r.head, ("uniform", wd))})
    return out


def layer_norm(x, eps=1e-5):  # shardlib's layer_norm: biased variance, eps 1e-5, no affine
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps)


def make_loss(cfg, r, use_specs):
    wsc = jax.lax.with_sharding_constraint
    mesh = r.mesh
    S = cfg.seq
    scale = 1.0 / math.sqrt(cfg.dim // cfg.heads)
    mask = jnp.where(jnp.arange(S)[None, :] > jnp.arange(S)[:, None], -1e9, 0.0).astype(jnp.float32)
    act = NamedSharding(mesh, r.fit(r.act, (cfg.batch, S, cfg.dim), "activations"))
    full = NamedSharding(mesh, r.fit(r.full, (cfg.batch, S, cfg.dim), "block inputs"))

    def use(params, name):
        p = params[name]
        if r.fsdp:  # stored split over "data": gathered for use (its gradient goes back split)
            p = wsc(p, NamedSharding(mesh, use_specs[name]))
        return p

    def loss(params, ids, targets):
        x = wsc(jnp.take(use(params, "wte"), ids, axis=0), act) + use(params, "wpe")
        for l in range(cfg.layers):
            u = lambda n: use(params, f"l{l}.{n}")  # noqa: E731
            a = wsc(layer_norm(x) * u("g1") + u("b1"), full)
            q = jnp.einsum("bsd,dhk->bshk", a, u("wq"))
            k = jnp.einsum("bsd,dhk->bshk", a, u("wk"))
            v = jnp.einsum("bsd,dhk->bshk", a, u("wv"))
            p = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k) * scale + mask, axis=-1)
            att = jnp.einsum("bhqs,bshk->bqhk", p, v)
            x = x + wsc(jnp.einsum("bqhk,hkd->bqd", att, u("wo")), act)
            h = wsc(layer_norm(x) * u("g2") + u("b2"), full)
            f = jax.nn.gelu(jnp.einsum("bsd,df->bsf", h, u("w1")), approximate=False)
            x = x + wsc(jnp.einsum("bsf,fd->bsd", f, u("w2")), act)
        h = wsc(layer_norm(x) * use(params, "gf") + use(params, "bf"), full)
        logits = jnp.einsum("bsd,dv->bsv", h, use(params, "head"))
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return jnp.mean(lse - picked)

    return loss


def make_step(cfg, r, use_specs, state_specs):
    loss_fn = make_loss(cfg, r, use_specs)
    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.01
    wsc = jax.lax.with_sharding_constraint

    def step(params, m, v, t, ids, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, targets)
        if r.grads_to_state:  # ZeRO-2: the gradients in the state's shards
            grads = {k: wsc(g, NamedSharding(r.mesh, state_specs[k])) for k, g in grads.items()}
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in grads.values()))
        gs = jnp.minimum(1.0, cfg.clip / (norm + 1e-6)) if cfg.clip > 0 else jnp.float32(1.0)
        tf = t.astype(jnp.float32)
        step_size = cfg.lr / (1 - b1 ** tf)
        bc2_sqrt = jnp.sqrt(1 - b2 ** tf)
        new_p, new_m, new_v = {}, {}, {}
        for k, p in params.items():
            g = gs * grads[k]
            mk = b1 * m[k] + (1 - b1) * g
            vk = b2 * v[k] + (1 - b2) * g * g
            new_m[k], new_v[k] = mk, vk
            new_p[k] = p * (1 - cfg.lr * wd) - step_size * mk / (jnp.sqrt(vk) / bc2_sqrt + eps)
        return new_p, new_m, new_v, loss, norm

    return step


COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")
_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
          "s8": 1, "u8": 1, "pred": 1}


def count_collectives(hlo):
    """Ops of each kind in an HLO module's text (async pairs counted once, by their -start), and
    the bytes of their results on one device (a combined op's tuple summed)."""
    counts, nbytes = dict.fromkeys(COLLECTIVES, 0), dict.fromkeys(COLLECTIVES, 0)
    op = re.compile(r"=\s*(.*?)\s(all-reduce|reduce-scatter|all-gather|all-to-all|collective-permute)(-start)?\(")
    for line in hlo.splitlines():
        m = op.search(line)
        if not m:
            continue
        counts[m.group(2)] += 1
        for dt, dims in re.findall(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]", m.group(1)):
            if dt in _BYTES:
                nbytes[m.group(2)] += _BYTES[dt] * math.prod(int(d) for d in dims.split(",") if d)
    return counts, nbytes


def run_recipe(cfg, name, stream):
    r = Recipe(name, cfg.devices)
    layout = param_layout(cfg, r)
    use_specs = {k: r.fit(spec, shape, k) for k, (shape, spec, _) in layout.items()}
    if r.fsdp:
        store_specs = {k: r.zero_spec(use_specs[k], layout[k][0], k) for k in layout}
        state_specs = store_specs
    else:
        store_specs = use_specs
        state_specs = ({k: r.zero_spec(use_specs[k], layout[k][0], k) for k in layout} if r.zero else use_specs)
    sh = lambda specs: {k: NamedSharding(r.mesh, s) for k, s in specs.items()}  # noqa: E731
    p_sh, s_sh = sh(store_specs), sh(state_specs)
    ids_sh = NamedSharding(r.mesh, r.fit(r.ids, (cfg.batch, cfg.seq), "ids"))
    rep = NamedSharding(r.mesh, P())

    rng = np.random.default_rng(cfg.seed)
    params, m, v = {}, {}, {}
    for k, (shape, _, (kind, val)) in layout.items():
        host = (rng.uniform(-val, val, size=shape) if kind == "uniform" else np.full(shape, val)).astype(np.float32)
        params[k] = jax.device_put(host, p_sh[k])
        m[k] = jax.device_put(np.zeros(shape, np.float32), s_sh[k])
        v[k] = jax.device_put(np.zeros(shape, np.float32), s_sh[k])

    step = jax.jit(make_step(cfg, r, use_specs, state_specs),
                   in_shardings=(p_sh, s_sh, s_sh, rep, ids_sh, ids_sh),
                   out_shardings=(p_sh, s_sh, s_sh, rep, rep), donate_argnums=(0, 1, 2))
    ids0, tg0 = stream.batch(cfg.batch, 0)
    t0 = time.perf_counter()
    compiled = step.lower(params, m, v, jnp.int32(1), jax.device_put(ids0, ids_sh),
                          jax.device_put(tg0, ids_sh)).compile()
    compile_s = time.perf_counter() - t0
    try:
        collectives, collective_bytes = count_collectives(compiled.as_text())
    except Exception as e:  # noqa: BLE001
        r.notes.append(f"no HLO text: {e}")
        collectives = collective_bytes = None

    times, data_times, losses, norms = [], [], [], []
    for s in range(cfg.warmup + cfg.steps):
        t0 = time.perf_counter()
        ids, tg = stream.batch(cfg.batch, s)
        ids, tg = jax.device_put(ids, ids_sh), jax.device_put(tg, ids_sh)
        t1 = time.perf_counter()
        params, m, v, loss, norm = compiled(params, m, v, jnp.int32(s + 1), ids, tg)
        loss = float(loss)  # read back (blocks on the step)
        jax.block_until_ready((params, m, v))
        t2 = time.perf_counter()
        losses.append(loss)
        norms.append(float(norm))
        if s >= cfg.warmup:
            times.append(t2 - t0)
            data_times.append(t1 - t0)
    sec = statistics.median(times)
    return {
        "bench": "train", "part": "recipe", "name": name, "backend": "jax-cpu", "devices": cfg.devices,
        "seconds": sec, "baseline": None, "baseline_seconds": None,
        "tokens_per_second": cfg.batch * cfg.seq / sec, "steps": cfg.steps, "first_loss": losses[0],
        "last_loss": losses[-1], "jax_version": jax.__version__, "collectives": collectives,
        "collective_bytes": collective_bytes,
        "compile_seconds": compile_s, "data_seconds": statistics.median(data_times),
        "mesh": dict(zip(r.axes, r.shape)), "first_grad_norm": norms[0], "notes": sorted(set(r.notes)),
        "config": {k: getattr(cfg, k) for k in ("vocab", "seq", "dim", "heads", "ff", "layers", "batch")},
    }


def main(cfg):
    stream = TokenStream(cfg.vocab, cfg.seq, cfg.seed)
    records = []
    for name in cfg.recipes:
        print(f"jax_train: {name} on {cfg.devices} devices ...", file=sys.stderr, flush=True)
        rec = run_recipe(cfg, name, stream)
        print(f"jax_train: {name}: loss {rec['first_loss']:.4f} -> {rec['last_loss']:.4f}, "
              f"{rec['seconds'] * 1e3:.2f} ms/step, {rec['tokens_per_second']:.0f} tokens/s"
              + "".join(f"\n  note: {n}" for n in rec["notes"]), file=sys.stderr, flush=True)
        records.append(rec)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    if cfg.json:
        with open(cfg.json, "w") as f:
            f.write(lines)
    else:
        sys.stdout.write(lines)
    short = {"all-reduce": "AR", "reduce-scatter": "RS", "all-gather": "AG", "all-to-all": "A2A",
             "collective-permute": "CP"}
    print(f"\njax {jax.__version__}, {cfg.devices} CPU devices, V={cfg.vocab} S={cfg.seq} D={cfg.dim} "
          f"H={cfg.heads} F={cfg.ff} L={cfg.layers} B={cfg.batch}", file=sys.stderr)
    print(f"{'recipe':<8}{'mesh':>8}{'ms/step':>10}{'tokens/s':>11}{'loss first':>12}{'last':>9}{'compile s':>11}"
          "  collectives in the step", file=sys.stderr)
    for r in records:
        c = r["collectives"] or {}
        coll = " ".join(f"{short[k]} {n}" for k, n in c.items() if n) or "none"
        mesh = "x".join(str(n) for n in r["mesh"].values())
        print(f"{r['name']:<8}{mesh:>8}{r['seconds'] * 1e3:>10.2f}{r['tokens_per_second']:>11.0f}"
              f"{r['first_loss']:>12.4f}{r['last_loss']:>9.4f}{r['compile_seconds']:>11.2f}  {coll}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
