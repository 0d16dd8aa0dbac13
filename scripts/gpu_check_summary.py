#!/usr/bin/env python3
"""The one summary of `scripts/gpu-check.sh run`: what ran from OUT/results/, read back.

  gpu_check_summary.py OUT                 the summary (suites, goals, PyTorch, profile, wall time)
  gpu_check_summary.py --ncu-csv FILE      the kernels of an `ncu --csv --page raw` export alone

Suites: doctest's totals in OUT/results/NAME.log, the exit status in suites.txt. Benchmarks: the
JSON records in records.jsonl (bench_gpu's and the PyTorch peer's), the GPU goals of
benchmarks/harness/goals.py (issue 14) evaluated on them, bench_gpu's table (the one
`benchmarks/run gpu` prints) in table.txt, ours beside PyTorch where both measured the same case on
one device. Profile: the kernels of one step from profile_kernels.csv (Nsight Compute,
gpu__time_duration.sum per launch) against the step's wall time (bench_gpu --profile-step's
record in profile_wall.out). Exit status 0 (the shell script decides what failed).
"""
import csv
import io
import json
import os
import re
import sys
from contextlib import redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from harness import goals  # noqa: E402
from harness.suites import gpu_table  # noqa: E402

PEERS = ("torch-cuda", "torch-eager", "torch-compile")  # block_torch.py's forms, torch_gpu.py's eager


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def records_of(text):
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def doctest_totals(log):
    """(cases passed, cases failed, checks passed, checks failed) from doctest's last lines, or None."""
    cases = re.search(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed", log)
    checks = re.search(r"assertions:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed", log)
    if not cases or not checks:
        return None
    return int(cases.group(2)), int(cases.group(3)), int(checks.group(2)), int(checks.group(3))


# ---- Nsight Compute --------------------------------------------------------------------------

UNITS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0, "s": 1.0}


def short_kernel(name):
    """A readable kernel name: Kokkos's launch wrapper gives way to the functor it runs."""
    name = re.sub(r"^void ", "", name.strip())
    m = re.search(r"Parallel(For|Reduce|Scan)(WithTotal)?<\s*([^<,>]+)", name)
    if "cuda_parallel_launch" in name and m:
        functor = m.group(3).strip()
        parts = functor.split("::")
        return f"{'::'.join(parts[-2:])} (Kokkos Parallel{m.group(1)})"
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # drop the parameter list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    return name if len(name) <= 68 else name[:65] + "..."


def ncu_kernels(text):
    """[(kernel name, seconds)] per launch from an `ncu --csv` export of gpu__time_duration.sum:
    its details page (a row per launch and metric: "Kernel Name", "Metric Name", "Metric Unit",
    "Metric Value") or its raw page (a header row, a units row, a row per launch)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    if "Kernel Name" not in header:
        return []
    name_col = header.index("Kernel Name")

    def seconds(value, unit):
        return float(value.replace(",", "")) * UNITS.get(unit.strip(), 1e-9)

    out = []
    if "Metric Name" in header and "Metric Value" in header:  # the details page
        m, u, v = header.index("Metric Name"), header.index("Metric Unit"), header.index("Metric Value")
        for r in rows[1:]:
            if len(r) > max(m, u, v, name_col) and r[m] == "gpu__time_duration.sum":
                try:
                    out.append((r[name_col], seconds(r[v], r[u])))
                except ValueError:
                    pass
        return out
    if "gpu__time_duration.sum" not in header:
        return []
    col = header.index("gpu__time_duration.sum")
    body, unit = rows[1:], "nsecond"
    if body and len(body[0]) > col and not re.match(r"^[\d.,]+$", body[0][col] or "x"):  # the units row
        unit, body = body[0][col], body[1:]
    for r in body:
        if len(r) > max(name_col, col):
            try:
                out.append((r[name_col], seconds(r[col], unit)))
            except ValueError:
                pass
    return out


def kernel_lines(launches, top=10):
    total = sum(s for _, s in launches)
    by = {}
    for name, s in launches:
        k = short_kernel(name)
        n, t = by.get(k, (0, 0.0))
        by[k] = (n + 1, t + s)
    lines = [f"    {'kernel':<70}{'launches':>9}{'us':>10}{'share':>8}"]
    for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"    {k:<70}{n:>9}{t * 1e6:>10.1f}{t / total if total else 0:>8.1%}")
    if len(by) > top:
        lines.append(f"    ... and {len(by) - top} more kernels")
    return total, lines


# ---- the summary -----------------------------------------------------------------------------

def summary(out):
    res = os.path.join(out, "results")
    manifest = [line.split() for line in read(os.path.join(out, "manifest.txt")).splitlines() if line and line[0] != "#"]
    header = [line[2:] for line in read(os.path.join(out, "manifest.txt")).splitlines() if line.startswith("# ")][:2]
    records = records_of(read(os.path.join(res, "records.jsonl")))
    ours = [r for r in records if r.get("backend") not in PEERS]
    peer = [r for r in records if r.get("backend") in PEERS]
    failed = False
    print("\n" + "=" * 30 + " scripts/gpu-check.sh: summary " + "=" * 30)
    gpu = next((r["gpu"] for r in records if r.get("gpu")), None)
    if gpu:
        print(f"GPU: {gpu}")
    for h in header:
        print(f"built: {h}")

    # Suites.
    print("\nsuites (each on 1 to 8 virtual devices unless --devices):")
    for line in read(os.path.join(res, "suites.txt")).splitlines():
        name, rc, secs = line.split()
        totals = doctest_totals(read(os.path.join(res, name + ".log")))
        if totals:
            cp, cf, ap, af = totals
            verdict = "pass" if rc == "0" and cf == 0 and af == 0 else "FAIL"
            print(f"  [{verdict}] {name:<24} {cp} of {cp + cf} cases, {ap:,} of {ap + af:,} checks passed, "
                  f"{float(secs):.1f} s" + ("" if rc == "0" else f", exit {rc}"))
        else:
            verdict = "FAIL"
            print(f"  [FAIL] {name:<24} exit {rc} after {float(secs):.1f} s, no doctest totals "
                  f"(see {os.path.join(res, name + '.log')})")
        failed |= verdict == "FAIL"
    if not any(m[0] == "suite" for m in manifest):
        print("  (none built)")

    # Benchmark parts.
    cases = [line.split() for line in read(os.path.join(res, "bench.txt")).splitlines()]
    if cases:
        bad = [f"{c[1]} on {c[2]} (exit {c[3]})" for c in cases if c[3] != "0"]
        print(f"\nbench_gpu: {len(cases) - len(bad)} of {len(cases)} parts ran, {len(ours)} records"
              + (f"; failed: {', '.join(bad)}" if bad else ""))
        failed |= bool(bad)
        table = io.StringIO()
        with redirect_stdout(table):
            try:
                gpu_table(ours)
            except (KeyError, TypeError, ValueError) as e:
                print(f"(the table could not be printed: {type(e).__name__} {e})")
        with open(os.path.join(res, "table.txt"), "w") as f:
            f.write(table.getvalue())
        print("\n".join(line for line in table.getvalue().rstrip().splitlines() if not line.startswith("GPU: ")))
        print("\nGPU goals (benchmarks/harness/goals.py):")
        for area, figure, goal, measured, result in goals.evaluate({"gpu": records}):
            if area == "gpu":
                word = {"pass": "met", "short": "SHORT"}.get(result, result)
                print(f"  [{word}] {figure}: goal {goal}; measured {measured}")

    # The stencil kernels side by side: the interior as planes in shared memory (SHARDLIB_STENCIL_PLANES,
    # include/shardlib/stencil/planes.hpp) is not the default until it measures faster than the default kernels.
    planes = {(r["name"][:-len(" (planes)")], r.get("block_shape"), r.get("devices")): r
              for r in ours if r.get("part") == "stencil" and r.get("kernel") == "planes"}
    pairs = [(r, planes[(r["name"], r.get("block_shape"), r.get("devices"))]) for r in ours
             if r.get("part") == "stencil" and r.get("kernel") == "default"
             and (r["name"], r.get("block_shape"), r.get("devices")) in planes]
    if pairs:
        print("\nstencils, the interior as planes in shared memory (SHARDLIB_STENCIL_PLANES=1) beside the default kernels"
              " (fraction of a copy; speed ratio > 1: planes faster):")
        for d, p in pairs:
            print(f"  {d['name']:<36}{d['block_shape']:<16}{d['devices']} dev  default {d['fraction_of_copy']:.3f}  "
                  f"planes {p['fraction_of_copy']:.3f}  planes/default {d['seconds'] / p['seconds']:.2f}")

    # Ours beside PyTorch, the same case on one device.
    if peer:
        print(f"\nbeside PyTorch {peer[0].get('torch', '')} (same GPU, 1 device; speed ratio > 1: ours faster):")
        for form in PEERS:
            theirs = {(r["part"], r["name"], r.get("dtype")): r for r in peer if r["backend"] == form}
            for r in ours:
                key = (r.get("part"), r.get("name"), r.get("dtype"))
                if r.get("devices") == 1 and key in theirs:
                    t = theirs[key]
                    figure = ("TFLOP/s", "tflops") if "tflops" in r else ("GB/s", "gbytes_per_second")
                    print(f"  {r['part']:<12}{r['name'] + ' ' + str(r.get('dtype')):<34} ours {r[figure[1]]:>8.1f}  "
                          f"{form} {t[figure[1]]:>8.1f} {figure[0]:<8} ours/torch {t['seconds'] / r['seconds']:.2f}")

    # The profile.
    prof_wall = [r for r in records_of(read(os.path.join(res, "profile_wall.out"))) if r.get("part") == "profile"]
    launches = ncu_kernels(read(os.path.join(res, "profile_kernels.csv")))
    if prof_wall or launches:
        print("\nprofile of one step (Nsight Compute, gpu__time_duration.sum; "
              f"{os.path.join(res, 'profile_summary.txt')} has ncu's per-kernel summary):")
        total, lines = kernel_lines(launches)
        if launches:
            print("\n".join(lines))
        if prof_wall:
            wall = prof_wall[0]["seconds"]
            name = prof_wall[0]["name"]
            if launches:
                print(f"  {name}: {wall * 1e6:.1f} us wall (fenced, median of 21), kernels {total * 1e6:.1f} us "
                      f"({len(launches)} launches); outside kernels {(wall - total) * 1e6:.1f} us "
                      f"({(wall - total) / wall:.0%} of the step)")
            else:
                print(f"  {name}: {wall * 1e6:.1f} us wall; no kernel times (see profile_ncu.log)")

    for note in read(os.path.join(res, "notes.txt")).splitlines():
        print("note: " + note)
    secs = read(os.path.join(res, "seconds.txt")).strip()
    if secs:
        print(f"\nrun: {float(secs):.0f} s" + ("" if float(secs) < 180 else " (over the 3 minutes it should take)")
              + ("; FAILED" if failed else "; every suite passed"))
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--ncu-csv":
        launches = ncu_kernels(read(argv[2]))
        total, lines = kernel_lines(launches)
        print("\n".join(lines))
        print(f"    total {total * 1e6:.1f} us in {len(launches)} launches")
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    return summary(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
