#!/usr/bin/env python3
"""Compiles a translation unit with `nvcc -std=c++20 -x cu` (no GPU needed), with the include
directories and defines of a reference translation unit of the build (tests/compile_flags.py):
what a user's CUDA build of the same program does with the same dependencies.

usage: nvcc_compile.py NVCC COMPILE_COMMANDS REFERENCE_SOURCE_NAME SOURCE OUTPUT
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_flags import include_and_define_flags, reference_flags  # noqa: E402


def main():
    nvcc, compile_commands, reference, source, output = sys.argv[1:6]
    cwd, _, flags = reference_flags(compile_commands, reference)
    includes, host = include_and_define_flags(flags)
    cmd = [nvcc, "-std=c++20", "-x", "cu"] + includes
    for h in host:
        cmd += ["-Xcompiler", h]
    cmd += ["-c", os.path.abspath(source), "-o", os.path.abspath(output)]
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=cwd).returncode


if __name__ == "__main__":
    sys.exit(main())
