#!/usr/bin/env python3
"""The benchmark programs' command lines (bench::check_args, benchmarks/common.hpp): each program
refuses an unknown flag, a flag without its value, a non-integer device count and an unknown
backend with "PROGRAM: why" on stderr, exit status 1 and nothing on stdout, before anything runs
(an unknown flag was ignored before, and the run measured something other than what was asked);
a word flag with choices (--part) refuses another word, naming the choices; and every command line
benchmarks/run gives a program (every benchmark's cases, `all` and `all --quick`) is one it
accepts: each with an unknown flag appended fails on that flag alone.

usage: bench_flags.py BENCH_EXE [BENCH_EXE ...]
"""
import importlib.machinery
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

# The programs with a --part, and a part each has (the rest of the check is the same for all).
PARTS = {"bench_ops": "overhead", "bench_stencil": "sweep", "bench_grad": "block", "bench_gpu": "elementwise"}


def refused(argv, why):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    prog = os.path.basename(argv[0])
    assert r.returncode == 1 and f"{prog}: {why}" in r.stderr and not r.stdout, (argv, r.returncode, r.stderr, r.stdout)


def harness_command_lines(exes):
    """Every (argv) benchmarks/run gives one of `exes`, from its suites' case lists."""
    loader = importlib.machinery.SourceFileLoader("benchmarks_run", os.path.join(ROOT, "benchmarks", "run"))
    spec = importlib.util.spec_from_loader("benchmarks_run", loader)
    run = importlib.util.module_from_spec(spec)
    loader.exec_module(run)
    from harness.suites import SUITES, Peers, Skipped
    lines = []
    for extra in ([], ["--quick"]):
        args = run.parse(["all"] + extra)
        for suite in SUITES:
            if suite.name == "compile" or not all(t in exes for t in suite.targets):
                continue  # (compile runs the compiler; bench_io needs HDF5)
            args.devs = run.devices_for(suite, args)
            try:
                cases = suite.cases(args, {t: exes[t] for t in suite.targets}, Peers(False))
            except Skipped:
                continue  # (gpu: no GPU here)
            for c in cases:
                at = [k for k, a in enumerate(c.argv) if os.path.basename(str(a)) in exes]
                if at:
                    lines.append([str(a) for a in c.argv[at[0]:]])
    return lines


def main():
    exes = {os.path.basename(p): p for p in sys.argv[1:]}
    assert "bench_train" in exes and "bench_grad" in exes, sorted(exes)
    for name, exe in sorted(exes.items()):
        refused([exe, "--frob"], "unknown argument '--frob'")
        refused([exe, "--devices"], "--devices needs a value")
        refused([exe, "--devices", "two"], "--devices takes an integer, not 'two'")
        refused([exe, "--devices", "2", "--devices", "4"], "'--devices' given twice")
        refused([exe, "--backend", "gpu"], "--backend is threads, mpi, nccl or simulate, not 'gpu'")
        if name in PARTS:
            refused([exe, "--part", "nosuch"], "--part is ")
            refused([exe, "--part", PARTS[name], "--frob"], "unknown argument '--frob'")
    refused([exes["bench_train"], "--steps", "1x"], "--steps takes an integer, not '1x'")
    refused([exes["bench_train"], "--transport", "carrier-pigeon"], "--transport is p2p or permutes, not 'carrier-pigeon'")
    refused([exes["bench_grad"], "--capacity-factor", "1.5x"], "--capacity-factor takes a number, not '1.5x'")
    refused([exes["bench_grad"], "--part", "nosuch"], "--part is block, tape, context or moe, not 'nosuch'")

    lines = harness_command_lines(exes)
    assert len(lines) >= 50, len(lines)  # (every benchmark but gpu and compile: 120 here)
    for argv in lines:
        refused(argv + ["--frob-last"], "unknown argument '--frob-last'")
    print(f"bench_flags: {len(exes)} programs refuse bad command lines; the {len(lines)} command lines of "
          "benchmarks/run's cases are accepted")


if __name__ == "__main__":
    main()
