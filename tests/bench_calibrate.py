#!/usr/bin/env python3
"""bench_calibrate (benchmarks/calibrate.cpp), quick, on 2 in-process devices: its records carry
the fields every benchmark record has; the profile it writes has every figure above 0, the link
kinds it measured (within a node with --node 2, across nodes with --node 1) and not the others;
the large kernels and the GEMMs of a transformer's shapes take their operands from sets that
together overflow the last-level cache;
benchmarks/run's calibrate table prints it; a --node that does not divide the devices: exit 2.

usage: bench_calibrate.py BENCH_CALIBRATE
"""
import io
import json
import os
import subprocess
import sys
import tempfile
from contextlib import redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from harness.suites import calibrate_table  # noqa: E402

COMMON = ("bench", "part", "name", "backend", "devices", "seconds", "baseline", "baseline_seconds")


def getconf(name):
    """getconf's value of `name` (0 when it has none)."""
    out = subprocess.run(["getconf", name], capture_output=True, text=True).stdout.strip()
    return int(out) if out.isdigit() else 0


def run(exe, out, node):
    p = subprocess.run([exe, "--devices", "2", "--quick", "--reps", "1", "--node", str(node), "--out", out],
                       capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        sys.exit(f"bench_calibrate --node {node} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    records = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    for r in records:
        missing = [f for f in COMMON if f not in r]
        if missing:
            sys.exit(f"record {r} lacks {missing}")
    with open(out) as f:
        return records, json.load(f), p.stderr


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        records, prof, err = run(exe, os.path.join(d, "intra.json"), 2)
        parts = {r["part"] for r in records}
        assert parts == {"gemm", "kernels", "link", "profile"}, parts
        for k in ("gemm_rate", "gemm_call", "memory_bandwidth", "kernel_call", "memory", "node_size"):
            assert prof[k] > 0 or (k in ("gemm_call", "kernel_call") and prof[k] >= 0), (k, prof)
        assert prof["node_size"] == 2
        # attention's batched products have a rate of their own, below the unbatched products'
        # (a fifth to a quarter of it measured)
        assert 0 < prof["batched_gemm_rate"] < prof["gemm_rate"], prof
        # the fit record says the profile's figures to 6 digits, the microsecond ones too (they
        # were written with 6 decimals, a per-product cost of 1.8 us as 0.000002)
        fit = next(r for r in records if r["part"] == "profile")
        for k in ("gemm_rate", "gemm_product", "batched_gemm_rate", "memory_bandwidth", "kernel_call", "shared"):
            assert abs(fit[k] - prof[k]) <= 1e-5 * abs(prof[k]), (k, fit[k], prof[k])
        assert fit["intra_latency"] == prof["intra_node"]["latency"] or \
            abs(fit["intra_latency"] / prof["intra_node"]["latency"] - 1) < 1e-5, (fit, prof)
        # The large kernels' and the linear layers' operands in sets that take turns, together
        # (both devices') twice the last-level cache or 1/8 of the memory (cold_sets), at most 64 sets.
        cache = getconf("LEVEL3_CACHE_SIZE") or getconf("LEVEL2_CACHE_SIZE") or 32 << 20
        target = min(2 * cache, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE") / 8) / 2
        for r in records:
            if r["part"] == "kernels" and r["bytes"] > 1 << 20:
                want = min(64, max(1, -(-target // (2 * 4 * (1 << 20)))))  # a and b, 1 Mi floats each (--quick)
                assert r["operand_sets"] == want, (r, want, cache)
            elif r["part"] == "kernels" or "^3" in r["name"]:  # the small kernels and the squares: one set
                assert r["operand_sets"] == 1, r
            elif r["part"] == "gemm" and target > 8 << 20:  # (a set of these is 4 MiB at most)
                assert r["operand_sets"] > 1, (r, target)
        assert "intra_node" in prof and "inter_node" not in prof, prof
        assert prof["intra_node"]["latency"] > 0 and prof["intra_node"]["bandwidth"] > 0, prof
        assert "measured by bench_calibrate on 2 threads devices" in prof["source"], prof["source"]
        assert "the profile: " in err, err
        buf = io.StringIO()
        with redirect_stdout(buf):
            calibrate_table(records)
        assert len(buf.getvalue().splitlines()) == 2, buf.getvalue()

        _, prof, _ = run(exe, os.path.join(d, "inter.json"), 1)
        assert prof["node_size"] == 1
        assert "inter_node" in prof and "intra_node" not in prof, prof

        p = subprocess.run([exe, "--devices", "2", "--node", "3", "--out", os.path.join(d, "x.json")],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "--node 3 does not divide the 2 devices" in p.stderr, (p.returncode, p.stderr)
    print("bench_calibrate: records, profile and table as expected")


if __name__ == "__main__":
    main()
