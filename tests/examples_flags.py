#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The examples' command lines (examples/common.hpp): each bad one is refused with exit status 2
and one line on stderr, `<program>: <message>`, that names the flag (and, for a misspelling, the
flag meant); --help prints the usage with status 0; good command lines still run.

usage: examples_flags.py EXECUTABLE...   (the examples, known by their file names: gpt, quickstart,
                                          heat2d, poisson3d, advection2d, checkpoint; any subset)

Bad command lines stop before the runtime starts, except where the device count decides (they
run with SHARDLIB_NO_BLAS_WARNING=1: the runtime's warning about a slow BLAS kernel is a line of
its own on some CPUs). Each run takes well under a second; the good ones are kept tiny.
"""
import os
import subprocess
import sys
import tempfile

USAGE_STATUS = 2
PROGRAMS = {"gpt", "quickstart", "heat2d", "poisson3d", "advection2d", "checkpoint"}

# (program, arguments, words the message must contain, whether the runtime starts first)
BAD = [
    # unknown flags and misspellings: the nearest known flag, the runtime's included
    ("gpt", ["--recipie", "zero2"], ["unknown flag '--recipie'", "did you mean '--recipe'?"], False),
    ("gpt", ["--no-such-flag", "1"], ["unknown flag '--no-such-flag'", "gpt --help"], False),
    ("gpt", ["--device", "4"], ["unknown flag '--device'", "did you mean '--devices'?"], False),
    ("gpt", ["--stpes", "3"], ["unknown flag '--stpes'", "did you mean '--steps'?"], False),
    ("gpt", ["-steps", "3"], ["unknown flag '-steps'", "did you mean '--steps'?"], False),
    ("gpt", ["zero2"], ["unexpected argument 'zero2'"], False),
    # an unknown flag is reported before a bad value elsewhere on the line
    ("gpt", ["--heads", "0", "--recipie", "zero2"], ["unknown flag '--recipie'"], False),
    # numbers: whole, within range
    ("gpt", ["--dim", "abc"], ["--dim", "'abc'"], False),
    ("gpt", ["--dim", "12x"], ["--dim", "'12x'"], False),
    ("gpt", ["--dim", ""], ["--dim", "''"], False),
    ("gpt", ["--dim", "0"], ["--dim", "from 1 to"], False),
    ("gpt", ["--heads", "0"], ["--heads", "from 1 to", "'0'"], False),
    ("gpt", ["--batch", "0"], ["--batch", "'0'"], False),
    ("gpt", ["--seq", "0"], ["--seq", "'0'"], False),
    ("gpt", ["--layers", "-2"], ["--layers", "'-2'"], False),
    ("gpt", ["--steps", "-5"], ["--steps", "'-5'"], False),
    ("gpt", ["--vocab", "1"], ["--vocab", "from 2 to"], False),
    ("gpt", ["--ff", "99999999999999999999"], ["--ff", "'99999999999999999999'"], False),
    # sizes that do not fit together
    ("gpt", ["--heads", "5"], ["--dim 32 is not a multiple of --heads 5"], False),
    # choices and switches
    ("gpt", ["--recipe", "zero4"], ["--recipe", "'zero4'", "zero3"], False),
    ("gpt", ["--precision", "fp8"], ["--precision", "'fp8'", "bf16"], False),
    ("gpt", ["--check", "yes"], ["--check must be 0 or 1", "'yes'"], False),
    ("gpt", ["--describe", "2"], ["--describe must be 0 or 1"], False),
    # data, sampling and checkpoints
    ("gpt", ["--temperature", "hot"], ["--temperature must be a number", "'hot'"], False),
    ("gpt", ["--vocab", "100"], ["--vocab 100 is smaller than the data's 256 tokens"], False),
    ("gpt", ["--every", "5"], ["--every needs --save DIR"], False),
    ("gpt", ["--resume", "x", "--check", "1"], ["not with --resume"], False),
    # twice, or without a value
    ("gpt", ["--steps", "1", "--steps", "2"], ["--steps given twice"], False),
    ("gpt", ["--devices", "2", "--devices", "4"], ["--devices given twice"], False),
    ("gpt", ["--steps"], ["--steps needs a value"], False),
    ("gpt", ["--steps", "--layers", "1"], ["--steps needs a value"], False),
    # the runtime's own flags, refused by Runtime::from_args: usage errors too
    ("gpt", ["--devices", "0"], ["--devices", "'0'"], True),
    ("gpt", ["--backend", "carrier-pigeon"], ["unknown backend 'carrier-pigeon'"], True),
    ("quickstart", ["--modle", "2"], ["unknown flag '--modle'", "did you mean '--model'?"], False),
    ("quickstart", ["--model", "0"], ["--model", "'0'"], False),
    ("quickstart", ["--model", "3"], ["--model 3 does not divide the 8 devices"], True),
    ("heat2d", ["--sweep", "5"], ["unknown flag '--sweep'", "did you mean '--sweeps'?"], False),
    ("heat2d", ["--n", "0"], ["--n", "'0'"], False),
    ("heat2d", ["--sweeps", "abc"], ["--sweeps", "'abc'"], False),
    ("heat2d", ["--png", ""], ["--png must not be empty"], False),
    ("heat2d", ["--png"], ["--png needs a value"], False),
    ("poisson3d", ["--tol_digits", "3"], ["unknown flag '--tol_digits'", "did you mean '--tol-digits'?"], False),
    ("poisson3d", ["--tol-digits", "0"], ["--tol-digits", "from 1 to 16"], False),
    ("poisson3d", ["--n", "-1"], ["--n", "'-1'"], False),
    ("advection2d", ["--stesp", "3"], ["unknown flag '--stesp'", "did you mean '--steps'?"], False),
    ("advection2d", ["--steps", "0"], ["--steps", "'0'"], False),
    ("checkpoint", ["--dri", "."], ["unknown flag '--dri'", "did you mean '--dir'?"], False),
    ("checkpoint", ["--dir"], ["--dir needs a value"], False),
]


def good(tmp):
    """(program, arguments, words stdout must contain): command lines that must still run."""
    return [
        # the = form, a Kokkos flag passed on, the runtime's flags, a non-default recipe
        ("gpt", ["--steps", "1", "--recipe=tp", "--devices", "2", "--check", "1", "--kokkos-disable-warnings"],
         ["recipe tp", "step   0"]),
        ("gpt", ["--steps", "1", "--layers", "1", "--seq", "1", "--batch", "1", "--heads", "1", "--dim", "1",
                 "--vocab", "2", "--ff", "1", "--devices", "3", "--data", "synthetic"], ["step   0"]),
        ("quickstart", ["--devices", "2", "--model", "2"], ["collectives in the block"]),
        ("heat2d", ["--n", "8", "--sweeps", "2", "--devices", "2", "--png", os.path.join(tmp, "h.png")],
         ["bit for bit the same"]),
        ("poisson3d", ["--n", "6", "--devices", "2"], ["serial CG"]),
        ("advection2d", ["--n", "8", "--steps", "2", "--devices", "2", "--png", os.path.join(tmp, "a.png")],
         ["bit for bit the same"]),
        ("checkpoint", ["--devices", "2", "--dir", tmp], ["every tensor equal"]),
    ]


def run(exe, args, quiet_runtime, cwd):
    """The program's exit status, stdout and stderr; run in `cwd`, where a program that wrongly
    takes a bad command line leaves its files."""
    env = dict(os.environ)
    if quiet_runtime:
        env["SHARDLIB_NO_BLAS_WARNING"] = "1"
    env.pop("SHARDLIB_DEVICES", None)  # the defaults the messages name
    env.pop("SHARDLIB_BACKEND", None)
    return subprocess.run([exe] + args, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def main():
    exes = {os.path.basename(p): os.path.abspath(p) for p in sys.argv[1:]}
    if not exes or set(exes) - PROGRAMS:
        sys.exit(f"not examples: {sorted(set(exes) - PROGRAMS)}\n{__doc__}")
    with tempfile.TemporaryDirectory() as tmp:
        failures, checked = check(exes, tmp)
    for f in failures:
        print("FAILED:", f)
    print(f"{checked - len(failures)} of {checked} command lines behaved ({', '.join(sorted(exes))})")
    return 1 if failures else 0


def check(exes, tmp):
    """(failures, command lines checked)."""
    failures, checked = [], 0

    def fail(program, args, why, r):
        failures.append(f"{program} {' '.join(repr(a) if a == '' else a for a in args)}: {why}\n"
                        f"  exit status {r.returncode}\n  stderr: {r.stderr!r}\n  stdout: {r.stdout[-400:]!r}")

    for program, args, words, starts_runtime in BAD:
        if program not in exes:
            continue
        checked += 1
        r = run(exes[program], args, starts_runtime, tmp)
        lines = r.stderr.splitlines()
        if r.returncode != USAGE_STATUS:
            fail(program, args, f"exit status {r.returncode}, not {USAGE_STATUS}", r)
        elif len(lines) != 1:
            fail(program, args, f"{len(lines)} lines on stderr, not one", r)
        elif not lines[0].startswith(program + ": "):
            fail(program, args, f"the message does not start with '{program}: '", r)
        elif missing := [w for w in words if w not in lines[0]]:
            fail(program, args, f"the message lacks {missing}", r)
        elif r.stdout and not starts_runtime:
            fail(program, args, "something was printed on stdout before the refusal", r)

    for program in exes:
        checked += 1
        r = run(exes[program], ["--help"], False, tmp)
        if r.returncode != 0 or not r.stdout.startswith(f"usage: {program} ") or r.stderr:
            fail(program, ["--help"], "no usage on stdout with exit status 0 (or something on stderr)", r)

    for program, args, words in good(tmp):
        if program not in exes:
            continue
        checked += 1
        r = run(exes[program], args, True, tmp)
        if r.returncode != 0:
            fail(program, args, "a good command line failed", r)
        elif missing := [w for w in words if w not in r.stdout]:
            fail(program, args, f"the output lacks {missing}", r)
    return failures, checked


if __name__ == "__main__":
    sys.exit(main())
