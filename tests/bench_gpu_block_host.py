#!/usr/bin/env python3
"""bench_gpu_block (benchmarks/gpu_block.cpp) on host memory (--host; this build's Kokkos has no
CUDA): without --host it refuses with exit status 77 and says why; a bad argument is an error
naming it; in float32 and bf16 on 1 and 2 devices it prints a "fwd+bwd" and a "fwd" record with
the fields every record has and those the gpu table and goals read, the attention's kernel (the
unfused ops on the host), and a steady-state step that allocates nothing, frees nothing and waits
for nothing; the goals join a PyTorch record of the same name and dtype; --profile-step gives one
record of the step's wall time.

usage: bench_gpu_block_host.py BENCH_GPU_BLOCK
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

FIELDS = ("bench", "part", "name", "backend", "devices", "seconds", "baseline", "baseline_seconds", "gpu", "dtype",
          "mesh", "shape", "tflops", "attention_kernel", "attention_fallback", "allocations_per_step", "frees_per_step",
          "waits_per_step")


def layer_flops(b, s, d, h, k, f):
    """The layer's forward products (bench_gpu_block's Layer::flops): causal attention at half."""
    t, hk = b * s, h * k
    return 2 * t * d * hk * 3 + 2 * t * hk * d + 2 * 2 * t * d * f + 2 * 2 * b * h * s * s * k / 2


def run(argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=240)


def main():
    exe = sys.argv[1]
    r = run([exe])
    assert r.returncode == 77 and "has no CUDA" in r.stderr, (r.returncode, r.stderr)
    r = run([exe, "--host", "--frob"])
    assert r.returncode == 1 and "unknown argument '--frob'" in r.stderr, (r.returncode, r.stderr)
    r = run([exe, "--host", "--config", "huge"])
    assert r.returncode == 1 and "--config is gpt2, large or small, not 'huge'" in r.stderr, r.stderr
    r = run([exe, "--host", "--plan"])  # (the program's name once, not twice)
    assert r.returncode == 1 and "bench_gpu_block: --plan needs a value" in r.stderr, r.stderr
    assert r.stderr.count("bench_gpu_block:") == 1, r.stderr
    r = run([exe, "--host", "--plan", "nosuch"])
    assert r.returncode == 1 and "--plan is a preset (h100, h200, a100), a profile file or none" in r.stderr, r.stderr
    records = []
    for dtype, label in (("f32", "float32"), ("bf16", "bf16")):
        for devices in (1, 2):
            r = run([exe, "--host", "--quick", "--config", "small", "--dtype", dtype, "--devices", str(devices)])
            assert r.returncode == 0, r.stderr
            recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
            assert [x["name"] for x in recs] == ["small fwd+bwd", "small fwd"], recs
            for x in recs:
                missing = [f for f in FIELDS if f not in x]
                assert not missing, (missing, x)
                assert x["part"] == "block" and x["dtype"] == label and x["devices"] == devices, x
                assert x["seconds"] > 0 and x["tflops"] > 0, x
                assert x["attention_kernel"] == "unfused ops", x
                assert x["allocations_per_step"] == 0 and x["frees_per_step"] == 0 and x["waits_per_step"] == 0, x
                # --plan: on 1 device the step's work on shapes alone (no profile on host memory by
                # default: no prediction); its products at least the layer's (the unfused causal
                # attention computes whole score matrices); none on virtual devices sharing the GPU
                assert ("work" in x) == (devices == 1) and "predicted_seconds" not in x, x
                if devices == 1:
                    fwd = layer_flops(2, 128, 256, 4, 64, 1024)
                    want = 3 * fwd if x["name"].endswith("fwd+bwd") else fwd
                    assert want <= x["work"]["gemm_flops"] <= 1.2 * want, (want, x["work"])
                    assert x["work"]["kernel_calls"] > 0 and x["work"]["collective_calls"] == 0, x
                    assert x["work"]["attention_kernel"] == "unfused ops", x
            records += recs
    # A preset predicts bf16 steps (its GEMM rate is bf16's), not float32 ones; "none" plans nothing.
    for dtype, predicted in (("bf16", True), ("f32", False)):
        r = run([exe, "--host", "--quick", "--config", "small", "--dtype", dtype, "--plan", "h100"])
        recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        assert r.returncode == 0 and len(recs) == 2, r.stderr
        for x in recs:
            assert ("predicted_seconds" in x) == predicted and "work" in x, x
            if predicted:
                p = x["predicted"]
                assert x["profile"] == "h100" and x["predicted_seconds"] > 0, x
                assert abs(p["gemm"] + p["kernels"] + p["communication"] - x["predicted_seconds"]) < 1e-6 * x["predicted_seconds"] + 1e-12, x
                assert abs(x["prediction_ratio"] - x["predicted_seconds"] / x["seconds"]) < 1e-4 * x["prediction_ratio"], x
        if predicted:
            assert "the cost model on h100" in r.stderr, r.stderr
            planned = recs
    r = run([exe, "--host", "--quick", "--config", "small", "--plan", "none"])
    assert r.returncode == 0 and all("predicted_seconds" not in json.loads(line) for line in r.stdout.splitlines()
                                     if line.startswith("{")), r.stdout
    table = io.StringIO()
    with redirect_stdout(table):
        gpu_table(records)
    assert table.getvalue().count("block") == len(records), table.getvalue()
    # The goals: no GPU figure here (gpu "none"); as GPU figures beside a PyTorch record they are read.
    rows = {r[1]: r for r in goals.evaluate({"gpu": records})}
    key = "transformer layer fwd+bwd in bf16 beside PyTorch eager (torch time / ours)"
    assert rows[key][4] == "not measured", rows[key]
    gpu = [dict(x, gpu="NVIDIA H100") for x in records if x["devices"] == 1]
    ours = next(x for x in gpu if x["name"] == "small fwd+bwd" and x["dtype"] == "bf16")
    peer = dict(ours, backend="torch-eager", seconds=ours["seconds"] / 2)
    rows = {r[1]: r for r in goals.evaluate({"gpu": gpu + [peer]})}
    assert rows[key][4] == "short" and rows[key][3].startswith("0.500"), rows[key]
    steady = "a layer's training step in steady state: blocks allocated or freed from GPU memory, waits for the GPU"
    assert rows[steady][4] == "pass", rows[steady]
    # The cost model's goal reads the predictions of bf16 steps on a GPU (none here: not measured).
    plan = "the cost model's predicted time of a transformer layer's bf16 fwd+bwd on one GPU over the measured (|ratio - 1|, issue 44)"
    rows = {r[1]: r for r in goals.evaluate({"gpu": planned})}
    assert rows[plan][4] == "not measured", rows[plan]
    on_gpu = [dict(x, gpu="NVIDIA H100", prediction_ratio=ratio) for x, ratio in zip(planned, (1.2, 3.0))]
    rows = {r[1]: r for r in goals.evaluate({"gpu": on_gpu})}
    assert rows[plan][4] == "pass" and "ratio 1.20" in rows[plan][3], rows[plan]  # (the fwd record is not read)
    on_gpu[0]["prediction_ratio"] = 0.7
    rows = {r[1]: r for r in goals.evaluate({"gpu": on_gpu})}
    assert rows[plan][4] == "short", rows[plan]
    r = run([exe, "--host", "--config", "small", "--profile-step"])
    recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and len(recs) == 1 and recs[0]["part"] == "profile", (r.stderr, recs)
    print(f"bench_gpu_block --host: {len(records)} records, goals and table read them")


if __name__ == "__main__":
    main()
