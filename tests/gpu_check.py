#!/usr/bin/env python3
"""scripts/gpu-check.sh without a GPU and without a CUDA-enabled Kokkos (nothing is compiled): it
refuses with exit status 77 and one line saying why (no GPU, no nvcc_wrapper, a host-only Kokkos),
a bad flag is exit status 2 naming the flag, --help prints the usage; `run` on a GPU machine with
nothing built says so (a stand-in nvidia-smi plays the GPU); and the summary
(scripts/gpu_check_summary.py) reads doctest's totals, bench_gpu's records, the goals and an
Nsight Compute export back. With shellcheck installed, the script is shellcheck-clean.

usage: gpu_check.py
"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu-check.sh")
SUMMARY = os.path.join(ROOT, "scripts", "gpu_check_summary.py")


def run(args, env=None):
    r = subprocess.run([SCRIPT] + args, capture_output=True, text=True, timeout=60, env=env)
    return r.returncode, r.stdout, r.stderr


def expect(args, status, words, env=None):
    rc, out, err = run(args, env)
    where = f"gpu-check.sh {' '.join(args)}: exit {rc}\nstdout: {out}\nstderr: {err}"
    assert rc == status, where
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"not one line: {where}"
    for w in words:
        assert w in lines[0], f"{w!r} missing: {where}"
    print(f"ok: {' '.join(args)} -> {rc}: {lines[0]}")


def fake_tool(folder, name, text, status):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho '{text}'\nexit {status}\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        # No GPU: this machine's own (where nvidia-smi is missing), and a driver that answers nothing.
        if shutil.which("nvidia-smi") is None:
            expect(["run", "--out", empty], 77, ["no GPU", "nvidia-smi"])
        broken = os.path.join(tmp, "broken")
        os.mkdir(broken)
        fake_tool(broken, "nvidia-smi", "NVIDIA-SMI has failed because it could not communicate with the driver", 9)
        env = dict(os.environ, PATH=broken + os.pathsep + os.environ["PATH"])
        expect(["run", "--out", empty], 77, ["no GPU", "NVIDIA-SMI has failed"], env)
        # A GPU (a stand-in nvidia-smi) but nothing built: an error, not a skip.
        gpu = os.path.join(tmp, "gpu")
        os.mkdir(gpu)
        fake_tool(gpu, "nvidia-smi", "NVIDIA H100 80GB HBM3, 9.0", 0)
        env = dict(os.environ, PATH=gpu + os.pathsep + os.environ["PATH"])
        expect(["run", "--out", empty], 1, ["nothing built", "build --kokkos"], env)
        # No nvcc_wrapper, and a host-only Kokkos (its config without KOKKOS_ENABLE_CUDA).
        expect(["--kokkos", "/nonexistent"], 77, ["no nvcc_wrapper", "/nonexistent/bin/nvcc_wrapper"])
        expect(["build", "--kokkos", "/nonexistent", "--out", empty], 77, ["no nvcc_wrapper"])
        host = os.path.join(tmp, "kokkos-host")
        os.makedirs(os.path.join(host, "include"))
        os.makedirs(os.path.join(host, "bin"))
        fake_tool(os.path.join(host, "bin"), "nvcc_wrapper", "", 1)
        with open(os.path.join(host, "include", "KokkosCore_config.h"), "w") as f:
            f.write("#define KOKKOS_ENABLE_SERIAL\n#define KOKKOS_ENABLE_OPENMP\n")
        expect(["build", "--kokkos", host, "--out", empty], 77, ["host-only Kokkos", "KOKKOS_ENABLE_CUDA"])
        assert os.listdir(empty) == [], os.listdir(empty)  # a refusal writes nothing
        # Bad flags: exit status 2 naming the flag.
        expect(["run", "--frobnicate"], 2, ["unknown flag '--frobnicate'"])
        expect(["build"], 2, ["--kokkos DIR"])
        expect(["build", "-j", "x", "--kokkos", host], 2, ["-j", "'x'"])
        expect(["run", "--devices", "0,9"], 2, ["--devices"])
        expect(["run", "build"], 2, ["'build' must come first"])
        rc, out, _ = run(["--help"])
        assert rc == 0 and "gpu-check.sh build --kokkos DIR" in out and "Exit status" in out, out
        print("ok: --help")
        check_summary(tmp)
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", SCRIPT], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout
        print("ok: shellcheck")
    return 0


def check_summary(tmp):
    """The summary of a results folder written by hand (as `run` writes it)."""
    out = os.path.join(tmp, "out")
    res = os.path.join(out, "results")
    os.makedirs(res)
    files = {
        "manifest.txt": "# scripts/gpu-check.sh build, today: shardlib abc\n# kind name file suites compile-seconds bytes\n"
                        "suite tensor_memory_space tensor_memory_space_tests tensor_memory_space 300 5000000\n",
        "results/suites.txt": "tensor_memory_space 0 12.5\nautodiff_memory_space 134 2.0\n",
        "results/tensor_memory_space.log": "[doctest] test cases: 10 | 10 passed | 0 failed | 0 skipped\n"
                                           "[doctest] assertions: 2583065 | 2583065 passed | 0 failed |\n",
        "results/autodiff_memory_space.log": "Segmentation fault\n",
        "results/bench.txt": "bench mlp 1 0 4.0\n",
        "results/records.jsonl":
            '{"bench": "gpu", "backend": "threads", "devices": 1, "gpu": "NVIDIA H100 80GB HBM3", "part": "mlp", '
            '"name": "mlp T8192 D4096 F16384", "mesh": "(1, 1)", "dtype": "bf16", "seconds": 0.01, "tflops": 550.0, '
            '"peak_tflops": 989.4, "fraction_of_peak": 0.556, "cublas_tflops": 700.0, "fraction_of_cublas": 0.79}\n'
            '{"bench": "gpu", "backend": "torch-cuda", "devices": 1, "gpu": "NVIDIA H100 80GB HBM3", "part": "mlp", '
            '"name": "mlp T8192 D4096 F16384", "dtype": "bf16", "seconds": 0.005, "tflops": 1100.0, "torch": "2.11"}\n'
            + "".join('{"bench": "gpu", "backend": "threads", "devices": 1, "gpu": "NVIDIA H100 80GB HBM3", '
                      f'"part": "stencil", "name": "jacobi7 sweep{suffix}", "kernel": "{kernel}", "dtype": "float32", '
                      '"block_shape": "[512, 512, 512]", "mesh": "(1, 1)", "bytes": 1073741824, '
                      f'"seconds": {secs}, "gbytes_per_second": 1.0, "baseline": "copy", "baseline_seconds": 0.0004, '
                      f'"copy_gbytes_per_second": 2.7, "fraction_of_copy": {frac}}}\n'
                      for suffix, kernel, secs, frac in (("", "default", 0.0008, 0.5), (" (planes)", "planes", 0.0005, 0.8))),
        "results/profile_wall.out": '{"bench": "gpu", "part": "profile", "name": "mlp T4096 D1024 F4096 step", '
                                    '"seconds": 0.0002}\n',
        "results/profile_kernels.csv":
            '"ID","Process ID","Kernel Name","gpu__time_duration.sum"\n"","","","usecond"\n'
            '"0","1","void Kokkos::Impl::cuda_parallel_launch_local_memory<Kokkos::Impl::ParallelFor<'
            'shardlib::kernels::detail::portable::FlatKernel<float>, Kokkos::RangePolicy<>, Kokkos::Cuda>>(T1)","12.5"\n'
            '"1","1","sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n","137.5"\n',
        "results/seconds.txt": "61.3\n",
    }
    for name, text in files.items():
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    r = subprocess.run([sys.executable, SUMMARY, out], capture_output=True, text=True, timeout=60)
    text = r.stdout
    assert r.returncode == 0, r.stderr
    for want in ("[pass] tensor_memory_space      10 of 10 cases, 2,583,065 of 2,583,065 checks passed",
                 "[FAIL] autodiff_memory_space    exit 134", "bench_gpu: 1 of 1 parts ran, 3 records",
                 "[met] bf16 MLP block at large sizes", "ours/torch 0.50", "portable::FlatKernel (Kokkos ParallelFor)",
                 "kernels 150.0 us (2 launches); outside kernels 50.0 us (25% of the step)", "run: 61 s; FAILED",
                 "jacobi7 sweep                       [512, 512, 512] 1 dev  default 0.500  planes 0.800  planes/default 1.60",
                 "measured 0.500 (jacobi7 sweep [512, 512, 512] 1 dev)"):
        assert want in text, f"{want!r} missing from the summary:\n{text}"
    # ncu's details page (what `run --profile` exports): a row per launch and metric, units per row.
    details = os.path.join(tmp, "details.csv")
    with open(details, "w") as f:
        f.write('==PROF== Connected to process\n"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
                '"0","void k<int>(int)","Command line profiler metrics","gpu__time_duration.sum","usecond","1,234.5"\n'
                '"1","void k<int>(int)","Command line profiler metrics","gpu__time_duration.sum","nsecond","500"\n')
    r = subprocess.run([sys.executable, SUMMARY, "--ncu-csv", details], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "total 1235.0 us in 2 launches" in r.stdout, r.stdout + r.stderr
    # The torch record is a peer's: it does not count for our goals.
    assert "[met] bf16 MLP block at large sizes (1 device), of the GPU's bf16 peak: goal >= 0.50; measured 0.556" in text, text
    print("ok: the summary")


if __name__ == "__main__":
    sys.exit(main())
