"""The bars the project holds itself to (the targets of its issues), each evaluated on the report's
records: a row [area, figure, goal, measured, result] with result "pass", "short" or "not measured".

A goal over many cases is met when every case meets it; "measured" names the worst case (and the
spread). Peers' goals ("faster than JAX") compare records with the same name and device count.
"""
import statistics

# The peers' backends: their records are never counted as ours (torch-cuda: PyTorch eager on the
# GPU, benchmarks/peers/torch_gpu.py, beside bench_gpu in scripts/gpu-check.sh).
PEER = {"jax": "jax-cpu", "dtensor": "dtensor-gloo", "torch": "torch-cuda", "torch_eager": "torch-eager",
        "torch_compile": "torch-compile"}


def _ours(recs):
    return [r for r in recs if r.get("backend") not in PEER.values()]


def _row(area, figure, goal, values, ok, fmt, worst_is_max):
    """values: [(value, label)]; ok(value) -> bool."""
    if not values:
        return [area, figure, goal, "-", "not measured"]
    worst = max(values, key=lambda v: v[0]) if worst_is_max else min(values, key=lambda v: v[0])
    text = f"{fmt(worst[0])} ({worst[1]})"
    if len(values) > 1:
        text = f"worst {text}; median {fmt(statistics.median(v[0] for v in values))} of {len(values)}"
    passed = all(ok(v[0]) for v in values)
    return [area, figure, goal, text, "pass" if passed else "short"]


def _at_least(area, figure, goal, values, bound, fmt=lambda v: f"{v:.3f}"):
    return _row(area, figure, goal, values, lambda v: v >= bound, fmt, worst_is_max=False)


def _at_most(area, figure, goal, values, bound, fmt=lambda v: f"{v:.3f}"):
    return _row(area, figure, goal, values, lambda v: v <= bound, fmt, worst_is_max=True)


def _faster(area, figure, ours, peers, key, peer_name, speed=lambda r: 1.0 / r["seconds"]):
    """Speed-up of ours over the peer's record with the same key: goal > 1."""
    theirs = {key(r): r for r in peers}
    values = [(speed(r) / speed(theirs[key(r)]), " ".join(str(x) for x in key(r))) for r in ours if key(r) in theirs]
    return _row(area, figure, f"faster than {peer_name} (ours/peer speed > 1)", values, lambda v: v > 1.0,
                lambda v: f"{v:.2f}x", worst_is_max=False)


def evaluate(by_bench):
    rows = []
    g = lambda name: by_bench.get(name, [])  # noqa: E731
    # collectives (issue 3)
    c = _ours(g("collectives"))
    big = max((r["bytes"] for r in c if r["backend"] == "threads"), default=None)
    rows.append(_at_least("collectives", "threads all_gather / reduce_scatter / all_reduce at 64 MiB, of the memcpy limit",
                          ">= 0.60", [(r["fraction_of_baseline"], f"{r['name']} {r['devices']} dev")
                                      for r in c if r["backend"] == "threads" and r["bytes"] == big and big >= 64 << 20
                                      and r["name"] in ("all_gather", "reduce_scatter", "all_reduce")], 0.60))
    rows.append(_at_least("collectives", "mpi at >= 1 MiB, of the raw MPI call's speed", ">= 0.95",
                          [(r["fraction_of_baseline"], f"{r['name']} {r['devices']} ranks {r['bytes'] / 2**20:.0f} MiB")
                           for r in c if r["backend"] == "mpi" and r["bytes"] >= 1 << 20], 0.95))
    rows.append(_at_most("collectives", "threads all_reduce of 8 B on 2 devices", "<= 10 us",
                         [(r["seconds"] * 1e6, "2 dev") for r in c if r["backend"] == "threads" and r["name"] == "all_reduce"
                          and r["bytes"] == 8 and r["devices"] == 2], 10.0, fmt=lambda v: f"{v:.2f} us"))
    # reshard (issue 4)
    rs = g("reshard")
    o = _ours(rs)
    rows.append(_at_most("reshard", "reshard time / the hand-written call, >= 1 MiB", "<= 1.15",
                         [(r["ratio_to_baseline"], f"{r['name']} {r['backend']} {r['bytes'] / 2**20:.0f} MiB")
                          for r in o if r["bytes"] >= 1 << 20], 1.15))
    rows.append(_at_most("reshard", "bytes moved / lower bound", "= 1.00",
                         [(r["bytes_over_bound"], f"{r['name']} {r['backend']}") for r in o], 1.0 + 1e-9))
    for peer in ("jax", "dtensor"):
        rows.append(_faster("reshard", f"reshard beside {peer} (threads backend)", [r for r in o if r["backend"] == "threads"],
                            [r for r in rs if r["backend"] == PEER[peer]], lambda r: (r["name"], r["devices"], r["bytes"]),
                            {"jax": "JAX (jit'd identity with out_shardings)", "dtensor": "DTensor (redistribute, gloo)"}[peer]))
    # ops (issues 5, 11)
    ops = g("ops")
    o = _ours(ops)
    rows.append(_at_most("ops", "host overhead per op above the local kernel (1 device, 32x32)", "<= 1 us",
                         [(r["overhead_us"], r["name"]) for r in o if r["part"] == "overhead"], 1.0,
                         fmt=lambda v: f"{v:.3f} us"))
    for peer in ("jax", "dtensor"):
        rows.append(_faster("ops", f"time per op, 32x32 on 1 device, beside {peer}", [r for r in o if r["part"] == "overhead"],
                            [r for r in ops if r["part"] == "overhead" and r["backend"] == PEER[peer]],
                            lambda r: (r["name"],), {"jax": "JAX eager dispatch", "dtensor": "DTensor eager ops"}[peer]))
    rows.append(_at_least("ops", "sharded matmul (no communication) / single-thread OpenBLAS, same local shapes", ">= 0.90",
                          [(r["fraction_of_baseline"], f"{r['name']} {r['dtype']} {r['devices']} dev")
                           for r in o if r["part"] == "matmul"], 0.90))
    rows.append(_at_least("ops", "SGEMM of the core's float32 peak (the kernel OpenBLAS picks)", ">= 0.80",
                          [(r["fraction_of_peak"], f"{r['name']} {r['devices']} dev") for r in o
                           if r["part"] == "matmul" and r.get("dtype") == "float32" and r.get("fraction_of_peak")], 0.80))
    rows.append(_at_least("ops", "gelu, softmax, layer_norm of the copy bandwidth (float32, 1 core)", ">= 0.50",
                          [(r["fraction_of_copy"], r["name"]) for r in o if r["part"] == "kernels"
                           and "target_fraction_of_copy" in r and r.get("dtype") == "float32"], 0.50))
    rows.append(_at_least("ops", "the same, 128 MiB tensors past the cache, of the memory's copy bandwidth", ">= 0.50",
                          [(r["fraction_of_copy"], r["name"]) for r in o if r["part"] == "kernels"
                           and r["name"].endswith(", beyond cache")], 0.50))
    mlp = [r for r in o if r["part"] == "mlp"]
    rows.append(_faster("ops", "MLP block beside JAX (same devices)", mlp,
                        [r for r in ops if r["part"] == "mlp" and r["backend"] == "jax-cpu"], lambda r: (r["devices"],), "JAX"))
    rows.append(_faster("ops", "MLP block beside DTensor (same devices)", mlp,
                        [r for r in ops if r["part"] == "mlp" and r["backend"] == "dtensor-gloo"], lambda r: (r["devices"],),
                        "DTensor"))
    # grad (issues 11, 12)
    gr = g("grad")
    o = _ours(gr)
    blocks = [r for r in o if r["part"] == "block"]
    for peer, label in (("jax", "JAX"), ("dtensor", "DTensor")):
        pb = {(r["name"], r["devices"]): r for r in gr if r["backend"] == PEER[peer]}
        vals = [(pb[(r["name"], r["devices"])]["seconds"] / r["baseline_seconds"], f"{r['name']} {r['devices']} dev")
                for r in blocks if (r["name"], r["devices"]) in pb]
        rows.append(_row("grad", f"transformer block forward beside {label}", f"faster than {label} (ours/peer speed > 1)",
                         vals, lambda v: v > 1.0, lambda v: f"{v:.2f}x", False))
        vals = [(pb[(r["name"], r["devices"])]["forward_backward_seconds"] / r["seconds"], f"{r['name']} {r['devices']} dev")
                for r in blocks if (r["name"], r["devices"]) in pb and pb[(r["name"], r["devices"])].get("forward_backward_seconds")]
        rows.append(_row("grad", f"transformer block forward + backward beside {label}",
                         f"faster than {label} (ours/peer speed > 1)", vals, lambda v: v > 1.0, lambda v: f"{v:.2f}x", False))
    rows.append(_at_most("grad", "forward + backward / forward, transformer block", "<= 3.2",
                         [(r["ratio"], f"{r['name']} {r['devices']} dev") for r in blocks], 3.2))
    rows.append(_at_most("grad", "tape overhead per recorded op", "<= 1 us",
                         [(r["overhead_us"], r["name"]) for r in o if r["part"] == "tape"], 1.0, fmt=lambda v: f"{v:.3f} us"))
    # issue 42: ring attention beside the all-to-all form; the MoE layer beside the dense MLP
    rows.append(_at_least("grad", "ring attention's speed over the all-to-all form's faster kernel (causal, fwd + bwd)", ">= 0.8",
                          [(1.0 / r["vs_all_to_all"], f"{r['name'][len('context parallel '):]} S {r['shape']['seq']}, {r['devices']} dev")
                           for r in o if r["part"] == "context" and r["name"].startswith("context parallel (ring") and r.get("vs_all_to_all")],
                          0.8))
    # ... and beside JAX's fastest form on the same shapes and devices (forms that failed left out)
    jax_best = {}
    for r in gr:
        if r.get("backend") == PEER["jax"] and r["part"] == "context" and r.get("seconds"):
            key = (r["shape"]["seq"], r["devices"])
            jax_best[key] = min(jax_best.get(key, r["seconds"]), r["seconds"])
    rings = [r for r in o if r["part"] == "context" and r["name"].startswith("context parallel (ring")]
    rows.append(_faster("grad", "ring attention fwd + bwd beside JAX's fastest form (causal, split sequence)",
                        [dict(r, seconds=r["seconds"], key=(r["name"][len("context parallel "):], r["shape"]["seq"], r["devices"]))
                         for r in rings], [dict(seconds=t, key=(n, seq, d)) for (seq, d), t in jax_best.items()
                                           for n in {r["name"][len("context parallel "):] for r in rings}],
                        lambda r: r["key"], "JAX's fastest form"))
    rows.append(_at_most("grad", "MoE layer fwd + bwd over the dense MLP of the same FLOPs per token", "<= 1.3",
                         [(r["ratio"], f"{r['name']}, {r['devices']} dev") for r in o if r["part"] == "moe"], 1.3))
    # train (issue 13)
    tr = g("train")
    rows.append(_faster("train", "tokens/s of each recipe beside JAX (same model, strategy, devices)",
                        [r for r in _ours(tr) if r.get("part", "recipe") == "recipe"],
                        [r for r in tr if r["backend"] == "jax-cpu"], lambda r: (r["name"], r["devices"]), "JAX"))
    # pipeline (issue 41): each pp recipe beside JAX's best strategy on as many devices (JAX has no
    # pipeline), and each schedule's bubble against its ideal (p - 1) / (v m + p - 1)
    best = {}
    for r in tr:
        if r["backend"] == "jax-cpu" and r.get("part", "recipe") == "recipe":
            best[r["devices"]] = max(best.get(r["devices"], 0.0), r["tokens_per_second"])
    rows.append(_at_least("train", "tokens/s of each pipeline recipe over JAX's best strategy on as many devices",
                          "> 1 (ours/JAX best)",
                          [(r["tokens_per_second"] / best[r["devices"]], f"{r['name']} {r['devices']} dev")
                           for r in _ours(tr) if r.get("part") == "recipe" and r["name"].startswith("pp_")
                           and r["devices"] in best], 1.0 + 1e-9, fmt=lambda v: f"{v:.2f}x"))
    rows.append(_at_most("train", "pipeline bubble over its ideal (every device a stage)", "<= 1.10",
                         [(r["bubble"] / r["bubble_ideal"], f"{r['name']} {r['stages']} stages")
                          for r in _ours(tr) if r.get("part") == "bubble" and r["bubble_ideal"] > 0], 1.10))
    # 1F1B holds p micro-batches' activations where GPipe holds all m: its first stage's activation
    # bytes over GPipe's, over p / m (<= 1): held at the ends of ops (activation_held_bytes, what the
    # schedule keeps), and at their peak (the same, where no op holds scratch beside its output).
    bub = {(r["name"], r["backend"], r["stages"]): r for r in _ours(tr)
           if r.get("part") == "bubble" and r.get("activation_peak_bytes")}
    for field, figure in (("activation_held_bytes", "1F1B's activations held per stage (at the ends of ops) over GPipe's, over p/m"),
                          ("activation_peak_bytes", "1F1B's activation peak per stage over GPipe's, over p/m")):
        rows.append(_at_most("train", figure, "<= 1",
                             [(f[field] / bub[("gpipe", b, p)][field] / (f["stages"] / f["microbatches"]),
                               f"{f['stages']} stages, m {f['microbatches']}")
                              for (n, b, p), f in bub.items() if n == "1f1b" and ("gpipe", b, p) in bub
                              and f.get(field) and bub[("gpipe", b, p)].get(field)], 1.0))
    # loops and stencils (issue 15)
    lp = _ours(g("loops"))
    rows.append(_at_least("loops", "parallel_for / parallel_reduce speed of the hand-written loop", ">= 0.95",
                          [(r["ratio_to_baseline"], f"{r['name']} {r['devices']} dev") for r in lp if r["part"] != "alternatives"], 0.95))
    st = _ours(g("stencil"))
    sweeps = [r for r in st if r["part"] == "sweep"]
    rows.append(_at_least("stencil", "2-D 5-point sweep of the copy-bandwidth limit (per device)", ">= 0.60",
                          [(r["fraction_of_copy_bandwidth"], f"{r['name']} {r['backend']} {r['devices']} dev") for r in sweeps
                           if r["name"].startswith("jacobi5")], 0.60))
    rows.append(_at_least("stencil", "stencil_for speed of the plain loop over local()", ">= 0.95",
                          [(r["ratio_to_baseline"], f"{r['name']} {r['backend']} {r['devices']} dev") for r in sweeps], 0.95))
    rows.append(_at_least("stencil", "ghost exchange (mpi, 2+ ranks) speed of the hand-written MPI exchange", ">= 0.95",
                          [(r["baseline_seconds"] / r["seconds"], f"{r['name']} {r['backend']} {r['devices']} dev")
                           for r in st if r["part"] == "exchange" and r["backend"] == "mpi" and r["devices"] > 1], 0.95))
    rows.append(_at_most("stencil", "overlapped step / max(sweep, exchange)", "<= 1.10",
                         [(r["ratio_to_baseline"], f"{r['name']} {r['backend']} {r['devices']} dev")
                          for r in st if r["part"] == "step"], 1.10))
    # io (issue 16)
    io = _ours(g("io"))
    rows.append(_at_least("io", "save and load of >= 256 MiB, of the plain file's bandwidth (loads onto the replicated "
                                "spec, which read the file once per device, left out)", ">= 0.70",
                          [(r["fraction_of_baseline"], f"{r['name']} {r['backend']} {r['devices']} dev {r['cache']}")
                           for r in io if r["bytes"] >= 256 << 20 and not r["name"].endswith("->R")], 0.70))
    # gpu (issue 14): records of bench_gpu on a GPU only (its --host check of the program is no GPU figure)
    gp = [r for r in _ours(g("gpu")) if r.get("gpu", "none").split(" ")[0] != "none"]
    rows.append(_at_least("gpu", "elementwise ops of the device-to-device copy bandwidth", ">= 0.80",
                          [(r["fraction_of_copy"], f"{r['name']} {r['dtype']}") for r in gp if r["part"] == "elementwise"], 0.80))
    rows.append(_at_least("gpu", "row kernels (softmax, log_softmax, layer/RMS norm, their backward, sums along rows, "
                                 "casts; rows of 64 to 32k) of the device-to-device copy bandwidth", ">= 0.80",
                          [(r["fraction_of_copy"], f"{r['name']}") for r in gp if r["part"] == "rows"], 0.80))
    rows.append(_at_least("gpu", "sharded matmul of the speed of cuBLAS called directly on the same local shapes", ">= 0.95",
                          [(r["fraction_of_baseline"], f"{r['name']} {r['dtype']} {r['devices']} dev")
                           for r in gp if r["part"] == "matmul"], 0.95))
    # matmul's launch is a cuBLAS call, whose own host time is not ours: where bench_gpu measured
    # an op next to its direct call too, that record ("stands_for": the op) counts for the op.
    ov = [r for r in gp if r["part"] == "overhead"]
    direct = {r["stands_for"] for r in ov if r.get("stands_for")}
    rows.append(_at_most("gpu", "host overhead per op above its bare launch: a Kokkos kernel, for matmul its cublasGemmEx "
                                "call (1 device, 32x32)", "<= 5 us",
                         [(r["overhead_us"], r["name"]) for r in ov if r["name"] not in direct], 5.0,
                         fmt=lambda v: f"{v:.2f} us"))
    big = max((r["tflops"] for r in gp if r["part"] == "mlp" and r["devices"] == 1 and r.get("peak_tflops")), default=None)
    rows.append(_at_least("gpu", "bf16 MLP block at large sizes (1 device), of the GPU's bf16 peak", ">= 0.50",
                          [(r["fraction_of_peak"], f"{r['name']}, {r['gpu']}") for r in gp if r["part"] == "mlp"
                           and r["devices"] == 1 and r.get("peak_tflops") and r["tflops"] == big], 0.50))
    rows.append(_at_least("gpu", "stencil_for sweep in GPU memory (2-D 5-point, 3-D 7-point) of the device-to-device "
                                 "copy bandwidth", ">= 0.80",
                          [(r["fraction_of_copy"], f"{r['name']} {r['block_shape']} {r['devices']} dev")
                           for r in gp if r["part"] == "stencil" and r["name"].endswith("sweep")], 0.80))
    # A transformer layer's training step beside PyTorch on the same GPU (issue 40; bench_gpu_block and
    # benchmarks/peers/block_torch.py): PyTorch's time over ours, 1 device, same name and dtype.
    blk = [r for r in gp if r["part"] == "block" and r["devices"] == 1 and r["name"].endswith("fwd+bwd")]
    peers = {(r["backend"], r["name"], r["dtype"]): r for r in g("gpu") if r.get("part") == "block"}

    def beside(peer, dtypes):
        return [(peers[(peer, r["name"], r["dtype"])]["seconds"] / r["seconds"], f"{r['name']} {r['dtype']}")
                for r in blk if r["dtype"] in dtypes and (peer, r["name"], r["dtype"]) in peers]
    rows.append(_at_least("gpu", "transformer layer fwd+bwd in bf16 beside PyTorch eager (torch time / ours)", ">= 1.0",
                          beside("torch-eager", ("bf16",)), 1.0))
    rows.append(_at_least("gpu", "transformer layer fwd+bwd in bf16 beside torch.compile with SDPA (torch time / ours)",
                          ">= 0.8", beside("torch-compile", ("bf16",)), 0.8))
    rows.append(_at_least("gpu", "transformer layer fwd+bwd in float32 with TF32 beside PyTorch eager (torch time / ours)",
                          ">= 1.0", beside("torch-eager", ("float32+tf32",)), 1.0))
    rows.append(_at_most("gpu", "a layer's training step in steady state: blocks allocated or freed from GPU memory, "
                                "waits for the GPU", "0",
                         [(r["allocations_per_step"] + r["frees_per_step"] + r["waits_per_step"],
                           f"{r['name']} {r['dtype']} {r['devices']} dev") for r in gp if r["part"] == "block"], 0.0,
                         fmt=lambda v: f"{v:g}"))
    # The cost model on one GPU (issue 44): a layer's bf16 step planned on shapes alone, its predicted
    # time (bench_gpu_block --plan, the GPU's preset profile) over the measured one.
    rows.append(_at_most("gpu", "the cost model's predicted time of a transformer layer's bf16 fwd+bwd on one GPU over "
                                "the measured (|ratio - 1|, issue 44)", "<= 0.25",
                         [(abs(r["prediction_ratio"] - 1), f"{r['name']} {r['dtype']}, {r['profile']}, ratio "
                                                            f"{r['prediction_ratio']:.2f}")
                          for r in blk if r["dtype"] == "bf16" and r.get("prediction_ratio") is not None], 0.25))
    # plan (issue 44): the cost model's step time beside the measured one, each recipe and device count
    pr = [r for r in g("plan") if r.get("part") == "prediction"]
    rows.append(_at_most("plan", "predicted / measured step time, every recipe on 1-8 in-process devices and mpirun -np 2-8 "
                                 "(|ratio - 1|)",
                         "<= 0.25", [(abs(r["prediction_ratio"] - 1), f"{r['name']} {r.get('backend', 'threads')} {r['devices']} dev, ratio "
                                      f"{r['prediction_ratio']:.2f}") for r in pr], 0.25))
    pub = [r for r in g("plan") if r.get("part") == "published"]
    rows.append(_at_most("plan", "GPT-3 175B on 1,024 A100s: predicted TFLOP/s per GPU beside Megatron-LM's published 140 "
                                 "(|ratio - 1|)", "<= 0.25",
                         [(abs(r["prediction_ratio"] - 1), f"device {r['device']}, {r['tflops_per_gpu']:.0f} TFLOP/s")
                          for r in pub], 0.25))
    # compile (issue 10)
    cp = g("compile")
    rows.append(_at_most("compile", "quickstart.cpp at -O2 (CPU seconds of the compiler)", "<= 10 s",
                         [(r["seconds"], f"{r['backend'].split()[0]}, Kokkos alone {r['baseline_seconds']:.1f} s")
                          for r in cp if r["name"] == "quickstart" and r["part"] == "O2"], 10.0, fmt=lambda v: f"{v:.1f} s"))
    return rows
