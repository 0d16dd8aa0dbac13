"""The benchmarks: for each, the executables it builds, its cases (commands, ours and the peers'),
and the table it prints from its records. benchmarks/run's docstring says what each one measures.

A suite's `cases(args, exes, peers)` returns the cases to run; `table(records)` prints the table;
`devices(args)` the device counts (--devices, else the suite's own; `all` runs take `all_devices`,
sized so that `benchmarks/run all` fits in about 20 minutes on 2 cores).
"""
import atexit
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from .runner import BUILD, ROOT, Case, CaseFailed, has_mpi, mpi_env

PEERS = os.path.join(ROOT, "benchmarks", "peers")


class Peers:
    """The peers' Python: the benchmark's own virtual environment (build-bench/peers-venv) with
    jax / torch installed from PyPI on first use; `why` says what is missing when one is not."""

    def __init__(self, enabled):
        self.enabled = enabled
        self._python = {}
        self.why = {}

    def python(self, package):
        """The venv's python with `package` importable, or None (self.why[package] says why)."""
        if not self.enabled:
            self.why[package] = "skipped (--no-peers)"
            return None
        if package not in self._python:
            sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
            from peers import venv  # noqa: E402 (benchmarks/peers/venv.py)
            py = venv.ensure_venv(os.path.join(BUILD, "peers-venv"), [package])
            self._python[package] = py
            if py is None:
                self.why[package] = f"{package} could not be installed from PyPI ({venv.last_error}); its records are left out"
        return self._python[package]


def faster(ours, theirs, who="jax"):
    """'ours 1.23x' or 'jax 1.23x': who is faster, by how much."""
    return f"ours {theirs / ours:.2f}x" if ours <= theirs else f"{who} {ours / theirs:.2f}x"


def threads_and_mpi(bench, exe, args, devices, extra, label):
    """Cases of `exe` on the threads backend for each device count, then under mpirun."""
    cases = [Case(f"{label}, threads, {n} devices", bench, [exe, "--backend", "threads", "--devices", str(n)] + extra)
             for n in devices]
    if not args.no_mpi and has_mpi(exe):
        cases += [Case(f"{label}, mpi, {n} processes", bench,
                       ["mpirun", "-np", str(n), "--oversubscribe", exe, "--backend", "mpi"] + extra, mpi_env())
                  for n in devices]
    return cases


def jax_cases(bench, peers, script, runs, label):
    """Peer cases: `script` (in benchmarks/peers) under the venv's python, one per argument list."""
    py = peers.python("jax")
    if py is None:
        return []
    return [Case(f"{label}: jax {' '.join(a)}", bench, [py, os.path.join(PEERS, script)] + a, peer="jax", timeout=600)
            for a in runs]


def dtensor_cases(bench, peers, runs, label):
    """Peer cases: benchmarks/peers/dtensor_bench.py under torchrun (gloo, N processes)."""
    py = peers.python("torch")
    if py is None:
        return []
    out = []
    for n, a in runs:
        argv = [py, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_port", str(29500 + n),
                os.path.join(PEERS, "dtensor_bench.py")] + a
        env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
        out.append(Case(f"{label}: dtensor {n} processes {' '.join(a)}", bench, argv, env, peer="dtensor", timeout=600))
    return out


# ---- collectives -------------------------------------------------------------------------------

def collectives_cases(args, exes, peers):
    return threads_and_mpi("collectives", exes["bench_collectives"], args, args.devs,
                           ["--max-bytes", str(args.max_bytes)], "collectives")


def collectives_table(records):
    print(f"{'collective':<15}{'backend':<9}{'dev':>4}{'bytes':>12}{'time us':>12}{'busbw GB/s':>12}"
          f"{'baseline':>18}{'base us':>12}{'base/ours':>10}")
    for r in records:
        print(f"{r['name']:<15}{r['backend']:<9}{r['devices']:>4}{r['bytes']:>12.0f}{r['seconds'] * 1e6:>12.2f}"
              f"{r['busbw_GBps']:>12.3f}{r['baseline']:>18}{r['baseline_seconds'] * 1e6:>12.2f}"
              f"{r['fraction_of_baseline']:>10.3f}")


# ---- reshard -----------------------------------------------------------------------------------

def reshard_cases(args, exes, peers):
    extra = ["--max-bytes", str(args.max_bytes)]
    cases = threads_and_mpi("reshard", exes["bench_reshard"], args, args.devs, extra, "reshard")
    cases += jax_cases("reshard", peers, "jax_layout.py", [["--bench", "reshard", "--devices", str(n)] + extra
                                                           for n in args.devs], "reshard")
    cases += dtensor_cases("reshard", peers, [(n, ["--bench", "reshard"] + extra) for n in args.devs], "reshard")
    return cases


def reshard_table(records):
    ours = [r for r in records if r["backend"] in ("threads", "mpi")]
    print(f"{'name':<23}{'backend':<9}{'dev':>4}{'bytes':>11}{'time us':>11}{'baseline':>34}{'base us':>11}"
          f"{'ours/base':>10}{'ours/bare':>10}{'bytes/bound':>12}")
    for r in ours:
        print(f"{r['name']:<23}{r['backend']:<9}{r['devices']:>4}{r['bytes']:>11.0f}{r['seconds'] * 1e6:>11.1f}"
              f"{r['baseline']:>34}{r['baseline_seconds'] * 1e6:>11.1f}{r['ratio_to_baseline']:>10.3f}"
              f"{r['ratio_to_bare_call']:>10.3f}{r['bytes_over_bound']:>12.3f}")
    side_by_side(records, "threads", ("jax-cpu", "dtensor-gloo"), key=("name", "devices", "bytes"),
                 title="reshard, side by side")


def side_by_side(records, ours_backend, peer_backends, key, title):
    """A table of ours next to each peer's record with the same key."""
    ours = {tuple(r[k] for k in key): r for r in records if r["backend"] == ours_backend}
    peers = {(r["backend"],) + tuple(r[k] for k in key): r for r in records if r["backend"] in peer_backends}
    if not peers:
        return
    print()
    print(f"{title:<40}{'dev':>4}{'bytes':>11}{'ours us':>11}" + "".join(f"{b + ' us':>18}{'faster':>15}"
                                                                     for b in peer_backends))
    for k, r in ours.items():
        line = f"{r['name']:<40}{r['devices']:>4}{r.get('bytes', 0):>11.0f}{r['seconds'] * 1e6:>11.1f}"
        any_peer = False
        for b in peer_backends:
            p = peers.get((b,) + k)
            if p:
                any_peer = True
                line += f"{p['seconds'] * 1e6:>18.1f}{faster(r['seconds'], p['seconds'], b.split('-')[0]):>15}"
            else:
                line += f"{'-':>18}{'-':>15}"
        if any_peer:
            print(line)


# ---- ops ---------------------------------------------------------------------------------------

def ops_cases(args, exes, peers):
    exe = exes["bench_ops"]
    base = [exe, "--backend", "threads", "--devices"]
    c = [Case("ops: peak FLOP/s and copy bandwidth", "ops", base + ["1", "--part", "peak"]),
         Case("ops: per-op overhead, 1 device", "ops", base + ["1", "--part", "overhead"])]
    c += [Case(f"ops: matmul, {n} device(s)", "ops", base + [str(n), "--part", "matmul"]) for n in (1, 2)]
    c.append(Case("ops: elementwise, softmax and norm kernels", "ops", base + ["1", "--part", "kernels"]))
    c += [Case(f"ops: MLP block, {n} device(s)", "ops", base + [str(n), "--part", "mlp"]) for n in args.devs]
    c += jax_cases("ops", peers, "jax_blocks.py", [["--bench", "ops", "--devices", str(n)] for n in args.devs], "ops")
    c += jax_cases("ops", peers, "jax_layout.py", [["--bench", "overhead", "--devices", "1"]], "ops")
    c += dtensor_cases("ops", peers, [(1, ["--bench", "overhead"])] +
                       [(n, ["--bench", "mlp"]) for n in args.devs if n in (1, 2, 4, 8)], "ops")
    return c


def ops_table(records):
    for r in records:
        if r["part"] != "peak":
            continue
        if not r.get("measured", True):
            print(f"peak: not measured ({r['why']})")
        elif "peak_gflops" in r:
            print(f"peak: {r['name']}: {r['peak_gflops']:.1f} GFLOP/s = {r['fma_units']} FMA unit(s) (measured: "
                  f"{r['flops_per_cycle']:.2f} flops/cycle) x {r['lanes']} lanes ({r['isa']}) x 2 x {r['clock_ghz']:.3f} GHz "
                  f"(measured)")
        else:
            print(f"peak: {r['name']}: {r['gbytes_per_second']:.1f} GB/s (memcpy of {r['bytes'] / 2 / 2**20:.0f} MiB, "
                  f"read + write counted)")
    print()
    print(f"{'part':<9}{'name':<26}{'dev':>4}{'time us':>12}{'baseline':>44}{'base us':>11}{'ratio':>8}")
    for r in records:
        if r["part"] not in ("overhead", "matmul") or r["backend"] != "threads":
            continue
        base = r.get("baseline", "")
        base_s = r.get("baseline_seconds", float("nan")) * 1e6
        ratio = r.get("fraction_of_baseline", r.get("ratio_to_baseline", float("nan")))
        if r["part"] == "overhead":
            extra = f"  overhead {r['overhead_us']:.3f} us"
        else:
            extra = f"  {r['dtype']} {r['gflops']:.1f} GFLOP/s local {r['local_shape']}"
            if r.get("peak_gflops"):
                extra += (f"; of peak {r['peak_gflops']:.1f}: ours {r['fraction_of_peak']:.2f}, BLAS "
                          f"{r['baseline_fraction_of_peak']:.2f}")
                if "target_fraction_of_peak" in r:
                    extra += f" (target >= {r['target_fraction_of_peak']:.2f})"
        print(f"{r['part']:<9}{r['name']:<26}{r['devices']:>4}{r['seconds'] * 1e6:>12.2f}{base:>44}{base_s:>11.2f}"
              f"{ratio:>8.3f}{extra}")
    peer_overhead = [r for r in records if r["part"] == "overhead" and r["backend"] != "threads"]
    if peer_overhead:
        print()
        ours = {r["name"]: r for r in records if r["part"] == "overhead" and r["backend"] == "threads"}
        print(f"{'per-op time, side by side':<28}{'ours us':>10}{'peer':>14}{'peer us':>10}{'faster':>15}  peer's way")
        for p in peer_overhead:
            r = ours.get(p["name"])
            if r:
                print(f"{p['name']:<28}{r['seconds'] * 1e6:>10.2f}{p['backend']:>14}{p['seconds'] * 1e6:>10.2f}"
                      f"{faster(r['seconds'], p['seconds'], p['backend'].split('-')[0]):>15}  {p.get('how', '')}")
    print()
    print(f"{'kernel':<24}{'dtype':<9}{'shape':<13}{'ms':>9}{'ns/elem':>9}{'GB/s':>8}{'memcpy GB/s':>13}{'of copy':>9}")
    for r in records:
        if r["part"] == "kernels":
            target = f"  (target >= {r['target_fraction_of_copy']:.2f})" if "target_fraction_of_copy" in r else ""
            shape = "x".join(str(d) for d in r["local_shape"])
            print(f"{r['name']:<24}{r['dtype']:<9}{shape:<13}{r['seconds'] * 1e3:>9.3f}{r['ns_per_element']:>9.2f}"
                  f"{r['gbytes_per_second']:>8.1f}{r['copy_gbytes_per_second']:>13.1f}{r['fraction_of_copy']:>9.2f}{target}")
    print()
    mlp = {r["devices"]: r for r in records if r["part"] == "mlp" and r["backend"] == "threads"}
    jax = {r["devices"]: r for r in records if r["part"] == "mlp" and r["backend"] == "jax-cpu"}
    dt = {r["devices"]: r for r in records if r["part"] == "mlp" and r["backend"] == "dtensor-gloo"}
    print(f"{'mlp block':<10}{'dev':>4}{'mesh':>22}{'ours ms':>10}{'GFLOP/s':>9}{'jax ms':>10}{'GFLOP/s':>9}{'faster':>13}"
          f"{'dtensor ms':>12}{'faster':>15}  threads per device (ours)")
    for n, r in sorted(mlp.items()):
        p = jax.get(n)
        side = f"{p['seconds'] * 1e3:>10.2f}{p['gflops']:>9.1f}{faster(r['seconds'], p['seconds']):>13}" if p else \
            f"{'-':>10}{'-':>9}{'-':>13}"
        d = dt.get(n)
        side += f"{d['seconds'] * 1e3:>12.2f}{faster(r['seconds'], d['seconds'], 'dtensor'):>15}" if d else \
            f"{'-':>12}{'-':>15}"
        print(f"{'':<10}{n:>4}{r['mesh']:>22}{r['seconds'] * 1e3:>10.2f}{r['gflops']:>9.1f}{side}"
              f"  gemm {r.get('gemm_threads', '?')}, kernels {r.get('kernel_threads', '?')}")
    if jax:
        cores = next(iter(jax.values())).get("host_cores")
        print(f"(jax: XLA's CPU client runs the virtual devices on a thread pool over the machine's {cores} cores)")
    if 1 in mlp:
        for n, r in sorted(mlp.items()):
            if n != 1:
                print(f"mlp block: {n} devices {mlp[1]['seconds'] / r['seconds']:.2f}x the speed of 1 device")


# ---- io ----------------------------------------------------------------------------------------

def io_cases(args, exes, peers):
    exe = exes.get("bench_io")
    extra = ["--bytes", str(args.bytes), "--reps", str(args.reps or 5), "--dir", args.dir]
    cases = []
    for cache in ([], ["--cold"]):
        cases += threads_and_mpi("io", exe, args, args.devs, extra + cache, "io " + ("cold" if cache else "warm"))
    return cases


def io_table(records):
    print(f"{'name':<14}{'backend':<9}{'dev':>4}{'cache':>6}{'MiB':>6}{'ms':>9}{'GB/s':>7}{'baseline':>30}{'base ms':>9}"
          f"{'GB/s':>7}{'ours/base':>10}")
    for r in records:
        print(f"{r['name']:<14}{r['backend']:<9}{r['devices']:>4}{r['cache']:>6}{r['bytes'] / 2**20:>6.0f}"
              f"{r['seconds'] * 1e3:>9.1f}{r['GBps']:>7.2f}{r['baseline']:>30}{r['baseline_seconds'] * 1e3:>9.1f}"
              f"{r['baseline_GBps']:>7.2f}{r['fraction_of_baseline']:>10.2f}")


# ---- grad --------------------------------------------------------------------------------------

def grad_cases(args, exes, peers):
    exe = exes["bench_grad"]
    extra = ["--quick"] if args.quick else []
    for flag in ("batch", "seq", "dmodel", "heads", "dff", "reps"):
        if getattr(args, flag) is not None:
            extra += ["--" + flag, str(getattr(args, flag))]
    base = [exe, "--backend", "threads"]
    cases = [Case("grad: tape overhead", "grad", base + ["--devices", "1", "--part", "tape"] + extra)]
    for n in args.devs:  # 1: the block on one device; more: DP {n,1} and Megatron TP {n/2,2}
        cases.append(Case(f"grad: block, dp, {n} device(s)", "grad",
                          base + ["--devices", str(n), "--part", "block", "--layout", "dp"] + extra))
        if n > 1 and n % 2 == 0:
            cases.append(Case(f"grad: block, tp, {n} devices", "grad",
                              base + ["--devices", str(n), "--part", "block", "--layout", "tp", "--model", "2"] + extra))
    if max(args.devs) > 1:  # context parallelism: attention over a sequence split over every device
        n = max(args.devs)
        cases.append(Case(f"grad: attention over a split sequence, {n} devices", "grad",
                          base + ["--devices", str(n), "--part", "context"] + extra))
        for k in (1, 2):  # a mixture-of-experts layer beside the dense MLP of the same FLOPs per token
            cases.append(Case(f"grad: moe top-{k}, {n} devices", "grad",
                              base + ["--devices", str(n), "--part", "moe", "--top-k", str(k), "--capacity-factor", "1.0"] + extra))
        if n % 2 == 0:  # each expert (and the dense MLP) tensor parallel over a "model" axis of 2
            cases.append(Case(f"grad: moe tp top-1, {n} devices", "grad",
                              base + ["--devices", str(n), "--part", "moe", "--layout", "tp", "--model", "2", "--top-k", "1",
                                      "--capacity-factor", "1.0"] + extra))
    # The peer: the same block in JAX, the same shapes, layouts and device counts.
    sizes = ["--seq", "16", "--dmodel", "64", "--heads", "2", "--dff", "256", "--reps", "3"] if args.quick else []
    for flag in ("batch", "seq", "dmodel", "heads", "dff", "reps"):
        if getattr(args, flag) is not None:
            sizes += ["--" + flag, str(getattr(args, flag))]
    runs, druns = [], []
    if max(args.devs) > 1:  # the context part's attention in JAX's forms, beside the ring
        runs.append(["--bench", "context", "--devices", str(max(args.devs))] + sizes)
    for n in args.devs:
        runs.append(["--bench", "grad", "--devices", str(n), "--layout", "dp"] + sizes)
        druns.append((n, ["--bench", "block", "--layout", "dp"] + sizes))
        if n > 1 and n % 2 == 0:
            runs.append(["--bench", "grad", "--devices", str(n), "--layout", "tp", "--model", "2"] + sizes)
            druns.append((n, ["--bench", "block", "--layout", "tp", "--model", "2"] + sizes))
    return cases + jax_cases("grad", peers, "jax_blocks.py", runs, "grad") + dtensor_cases("grad", peers, druns, "grad")


def grad_table(records):
    print(f"{'part':<7}{'name':<38}{'dev':>4}{'time us':>13}{'baseline':>10}{'base us':>13}{'ratio':>8}  figure")
    for r in records:
        if r["backend"] in ("jax-cpu", "dtensor-gloo"):
            continue
        if r["part"] == "tape":
            extra_text = f"overhead {r['overhead_us']:.3f} us (target <= 1)"
            ratio = r.get("ratio", float("nan"))
            base_name = "plain" if r["baseline_seconds"] else "none"
        elif r["part"] == "moe":
            sh = r["shape"]
            extra_text = (f"{sh['tokens']} tokens, {sh['experts']} experts of {sh['expert_hidden']} (top-{r['top_k']}, "
                          f"capacity factor {r['capacity_factor']:g}: {r['dropped']} of {r['choices']} choices dropped) "
                          f"beside the dense MLP of {sh['dense_hidden']}; {r['collective_calls']} collectives, "
                          f"{r['bytes'] / 2**20:.2f} MiB sent per device (target ratio <= 1.3)")
            ratio = r["ratio"]
            base_name = "dense"
        elif r["part"] == "context":
            sh = r["shape"]
            alone = r.get("baseline_gflops") is None  # --blockwise-only: the unfused forms do not fit
            vs = r.get("vs_all_to_all")
            kernel = r.get("all_to_all_kernel", "unfused")
            extra_text = (f"causal attention [1, {sh['seq']}, {sh['heads']}, {sh['head_dim']}], fwd+bwd; "
                          + (f"{r['gflops']:.1f} GFLOP/s (the unfused forms' [S, S] scores do not fit); " if alone else
                             f"{r['gflops']:.1f} GFLOP/s vs {r['baseline_gflops']:.1f} with the heads split; ")
                          + (f"{vs:.2f}x the all-to-all form's time ({kernel}); " if vs is not None and "all-to-all" not in r["name"] else "")
                          + (f"{r['vs_ring']:.2f}x the in-order ring's time; " if r.get("vs_ring") is not None and "zig-zag" in r["name"] else "")
                          + f"{r['collective_calls']} collectives, {r['bytes'] / 2**20:.2f} MiB sent per device")
            ratio = r["ratio"] if r["ratio"] is not None else float("nan")
            base_name = "none" if alone else "heads"
        else:
            extra_text = (f"recorded fwd {r['recorded_forward_seconds'] * 1e3:.1f} ms + backward "
                          f"{r['backward_seconds'] * 1e3:.1f} ms ({r['backward_over_forward']:.2f}x forward); "
                          f"{r['gflops']:.1f} GFLOP/s vs {r['baseline_gflops']:.1f}; collectives fwd "
                          f"{r['collectives_forward']}, fwd+bwd {r['collectives_recorded_forward']}+"
                          f"{r['collectives_backward']} (target ratio <= 3.2, FLOP ratio 3)")
            ratio = r["ratio"]
            base_name = r["baseline"]
        print(f"{r['part']:<7}{r['name']:<38}{r['devices']:>4}{r['seconds'] * 1e6:>13.3f}{base_name:>10}"
              f"{(r['baseline_seconds'] or 0) * 1e6:>13.3f}{ratio:>8.3f}  {extra_text}")
    for backend, who in (("jax-cpu", "jax"), ("dtensor-gloo", "dtensor")):
        peer = {(r["name"], r["devices"]): r for r in records if r["backend"] == backend}
        if not peer:
            continue
        print()
        print(f"{'block, side by side with ' + who:<30}{'dev':>4}{'fwd ms':>9}{who + ' ms':>12}{'faster':>15}"
              f"{'fwd+bwd ms':>12}{who + ' ms':>12}{'faster':>15}")
        for r in records:
            p = peer.get((r["name"], r["devices"]))
            if r["part"] != "block" or r["backend"] not in ("threads", "mpi") or p is None:
                continue
            fb = p.get("forward_backward_seconds")
            fbs = f"{fb * 1e3:>12.1f}{faster(r['seconds'], fb, who):>15}" if fb else f"{'-':>12}{'-':>15}"
            print(f"{r['name']:<30}{r['devices']:>4}{r['baseline_seconds'] * 1e3:>9.1f}{p['seconds'] * 1e3:>12.1f}"
                  f"{faster(r['baseline_seconds'], p['seconds'], who):>15}{r['seconds'] * 1e3:>12.1f}{fbs}"
                  f"  gemm {r.get('gemm_threads', '?')}, kernels {r.get('kernel_threads', '?')} thread(s) per device")
    jax_context = [r for r in records if r["backend"] == "jax-cpu" and r["part"] == "context"]
    if jax_context:
        print()
        print(f"{'causal attention over a split sequence':<40}{'dev':>4}{'S':>7}{'fwd+bwd ms':>12}  form")
        for r in records:
            if r["part"] == "context" and (r["backend"] in ("threads", "mpi") or r in jax_context):
                t = f"{r['seconds'] * 1e3:>12.1f}" if r.get("seconds") else f"{'failed':>12}"
                print(f"{r['name']:<40}{r['devices']:>4}{r['shape']['seq']:>7}{t}  {r.get('error', '')[:80]}")
    jax = [r for r in records if r["backend"] == "jax-cpu"]
    if jax:
        print(f"(ours: each device's threads as listed; jax: XLA's CPU client, a thread pool over the machine's "
              f"{jax[0].get('host_cores')} cores; dtensor: one process per device, cores / devices torch threads each)")


# ---- loops -------------------------------------------------------------------------------------

def loops_cases(args, exes, peers):
    extra = []
    for flag in ("rows", "cols"):
        if getattr(args, flag) is not None:
            extra += ["--" + flag, str(getattr(args, flag))]
    return [Case(f"loops: {n} device(s)", "loops", [exes["bench_loops"], "--backend", "threads", "--devices", str(n)] + extra)
            for n in args.devs]


def loops_table(records):
    print(f"{'part':<13}{'name':<26}{'dev':>4}{'ms':>9}{'hand ms':>9}{'hand/ours':>10}{'GB/s':>8}{'hand GB/s':>10}"
          f"{'copy GB/s':>10}{'of copy':>8}")
    for r in records:
        print(f"{r['part']:<13}{r['name']:<26}{r['devices']:>4}{r['seconds'] * 1e3:>9.3f}{r['baseline_seconds'] * 1e3:>9.3f}"
              f"{r['ratio_to_baseline']:>10.3f}{r['GBps']:>8.2f}{r['baseline_GBps']:>10.2f}{r['copy_GBps']:>10.2f}"
              f"{r['fraction_of_copy']:>8.2f}")


# ---- stencil -----------------------------------------------------------------------------------

def stencil_cases(args, exes, peers):
    exe = exes["bench_stencil"]
    extra = ["--weak", "0" if args.strong else "1"]
    if args.n:
        extra += ["--n", str(args.n)]
    if args.m:
        extra += ["--m", str(args.m)]
    mpi = not args.no_mpi and has_mpi(exe)
    cases = []
    for part in ("sweep", "exchange", "step"):
        for backend in ["threads"] + (["mpi"] if mpi else []):
            for n in args.devs:
                if backend == "threads":
                    argv, env = [exe, "--backend", "threads", "--devices", str(n), "--part", part] + extra, None
                else:
                    argv = ["mpirun", "-np", str(n), "--oversubscribe", exe, "--backend", "mpi", "--part", part] + extra
                    env = mpi_env()
                cases.append(Case(f"stencil: {part}, {backend}, {n} device(s)", "stencil", argv, env))
    for n in (1, 4):  # whole-array form (4 rolls) vs stencil_for, 2048^2
        cases.append(Case(f"stencil: roll, threads, {n} device(s)", "stencil",
                          [exe, "--backend", "threads", "--devices", str(n), "--part", "roll"] + extra))
    return cases


def stencil_table(records):
    print(f"{'part':<9}{'name':<13}{'backend':<8}{'dev':>4}{'ms':>10}{'base ms':>10}{'base/ours':>10}  figure")
    for r in records:
        if r["part"] == "sweep":
            fig = (f"{r['GBps']:.1f} GB/s: {r['fraction_of_copy_bandwidth']:.2f} of STREAM copy's {r['copy_GBps']:.1f} "
                   f"(target >= 0.60), {r['fraction_of_memcpy']:.2f} of memcpy's {r['memcpy_GBps']:.1f}; "
                   f"plain loop / ours {r['ratio_to_baseline']:.2f} (target >= 0.95)")
        elif r["part"] == "roll":
            fig = (f"4 rolls {r['seconds'] * 1e3:.2f} ms vs stencil_for (periodic ghosts) {r['baseline_seconds'] * 1e3:.2f} ms: "
                   f"the roll form takes {r['seconds'] / r['baseline_seconds']:.2f}x as long")
        elif r["part"] == "exchange":
            fig = f"{r['bytes'] / 1e3:.1f} kB to device 0 (target >= 0.95 of the hand-written exchange)"
        else:
            fig = (f"overlapped / max(sweep {r['sweep_seconds'] * 1e3:.2f}, exchange {r['exchange_seconds'] * 1e3:.3f} ms) "
                   f"= {r['ratio_to_baseline']:.2f} (target <= 1.1); blocking {r['blocking_seconds'] * 1e3:.2f} ms")
        ratio = r["baseline_seconds"] / r["seconds"] if r["part"] != "step" else r["ratio_to_baseline"]
        print(f"{r['part']:<9}{r['name']:<13}{r['backend']:<8}{r['devices']:>4}{r['seconds'] * 1e3:>10.3f}"
              f"{r['baseline_seconds'] * 1e3:>10.3f}{ratio:>10.3f}  {fig}")


# ---- train -------------------------------------------------------------------------------------

TRAIN_SIZES = {"vocab": 512, "seq": 128, "dim": 256, "heads": 8, "ff": 1024, "layers": 2, "batch": 16}
TRAIN_RECIPES = "dp,zero1,zero2,zero3,tp,dp_tp"
TRAIN_PP_RECIPES = "pp_dp,pp_zero1,pp_zero2,pp_tp"


def _xla_names(r):
    """A jax_train.py record with XLA's op names (all-reduce) as ours (all_reduce), kinds that occurred only."""
    r["collectives"] = {k.replace("-", "_"): v for k, v in r.get("collectives", {}).items() if v}
    return r


def train_cases(args, exes, peers):
    sizes = []
    for k, v in TRAIN_SIZES.items():
        sizes += ["--" + k, str(getattr(args, "train_" + k, None) or v)]
    recipes = args.recipe or TRAIN_RECIPES
    steps = str(args.steps or 10)
    cases = [Case(f"train: {recipes}, {n} device(s)", "train",
                  [exes["bench_train"], "--devices", str(n), "--recipe", recipes, "--steps", steps] + sizes)
             for n in args.devs]
    peer = jax_cases("train", peers, "jax_train.py",
                     [["--devices", str(n), "--recipe", recipes, "--steps", steps] + sizes for n in args.devs], "train")
    for c in peer:
        c.post = _xla_names
    # Pipeline parallelism (ours alone: jax_train.py has no pipeline): the recipes on 2 stages of the
    # same model, and each schedule's bubble measured with every device a stage.
    if not args.recipe:
        # A mixture of experts (Switch, 2 experts a device over "data") beside the dense dp.
        cases += [Case(f"train: dp_moe, {n} devices", "train",
                       [exes["bench_train"], "--devices", str(n), "--recipe", "dp_moe", "--steps", steps] + sizes)
                  for n in args.devs if n > 1]
        cases += [Case(f"train: {TRAIN_PP_RECIPES}, {n} device(s)", "train",
                       [exes["bench_train"], "--devices", str(n), "--recipe", TRAIN_PP_RECIPES, "--steps", steps] + sizes)
                  for n in args.devs if n % 2 == 0]
        # The bubble cases' vocabulary is 64, so that the last stage's LM head and loss (a sixth of
        # a layer's work at vocabulary 512) do not unbalance the stages: the ideal bubble is that of
        # equal stages (an interleaved chunk is 2 layers; docs/11 has both).
        bubble_sizes = list(sizes)
        bubble_sizes[bubble_sizes.index("--vocab") + 1] = "64"
        cases += [Case(f"train: pipeline bubbles, {n} stages", "train",
                       [exes["bench_train"], "--bubble", "--devices", str(n), "--steps", steps] + bubble_sizes)
                  for n in (4, 8) if n <= max(args.devs)]
    return cases + peer


def train_table(records):
    bubbles = [r for r in records if r.get("part") == "bubble"]
    records = [r for r in records if r.get("part") != "bubble"]
    ours = {(r["name"], r["devices"]): r for r in records if r["backend"] != "jax-cpu"}
    peer = {(r["name"], r["devices"]): r for r in records if r["backend"] == "jax-cpu"}
    print(f"{'recipe':<8}{'dev':>4}{'tokens/s':>11}{'x 1 device':>11}{'loss':>17}{'jax tokens/s':>14}"
          f"{'ours/jax':>10}  collectives per step (ours)")
    for key, r in ours.items():
        p = peer.get(key)
        jt = f"{p['tokens_per_second']:>14.0f}" if p else f"{'-':>14}"
        ratio = f"{r['tokens_per_second'] / p['tokens_per_second']:>10.2f}" if p else f"{'-':>10}"
        coll = ", ".join(f"{k} {v}" for k, v in r["collectives"].items())
        print(f"{r['name']:<8}{r['devices']:>4}{r['tokens_per_second']:>11.0f}"
              f"{r['baseline_seconds'] / r['seconds']:>11.2f}{r['first_loss']:>8.3f} ->{r['last_loss']:>6.3f}"
              f"{jt}{ratio}  {coll}")
    if bubbles:
        print(f"\n{'schedule':<13}{'stages':>7}{'m':>4}{'v':>3}{'vocab':>6}{'bubble':>9}{'ideal':>8}{'over':>7}{'ms/step':>10}")
        for r in bubbles:
            print(f"{r['name']:<13}{r['stages']:>7}{r['microbatches']:>4}{r['chunks']:>3}"
                  f"{r.get('config', {}).get('vocab', '-'):>6}{r['bubble']:>9.3f}{r['bubble_ideal']:>8.3f}"
                  f"{(r['bubble'] / r['bubble_ideal'] - 1) * 100:>+6.0f}%{r['seconds'] * 1e3:>10.1f}")


# ---- calibrate, plan ----------------------------------------------------------------------------

def profile_path(args, n, backend="threads"):
    """Where `benchmarks/run calibrate` writes the profile of n devices (--out DIR, else the report
    folder): host-N.json for in-process devices, host-mpi-N.json for N processes."""
    folder = getattr(args, "profile_dir", None) or os.path.join(args.report, "profiles")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"host-{n}.json" if backend == "threads" else f"host-{backend}-{n}.json")


def calibrate_cases(args, exes, peers):
    quick = ["--quick"] if args.quick else []
    return [Case(f"calibrate: {n} device(s)", "calibrate",
                 [exes["bench_calibrate"], "--devices", str(n), "--out", profile_path(args, n)] + quick)
            for n in args.devs]


def calibrate_table(records):
    fits = [r for r in records if r.get("part") == "profile" and r.get("name") == "fit"]
    print(f"{'backend':>8}{'dev':>4}{'shared':>7}{'GEMM GFLOP/s':>14}{'us/matrix':>10}{'batched':>9}"
          f"{'kernels GB/s':>14}{'us/kernel':>11}{'link us/step':>14}{'link GB/s':>11}")
    for r in fits:
        print(f"{r.get('backend', 'threads'):>8}{r['devices']:>4}{r.get('shared', 1):>7.3g}"
              f"{r['gemm_rate'] * 1e-9:>14.3g}{r.get('gemm_product', r.get('gemm_call', 0)) * 1e6:>10.3g}"
              f"{r.get('batched_gemm_rate', 0) * 1e-9:>9.3g}"
              f"{r['memory_bandwidth'] * 1e-9:>14.3g}{r['kernel_call'] * 1e6:>11.3g}"
              f"{r['intra_latency'] * 1e6:>14.3g}{r['intra_bandwidth'] * 1e-9:>11.3g}")


PLAN_RECIPES = "dp,zero2,zero3,tp,dp_tp,pp_dp"


def plan_cases(args, exes, peers):
    """Each device count: calibrate (bench_calibrate writes the profile), then the training
    benchmark's recipes measured beside the cost model's prediction from that profile; in-process
    devices, then (2 devices or more) as many processes under mpirun."""
    sizes = []
    for k, v in TRAIN_SIZES.items():
        sizes += ["--" + k, str(getattr(args, "train_" + k, None) or v)]
    mpi = not args.no_mpi and has_mpi(exes["bench_train"]) and has_mpi(exes["bench_calibrate"])
    cases = []
    for n in args.devs:
        recipes = ",".join(r for r in (args.recipe or PLAN_RECIPES).split(",") if not r.startswith("pp") or n % 2 == 0)
        for backend in ["threads"] + (["mpi"] if mpi and n >= 2 else []):
            prof = profile_path(args, n, backend)
            if backend == "threads":
                launch, env, what = [], None, f"{n} device(s)"
            else:
                launch, env, what = ["mpirun", "-np", str(n), "--oversubscribe"], mpi_env(), f"{n} mpi processes"
            cases.append(Case(f"plan: calibrate {what}", "plan",
                              launch + [exes["bench_calibrate"], "--backend", backend, "--devices", str(n), "--out", prof],
                              env, post=_to_plan))
            cases.append(Case(f"plan: {recipes}, {what}, predicted and measured", "plan",
                              launch + [exes["bench_train"], "--backend", backend, "--devices", str(n), "--recipe",
                                        recipes, "--steps", str(args.steps or 10), "--profile", prof] + sizes,
                              env, post=_to_plan))
    cases.append(Case("plan: GPT-3 175B on 1,024 simulated A100s beside Megatron-LM's published figure", "plan",
                      [exes["bench_train"], "--published"], post=_to_plan))
    return cases


def _to_plan(r):
    """A record of the plan suite's cases (bench_calibrate's, bench_train's) into its section; a
    recipe's measured-and-predicted record is part "prediction"."""
    if r.get("bench") == "train" and r.get("part") == "recipe":
        r["part"] = "prediction"
    r["bench"] = "plan"
    return r


def plan_table(records):
    calibrate_table(records)
    print()
    rows = [r for r in records if r.get("part") == "prediction"]
    print(f"{'recipe':<8}{'backend':>8}{'dev':>4}{'measured ms':>13}{'predicted ms':>14}{'ratio':>7}"
          f"{'GEMMs':>8}{'kernels':>9}{'bubble':>8}{'comm':>8}")
    for r in rows:
        p = r["predicted"]
        print(f"{r['name']:<8}{r.get('backend', 'threads'):>8}{r['devices']:>4}{r['seconds'] * 1e3:>13.2f}"
              f"{r['predicted_seconds'] * 1e3:>14.2f}"
              f"{r['prediction_ratio']:>7.2f}{p['gemm'] * 1e3:>8.2f}{p['kernels'] * 1e3:>9.2f}{p['bubble'] * 1e3:>8.2f}"
              f"{(p['intra_node'] + p['inter_node']) * 1e3:>8.2f}")
    for r in (r for r in records if r.get("part") == "published"):
        p = r["predicted"]
        print(f"\n{r['name']}, device {r['device']} of {r['devices']} ({r['config']}): predicted "
              f"{r['tflops_per_gpu']:.0f} TFLOP/s per GPU beside the published {r['published_tflops_per_gpu']:.0f} "
              f"(ratio {r['prediction_ratio']:.2f}); step {r['seconds']:.1f} s: GEMMs {p['gemm']:.1f}, kernels "
              f"{p['kernels']:.1f}, bubble {p['bubble']:.1f}, intra-node {p['intra_node']:.1f}, inter-node "
              f"{p['inter_node']:.1f} s; planned in {r['plan_seconds']:.1f} s")


# ---- gpu ---------------------------------------------------------------------------------------

class Skipped(Exception):
    """A benchmark that cannot run on this machine (no GPU, no CUDA-enabled Kokkos): its section
    says why and is marked skipped, not failed."""


def gpu_here():
    """(name, compute capability) of the first GPU nvidia-smi lists, or (None, why not)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi is not on the PATH (no NVIDIA driver on this machine)"
    r = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True, text=True)
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    if r.returncode != 0 or not lines:
        return None, f"nvidia-smi lists no GPU ({(r.stderr or r.stdout).strip()[:200] or 'no output'})"
    name, _, cap = lines[0].rpartition(",")
    return (name.strip(), cap.strip()), None


def cuda_kokkos(args):
    """The CUDA-enabled Kokkos install to build with: --kokkos DIR, else $SHARDLIB_KOKKOS_CUDA; None
    when neither is given. A folder that is not one is an error naming what is missing."""
    folder = args.kokkos or os.environ.get("SHARDLIB_KOKKOS_CUDA")
    if not folder:
        return None
    folder = os.path.abspath(folder)
    wrapper = os.path.join(folder, "bin", "nvcc_wrapper")
    config = os.path.join(folder, "include", "KokkosCore_config.h")
    if not os.path.exists(wrapper) or not os.path.exists(config):
        raise CaseFailed(f"--kokkos {folder} is not a Kokkos install with CUDA: it needs bin/nvcc_wrapper and "
                         f"include/KokkosCore_config.h (cmake --install of a Kokkos configured with -DKokkos_ENABLE_CUDA=ON)")
    with open(config) as f:
        if not re.search(r"^#define KOKKOS_ENABLE_CUDA\b", f.read(), re.M):
            raise CaseFailed(f"the Kokkos in {folder} was built without CUDA (no KOKKOS_ENABLE_CUDA in {config})")
    libdir = next((d for d in (os.path.join(folder, "lib"), os.path.join(folder, "lib64"))
                   if os.path.exists(os.path.join(d, "libkokkoscore.a")) or os.path.exists(os.path.join(d, "libkokkoscore.so"))),
                  None)
    if libdir is None:
        raise CaseFailed(f"the Kokkos in {folder} has no libkokkoscore in lib/ or lib64/")
    return folder, wrapper, libdir


def gpu_build_argv(wrapper, folder, libdir, arch, out, source="gpu.cpp", extra=()):
    """The compile-and-link command of a GPU benchmark with Kokkos's nvcc_wrapper (as docs/13 says)."""
    eigen = subprocess.run(["pkg-config", "--cflags", "eigen3"], capture_output=True, text=True).stdout.split() \
        if shutil.which("pkg-config") else []
    eigen = [("-isystem" + a[2:]) if a.startswith("-I") else a for a in eigen] or ["-isystem/usr/include/eigen3"]
    return [wrapper, "-std=c++20", "-extended-lambda", f"-arch=sm_{arch}", "-O3", "-DNDEBUG",
            "-I" + os.path.join(ROOT, "include"), "-I" + os.path.join(folder, "include")] + eigen + list(extra) + \
           [os.path.join(ROOT, "benchmarks", source), "-o", out, "-L" + libdir, "-lkokkoscore", "-lcublas", "-lcuda", "-ldl"]


def cudnn_frontend():
    """The cuDNN frontend's include folder for the fused attention (bench_gpu_block): $SHARDLIB_CUDNN_FRONTEND,
    else build-gpu/cudnn-frontend/include (scripts/gpu-check.sh build fetches it there), else fetched from PyPI
    into build-bench/cudnn-frontend; None (the unfused ops then run) when none can be had."""
    for d in (os.environ.get("SHARDLIB_CUDNN_FRONTEND"), os.path.join(ROOT, "build-gpu", "cudnn-frontend", "include"),
              os.path.join(BUILD, "cudnn-frontend", "include")):
        if d and os.path.exists(os.path.join(d, "cudnn_frontend.h")):
            return d
    tmp = tempfile.mkdtemp(prefix="shardlib-cudnn-")
    atexit.register(shutil.rmtree, tmp, True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp,
                        "nvidia-cudnn-frontend==1.32.0"], capture_output=True, text=True)
    wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
    if r.returncode != 0 or not wheels:
        print("  the cuDNN frontend could not be fetched: bench_gpu_block runs attention unfused", file=sys.stderr)
        return None
    import zipfile
    dest = os.path.join(BUILD, "cudnn-frontend")
    with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z:
        z.extractall(dest, [n for n in z.namelist() if n.startswith("include/")])
    return os.path.join(dest, "include")


def build_gpu(kokkos, arch, source="gpu.cpp", name="bench_gpu_cuda", extra=()):
    """build-bench/benchmarks/NAME compiled from benchmarks/SOURCE with nvcc_wrapper for sm_ARCH;
    again only when a header, the source or the command changed."""
    folder, wrapper, libdir = kokkos
    out = os.path.join(BUILD, "benchmarks", name)
    argv = gpu_build_argv(wrapper, folder, libdir, arch, out, source, extra)
    stamp = out + ".cmd"
    sources = [os.path.join(ROOT, "benchmarks", f) for f in (source, "common.hpp", "gpu_common.hpp")]
    for d, _, files in os.walk(os.path.join(ROOT, "include")):
        sources += [os.path.join(d, f) for f in files]
    try:
        fresh = open(stamp).read() == shlex.join(argv) and \
            os.path.getmtime(out) >= max(os.path.getmtime(f) for f in sources)
    except OSError:
        fresh = False
    if fresh:
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    env = dict(os.environ)
    if shutil.which("nvcc") is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        env["PATH"] = "/usr/local/cuda/bin:" + env.get("PATH", "")
    print(f"  building {out} with {wrapper} (sm_{arch}; minutes) ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        errors = [line for line in r.stdout.splitlines() if "error" in line]
        raise CaseFailed(f"nvcc_wrapper could not build {name}: $ {shlex.join(argv)}\n" +
                         "\n".join((errors or r.stdout.splitlines())[-30:]))
    with open(stamp, "w") as f:
        f.write(shlex.join(argv))
    print(f"  built in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def gpu_cases(args, exes, peers):
    kokkos = cuda_kokkos(args)
    gpu, why = gpu_here()
    if kokkos is None:
        raise Skipped(("no GPU here: " + why + "; " if gpu is None else "") +
                      "no CUDA-enabled Kokkos was given: benchmarks/run gpu --kokkos DIR (or SHARDLIB_KOKKOS_CUDA=DIR), "
                      "DIR a Kokkos install configured with -DKokkos_ENABLE_CUDA=ON (docs/13)")
    arch = args.cuda_arch or (gpu[1].replace(".", "") if gpu else "90")
    exe = build_gpu(kokkos, arch)  # where there is no GPU, this still checks that it builds
    if gpu is None:
        raise Skipped(f"no GPU here: {why} (bench_gpu was built for sm_{arch}: {exe})")
    base = [exe, "--backend", "threads", "--devices"]
    c = [Case("gpu: elementwise against cudaMemcpy, 1 device", "gpu", base + ["1", "--part", "elementwise"]),
         Case("gpu: row kernels against cudaMemcpy, 1 device", "gpu", base + ["1", "--part", "rows"]),
         Case("gpu: per-op host overhead, 1 device", "gpu", base + ["1", "--part", "overhead"])]
    c += [Case(f"gpu: matmul against cuBLAS, {n} device(s)", "gpu", base + [str(n), "--part", "matmul"]) for n in (1, 2)]
    c += [Case(f"gpu: MLP block, {n} device(s)", "gpu", base + [str(n), "--part", "mlp"]) for n in args.devs]
    c += [Case(f"gpu: reshards, {n} devices", "gpu", base + [str(n), "--part", "reshard"]) for n in args.devs if n > 1]
    c += [Case(f"gpu: stencil_for against cudaMemcpy, {n} device(s)", "gpu", base + [str(n), "--part", "stencil"])
          for n in args.devs]
    # A transformer layer's training step (bench_gpu_block, cuDNN's fused attention where it loads),
    # then the same layer in PyTorch on the same GPU (eager, torch.compile): the python that has torch.
    front = cudnn_frontend()
    block = build_gpu(kokkos, arch, "gpu_block.cpp", "bench_gpu_block_cuda",
                      ["-DSHARDLIB_HAVE_CUDNN=1", "-isystem" + front] if front else [])
    for cfg, dtype in (("gpt2", "bf16"), ("large", "bf16"), ("gpt2", "tf32")):
        c += [Case(f"gpu: transformer layer {cfg} {dtype}, {n} device(s)", "gpu",
                   [block, "--backend", "threads", "--devices", str(n), "--config", cfg, "--dtype", dtype])
              for n in (1, 2)]
    torch_py = next((p for p in (shutil.which("python3"), sys.executable) if p and subprocess.run(
        [p, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
        capture_output=True).returncode == 0), None)
    if torch_py:
        c.append(Case("gpu: the layer in PyTorch (eager, torch.compile)", "gpu",
                      [torch_py, os.path.join(PEERS, "block_torch.py"), "--configs", "gpt2,large", "--dtypes", "bf16,tf32",
                       "--compile-configs", "gpt2,large"],
                      peer="torch", timeout=600))
    return c


def gpu_table(records):
    print(f"GPU: {records[0]['gpu']}" if records else "")
    for r in records:
        p, name, dev = r["part"], r["name"], r["devices"]
        if p in ("elementwise", "rows"):
            print(f"{p:<12}{name + ' ' + r['dtype']:<26}{dev:>4}{r['gbytes_per_second']:>10.1f} GB/s  copy "
                  f"{r['copy_gbytes_per_second']:>8.1f} GB/s  fraction {r['fraction_of_copy']:.3f} (target >= 0.8)")
        elif p == "matmul":
            print(f"{p:<12}{name + ' ' + r['dtype']:<26}{dev:>4}{r['tflops']:>10.1f} TFLOP/s  direct "
                  f"{r['baseline_tflops']:>8.1f}  fraction {r['fraction_of_baseline']:.3f} (target >= 0.95)")
        elif p == "overhead":
            print(f"{p:<12}{name:<26}{dev:>4}{r['seconds'] * 1e6:>10.2f} us  bare launch {r['baseline_seconds'] * 1e6:.2f} us"
                  f"  overhead {r['overhead_us']:.2f} us (target <= 5)")
        elif p == "mlp":
            peak = f"{r['fraction_of_peak']:.3f} of peak {r['peak_tflops']}" if r.get("peak_tflops") else "peak unknown"
            print(f"{p:<12}{name:<26}{dev:>4}{r['tflops']:>10.1f} TFLOP/s  {peak} (target >= 0.5); "
                  f"{r['fraction_of_cublas']:.3f} of cuBLAS's {r['cublas_tflops']:.1f}")
        elif p == "reshard":
            print(f"{p:<12}{name:<26}{dev:>4}{r['seconds'] * 1e6:>10.1f} us  bare copies {r['baseline_seconds'] * 1e6:.1f} us"
                  f"  {r['ratio_to_baseline']:.2f}x")
        elif p == "block":
            print(f"{p:<12}{name + ' ' + r['dtype']:<26}{dev:>4}{r['seconds'] * 1e3:>10.3f} ms  {r['tflops']:.1f} TFLOP/s"
                  f"  attention: {r['attention_kernel']}; per step {r['allocations_per_step']:g} allocations, "
                  f"{r['frees_per_step']:g} frees, {r['waits_per_step']:g} waits"
                  + (f"; predicted {r['predicted_seconds'] * 1e3:.3f} ms on {r['profile']} ({r['prediction_ratio']:.2f})"
                     if r.get("predicted_seconds") is not None else ""))
        elif p == "stencil":
            print(f"{p:<12}{name:<26}{dev:>4}{r['gbytes_per_second']:>10.1f} GB/s  copy "
                  f"{r['copy_gbytes_per_second']:>8.1f} GB/s  fraction {r['fraction_of_copy']:.3f} (block {r['block_shape']})")


# ---- compile -----------------------------------------------------------------------------------

COMPILE_TUS = [  # (name, source relative to the root); the first is the baseline
    ("kokkos_core_only", "benchmarks/compile/kokkos_core.cpp"),
    ("shardlib_hpp_only", "benchmarks/compile/shardlib_header.cpp"),
    ("one_matmul", "benchmarks/compile/one_matmul.cpp"),
    ("one_reshard", "benchmarks/compile/one_reshard.cpp"),
    ("quickstart", "examples/quickstart.cpp"),
    ("mlp_backward", "benchmarks/compile/mlp_backward.cpp"),
]


def compile_commands():
    """The release build's compile command of each benchmark TU (the build configured by the caller)."""
    subprocess.run(["ninja", "-C", BUILD, "build.ninja"], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(BUILD, "compile_commands.json")) as f:
        entries = json.load(f)
    out = {}
    for name, src in COMPILE_TUS:
        want = os.path.realpath(os.path.join(ROOT, src))
        for e in entries:
            if "compile_bench_tus" in e["output"] and \
                    os.path.realpath(os.path.join(e["directory"], e["file"])) == want:
                out[name] = (e["directory"], shlex.split(e["command"]))
        if name not in out:
            raise CaseFailed(f"no compile command for {src} in {BUILD}/compile_commands.json")
    return out


def compile_argv(argv, mode, compiler, obj):
    """The TU's command for `mode` ("frontend": -fsyntax-only; "O2": -O2 object, no debug info), run by
    `compiler` when given, never through ccache, without dependency-file output. The benchmarks'
    -march=native is left out: the TUs are compiled with the flags a user's portable build has."""
    args = list(argv)
    while args and os.path.basename(args[0]) in ("ccache", "sccache"):
        args = args[1:]
    if compiler:
        args[0] = compiler
    out, skip = [args[0]], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MQ", "-MF", "-MT"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD", "-fdiagnostics-color=always", "-march=native") or \
                re.fullmatch(r"-O[0-3sgz]?|-g[0-3]?", a):
            continue
        out.append(a)
    return out + (["-fsyntax-only"] if mode == "frontend" else ["-O2", "-c", "-o", obj])


def compiler_version(cmd0):
    first = subprocess.run([cmd0, "--version"], capture_output=True, text=True).stdout.splitlines()
    return first[0] if first else cmd0


def time_compile(cwd, argv):
    """CPU seconds (user + sys), wall seconds and peak memory of one compiler run."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if status != 0:
        raise CaseFailed("the compiler failed: $ " + shlex.join(argv), err[-3000:])
    return ru.ru_utime + ru.ru_stime, wall, ru.ru_maxrss / 1024.0


def compile_cases(args, exes, peers):
    cmds = compile_commands()
    compilers = args.compilers.split(",") if args.compilers else [None]
    tmp = tempfile.mkdtemp(prefix="shardlib-compile-")
    atexit.register(shutil.rmtree, tmp, True)
    obj = os.path.join(tmp, "tu.o")
    cases = []
    reps = args.reps or (1 if args.all else 3)
    for rep in range(reps):  # repetitions interleaved: noise from the shared machine spreads evenly
        for c in compilers:
            for mode in ("frontend", "O2"):
                for name, src in COMPILE_TUS:
                    def one(c=c, mode=mode, name=name, src=src):
                        cwd, argv = cmds[name]
                        full = compile_argv(argv, mode, c, obj)
                        cpu, wall, rss = time_compile(cwd, full)
                        return [{"bench": "compile", "part": "raw", "mode": mode, "name": name,
                                 "compiler": compiler_version(full[0]), "cpu": cpu, "wall": wall, "rss": rss,
                                 "source": src}]
                    cases.append(Case(f"compile: {name}, {mode}" + (f", {c}" if c else "") +
                                      (f", run {rep + 1}" if reps > 1 else ""), "compile", fn=one))
    return cases


def compile_finish(records):
    """The raw compiler runs as one record per (compiler, mode, TU): medians, next to Kokkos alone."""
    raw = [r for r in records if r.get("part") == "raw"]
    groups = {}
    for r in raw:
        groups.setdefault((r["compiler"], r["mode"], r["name"]), []).append(r)
    out = []
    for (comp, mode, name), runs in groups.items():
        cpu = statistics.median(r["cpu"] for r in runs)
        base_runs = groups.get((comp, mode, COMPILE_TUS[0][0]))
        base = statistics.median(r["cpu"] for r in base_runs) if base_runs else float("nan")
        out.append({"bench": "compile", "part": mode, "name": name, "backend": comp, "devices": None, "seconds": cpu,
                    "wall_seconds": statistics.median(r["wall"] for r in runs),
                    "peak_rss_mb": max(r["rss"] for r in runs), "runs": len(runs), "baseline": COMPILE_TUS[0][0],
                    "baseline_seconds": base, "ratio_to_baseline": cpu / base, "source": runs[0]["source"],
                    "blas_kernel": None})
    return [r for r in records if r.get("part") != "raw"] + out


def compile_table(records):
    print(f"{'part':<10}{'translation unit':<20}{'compiler':<40}{'cpu s':>8}{'wall s':>8}{'MiB':>7}{'x kokkos':>10}")
    for r in records:
        print(f"{r['part']:<10}{r['name']:<20}{r['backend'][:38]:<40}{r['seconds']:>8.2f}{r['wall_seconds']:>8.2f}"
              f"{r['peak_rss_mb']:>7.0f}{r['ratio_to_baseline']:>10.2f}")


class Suite:
    """`meson_build`: whether the suite needs build-bench/ configured (gpu builds with nvcc_wrapper)."""

    def __init__(self, name, targets, cases, table, devices, all_devices=None, finish=None, meson_build=True):
        self.name, self.targets, self.cases, self.table = name, targets, cases, table
        self.default_devices, self.all_devices = devices, all_devices or devices
        self.finish = finish
        self.meson_build = meson_build


SUITES = [
    Suite("collectives", ["bench_collectives"], collectives_cases, collectives_table, "2,4,8", "2,8"),
    Suite("reshard", ["bench_reshard"], reshard_cases, reshard_table, "8"),
    Suite("ops", ["bench_ops"], ops_cases, ops_table, "1,8", "1,2,4,8"),
    Suite("grad", ["bench_grad"], grad_cases, grad_table, "1,8"),
    Suite("io", ["bench_io"], io_cases, io_table, "1,8"),
    Suite("loops", ["bench_loops"], loops_cases, loops_table, "1,8"),
    Suite("stencil", ["bench_stencil"], stencil_cases, stencil_table, "1,2,4,8", "1,8"),
    Suite("train", ["bench_train"], train_cases, train_table, "8"),
    Suite("calibrate", ["bench_calibrate"], calibrate_cases, calibrate_table, "1,2,4,8", "8"),
    Suite("plan", ["bench_calibrate", "bench_train"], plan_cases, plan_table, "1,2,4,8", "1,8"),
    Suite("gpu", [], gpu_cases, gpu_table, "1,2,4,8", "1,8", meson_build=False),
    Suite("compile", [], compile_cases, compile_table, "1", finish=compile_finish),
]
BY_NAME = {s.name: s for s in SUITES}
