"""The report's plots (matplotlib, imported only when plotting) and tables, per benchmark. Every plot
draws the physical limit or the baseline, the goal where the project has one, and the peers beside
ours.
"""
import os

PEERS = {"jax-cpu": "JAX", "dtensor-gloo": "DTensor"}
COLORS = {"ours": "#1f77b4", "ours mpi": "#17becf", "baseline": "#7f7f7f", "JAX": "#ff7f0e", "DTensor": "#d62728",
          "limit": "#2ca02c", "goal": "#9467bd"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, folder, name):
    path = os.path.join(folder, name + ".png")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _plt().close(fig)
    return path


def _mib(b):
    return f"{b / 2**20:g} MiB" if b >= 2**20 else f"{b / 2**10:g} KiB" if b >= 2**10 else f"{b:g} B"


def _bars(ax, labels, series, ylabel, log=False):
    """Grouped bars: series = [(name, [value or None per label], color)]."""
    import numpy as np
    x = np.arange(len(labels))
    k = max(len(series), 1)
    w = 0.8 / k
    for i, (name, vals, color) in enumerate(series):
        xs = [x[j] + (i - (k - 1) / 2) * w for j, v in enumerate(vals) if v is not None]
        ys = [v for v in vals if v is not None]
        ax.bar(xs, ys, w, label=name, color=color)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _device_axis(ax, devices):
    """A log2 x axis of device counts, labelled with the counts."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(devices)
    ax.set_xticklabels([str(d) for d in devices])
    ax.set_xlabel("devices")


def _loglog(ax, ylabel, title):
    """Bytes (log 2) against `ylabel` (log 10), with a grid and a legend: the by-size plots."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot(name, recs, folder):
    fn = globals().get("plot_" + name)
    return fn(recs, folder) if fn else []


def tables(name, recs):
    fn = globals().get("tables_" + name)
    return fn(recs) if fn else []


def _ours(recs):
    return [r for r in recs if r.get("backend") not in PEERS]


# ---- collectives -------------------------------------------------------------------------------

def plot_collectives(recs, folder):
    plt = _plt()
    out = []
    for backend in ("threads", "mpi"):
        rs = [r for r in recs if r["backend"] == backend]
        if not rs:
            continue
        n = max(r["devices"] for r in rs)
        names = sorted({r["name"] for r in rs})
        fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
        for ax, cname in zip(axes[0], names):
            pts = sorted((r["bytes"], r) for r in rs if r["name"] == cname and r["devices"] == n)
            xs = [b for b, _ in pts]
            ax.plot(xs, [r["busbw_GBps"] for _, r in pts], "o-", color=COLORS["ours"], label="ours")
            base = [r["busbw_GBps"] * r["seconds"] / r["baseline_seconds"] for _, r in pts]
            if backend == "threads":
                ax.plot(xs, base, "--", color=COLORS["limit"], label="memcpy limit")
                ax.plot(xs, [0.6 * b for b in base], ":", color=COLORS["goal"], label="goal 0.60 of limit (64 MiB)")
            else:
                ax.plot(xs, base, "--", color=COLORS["baseline"], label="raw MPI call")
                ax.plot(xs, [0.95 * b for b in base], ":", color=COLORS["goal"], label="goal 0.95 of MPI (>= 1 MiB)")
            _loglog(ax, "bus bandwidth GB/s", f"{cname}, {backend}, {n} devices")
        out.append((_save(fig, folder, f"collectives_{backend}"), f"collectives bandwidth by size, {backend}"))
    return out


def tables_collectives(recs):
    rows = []
    for r in recs:
        if r["bytes"] in (8, 1 << 20, 64 << 20) or r["bytes"] == max(x["bytes"] for x in recs):
            rows.append([r["name"], r["backend"], r["devices"], _mib(r["bytes"]), f"{r['seconds'] * 1e6:.1f}",
                         f"{r['busbw_GBps']:.2f}", r["baseline"], f"{r['baseline_seconds'] * 1e6:.1f}",
                         f"{r['fraction_of_baseline']:.2f}"])
    return [("8 B, 1 MiB and the largest size (all sizes in records.json)",
             ["collective", "backend", "devices", "bytes", "us", "busbw GB/s", "baseline", "baseline us", "baseline/ours"],
             rows)]


# ---- reshard -----------------------------------------------------------------------------------

def _reshard_index(recs):
    idx = {}
    for r in recs:
        idx[(r["backend"], r["name"], r["devices"], r["bytes"])] = r
    return idx


def plot_reshard(recs, folder):
    plt = _plt()
    ours = [r for r in recs if r["backend"] == "threads"]
    if not ours:
        return []
    n = max(r["devices"] for r in ours)
    big = max(r["bytes"] for r in ours if r["devices"] == n)
    idx = _reshard_index(recs)
    names = [r["name"] for r in ours if r["devices"] == n and r["bytes"] == big]
    labels = [x.replace("reshard ", "") for x in names]
    series = [("ours (threads)", [idx[("threads", x, n, big)]["seconds"] * 1e3 for x in names], COLORS["ours"]),
              ("hand-written call", [idx[("threads", x, n, big)]["baseline_seconds"] * 1e3 for x in names],
               COLORS["baseline"])]
    if any(("mpi", x, n, big) in idx for x in names):
        series.append(("ours (mpi)", [idx[("mpi", x, n, big)]["seconds"] * 1e3 if ("mpi", x, n, big) in idx else None
                                      for x in names], COLORS["ours mpi"]))
    for b, label in PEERS.items():
        vals = [idx[(b, x, n, big)]["seconds"] * 1e3 if (b, x, n, big) in idx else None for x in names]
        if any(v is not None for v in vals):
            series.append((label, vals, COLORS[label]))
    fig, ax = plt.subplots(figsize=(9, 4))
    _bars(ax, labels, series, "ms per reshard (log)", log=True)
    ax.set_title(f"reshard of a {_mib(big)} float tensor, {n} devices (goal: <= 1.15x the hand-written call)", fontsize=9)
    out = [(_save(fig, folder, "reshard"), "reshard time by transition")]
    # By size: S0->S1 (all_to_all) and S0->R (all_gather), ours vs peers
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, nm in zip(axes, ("reshard S0->R", "reshard S0->S1")):
        for b, label, style in (("threads", "ours (threads)", "o-"), ("mpi", "ours (mpi)", "s-"),
                                ("jax-cpu", "JAX", "^-"), ("dtensor-gloo", "DTensor", "v-")):
            pts = sorted((r["bytes"], r["seconds"] * 1e3) for r in recs if r["backend"] == b and r["name"] == nm
                         and r["devices"] == n)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label,
                        color=COLORS.get(label, COLORS["ours"] if "threads" in label else COLORS["ours mpi"]))
        pts = sorted((r["bytes"], r["baseline_seconds"] * 1e3) for r in recs if r["backend"] == "threads" and r["name"] == nm
                     and r["devices"] == n)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "--", color=COLORS["baseline"], label="hand-written call")
        _loglog(ax, "ms", f"{nm}, {n} devices")
    out.append((_save(fig, folder, "reshard_sizes"), "reshard time by size"))
    return out


def tables_reshard(recs):
    idx = _reshard_index(recs)
    rows = []
    for r in recs:
        if r["backend"] not in ("threads", "mpi"):
            continue
        peers = []
        for b, label in PEERS.items():
            p = idx.get((b, r["name"], r["devices"], r["bytes"])) if r["backend"] == "threads" else None
            peers.append(f"{p['seconds'] * 1e6:.0f} ({p['seconds'] / r['seconds']:.2f}x)" if p else "-")
        rows.append([r["name"].replace("reshard ", ""), r["backend"], r["devices"], _mib(r["bytes"]),
                     f"{r['seconds'] * 1e6:.0f}", f"{r['baseline_seconds'] * 1e6:.0f}", f"{r['ratio_to_baseline']:.2f}",
                     f"{r['bytes_over_bound']:.2f}"] + peers)
    return [("us per reshard; peers' time and their time / ours (> 1: ours faster)",
             ["transition", "backend", "devices", "bytes", "ours us", "hand us", "ours/hand", "bytes/bound",
              "JAX us", "DTensor us"], rows)]


# ---- ops ---------------------------------------------------------------------------------------

def plot_ops(recs, folder):
    plt = _plt()
    out = []
    ov = [r for r in recs if r["part"] == "overhead" and r["backend"] == "threads"]
    if ov:
        names = [r["name"] for r in ov]
        series = [("ours: op", [r["seconds"] * 1e6 for r in ov], COLORS["ours"]),
                  ("ours: the bare local kernel", [r["baseline_seconds"] * 1e6 if r["baseline_seconds"] and
                                                   not str(r.get("baseline", "")).startswith("none") else None
                                                   for r in ov], COLORS["baseline"])]
        for b, label in PEERS.items():
            p = {r["name"]: r for r in recs if r["part"] == "overhead" and r["backend"] == b}
            if p:
                series.append((label + " (eager)", [p[x]["seconds"] * 1e6 if x in p else None for x in names], COLORS[label]))
        fig, ax = plt.subplots(figsize=(9, 4))
        _bars(ax, names, series, "us per op (log)", log=True)
        ax.set_title("time per op, float 32x32, 1 device (goal: ours <= kernel + 1 us)", fontsize=9)
        out.append((_save(fig, folder, "ops_overhead"), "per-op time"))
    mm = [r for r in recs if r["part"] == "matmul"]
    if mm:
        labels = [f"{r['name']} {r['dtype'][5:]} {r['devices']}d" for r in mm]
        fig, ax = plt.subplots(figsize=(9, 4))
        _bars(ax, labels, [("ours", [r["gflops"] for r in mm], COLORS["ours"]),
                           ("OpenBLAS, same local shapes", [r["gflops"] * r["seconds"] / r["baseline_seconds"] for r in mm],
                            COLORS["baseline"])], "GFLOP/s per device")
        peaks = {r["dtype"]: r["peak_gflops"] for r in mm if r.get("peak_gflops")}
        for dt, pk in peaks.items():
            ax.axhline(pk, color=COLORS["limit"], ls="--", lw=1)
            ax.text(0, pk, f" {dt} peak of one core {pk:.0f}", fontsize=7, va="bottom")
            if dt == "float32":
                ax.axhline(0.8 * pk, color=COLORS["goal"], ls=":", lw=1)
                ax.text(0, 0.8 * pk, " goal: SGEMM >= 0.80 of peak", fontsize=7, va="bottom")
        ax.set_title("sharded matmul (no communication) against the core's peak", fontsize=9)
        out.append((_save(fig, folder, "ops_gemm"), "GEMM GFLOP/s against the peak"))
    kr = [r for r in recs if r["part"] == "kernels"]
    if kr:
        labels = [f"{r['name']} {r['dtype'][5:]}" for r in kr]
        fig, ax = plt.subplots(figsize=(10, 4))
        _bars(ax, labels, [("ours", [r["gbytes_per_second"] for r in kr], COLORS["ours"]),
                           ("memcpy of the same bytes", [r["copy_gbytes_per_second"] for r in kr], COLORS["limit"])], "GB/s")
        for i, r in enumerate(kr):
            if "target_fraction_of_copy" in r:
                ax.plot([i - 0.4, i + 0.4], [r["target_fraction_of_copy"] * r["copy_gbytes_per_second"]] * 2,
                        color=COLORS["goal"], lw=2)
        ax.set_title("elementwise, softmax and norm kernels, 1 core (purple: goal >= 0.5 of copy)", fontsize=9)
        out.append((_save(fig, folder, "ops_kernels"), "kernels against copy bandwidth"))
    mlp = [r for r in recs if r["part"] == "mlp"]
    if mlp:
        fig, ax = plt.subplots(figsize=(6, 3.8))
        for b, label, style in (("threads", "ours", "o-"), ("jax-cpu", "JAX", "^-"), ("dtensor-gloo", "DTensor", "v-")):
            pts = sorted((r["devices"], r["gflops"]) for r in mlp if r["backend"] == b)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, color=COLORS[label])
        peak = next((r["peak_gflops"] for r in recs if r["part"] == "peak" and r.get("peak_gflops")
                     and "32" in r["name"]), None)
        cores = next((r.get("host_cores") for r in mlp if r.get("host_cores")), None)
        if peak and cores:
            ax.axhline(peak * cores, color=COLORS["limit"], ls="--", lw=1, label=f"float32 peak, {cores} cores")
        _device_axis(ax, sorted({r["devices"] for r in mlp}))
        ax.set_ylabel("GFLOP/s (whole block)")
        ax.set_title("MLP block scaling with devices (goal: faster than JAX)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        out.append((_save(fig, folder, "ops_mlp"), "MLP block scaling"))
    return out


def tables_ops(recs):
    out = []
    peak = [r for r in recs if r["part"] == "peak"]
    rows = []
    for r in peak:
        if "peak_gflops" in r:
            rows.append([r["name"], f"{r['peak_gflops']:.1f} GFLOP/s", f"{r['fma_units']} FMA unit(s) x {r['lanes']} lanes "
                         f"({r['isa']}) x 2 x {r['clock_ghz']:.2f} GHz (measured)"])
        elif "gbytes_per_second" in r:
            rows.append([r["name"], f"{r['gbytes_per_second']:.1f} GB/s", f"memcpy of {r['bytes'] / 2 / 2**20:.0f} MiB"])
    out.append(("The physical limits, measured", ["limit", "value", "how"], rows))
    peers = {(r["backend"], r["name"]): r for r in recs if r["part"] == "overhead" and r["backend"] in PEERS}
    rows = []
    for r in recs:
        if r["part"] == "overhead" and r["backend"] == "threads":
            ps = []
            for b in PEERS:
                p = peers.get((b, r["name"]))
                ps.append(f"{p['seconds'] * 1e6:.1f} ({p['seconds'] / r['seconds']:.1f}x)" if p else "-")
            rows.append([r["name"], f"{r['seconds'] * 1e6:.2f}", f"{r['baseline_seconds'] * 1e6:.2f}",
                         f"{r['overhead_us']:.3f}"] + ps)
    out.append(("Per-op time, us (peers: their time and time / ours)",
                ["op", "ours", "bare kernel", "overhead (goal <= 1)", "JAX eager", "DTensor eager"], rows))
    rows = [[r["name"], r["dtype"], r["devices"], str(r["local_shape"]), f"{r['gflops']:.1f}",
             f"{r.get('fraction_of_peak', 0):.2f}", f"{r['fraction_of_baseline']:.2f}"] for r in recs if r["part"] == "matmul"]
    out.append(("Matmul", ["name", "dtype", "devices", "local shape", "GFLOP/s", "of peak", "of OpenBLAS (goal >= 0.90)"],
                rows))
    rows = [[r["name"], r["dtype"], f"{r['ns_per_element']:.2f}", f"{r['gbytes_per_second']:.1f}",
             f"{r['fraction_of_copy']:.2f}", f"{r['target_fraction_of_copy']:.2f}" if "target_fraction_of_copy" in r else "-"]
            for r in recs if r["part"] == "kernels"]
    out.append(("Kernels", ["kernel", "dtype", "ns/element", "GB/s", "of copy", "goal"], rows))
    mlp = {(r["backend"], r["devices"]): r for r in recs if r["part"] == "mlp"}
    rows = []
    for (b, n), r in sorted(mlp.items(), key=lambda kv: kv[0][1]):
        if b != "threads":
            continue
        row = [n, r["mesh"], f"{r['seconds'] * 1e3:.2f}", f"{r['gflops']:.1f}"]
        for pb in PEERS:
            p = mlp.get((pb, n))
            row.append(f"{p['seconds'] * 1e3:.2f} ({p['seconds'] / r['seconds']:.2f}x)" if p else "-")
        rows.append(row)
    out.append(("MLP block, ms (peers: their time and time / ours; > 1: ours faster)",
                ["devices", "mesh", "ours ms", "GFLOP/s", "JAX ms", "DTensor ms"], rows))
    return out


# ---- grad --------------------------------------------------------------------------------------

def plot_grad(recs, folder):
    plt = _plt()
    blocks = [r for r in recs if r["part"] == "block" and r["backend"] == "threads"]
    jax = {(r["name"], r["devices"]): r for r in recs if r["backend"] == "jax-cpu"}
    if not blocks:
        return []
    labels = [f"{r['name']} {r['devices']}d" for r in blocks]
    series = [("ours forward", [r["baseline_seconds"] * 1e3 for r in blocks], COLORS["ours"]),
              ("JAX forward", [jax[(r["name"], r["devices"])]["seconds"] * 1e3 if (r["name"], r["devices"]) in jax else None
                               for r in blocks], COLORS["JAX"]),
              ("ours fwd+bwd", [r["seconds"] * 1e3 for r in blocks], "#aec7e8"),
              ("JAX fwd+bwd", [jax[(r["name"], r["devices"])].get("forward_backward_seconds", 0) * 1e3
                               if (r["name"], r["devices"]) in jax else None for r in blocks], "#ffbb78")]
    dt = {(r["name"], r["devices"]): r for r in recs if r["backend"] == "dtensor-gloo"}
    if dt:
        series.insert(2, ("DTensor forward", [dt[(r["name"], r["devices"])]["seconds"] * 1e3
                                              if (r["name"], r["devices"]) in dt else None for r in blocks], COLORS["DTensor"]))
        series.append(("DTensor fwd+bwd", [dt[(r["name"], r["devices"])]["forward_backward_seconds"] * 1e3
                                           if (r["name"], r["devices"]) in dt else None for r in blocks], "#ff9896"))
    fig, ax = plt.subplots(figsize=(9, 4))
    _bars(ax, labels, series, "ms")
    ax.set_title("pre-LN transformer block (goal: faster than JAX and DTensor; backward <= 3.2x forward)", fontsize=9)
    return [(_save(fig, folder, "grad_block"), "transformer block beside JAX")]


def tables_grad(recs):
    peers = {(r["backend"], r["name"], r["devices"]): r for r in recs if r["backend"] in PEERS}
    rows, context, experts = [], [], []
    for r in recs:
        if r["backend"] in PEERS:
            continue
        if r["part"] == "moe":
            experts.append([r["name"], r["devices"], r["shape"]["tokens"], r["shape"]["experts"], f"{r['seconds'] * 1e3:.1f}",
                            f"{r['baseline_seconds'] * 1e3:.1f}", f"{r['ratio']:.2f}", f"{r['dropped']} / {r['choices']}",
                            f"{r['bytes'] / 2**20:.2f}"])
            continue
        if r["part"] == "context":
            def fmt(v, spec, scale=1.0):
                return "-" if v is None else format(v * scale, spec)
            peak = r.get("peak_bytes", r.get("activation_peak_bytes"))  # (the latter: records before 2026-11-29)
            context.append([r["name"], r["devices"], r["shape"]["seq"], f"{r['seconds'] * 1e3:.1f}",
                            fmt(r["baseline_seconds"], ".1f", 1e3), fmt(r["ratio"], ".2f"), fmt(r.get("vs_all_to_all"), ".2f"),
                            f"{r['bytes'] / 2**20:.2f}", fmt(peak, ".1f", 1 / 2**20)])
            continue
        if r["part"] == "tape":
            rows.append([r["name"], r["devices"], f"{r['seconds'] * 1e6:.2f} us", "-", f"overhead {r['overhead_us']:.3f} us",
                         "-", "-", "-", "-"])
            continue
        row = [r["name"], r["devices"], f"{r['baseline_seconds'] * 1e3:.1f}", f"{r['seconds'] * 1e3:.1f}", f"{r['ratio']:.2f}"]
        for b in PEERS:
            p = peers.get((b, r["name"], r["devices"]))
            row.append(f"{p['seconds'] * 1e3:.1f} ({p['seconds'] / r['baseline_seconds']:.2f}x)" if p else "-")
            row.append(f"{p['forward_backward_seconds'] * 1e3:.1f} ({p['forward_backward_seconds'] / r['seconds']:.2f}x)"
                       if p and p.get("forward_backward_seconds") else "-")
        rows.append(row)
    tables = [("ms; each peer's time and its time / ours (> 1: ours faster)",
               ["case", "devices", "ours fwd", "ours fwd+bwd", "fwd+bwd / fwd (goal <= 3.2)", "JAX fwd", "JAX fwd+bwd",
                "DTensor fwd", "DTensor fwd+bwd"], rows)]
    if context:
        tables.append(("causal attention over a sequence split over every device, forward + backward (ms), beside the "
                       "same attention with the heads split (no communication)",
                       ["case", "devices", "sequence", "fwd+bwd", "heads split", "ratio", "/ all-to-all",
                        "MiB sent per device", "peak MiB (step)"], context))
    if experts:
        tables.append(("a mixture-of-experts layer (sl::moe), forward + backward (ms), beside the dense MLP of the same "
                       "FLOPs per token on the same tokens (data parallel, no communication); goal: ratio <= 1.3",
                       ["case", "devices", "tokens", "experts", "fwd+bwd", "dense MLP", "ratio", "dropped",
                        "MiB sent per device"], experts))
    return tables


# ---- train -------------------------------------------------------------------------------------

def plot_train(recs, folder):
    plt = _plt()
    ours = [r for r in recs if r["backend"] not in PEERS and r.get("part") == "recipe"]
    if not ours:
        return []
    jax = {(r["name"], r["devices"]): r for r in recs if r["backend"] == "jax-cpu"}
    labels = [f"{r['name']} {r['devices']}d" for r in ours]
    series = [("ours", [r["tokens_per_second"] for r in ours], COLORS["ours"]),
              ("JAX", [jax[(r["name"], r["devices"])]["tokens_per_second"] if (r["name"], r["devices"]) in jax else None
                       for r in ours], COLORS["JAX"]),
              ("ours, 1 device", [r["tokens_per_second"] * r["seconds"] / r["baseline_seconds"] for r in ours],
               COLORS["baseline"])]
    fig, ax = plt.subplots(figsize=(9, 4))
    _bars(ax, labels, series, "tokens / s")
    ax.set_title("training step of the small GPT, AdamW (goal: faster than JAX)", fontsize=9)
    return [(_save(fig, folder, "train"), "training tokens per second")]


def tables_train(recs):
    jax = {(r["name"], r["devices"]): r for r in recs if r["backend"] == "jax-cpu"}
    rows = []
    for r in recs:
        if r["backend"] in PEERS or r.get("part") != "recipe":
            continue
        p = jax.get((r["name"], r["devices"]))
        rows.append([r["name"], r["devices"], f"{r['tokens_per_second']:.0f}", f"{r['baseline_seconds'] / r['seconds']:.2f}",
                     f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}",
                     f"{p['tokens_per_second']:.0f}" if p else "-",
                     f"{r['tokens_per_second'] / p['tokens_per_second']:.2f}" if p else "-",
                     ", ".join(f"{k} {v}" for k, v in r.get("collectives", {}).items())])
    out = [("", ["recipe", "devices", "tokens/s", "x 1 device", "loss", "JAX tokens/s", "ours/JAX", "collectives per step"],
            rows)]
    bubbles = [r for r in recs if r["backend"] not in PEERS and r.get("part") == "bubble"]
    if bubbles:  # the pipeline schedules, every device a stage
        out.append(("pipeline bubble (every device a stage; goal: within 10 % of the ideal)",
                    ["schedule", "backend", "stages", "micro-batches", "chunks", "vocab", "bubble", "ideal", "over ideal",
                     "ms / step"],
                    [[r["name"], r["backend"], r["stages"], r["microbatches"], r["chunks"],
                      r.get("config", {}).get("vocab", "-"), f"{r['bubble']:.3f}", f"{r['bubble_ideal']:.3f}",
                      f"{(r['bubble'] / r['bubble_ideal'] - 1) * 100:+.0f} %", f"{r['seconds'] * 1e3:.1f}"]
                     for r in bubbles]))
    return out


# ---- loops, stencil, io, compile -----------------------------------------------------------------

def plot_loops(recs, folder):
    plt = _plt()
    labels = [f"{r['name']} {r['devices']}d" for r in recs]
    fig, ax = plt.subplots(figsize=(9, 4))
    _bars(ax, labels, [("ours", [r["GBps"] for r in recs], COLORS["ours"]),
                       ("hand-written loop", [r["baseline_GBps"] for r in recs], COLORS["baseline"]),
                       ("copy limit", [r["copy_GBps"] for r in recs], COLORS["limit"])], "GB/s")
    ax.set_title("parallel_for / parallel_reduce (goal: >= 0.95 of the hand-written loop)", fontsize=9)
    return [(_save(fig, folder, "loops"), "loops against hand-written loops")]


def tables_loops(recs):
    return [("", ["part", "name", "devices", "ms", "hand ms", "hand/ours (goal >= 0.95)", "GB/s", "of copy"],
             [[r["part"], r["name"], r["devices"], f"{r['seconds'] * 1e3:.3f}", f"{r['baseline_seconds'] * 1e3:.3f}",
               f"{r['ratio_to_baseline']:.3f}", f"{r['GBps']:.2f}", f"{r['fraction_of_copy']:.2f}"] for r in recs])]


def plot_stencil(recs, folder):
    plt = _plt()
    sw = [r for r in recs if r["part"] == "sweep"]
    if not sw:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, nm in zip(axes, sorted({r["name"] for r in sw})):
        for b, style in (("threads", "o-"), ("mpi", "s-")):
            pts = sorted((r["devices"], r) for r in sw if r["name"] == nm and r["backend"] == b)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[1]["GBps"] for p in pts], style, label=f"ours ({b})",
                    color=COLORS["ours"] if b == "threads" else COLORS["ours mpi"])
            ax.plot(xs, [p[1]["GBps"] * p[1]["seconds"] / p[1]["baseline_seconds"] for p in pts], "--",
                    color=COLORS["baseline"], label=f"plain loop ({b})")
            ax.plot(xs, [p[1]["copy_GBps"] for p in pts], ":", color=COLORS["limit"], label="copy limit")
            ax.plot(xs, [0.6 * p[1]["copy_GBps"] for p in pts], ":", color=COLORS["goal"], label="goal 0.60 of copy")
        _device_axis(ax, sorted({r["devices"] for r in sw}))
        ax.set_ylabel("GB/s per device")
        ax.set_title(nm, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return [(_save(fig, folder, "stencil"), "stencil sweeps against the copy limit")]


def tables_stencil(recs):
    rows = []
    for r in recs:
        if r["part"] == "sweep":
            fig = f"{r['fraction_of_copy_bandwidth']:.2f} of copy (goal >= 0.60); plain/ours {r['ratio_to_baseline']:.2f}"
        elif r["part"] == "exchange":
            fig = f"hand/ours {r['baseline_seconds'] / r['seconds']:.2f} (goal >= 0.95)"
        elif r["part"] == "step":
            fig = f"overlapped / max(sweep, exchange) {r['ratio_to_baseline']:.2f} (goal <= 1.10)"
        else:
            fig = f"4 rolls / stencil_for {r['seconds'] / r['baseline_seconds']:.2f}"
        rows.append([r["part"], r["name"], r["backend"], r["devices"], f"{r['seconds'] * 1e3:.3f}",
                     f"{r['baseline_seconds'] * 1e3:.3f}", fig])
    return [("", ["part", "name", "backend", "devices", "ms", "baseline ms", "figure"], rows)]


def plot_io(recs, folder):
    plt = _plt()
    labels = [f"{r['name']} {r['backend'][:3]} {r['devices']}d {r['cache']}" for r in recs]
    fig, ax = plt.subplots(figsize=(10, 4))
    _bars(ax, labels, [("ours", [r["GBps"] for r in recs], COLORS["ours"]),
                       ("plain file, one thread", [r["baseline_GBps"] for r in recs], COLORS["baseline"]),
                       ("goal 0.70 of plain", [0.7 * r["baseline_GBps"] for r in recs], COLORS["goal"])], "GB/s")
    ax.set_title("checkpoint save and load", fontsize=9)
    return [(_save(fig, folder, "io"), "checkpoint bandwidth")]


def tables_io(recs):
    return [("", ["name", "backend", "devices", "cache", "MiB", "GB/s", "plain GB/s", "ours/plain (goal >= 0.70)"],
             [[r["name"], r["backend"], r["devices"], r["cache"], f"{r['bytes'] / 2**20:.0f}", f"{r['GBps']:.2f}",
               f"{r['baseline_GBps']:.2f}", f"{r['fraction_of_baseline']:.2f}"] for r in recs])]


def plot_compile(recs, folder):
    plt = _plt()
    names = [r["name"] for r in recs if r["part"] == "O2"]
    by = {(r["part"], r["name"]): r["seconds"] for r in recs}
    fig, ax = plt.subplots(figsize=(8, 3.8))
    _bars(ax, names, [("front end (-fsyntax-only)", [by.get(("frontend", n)) for n in names], "#aec7e8"),
                      ("-O2", [by.get(("O2", n)) for n in names], COLORS["ours"])], "CPU seconds")
    ax.axhline(10, color=COLORS["goal"], ls=":", lw=1)
    ax.text(0, 10, " goal: quickstart -O2 <= 10 s", fontsize=7, va="bottom")
    ax.set_title("compile time of user TUs (kokkos_core_only: the baseline)", fontsize=9)
    return [(_save(fig, folder, "compile"), "compile time")]


def tables_compile(recs):
    return [("", ["mode", "translation unit", "compiler", "CPU s", "wall s", "MiB", "x Kokkos alone"],
             [[r["part"], r["name"], r["backend"], f"{r['seconds']:.2f}", f"{r['wall_seconds']:.2f}",
               f"{r['peak_rss_mb']:.0f}", f"{r['ratio_to_baseline']:.2f}"] for r in recs])]
