#!/usr/bin/env python3
"""bench_gpu (benchmarks/gpu.cpp) on host memory (--host --quick; this build's Kokkos has no CUDA):
every part prints its records with the fields every benchmark record has and the ones
benchmarks/run's gpu table and goals read; the table prints them; the goals leave them out (no GPU
figure), and on GPU figures count matmul's overhead from its cuBLAS call; without --host it
refuses with exit status 77 and says why; --profile-step gives one record of the step's wall time.

usage: bench_gpu_host.py BENCH_GPU
"""
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from harness import goals  # noqa: E402
from harness.suites import gpu_table  # noqa: E402

COMMON = ("bench", "part", "name", "backend", "devices", "seconds", "baseline", "baseline_seconds", "gpu")
FIELDS = {"elementwise": ("dtype", "bytes", "gbytes_per_second", "copy_gbytes_per_second", "fraction_of_copy"),
          "rows": ("dtype", "row_length", "bytes", "gbytes_per_second", "copy_gbytes_per_second", "fraction_of_copy"),
          "matmul": ("dtype", "local_shape", "tflops", "baseline_tflops", "fraction_of_baseline"),
          "overhead": ("shape", "overhead_us"),
          "mlp": ("mesh", "dtype", "tflops", "peak_tflops", "fraction_of_peak", "cublas_tflops", "fraction_of_cublas"),
          "reshard": ("bytes", "output_block_bytes", "ratio_to_baseline"),
          "stencil": ("kernel", "dtype", "block_shape", "mesh", "bytes", "gbytes_per_second", "copy_gbytes_per_second",
                      "fraction_of_copy")}
RUNS = [("elementwise", 1, 6), ("rows", 1, 16), ("matmul", 2, 5), ("overhead", 1, 8), ("mlp", 4, 1), ("reshard", 4, 4), ("stencil", 4, 8)]


def main():
    exe = sys.argv[1]
    r = subprocess.run([exe, "--part", "elementwise"], capture_output=True, text=True)
    assert r.returncode == 77 and "has no CUDA" in r.stderr, (r.returncode, r.stderr)
    records = []
    for part, devices, count in RUNS:
        argv = [exe, "--host", "--quick", "--part", part, "--backend", "threads", "--devices", str(devices)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{' '.join(argv)}: exit status {r.returncode}\n{r.stderr[-2000:]}"
        got = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        assert len(got) == count, f"{part}: {len(got)} records, expected {count}:\n{r.stdout}"
        for rec in got:
            missing = [f for f in COMMON + FIELDS[part] if f not in rec]
            assert not missing, f"{part}: record without {missing}: {rec}"
            assert rec["bench"] == "gpu" and rec["part"] == part and rec["devices"] == devices, rec
            assert rec["seconds"] > 0 and rec["gpu"] == "none (host memory)", rec
        records += got
        print(f"{part}: {len(got)} records on {devices} device(s)")
    out = io.StringIO()
    with redirect_stdout(out):
        gpu_table(records)
    assert out.getvalue().count("\n") == len(records) + 1, out.getvalue()
    rows = [row for row in goals.evaluate({"gpu": records}) if row[0] == "gpu"]
    assert len(rows) == 11 and all(row[4] == "not measured" for row in rows), rows
    # Stencils: each sweep and step with the default kernels and with planes in shared memory
    # (SHARDLIB_STENCIL_PLANES); the goal counts the default kernels' sweeps only.
    st = [r for r in records if r["part"] == "stencil"]
    assert sorted(r["kernel"] for r in st) == ["default"] * 4 + ["planes"] * 4, st
    assert all(r["name"].endswith("(planes)") == (r["kernel"] == "planes") for r in st), st
    fake = [dict(r, gpu="NVIDIA H100 80GB HBM3", fraction_of_copy=0.9 if r["kernel"] == "planes" else 0.7) for r in st]
    row = [row for row in goals.evaluate({"gpu": fake}) if row[0] == "gpu" and "stencil_for sweep" in row[1]][0]
    assert row[4] == "short" and "0.700" in row[3] and "of 2" in row[3] and "planes" not in row[3], row
    # The overhead goal on GPU figures: matmul counts from its cuBLAS call (its "over the GEMM"
    # record), every other op from the bare kernel launch.
    names = {r["name"] for r in records if r["part"] == "overhead"}
    assert {"matmul", "matmul (over the GEMM)"} <= names, names
    assert [r.get("stands_for") for r in records if r["part"] == "overhead" and r["name"] == "matmul (over the GEMM)"] == ["matmul"]
    gpu = [dict(r, gpu="NVIDIA H200", overhead_us={"matmul": 9.0, "matmul (over the GEMM)": 1.5}.get(r["name"], 0.2))
           for r in records if r["part"] == "overhead"]
    row = [row for row in goals.evaluate({"gpu": gpu}) if row[0] == "gpu" and "overhead" in row[1]][0]
    assert row[4] == "pass" and "1.50 us (matmul (over the GEMM))" in row[3] and "of 7" in row[3], row
    # --profile-step (scripts/gpu-check.sh --profile): the MLP block's step alone, one record of its
    # wall time; other parts refuse it.
    argv = [exe, "--host", "--quick", "--part", "mlp", "--profile-step", "--backend", "threads", "--devices", "2"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(argv)}: exit status {r.returncode}\n{r.stderr[-2000:]}"
    got = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(got) == 1 and got[0]["part"] == "profile" and got[0]["seconds"] > 0, r.stdout
    assert got[0]["name"] == "mlp T256 D64 F256 step", got[0]
    r = subprocess.run([exe, "--host", "--quick", "--part", "matmul", "--profile-step"], capture_output=True, text=True)
    assert r.returncode == 1 and "bench_gpu: --profile-step is for --part mlp" in r.stderr, (r.returncode, r.stderr)
    # Bad arguments: a clear error and exit status 1, nothing run (an unknown flag was ignored, a
    # bad --part ended in std::terminate).
    for argv, why in ((["--host", "--frob"], "bench_gpu: unknown argument '--frob'"),
                      (["--host", "--part", "frob"], "bench_gpu: --part is elementwise, rows, matmul, overhead, mlp, "
                                                     "reshard or stencil, not 'frob'"),
                      (["--host", "--mib"], "bench_gpu: --mib needs a value")):
        r = subprocess.run([exe] + argv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and why in r.stderr and not r.stdout, (argv, r.returncode, r.stderr, r.stdout)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
